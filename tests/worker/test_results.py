"""A task's result commits once, with its acknowledgement and its own writes, in real
worker processes: no moment at which the job has succeeded without its result."""

from __future__ import annotations

from pathlib import Path

import pytest

import plunder
from plunder.model import JobSpec
from plunder.states import Status, is_terminal
from plunder.store import Store
from tests.store.helpers import raw_connect
from tests.worker.conftest import Workers, wait_for, worker_in_thread
from tests.worker.test_processes import _effects_table


def _job_and_effect(url: str, job_id: int, token: str) -> tuple[str, str | None, int]:
    """The job's status and result and the number of its task's rows, read by one
    statement: one snapshot of the database."""
    mark = "?" if url.startswith("sqlite") else "%s"
    conn = raw_connect(url)
    try:
        row = conn.execute(
            "SELECT status, result, (SELECT count(*) FROM effects WHERE token = "
            f"{mark}) FROM plunder_jobs WHERE id = {mark}",
            (token, job_id),
        ).fetchone()
    finally:
        conn.close()
    return str(row[0]), row[1], int(row[2])


@pytest.mark.parametrize("task", ["effect_then_return", "async_effect_then_return"])
def test_the_result_commits_with_the_task_s_own_writes(
    store: Store, workers: Workers, tmp_path: Path, task: str
) -> None:
    """The task writes a row in ``ctx.transaction(result=v)`` (``async with`` for the async
    task): the row, the succeeded status and ``v`` appear in one commit at the block's end,
    never one without the others; the task then returns ``v``, which is not refused."""
    _effects_table(workers.url)
    workers.start()
    gate = tmp_path / "gate"
    (job,) = store.job_enqueue_many([JobSpec(task, ["tok", str(gate)])])
    seen: list[tuple[str, str | None, int]] = []

    def snapshot() -> bool:
        # the mark first: once it exists the block has committed, so the read after it
        # must see the commit (read first, the commit could fall between the two)
        reached = Path(f"{gate}.reached").exists()
        seen.append(_job_and_effect(workers.url, job.id, "tok"))
        return reached

    wait_for(snapshot, what="the task past its transaction block")
    done = ("succeeded", '{"token":"tok"}', 1)
    assert set(seen) <= {("pending", None, 0), ("running", None, 0), done}
    assert seen[-1] == done, "the block ended without its commit"
    gate.touch()
    app = plunder.App(workers.url)
    try:
        assert app.job(job.id).result(timeout=20) == {"token": "tok"}
    finally:
        app.close()
    wait_for(lambda: store.job_runs(job.id)[0].outcome is not None, what="the run closed")
    assert workers.procs[0].poll() is None
    assert " ERROR " not in workers.log(0)


def test_a_return_value_other_than_the_committed_result_is_refused(
    store_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The job keeps the result its transaction committed; the worker logs the refusal as
    an ERROR naming the job."""
    from tests.worker import tasks

    with worker_in_thread(store_url) as worker:
        job = tasks.returns_other.enqueue()
        assert job.result(timeout=20) == 1
        wait_for(lambda: "refused" in caplog.text, what="the refusal logged")
        assert worker.store.job_get(job.id).status == Status.SUCCEEDED
    (refusal,) = [r for r in caplog.records if "refused" in r.getMessage()]
    assert refusal.levelname == "ERROR"
    assert refusal.getMessage().startswith(f"job {job.id} returned 2, not the result its ")


@pytest.mark.parametrize("seconds", [0.0, 1.6])
def test_plunder_calls_after_the_transaction_block_work(
    store: Store, workers: Workers, tmp_path: Path, seconds: float
) -> None:
    """After its block committed, the task enqueues another job and streams on its own
    thread, then runs longer than the session expiry (1 s) before it returns: no open
    transaction holds the database (on SQLite its write lock, which the worker's own
    heartbeat needs), so the job succeeds once, the enqueued job runs, and the late
    stream event is discarded with a warning (the job's stream ended with its commit)."""
    _effects_table(workers.url)
    worker = workers.start()
    out = tmp_path / "child"
    (job,) = store.job_enqueue_many(
        [JobSpec("calls_after_transaction", ["tok", seconds, str(out)])]
    )
    wait_for(out.exists, timeout=30, what="the task's return")
    child = int(out.read_text())
    wait_for(lambda: is_terminal(store.job_get(child).status), timeout=30, what="the child job")
    assert store.job_get(child).result == 3
    record = store.job_get(job.id)
    assert (record.status, record.attempt, record.result) == (Status.SUCCEEDED, 1, None)
    assert _job_and_effect(workers.url, job.id, "tok") == ("succeeded", "null", 1)
    assert [e.data for e in store.stream_read(job.id)] == []
    wait_for(lambda: "were discarded" in workers.log(0), what="the discarded events logged")
    assert worker.poll() is None
    log = workers.log(0)
    assert " ERROR " not in log and "SESSION LOST" not in log, log


def test_a_plain_with_in_an_async_task_is_refused(store_url: str) -> None:
    from tests.worker import tasks

    with worker_in_thread(store_url):
        job = tasks.async_plain_with.enqueue()
        with pytest.raises(plunder.JobFailed, match="in an async def task use `async with`"):
            job.result(timeout=20)


def test_a_retry_s_stream_follows_a_mark_of_its_attempt(store_url: str) -> None:
    from tests.worker import tasks

    with worker_in_thread(store_url):
        job = tasks.flaky_streamer.enqueue(3)
        assert job.result(timeout=20) == 3
        events = list(job.stream(timeout=5))
    seen = [(e.attempt, e.kind, e.data) for e in events]
    progress = {"current": 3, "total": 3}
    assert seen == [
        *[(1, "chunk", f"attempt 1 chunk {i}") for i in range(3)],
        (1, "progress", progress),
        (2, "attempt", {"attempt": 2, "previous": 1}),
        *[(2, "chunk", f"attempt 2 chunk {i}") for i in range(3)],
        (2, "progress", progress),
    ]


def test_a_retry_that_streams_nothing_ends_the_stream_with_its_mark(store_url: str) -> None:
    """Attempt 1 streams and fails; attempt 2 streams nothing and succeeds: the stream
    ends with attempt 2's mark, so a follower knows attempt 1's text is void."""
    from tests.worker import tasks

    with worker_in_thread(store_url):
        job = tasks.flaky_quiet.enqueue(2)
        assert job.result(timeout=20) == 2
        events = list(job.stream(timeout=5))
    seen = [(e.attempt, e.kind, e.data) for e in events]
    assert seen == [
        (1, "chunk", "partial 0"),
        (1, "chunk", "partial 1"),
        (2, "attempt", {"attempt": 2, "previous": 1}),
    ]
    assert events[-1].seq == events[-2].seq


def test_events_streamed_in_the_block_commit_with_the_acknowledgement(
    store: Store, workers: Workers
) -> None:
    """Events still buffered when the block ends are written by the acknowledging
    transaction: the stream of a succeeded job has them (before, the next flush found the
    job ended and discarded them)."""
    workers.start()
    (job,) = store.job_enqueue_many([JobSpec("streams_in_transaction")])
    wait_for(lambda: is_terminal(store.job_get(job.id).status), what="the job")
    assert store.job_get(job.id).status == Status.SUCCEEDED
    events = [(e.kind, e.data) for e in store.stream_read(job.id)]
    assert events == [
        ("chunk", "before "),
        ("chunk", "inside"),
        ("progress", {"current": 1, "total": 1}),
    ]
