"""A task's result commits once, with its acknowledgement and its own writes, in real
worker processes: no moment at which the job has succeeded without its result."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest

import plunder
from plunder.model import JobSpec
from plunder.states import Status
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
def test_the_returned_value_commits_with_the_task_s_own_writes(
    store: Store, workers: Workers, tmp_path: Path, task: str
) -> None:
    """The task writes a row in its transaction and returns a value after the block. While
    it has not returned, neither the row nor a succeeded job is visible; once it has, both
    are, with the result, in the same snapshot. A waiter only ever sees the value."""
    _effects_table(workers.url)
    workers.start()
    gate = tmp_path / "gate"
    (job,) = store.job_enqueue_many([JobSpec(task, ["tok", str(gate)])])
    wait_for(Path(f"{gate}.reached").exists, what="the task past its transaction block")
    before = _job_and_effect(workers.url, job.id, "tok")
    assert before == ("running", None, 0), "acknowledged before the task returned"
    seen: list[Any] = []
    app = plunder.App(workers.url)
    waiter = threading.Thread(target=lambda: seen.append(app.job(job.id).result(timeout=20)))
    waiter.start()
    gate.touch()
    waiter.join(timeout=30)
    app.close()
    assert seen == [{"token": "tok"}]
    assert _job_and_effect(workers.url, job.id, "tok") == ("succeeded", '{"token":"tok"}', 1)


def test_a_return_value_other_than_the_committed_result_is_refused(
    store_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    from tests.worker import tasks

    with worker_in_thread(store_url) as worker:
        job = tasks.returns_other.enqueue()
        assert job.result(timeout=20) == 1
        wait_for(lambda: "refused" in caplog.text, what="the refusal logged")
        assert worker.store.job_get(job.id).status == Status.SUCCEEDED
    assert "returned a value other than the result its transaction committed" in caplog.text


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
