"""A worker in this process (on a thread): task kinds, failures, cancellation, timeouts,
streams. The process-level behaviour (signals, crashes) is in test_processes.py."""

from __future__ import annotations

import asyncio
import logging
import os
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from plunder import JobFailed, stopping
from plunder.states import Outcome, Status
from plunder.worker import Worker, WorkerOptions
from tests.store.helpers import claim
from tests.worker import tasks
from tests.worker.conftest import wait_for, worker_in_thread


@pytest.fixture
def worker(store_url: str) -> Iterator[Worker]:
    with worker_in_thread(store_url) as running:
        yield running


def test_sync_async_and_process_tasks_return_results(worker: Worker) -> None:
    jobs = tasks.add.enqueue_many([(i, i) for i in range(30)])
    coroutine = tasks.async_add.enqueue(2, 3)
    process = tasks.cpu.enqueue(100)
    assert repr(jobs[0]) == f"<Job {jobs[0].id}>"  # a handle reads its job when asked
    assert [j.result(timeout=20) for j in jobs] == [2 * i for i in range(30)]
    assert repr(jobs[0]) == f"<Job {jobs[0].id} succeeded>"
    assert coroutine.result(timeout=20) == 5
    assert process.result(timeout=30) == sum(i * i for i in range(100))


def test_short_jobs_run_on_a_few_threads(store_url: str) -> None:
    """A hundred slots full of short jobs do not keep a hundred threads: a task thread
    that finishes its job takes the next waiting one itself, and another thread is woken
    only while jobs still wait."""
    before = {t.ident for t in threading.enumerate()}
    with worker_in_thread(store_url, concurrency=100) as running:
        jobs = tasks.add.enqueue_many([(i, 1) for i in range(2000)])
        assert [j.result(timeout=60) for j in jobs[-5:]] == [i + 1 for i in range(1995, 2000)]
        wait_for(lambda: running.stats["succeeded"] == 2000, timeout=60)
        made = [
            t for t in threading.enumerate() if t.name == "plunder-task" and t.ident not in before
        ]
        assert len(made) < 25, f"{len(made)} task threads for 2,000 short jobs"


def test_failures_record_the_error_and_retry_unless_told_not_to(worker: Worker) -> None:
    retried, not_retried = tasks.fails.enqueue("runtime"), tasks.fails.enqueue("key")
    with pytest.raises(JobFailed) as caught:
        retried.result(timeout=20)
    assert caught.value.error_type == "RuntimeError"
    assert "raise RuntimeError" in (caught.value.traceback or "")
    assert [r.outcome for r in retried.runs] == [Outcome.FAILED] * 3
    with pytest.raises(JobFailed, match="KeyError"):
        not_retried.result(timeout=20)
    assert len(not_retried.runs) == 1


def test_bad_arguments_and_unserializable_results_fail_that_job_only(worker: Worker) -> None:
    bad_args = tasks.add.enqueue(1)
    bad_result = tasks.unserializable.enqueue()
    good = tasks.add.enqueue(1, 1)
    with pytest.raises(JobFailed, match="do not fit task add"):
        bad_args.result(timeout=20)
    assert len(bad_args.runs) == 1  # not retried: they would not fit next time either
    with pytest.raises(JobFailed, match="not JSON-serializable"):
        bad_result.result(timeout=20)
    assert good.result(timeout=20) == 2


def test_cancelling_a_running_task_stops_it(worker: Worker) -> None:
    job = tasks.sleepy.enqueue(30)
    wait_for(lambda: job.status == Status.RUNNING, what="running")
    job.cancel()
    wait_for(
        lambda: worker.stats["claimed"] >= 1 and not worker._slots.handles(),
        timeout=5,
        what="the worker dropped the cancelled task",
    )
    assert job.status == Status.CANCELLED
    assert job.runs[0].outcome == Outcome.CANCELLED
    assert tasks.add.enqueue(1, 2).result(timeout=10) == 3


def test_async_jobs_started_together_all_run_and_a_cancel_reaches_its_coroutine(
    worker: Worker,
) -> None:
    # jobs claimed in one turn reach the event loop in one hand-over
    jobs = tasks.async_add.enqueue_many([(i, 1) for i in range(300)])
    assert [j.result(timeout=30) for j in jobs] == [i + 1 for i in range(300)]
    sleeper = tasks.async_sleepy.options(timeout=60).enqueue(30)
    wait_for(lambda: sleeper.status == Status.RUNNING, what="running")
    sleeper.cancel()
    wait_for(
        lambda: not worker._slots.handles(), timeout=5, what="the worker dropped the coroutine"
    )
    assert sleeper.status == Status.CANCELLED

    async def others() -> int:
        return len(asyncio.all_tasks()) - 1  # less this one

    loop = worker._slots._async._loop
    assert loop is not None
    wait_for(
        lambda: asyncio.run_coroutine_threadsafe(others(), loop).result(timeout=5) == 0,
        timeout=5,
        what="the cancelled coroutine ended",
    )


@pytest.mark.parametrize("task", ["thread_slow", "async_sleepy", "cpu_hang"])
def test_each_kind_of_task_is_stopped_at_its_timeout(worker: Worker, task: str) -> None:
    job = tasks.app.enqueue(task, [5] if task == "async_sleepy" else [])
    with pytest.raises(JobFailed) as caught:
        job.result(timeout=20)
    assert caught.value.status == "timed_out"
    assert job.runs[-1].outcome == Outcome.TIMED_OUT


def test_stream_events_arrive_in_order_before_the_result(worker: Worker) -> None:
    job = tasks.streamer.enqueue(100)
    assert job.result(timeout=20) == 100
    events = list(job.stream(timeout=5))
    chunks = [e.data for e in events if e.kind == "chunk"]
    assert chunks == [f"chunk {i}" for i in range(100)]
    assert [e.seq for e in events] == sorted(e.seq for e in events)
    assert sum(e.kind == "progress" for e in events) == 10
    assert any("streamed 100 chunks" in line for line in job.runs[0].logs)


def test_a_process_task_streams_and_logs_through_its_worker(worker: Worker) -> None:
    job = tasks.cpu_streamer.enqueue(60)
    result = job.result(timeout=30)
    assert result["n"] == 60 and result["job"] == job.id and result["attempt"] == 1
    assert result["pid"] != os.getpid()  # it really ran in a child process
    events = list(job.stream(timeout=5))
    assert [e.data["i"] for e in events if e.kind == "chunk"] == list(range(60))
    assert {e.data["pid"] for e in events if e.kind == "chunk"} == {result["pid"]}
    assert [e.data["current"] for e in events if e.kind == "progress"] == list(range(0, 60, 10))
    assert any(f"child {result['pid']} streamed 60 chunks" in line for line in job.runs[0].logs)


def test_a_process_task_cannot_join_the_acknowledgement_transaction(worker: Worker) -> None:
    job = tasks.cpu_transaction.enqueue()
    with pytest.raises(JobFailed, match="cannot write in its acknowledgement's transaction"):
        job.result(timeout=30)


def test_an_async_task_streams_and_a_follower_sees_it_live(worker: Worker) -> None:
    job = tasks.app.enqueue("async_streamer", [50])
    seen = [e.data["token"] for e in job.stream(timeout=20) if e.kind == "chunk"]
    assert seen == list(range(50))
    assert job.result(timeout=5) == 50


def test_a_claim_whose_answer_was_lost_goes_back_to_the_queue(store_url: str) -> None:
    """A claim commits but its answer never reaches the worker (the connection died after
    the commit): the job is running under the worker's live session with no task behind it.
    The heartbeat finds it, the worker gives it back, and it runs."""
    with worker_in_thread(store_url, concurrency=1) as worker:
        sleeper = tasks.sleepy.enqueue(30)  # fills the one slot: the worker claims no more
        wait_for(lambda: sleeper.status == Status.RUNNING, what="running")
        job = tasks.add.enqueue(2, 2)
        session = worker.session
        assert session is not None
        (lost,) = claim(worker.store, session, tasks=["add"])  # as if the answer were lost
        assert lost.id == job.id
        wait_for(lambda: job.status == Status.PENDING, what="the claim given back")
        sleeper.cancel()
        assert job.result(timeout=20) == 4
        assert [r.outcome for r in job.runs] == [Outcome.RELEASED, Outcome.SUCCEEDED]
        assert job.refresh().attempt == 2


def test_a_job_due_now_but_not_claimed_is_claimed_again_at_once_then_left_to_the_poll(
    store_url: str,
) -> None:
    """A job may come due between a claim and the next-due read: the worker claims once
    more at once. A job still due and unclaimed after that (locked elsewhere, or left to
    the workers that did not fail it) waits for a wake-up or the poll interval: no spin."""
    tasks.app.configure(url=store_url, poll_interval=5.0)
    try:
        worker = Worker(tasks.app, WorkerOptions(concurrency=2))
        answers = iter([0.0, -0.2, -0.1, 3.0, 0.0])
        worker.store.job_next_due = lambda **_: next(answers)  # type: ignore[method-assign]
        assert [worker._wait_time() for _ in range(5)] == [0.0, 5.0, 5.0, 3.0, 0.0]
    finally:
        tasks.app.close()


def test_jobs_whose_thread_cannot_be_made_fail_with_why(
    store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A process out of threads: the claim's jobs do not start, and each fails with the
    error that said so (not left running until its session expires)."""
    real = threading.Thread.start

    def start(thread: threading.Thread) -> None:
        if thread.name == "plunder-task":
            raise RuntimeError("can't start new thread")
        real(thread)

    monkeypatch.setattr(threading.Thread, "start", start)
    with worker_in_thread(store_url):
        jobs = tasks.add.enqueue_many([(i, 1) for i in range(3)])
        for job in jobs:
            with pytest.raises(JobFailed, match="can't start new thread") as caught:
                job.result(timeout=20)
            assert caught.value.error_type == "RuntimeError"


def test_a_task_that_ignores_its_stop_past_the_grace_period_is_reported(
    store_url: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Its timeout is written at once; once it runs on past the grace period, a warning
    names the job, and another when it finally returns and frees its slot."""
    monkeypatch.setattr(stopping, "STOP_GRACE", 0.2)
    caplog.set_level(logging.WARNING, logger="plunder.worker")
    returned = tmp_path / "returned"
    with worker_in_thread(store_url, concurrency=1) as worker:
        job = tasks.stubborn.options(timeout=0.1).enqueue(1.0, str(returned))
        with pytest.raises(JobFailed) as caught:
            job.result(timeout=10)
        assert caught.value.status == "timed_out"
        assert not returned.exists()
        assert worker._slots.busy() == 1  # its slot: still taken
        wait_for(lambda: f"job {job.id} attempt 1 (stubborn) still runs" in caplog.text)
        wait_for(lambda: f"job {job.id} attempt 1 (stubborn) returned" in caplog.text)
        assert returned.exists() and worker._slots.busy() == 0
        assert tasks.add.enqueue(1, 2).result(timeout=10) == 3
