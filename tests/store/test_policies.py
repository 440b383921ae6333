"""A job's policies for a lost run (retry_on_lost) and its start-by deadline (expires_in):
a lost job whose policy says no ends at once and never runs again; a job not started by its
deadline is never claimed, and the janitor ends it ``expired``."""

from __future__ import annotations

from datetime import datetime

import pytest

import plunder
from plunder import errors
from plunder.config import Settings
from plunder.janitor import Janitor
from plunder.model import ErrorInfo, Failure, JobSpec, Lease
from plunder.states import Outcome, Status
from plunder.store import Store
from tests.store.helpers import claim, enqueue, later, open_session


def lease_at(store: Store, now: datetime) -> Lease:
    lease = store.lease_acquire("janitor", "j", 600, now=now)
    assert lease is not None
    return lease


# -- lost ---------------------------------------------------------------------------------------
def test_a_lost_job_whose_policy_says_no_ends_at_once_with_worker_lost(store: Store) -> None:
    t0 = store.now()
    enqueue(
        store,
        JobSpec("t", [1], max_attempts=3, retry_on_lost=False),
        JobSpec("t", [2], max_attempts=3),  # the default: retried
        now=t0,
    )
    dying = open_session(store, expiry=5, now=t0)
    stale, rescued = claim(store, dying, now=t0)
    assert not stale.retry_on_lost and rescued.retry_on_lost
    alive = open_session(store, name="alive", expiry=60, now=t0)
    swept = store.session_reap_many(lease_at(store, t0), now=later(t0, 5.1))
    assert swept.finished == (stale.id,) and swept.retried == (rescued.id,)

    ended = store.job_get(stale.id)
    assert ended.status == Status.TIMED_OUT and ended.finished_at == later(t0, 5.1)
    assert ended.error is not None and ended.error["type"] == "plunder.WorkerLost"
    assert dying.id in ended.error["message"]
    (run,) = store.job_runs(stale.id)
    assert run.outcome == Outcome.LOST and run.session_id == dying.id
    assert run.error == ended.error
    # no further attempt: only the default job is claimed again
    assert [j.id for j in claim(store, alive, now=later(t0, 5.2))] == [rescued.id]
    assert store.job_get(stale.id).attempt == 1
    assert store.job_get(rescued.id).error["type"] == "plunder.SessionLost"  # type: ignore[index]


def test_a_worker_that_lost_its_session_ends_such_a_job_too(store: Store) -> None:
    """session_close(lost=True), the worker's own report of a lost session, applies the
    same policy as the reaper."""
    enqueue(
        store,
        JobSpec("t", [1], max_attempts=3, retry_on_lost=False),
        JobSpec("t", [2], max_attempts=3),
    )
    session = open_session(store)
    stale, other = claim(store, session)
    assert sorted(store.session_close(session.id, lost=True)) == sorted([stale.id, other.id])
    assert store.job_get(stale.id).status == Status.TIMED_OUT
    assert store.job_get(stale.id).error["type"] == "plunder.WorkerLost"  # type: ignore[index]
    assert store.job_get(other.id).status == Status.PENDING


def test_a_graceful_close_ends_a_stopped_job_whose_policy_says_no(store: Store) -> None:
    """A task stopped unfinished at shutdown may still run (a thread cannot be killed):
    with retry_on_lost=False its job ends timed_out (plunder.WorkerLost) and never runs
    again. A job claimed but never started is released whatever its policy, as is a stopped
    one whose policy allows another run."""
    t0 = store.now()
    enqueue(
        store,
        JobSpec("t", ["stopped"], max_attempts=3, retry_on_lost=False),
        JobSpec("t", ["unstarted"], max_attempts=3, retry_on_lost=False),
        JobSpec("t", ["retried"], max_attempts=3),
        now=t0,
    )
    session = open_session(store, expiry=600, now=t0)
    stopped, unstarted, retried = claim(store, session, now=t0)
    closed = store.session_close(
        session.id, started=[stopped.claim, retried.claim], now=later(t0, 1)
    )
    assert sorted(closed) == sorted([stopped.id, unstarted.id, retried.id])

    ended = store.job_get(stopped.id)
    assert ended.status == Status.TIMED_OUT and ended.finished_at == later(t0, 1)
    assert ended.error is not None and ended.error["type"] == "plunder.WorkerLost"
    assert session.id in ended.error["message"]
    (run,) = store.job_runs(stopped.id)
    assert run.outcome == Outcome.LOST and run.session_id == session.id
    assert run.error == ended.error
    for job in (unstarted, retried):
        again = store.job_get(job.id)
        assert again.status == Status.PENDING and again.error is None
        assert [r.outcome for r in store.job_runs(job.id)] == [Outcome.RELEASED]
    other = open_session(store, name="other", expiry=600, now=t0)
    taken = claim(store, other, now=later(t0, 2))
    assert sorted(j.id for j in taken) == sorted([unstarted.id, retried.id])
    assert store.job_get(stopped.id).attempt == 1


def test_timed_out_or_lost_is_read_on_the_database_clock(store: Store) -> None:
    """A run past its timeout whose session still lives has timed out (its worker may have
    died unseen): retry_on_timeout decides. One whose session expired first is lost, and
    the janitor reaps before it times out, so retry_on_lost decides."""
    t0 = store.now()
    enqueue(
        store,
        JobSpec("t", ["late"], timeout=10, max_attempts=3, retry_on_lost=False),
        JobSpec("t", ["dead"], timeout=10, max_attempts=3, retry_on_lost=False),
        now=t0,
    )
    (late,) = claim(store, open_session(store, name="a", expiry=20, now=t0), limit=1, now=t0)
    (dead,) = claim(store, open_session(store, name="b", expiry=5, now=t0), limit=1, now=t0)
    done = Janitor(store, Settings(url="sqlite:///unused.db")).run_once(now=later(t0, 10.1))
    assert done.timed_out.retried == (late.id,) and done.timed_out.finished == ()
    assert store.job_get(late.id).status == Status.PENDING
    assert done.reaped.finished == (dead.id,)
    ended = store.job_get(dead.id)
    assert ended.status == Status.TIMED_OUT
    assert ended.error is not None and ended.error["type"] == "plunder.WorkerLost"


# -- start-by deadline -------------------------------------------------------------------------
def test_a_job_past_its_start_by_deadline_is_never_claimed(store: Store) -> None:
    t0 = store.now()
    late, fresh, timely = enqueue(
        store,
        JobSpec("t", [1], expires_in=10),
        JobSpec("t", [2]),
        JobSpec("t", [3], expires_in=10),
        now=t0,
    )
    assert late.expires_at == later(t0, 10) and fresh.expires_at is None
    assert store.job_get(late.id).expires_at == later(t0, 10)
    session = open_session(store, expiry=600, now=t0)
    (taken,) = claim(store, session, limit=1, now=later(t0, 9.9))  # in time: claimed
    assert taken.id == late.id and taken.expires_at == later(t0, 10)
    # the janitor has not run: the claim itself refuses the job past its deadline
    assert [j.id for j in claim(store, session, now=later(t0, 10.1))] == [fresh.id]
    assert store.job_get(timely.id).status == Status.PENDING


def test_jobs_past_their_deadline_do_not_fill_a_claim(store: Store) -> None:
    """Expired jobs the janitor has not ended yet, at the head of a queue, are stepped over
    by the claim's walk: they never take the places of a claim's limit."""
    t0 = store.now()
    *late, good = enqueue(
        store, *[JobSpec("t", [i], expires_in=10) for i in range(3)], JobSpec("t", ["good"]), now=t0
    )
    session = open_session(store, expiry=600, now=t0)
    (taken,) = claim(store, session, limit=1, now=later(t0, 10.1))
    assert taken.id == good.id
    assert all(store.job_get(j.id).status == Status.PENDING for j in late)


def test_jobs_past_their_deadline_do_not_fill_a_turn(store: Store) -> None:
    """As a claim, a worker's turn (one statement on PostgreSQL), in every priority level
    and in the rest of a queue with more levels than a claim probes one by one."""
    t0 = store.now()
    levels = [JobSpec("t", [p], priority=p, expires_in=10) for p in range(40, 20, -1)]
    rest = [JobSpec("t", ["late", i], priority=0, expires_in=10) for i in range(3)]
    *_, good = enqueue(store, *levels, *rest, JobSpec("t", ["good"], priority=-1), now=t0)
    session = open_session(store, expiry=600, now=t0)
    turn = store.job_exchange_many(
        [],
        [],
        session_id=session.id,
        queues=["default"],
        tasks=["t"],
        limit=1,
        now=later(t0, 10.1),
    )
    assert [j.id for j in turn.claimed] == [good.id]


def test_the_janitor_ends_jobs_past_their_start_by_deadline_as_expired(store: Store) -> None:
    t0 = store.now()
    gone, kept, plain = enqueue(
        store,
        JobSpec("t", [1], expires_in=10),
        JobSpec("t", [2], expires_in=20),
        JobSpec("t", [3]),
        now=t0,
    )
    lease = lease_at(store, t0)
    assert store.job_expire_many(lease, now=later(t0, 9.9)).count == 0
    swept = store.job_expire_many(lease, now=later(t0, 10.1))
    assert swept.finished == (gone.id,) and swept.retried == ()
    ended = store.job_get(gone.id)
    assert ended.status == Status.EXPIRED and ended.attempt == 0
    assert ended.finished_at == later(t0, 10.1)
    assert ended.error is not None and ended.error["type"] == "plunder.JobExpired"
    assert store.job_runs(gone.id) == []  # it never ran
    assert store.job_expire_many(lease, now=later(t0, 10.2)).count == 0  # idempotent
    assert store.job_get(kept.id).status == Status.PENDING
    assert store.job_get(plain.id).status == Status.PENDING
    counts = {s.queue: s.counts for s in store.queue_stats()}["default"]
    assert counts["expired"] == 1 and counts["pending"] == 2
    assert [j.id for j in store.job_list(status="expired").jobs] == [gone.id]


def test_the_janitor_pass_expires_jobs(store: Store) -> None:
    t0 = store.now()
    (job,) = enqueue(store, JobSpec("t", expires_in=1), now=t0)
    janitor = Janitor(store, Settings(url="sqlite:///unused.db"))
    assert janitor.run_once(now=later(t0, 0.5)).expired.count == 0
    done = janitor.run_once(now=later(t0, 1.5))
    assert done.held and done.expired.finished == (job.id,)
    assert store.job_get(job.id).status == Status.EXPIRED


def test_the_deadline_bounds_every_start_not_only_the_first(store: Store) -> None:
    """A job that failed and waits for its retry past the deadline is not started again."""
    t0 = store.now()
    (job,) = enqueue(store, JobSpec("t", max_attempts=3, expires_in=10), now=t0)
    session = open_session(store, expiry=600, now=t0)
    (first,) = claim(store, session, now=t0)
    failure = Failure(first.claim, ErrorInfo("E", "bad"), retry_delay=20)
    assert store.job_fail_many([failure], now=later(t0, 1)).accepted == (first.claim,)
    assert claim(store, session, now=later(t0, 21.1)) == []
    swept = store.job_expire_many(lease_at(store, t0), now=later(t0, 21.2))
    assert swept.finished == (job.id,)
    assert store.job_get(job.id).status == Status.EXPIRED
    assert [r.outcome for r in store.job_runs(job.id)] == [Outcome.FAILED]


def test_an_expired_job_can_be_retried_and_runs_without_a_deadline(store: Store) -> None:
    t0 = store.now()
    (job,) = enqueue(store, JobSpec("t", expires_in=10), now=t0)
    store.job_expire_many(lease_at(store, t0), now=later(t0, 11))
    retried = store.job_retry(job.id, now=later(t0, 12))
    assert retried.status == Status.PENDING and retried.expires_at is None
    assert retried.error is None and retried.finished_at is None
    session = open_session(store, expiry=600, now=t0)
    (again,) = claim(store, session, now=later(t0, 13))
    assert again.id == job.id and again.attempt == 1


def test_a_start_by_deadline_must_leave_time_to_start(store: Store) -> None:
    for bad in (0, -1, float("inf"), "10", True):
        with pytest.raises(ValueError, match="expires_in"):
            enqueue(store, JobSpec("t", expires_in=bad))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"expires_in \(5s\) must be longer than delay"):
        enqueue(store, JobSpec("t", delay=5, expires_in=5))
    assert store.job_list().jobs == ()


def test_result_of_an_expired_job_raises_job_failed(store: Store, store_url: str) -> None:
    app = plunder.App(store_url)
    task = app.task(name="t", expires_in=60)(lambda: None)
    try:
        job = task.options(expires_in=5).enqueue()
        record = job.record
        assert record.expires_at == later(record.created_at, 5)
        store.job_expire_many(lease_at(store, record.created_at), now=later(record.created_at, 6))
        with pytest.raises(errors.JobFailed, match="expired") as failed:
            job.result(timeout=5)
        assert failed.value.status == "expired"
        assert job.retry().status == Status.PENDING
    finally:
        app.close()


def test_the_policies_are_options_of_a_task_and_of_each_enqueue(store_url: str) -> None:
    app = plunder.App(store_url)
    task = app.task(name="t", retry_on_lost=False, expires_in=30)(lambda: None)
    try:
        declared = task.enqueue().record
        assert not declared.retry_on_lost
        assert declared.expires_at == later(declared.created_at, 30)
        overridden = task.options(retry_on_lost=True, expires_in=None).enqueue().record
        assert overridden.retry_on_lost and overridden.expires_at is None
        by_name = app.enqueue("t", expires_in=7).record  # the task's own options, and this one
        assert not by_name.retry_on_lost
        assert by_name.expires_at == later(by_name.created_at, 7)
    finally:
        app.close()
