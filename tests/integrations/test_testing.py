"""plunder.testing: run_until_idle runs due jobs with the worker's semantics; eager mode."""

from __future__ import annotations

import asyncio

import pytest

import plunder
from plunder import errors, testing
from plunder.states import Status


def test_run_until_idle_runs_every_due_job_and_what_they_enqueue(plunder_app: plunder.App) -> None:
    seen: list[int] = []

    @plunder_app.task(name="double")
    def double(n: int) -> int:
        seen.append(n)
        if n < 4:
            double.enqueue(n + 1)
        return n * 2

    job = double.enqueue(1)
    assert [r.task for r in testing.enqueued(plunder_app, double)] == [double.name]
    ran = testing.run_until_idle(plunder_app)
    assert seen == [1, 2, 3, 4]
    assert ran.attempts == 4 and len(ran.succeeded) == 4 and not ran.failed
    assert job.result(timeout=0) == 2
    assert testing.enqueued(plunder_app) == []
    assert len(testing.enqueued(plunder_app, status=None)) == 4


def test_retries_follow_the_task_policy(plunder_app: plunder.App) -> None:
    calls: list[int] = []

    @plunder_app.task(retries=2, backoff_base=0, no_retry=(KeyError,), name="flaky")
    def flaky(ctx: plunder.Context) -> str:
        calls.append(ctx.attempt)
        if ctx.attempt < 3:
            raise ValueError(f"attempt {ctx.attempt}")
        return "ok"

    @plunder_app.task(retries=5, backoff_base=0, no_retry=(KeyError,), name="never")
    def never(x: int) -> None:
        raise KeyError(x)

    ok, bad = flaky.enqueue(), never.enqueue(1)
    ran = testing.run_until_idle(plunder_app)
    assert calls == [1, 2, 3] and ok.result(timeout=0) == "ok"
    assert [r.outcome.value for r in ok.runs if r.outcome] == ["failed", "failed", "succeeded"]
    assert bad.status == Status.FAILED and len(bad.runs) == 1  # KeyError is never retried
    assert ran.attempts == 4


def test_a_backoff_not_passed_is_not_due(plunder_app: plunder.App) -> None:
    @plunder_app.task(retries=1, backoff_base=3600, backoff_cap=3600, name="fails")
    def fails() -> None:
        raise ValueError("no")

    job = fails.enqueue()
    ran = testing.run_until_idle(plunder_app)
    assert ran.attempts == 1 and job.status == Status.PENDING


def test_timeouts_end_the_attempt(plunder_app: plunder.App) -> None:
    @plunder_app.task(timeout=0.05, retries=0, name="slow_async")
    async def slow_async() -> None:
        await asyncio.Event().wait()  # only its timeout ends it

    job = slow_async.enqueue()
    testing.run_until_idle(plunder_app)
    record = job.record
    assert record.status == Status.TIMED_OUT
    assert record.error is not None and record.error["type"] == "plunder.JobTimeout"


def test_a_stale_claim_is_refused_as_by_a_worker(plunder_app: plunder.App) -> None:
    """The task's job is cancelled while it runs: its completion is fenced out."""

    @plunder_app.task(name="cancels_itself")
    def cancels_itself(ctx: plunder.Context) -> str:
        plunder_app.job(ctx.job_id).cancel()
        return "too late"

    job = cancels_itself.enqueue()
    ran = testing.run_until_idle(plunder_app)
    assert ran.stale == [job.id]
    assert job.status == Status.CANCELLED and job.record.result is None


def test_eager_runs_at_enqueue_and_stores_nothing(plunder_app: plunder.App) -> None:
    @plunder_app.task(name="add")
    def add(a: int, b: int) -> int:
        return a + b

    @plunder_app.task(name="boom")
    def boom() -> None:
        raise ValueError("boom")

    with testing.eager(plunder_app) as ran:
        assert add.enqueue(2, 3).result() == 5
        with pytest.raises(errors.JobFailed, match="boom"):
            boom.enqueue().result()
        with pytest.raises(errors.PayloadError):
            add.enqueue(object(), 1)
    assert [j.status for j in ran] == [Status.SUCCEEDED, Status.FAILED]
    assert testing.enqueued(plunder_app, status=None) == []
    assert add.enqueue(1, 1).status == Status.PENDING  # eager mode ended
