"""Limits through a worker (docs/guide/limits.md): a task that pauses its limit key goes
back without spending an attempt, no job of the key starts before the pause ends, and
they all resume on their own."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from plunder.states import Outcome, Status
from plunder.worker import Worker
from tests.worker import tasks
from tests.worker.conftest import wait_for, worker_in_thread


@pytest.fixture
def worker(store_url: str) -> Iterator[Worker]:
    with worker_in_thread(store_url, concurrency=4) as running:
        yield running


def test_a_paused_key_starts_nothing_until_the_pause_ends(worker: Worker) -> None:
    app = tasks.app
    first, *others = tasks.provider_call.enqueue_many([(1.0,), (0,), (0,)])
    wait_for(lambda: any(s.paused_until for s in app.limits()), what="the pause")
    (state,) = app.limits()
    assert state.paused_until is not None and state.reason.startswith("paused until")
    assert state.running == 0 and state.held == 3
    assert [j.result(timeout=30) for j in (first, *others)] == [2, 1, 1]
    record = first.refresh()
    assert record.status == Status.SUCCEEDED and record.max_attempts == 2  # none spent
    released, succeeded = first.runs
    assert released.outcome == Outcome.RELEASED and succeeded.outcome == Outcome.SUCCEEDED
    for job in (first, *others):
        started = job.refresh().started_at
        assert started is not None and started >= state.paused_until, job
    assert worker.stats["stale"] == 0


def test_resume_says_whether_the_key_has_a_limit(worker: Worker) -> None:
    job = tasks.app.enqueue("provider_call", [0])
    assert job.result(timeout=30) == 1
    assert tasks.app.resume_limit("provider") is True
    assert tasks.app.resume_limit("nobody") is False
