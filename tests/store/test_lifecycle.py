"""Failures, retries in database time, run history, cancel and retry by a person."""

from __future__ import annotations

import pytest

from plunder import errors
from plunder.model import Claim, ErrorInfo, Failure, JobSpec
from plunder.states import Outcome, Status
from plunder.store import Store
from tests.store.helpers import claim, complete, enqueue, later, open_session


def _boom() -> ErrorInfo:
    try:
        raise KeyError("missing")
    except KeyError as exc:
        return ErrorInfo.from_exception(exc)


def test_a_failure_records_type_message_and_traceback_and_retries_after_the_delay(
    store: Store,
) -> None:
    t0 = store.now()
    (job,) = enqueue(store, JobSpec("t", max_attempts=3), now=t0)
    session = open_session(store, expiry=300, now=t0)
    (got,) = claim(store, session, now=t0)
    error = _boom()
    ack = store.job_fail_many(
        [Failure(got.claim, error, retry_delay=30, logs=("a", "b"))], now=later(t0, 1)
    )
    assert ack.accepted == (got.claim,)
    retried = store.job_get(job.id)
    assert retried.status == Status.PENDING and retried.attempt == 1
    assert abs((retried.run_at - later(t0, 31)).total_seconds()) < 0.01  # database time
    assert retried.error is not None and retried.error["type"] == "KeyError"
    assert "raise KeyError" in retried.error["traceback"]
    assert claim(store, session, now=later(t0, 30)) == []
    (again,) = claim(store, session, now=later(t0, 32))
    assert again.attempt == 2
    (run, _) = store.job_runs(job.id)
    assert run.outcome == Outcome.FAILED and run.logs == ("a", "b")
    assert run.error is not None and run.error["message"] == "'missing'"


def test_no_retry_when_told_not_to_or_when_attempts_are_spent(store: Store) -> None:
    enqueue(store, JobSpec("t", [1], max_attempts=5), JobSpec("t", [2], max_attempts=1))
    session = open_session(store)
    told, spent = claim(store, session)
    store.job_fail_many(
        [
            Failure(told.claim, _boom(), retry_delay=None),
            Failure(spent.claim, _boom(), retry_delay=0),
        ]
    )
    assert store.job_get(told.id).status == Status.FAILED
    assert store.job_get(spent.id).status == Status.FAILED
    assert store.job_get(told.id).finished_at is not None


def test_a_worker_detected_timeout_ends_as_timed_out(store: Store) -> None:
    enqueue(store, JobSpec("t", max_attempts=1, timeout=1))
    session = open_session(store)
    (job,) = claim(store, session)
    store.job_fail_many(
        [
            Failure(
                job.claim,
                ErrorInfo("plunder.JobTimeout", "late"),
                retry_delay=None,
                outcome=Outcome.TIMED_OUT,
            )
        ]
    )
    assert store.job_get(job.id).status == Status.TIMED_OUT
    assert store.job_runs(job.id)[0].outcome == Outcome.TIMED_OUT


def test_history_keeps_every_attempt(store: Store) -> None:
    (job,) = enqueue(store, JobSpec("t", max_attempts=3))
    sessions = [open_session(store, name=f"w{i}") for i in range(3)]
    for i, session in enumerate(sessions):
        (got,) = claim(store, session)
        if i < 2:
            store.job_fail_many([Failure(got.claim, _boom(), retry_delay=0)])
        else:
            assert complete(store, got.claim, "third time")
    runs = store.job_runs(job.id)
    assert [r.attempt for r in runs] == [1, 2, 3]
    assert [r.worker for r in runs] == ["w0", "w1", "w2"]
    assert [r.outcome for r in runs] == [Outcome.FAILED, Outcome.FAILED, Outcome.SUCCEEDED]
    assert all(r.duration is not None and r.duration >= 0 for r in runs)
    assert store.job_get(job.id).failed_sessions == (sessions[0].id, sessions[1].id)


def test_captured_logs_are_bounded(store: Store) -> None:
    enqueue(store, JobSpec("t"))
    session = open_session(store)
    (job,) = claim(store, session)
    lines = tuple(f"line {i} " + "x" * 5000 for i in range(300))
    store.job_fail_many([Failure(job.claim, _boom(), retry_delay=None, logs=lines)])
    (run,) = store.job_runs(job.id)
    assert len(run.logs) == 201 and run.logs[0] == "[100 earlier lines dropped]"
    assert run.logs[1].startswith("line 100 ") and len(run.logs[1]) == 2000


def test_cancel_a_pending_job_and_refuse_to_cancel_a_finished_one(store: Store) -> None:
    pending, done = enqueue(store, JobSpec("t", [1]), JobSpec("t", [2]))
    assert store.job_cancel(pending.id).status == Status.CANCELLED
    session = open_session(store)
    (got,) = claim(store, session)
    assert got.id == done.id and complete(store, got.claim)
    with pytest.raises(errors.InvalidTransition, match="it is succeeded"):
        store.job_cancel(done.id)
    with pytest.raises(errors.InvalidTransition, match="it is cancelled"):
        store.job_cancel(pending.id)
    with pytest.raises(errors.JobNotFound):
        store.job_cancel(10**9)


def test_retry_by_a_person_gives_one_more_attempt(store: Store) -> None:
    (job,) = enqueue(store, JobSpec("t", max_attempts=1))
    session = open_session(store)
    (got,) = claim(store, session)
    store.job_fail_many([Failure(got.claim, _boom(), retry_delay=0)])
    assert store.job_get(job.id).status == Status.FAILED
    again = store.job_retry(job.id)
    assert again.status == Status.PENDING and again.max_attempts == 2 and again.error is None
    (second,) = claim(store, session)
    assert second.attempt == 2
    with pytest.raises(errors.InvalidTransition, match="it is running"):
        store.job_retry(job.id)
    assert store.job_cancel(job.id).status == Status.CANCELLED
    assert store.job_retry(job.id).status == Status.PENDING


def test_release_gives_jobs_back_without_spending_an_attempt(store: Store) -> None:
    (job,) = enqueue(store, JobSpec("t", max_attempts=1))
    session = open_session(store)
    (got,) = claim(store, session)
    ack = store.job_release_many([got.claim, Claim(got.id, 99, session.id)])
    assert ack.accepted == (got.claim,) and len(ack.stale) == 1
    released = store.job_get(job.id)
    assert released.status == Status.PENDING and released.attempts_left == 1
    assert store.job_runs(job.id)[0].outcome == Outcome.RELEASED
