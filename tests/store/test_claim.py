"""Claim: order, filters, attempts, history, dead sessions, preferring other workers."""

from __future__ import annotations

import pytest

from plunder import errors
from plunder.model import ErrorInfo, Failure, JobRecord, JobSpec, Session
from plunder.states import Status
from plunder.store import Store
from tests.store.helpers import claim, enqueue, later, open_session


def test_claim_order_is_priority_then_run_at_then_id(store: Store) -> None:
    t0 = store.now()
    enqueue(
        store,
        JobSpec("t", ["low"]),
        JobSpec("t", ["high"], priority=5),
        JobSpec("t", ["delayed-high"], priority=5, delay=1),
        JobSpec("t", ["also-high"], priority=5),
        now=t0,
    )
    session = open_session(store, now=t0)
    got = claim(store, session, limit=10, now=later(t0, 2))
    assert [j.args[0] for j in got] == ["high", "also-high", "delayed-high", "low"]


def test_claim_takes_a_batch_up_to_the_limit(store: Store) -> None:
    store.job_enqueue_many([JobSpec("t", [i]) for i in range(25)])
    session = open_session(store)
    first = claim(store, session, limit=10)
    second = claim(store, session, limit=10)
    third = claim(store, session, limit=10)
    assert [len(first), len(second), len(third)] == [10, 10, 5]
    assert len({j.id for j in first + second + third}) == 25
    assert claim(store, session) == []


def test_a_delayed_job_waits_for_its_run_at_by_the_database_clock(store: Store) -> None:
    t0 = store.now()
    (job,) = enqueue(store, JobSpec("t", delay=60), now=t0)
    session = open_session(store, expiry=300, now=t0)
    assert claim(store, session, now=later(t0, 59)) == []
    (got,) = claim(store, session, now=later(t0, 61))
    assert got.id == job.id


def test_only_known_tasks_and_listed_queues_are_claimed(store: Store) -> None:
    known, unknown, elsewhere = enqueue(
        store, JobSpec("t"), JobSpec("nobody.knows"), JobSpec("t", queue="elsewhere")
    )
    session = open_session(store)
    assert [j.id for j in claim(store, session)] == [known.id]
    assert claim(store, session) == []
    assert store.job_get(unknown.id).status == Status.PENDING  # visible, never failed for it
    assert store.job_get(elsewhere.id).status == Status.PENDING


def test_claim_stamps_attempt_session_and_opens_a_run(store: Store) -> None:
    (job,) = enqueue(store, JobSpec("t", timeout=30))
    session = open_session(store, name="w-7")
    (got,) = claim(store, session)
    assert got.status == Status.RUNNING and got.attempt == 1 and got.session_id == session.id
    assert got.started_at is not None and got.deadline_at is not None
    assert 29 < (got.deadline_at - got.started_at).total_seconds() < 31
    (run,) = store.job_runs(job.id)
    assert (run.attempt, run.session_id, run.worker, run.host, run.pid) == (
        1,
        session.id,
        "w-7",
        "host-a",
        4242,
    )
    assert run.outcome is None and run.finished_at is None


def test_a_dead_session_cannot_claim(store: Store) -> None:
    t0 = store.now()
    enqueue(store, JobSpec("t"), now=t0)
    session = open_session(store, expiry=5, now=t0)
    with pytest.raises(errors.SessionGone):
        claim(store, session, now=later(t0, 6))  # expired, not yet reaped
    store.session_close(session.id)
    with pytest.raises(errors.SessionGone):
        claim(store, session)
    assert store.queue_stats()[0].counts["pending"] == 1


def test_a_failed_job_is_retried_on_another_live_worker(store: Store) -> None:
    (job,) = enqueue(store, JobSpec("t", max_attempts=3))
    first = open_session(store, name="first")
    second = open_session(store, name="second")
    (got,) = claim(store, first)
    store.job_fail_many([Failure(got.claim, ErrorInfo("E", "boom"), retry_delay=0)])
    assert claim(store, first) == []  # another worker serving the queue is live
    (again,) = claim(store, second)
    assert again.id == job.id and again.attempt == 2
    assert again.failed_sessions == (first.id,)


def test_the_worker_that_failed_a_job_takes_it_when_no_other_is_live(store: Store) -> None:
    enqueue(store, JobSpec("t", max_attempts=3))
    first = open_session(store)
    other = open_session(store, queues=["unrelated"])  # live, but does not serve the queue
    assert other.id != first.id
    (got,) = claim(store, first)
    store.job_fail_many([Failure(got.claim, ErrorInfo("E", "boom"), retry_delay=0)])
    (again,) = claim(store, first)
    assert again.attempt == 2


def _failed_by(store: Store, first: Session) -> JobRecord:
    """A job that ``first`` claimed and failed, pending again at once."""
    (got,) = claim(store, first)
    store.job_fail_many([Failure(got.claim, ErrorInfo("E", "boom"), retry_delay=0)])
    return got


def test_a_failed_job_is_not_left_to_a_worker_that_cannot_run_its_task(store: Store) -> None:
    """Another live session serves the queue but not the task: the job would wait for it
    for ever, so the session that failed it takes it again at once."""
    enqueue(store, JobSpec("t", max_attempts=3))
    first = open_session(store, name="first")
    open_session(store, name="other", tasks=["u"])  # the queue, not the task
    job = _failed_by(store, first)
    (again,) = claim(store, first)
    assert again.id == job.id and again.attempt == 2


def test_a_failed_job_is_not_left_to_a_worker_with_no_free_slot(store: Store) -> None:
    """Another live session runs the task but has no free slot (as its last heartbeat
    said): the session that failed the job takes it at once; once the other has room again,
    the job is left to it."""
    enqueue(store, JobSpec("t", max_attempts=5))
    first = open_session(store, name="first")
    busy = open_session(store, name="busy", free_slots=0)
    _failed_by(store, first)
    (again,) = claim(store, first)
    assert again.attempt == 2
    store.job_fail_many([Failure(again.claim, ErrorInfo("E", "boom"), retry_delay=0)])
    assert store.session_heartbeat(busy.id, free_slots=3).alive
    assert claim(store, first) == []  # left to the session with room
    assert [s.free_slots for s in store.session_list() if s.id == busy.id] == [3]
    assert store.session_heartbeat(busy.id, free_slots=0).alive
    (third,) = claim(store, first)
    assert third.attempt == 3


def test_claiming_with_no_tasks_or_queues_claims_nothing(store: Store) -> None:
    enqueue(store, JobSpec("t"))
    session = open_session(store)
    assert claim(store, session, tasks=()) == []
    assert claim(store, session, queues=()) == []
    with pytest.raises(ValueError, match="limit"):
        claim(store, session, limit=0)
