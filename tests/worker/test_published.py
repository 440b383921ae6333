"""Enqueue by name from a process without the task's code: a real worker publishes its
tasks when its session opens, and the job takes the task's own options."""

from __future__ import annotations

import pytest

import plunder
from plunder import errors
from plunder.states import Status
from plunder.store import Store
from tests.worker.conftest import Workers, session_of, wait_for


def test_enqueue_by_name_takes_the_options_the_worker_published(
    store: Store, store_url: str, workers: Workers
) -> None:
    """slow_llm is declared queue="llm", timeout=1, retries=0. A producer that never
    registered it enqueues it by name: the job goes to the llm queue, which the worker
    (``-q llm``) serves, and times out after one attempt instead of running 3 s."""
    proc = workers.start("-q", "llm", "-c", "2")
    wait_for(lambda: session_of(store, proc.pid), what="the worker's session")

    def free_slots() -> int:
        (session,) = [s for s in store.session_list() if s.pid == proc.pid]
        assert "slow_llm" in session.tasks and session.queues == ("llm",)
        return session.free_slots

    assert free_slots() == 2
    producer = plunder.App(store_url)
    try:
        assert "slow_llm" not in producer.registry
        job = producer.enqueue("slow_llm", [3])
        record = job.record
        assert (record.queue, record.timeout, record.max_attempts) == ("llm", 1.0, 1)
        assert record.priority == 3
        # its heartbeats record the slot the job takes
        wait_for(lambda: free_slots() == 1, what="one slot taken")
        assert job.wait(timeout=20).status == Status.TIMED_OUT
        assert [run.outcome.value for run in job.runs if run.outcome] == ["timed_out"]

        overridden = producer.enqueue("slow_llm", [0], timeout=5, retries=2)
        assert overridden.result(timeout=20) == "slept"
        record = overridden.record
        assert (record.queue, record.timeout, record.max_attempts) == ("llm", 5.0, 3)

        with pytest.raises(errors.UnknownTask, match="allow_unregistered"):
            producer.enqueue("tests.nobody", [1])
        anyway = producer.enqueue("tests.nobody", [1], allow_unregistered=True)
        assert anyway.record.queue == "default"
    finally:
        producer.close()
