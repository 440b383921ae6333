"""A worker claims nothing from a paused queue (``plunder queues pause``), lets the job it
runs there finish, and claims again once the queue is resumed."""

from __future__ import annotations

import time

from click.testing import CliRunner

from plunder.cli import main
from plunder.model import JobSpec
from plunder.states import Status
from plunder.store import Store
from plunder.store.pauses import PAUSE_TTL
from tests.worker.conftest import wait_for, worker_in_thread


def queues(url: str, *args: str) -> str:
    result = CliRunner().invoke(main, ["--db", url, "queues", *args], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return result.output


def test_a_worker_claims_nothing_from_a_paused_queue_until_it_is_resumed(
    store_url: str, store: Store
) -> None:
    with worker_in_thread(store_url, concurrency=2):
        (slow,) = store.job_enqueue_many([JobSpec("sleepy", [1.5])])
        wait_for(lambda: store.job_get(slow.id).status == Status.RUNNING, what="it runs")
        assert "paused" in queues(store_url, "pause", "default", "--reason", "upgrade")
        assert "upgrade" in queues(store_url)
        time.sleep(PAUSE_TTL + 0.2)  # the worker's store has read the pause by now
        held = store.job_enqueue_many([JobSpec("add", [i, i]) for i in range(5)])
        wait_for(lambda: store.job_get(slow.id).status == Status.SUCCEEDED, what="it ends")
        time.sleep(1.0)  # a worker with free slots, polling every 50 ms, claims none
        assert {store.job_get(j.id).status for j in held} == {Status.PENDING}
        assert "resumed" in queues(store_url, "resume", "default")
        wait_for(
            lambda: all(store.job_get(j.id).status == Status.SUCCEEDED for j in held),
            what="the resumed queue's jobs to run",
        )
    assert "no queue is paused" in queues(store_url, "list")
