"""A worker's turn, ``job_exchange_many``: acknowledge what finished and claim what is next,
fenced like each of the two on its own (on PostgreSQL a turn of completions and a claim is
one statement; with failures it is a transaction of several)."""

from __future__ import annotations

from datetime import datetime

import pytest

from plunder import errors
from plunder.model import Claim, Completion, ErrorInfo, Exchange, Failure, JobSpec, Session
from plunder.states import Outcome, Status
from plunder.store import Store
from tests.store.helpers import claim, enqueue, later, open_session


def turn(
    store: Store,
    session: Session,
    done: list[Claim],
    failed: tuple[Failure, ...] = (),
    *,
    limit: int = 10,
    now: datetime | None = None,
) -> Exchange:
    return store.job_exchange_many(
        [Completion(c, {"job": c.job_id}) for c in done],
        list(failed),
        session_id=session.id,
        queues=["default"],
        tasks=["t"],
        limit=limit,
        now=now,
    )


def test_a_turn_completes_the_finished_and_claims_the_next(store: Store) -> None:
    store.job_enqueue_many([JobSpec("t", [i]) for i in range(5)])
    session = open_session(store)
    first = claim(store, session, limit=2)
    got = turn(store, session, [j.claim for j in first], limit=2)
    assert got.completed.accepted == tuple(j.claim for j in first)
    assert got.completed.stale == () and got.failed.accepted == ()
    assert [j.args for j in got.claimed] == [[2], [3]]  # claim order: by id at one level
    for job in got.claimed:
        assert job.status == Status.RUNNING and job.attempt == 1
        assert job.session_id == session.id and job.claim.session_id == session.id
        assert job.started_at is not None and job.finished_at is None
    for job in first:
        done = store.job_get(job.id)
        assert done.status == Status.SUCCEEDED and done.result == {"job": job.id}
        (run,) = store.job_runs(job.id)
        assert run.outcome == Outcome.SUCCEEDED
    rest = turn(store, session, [j.claim for j in got.claimed], limit=10)
    assert [j.args for j in rest.claimed] == [[4]]
    last = turn(store, session, [j.claim for j in rest.claimed], limit=10)
    assert last.claimed == () and len(last.completed.accepted) == 1  # nothing left: no error
    assert {j.status for j in store.job_list().jobs} == {Status.SUCCEEDED}


def test_a_turn_refuses_stale_completions_and_still_claims(store: Store) -> None:
    store.job_enqueue_many([JobSpec("t", [i]) for i in range(4)])
    session = open_session(store)
    jobs = claim(store, session, limit=2)
    store.job_cancel(jobs[1].id)
    forged = Claim(jobs[0].id, jobs[0].attempt + 1, session.id)
    got = turn(store, session, [jobs[0].claim, jobs[1].claim, forged], limit=2)
    assert got.completed.accepted == (jobs[0].claim,)
    assert set(got.completed.stale) == {jobs[1].claim, forged}
    assert [j.args for j in got.claimed] == [[2], [3]]
    assert store.job_get(jobs[1].id).status == Status.CANCELLED
    assert store.job_get(jobs[0].id).result == {"job": jobs[0].id}


def test_a_repeated_turn_accepts_what_its_first_run_completed(store: Store) -> None:
    """A turn whose commit went unanswered (the connection lost) is run again: what it
    completed then is accepted again, not reported stale, and its result is kept."""
    store.job_enqueue_many([JobSpec("t", [i]) for i in range(3)])
    session = open_session(store)
    (job,) = claim(store, session, limit=1)
    turn(store, session, [job.claim], limit=1)
    again = store.job_exchange_many(
        [Completion(job.claim, "second")],
        [],
        session_id=session.id,
        queues=["default"],
        tasks=["t"],
        limit=1,
    )
    assert again.completed.accepted == (job.claim,) and again.completed.stale == ()
    assert len(again.claimed) == 1
    assert store.job_get(job.id).result == {"job": job.id}
    assert [r.outcome for r in store.job_runs(job.id)] == [Outcome.SUCCEEDED]


def test_a_turn_of_an_expired_session_completes_nothing_and_says_so(store: Store) -> None:
    t0 = store.now()
    enqueue(store, JobSpec("t"), JobSpec("t"), now=t0)
    session = open_session(store, expiry=5, now=t0)
    (job,) = claim(store, session, limit=1, now=t0)
    with pytest.raises(errors.SessionGone):
        turn(store, session, [job.claim], now=later(t0, 6))
    assert store.job_get(job.id).status == Status.RUNNING
    assert [j.status for j in store.job_list().jobs].count(Status.PENDING) == 1


def test_a_turn_with_failures_fails_them_with_the_rest(store: Store) -> None:
    store.job_enqueue_many([JobSpec("t", [i], max_attempts=1) for i in range(4)])
    session = open_session(store)
    jobs = claim(store, session, limit=2)
    failure = Failure(jobs[1].claim, ErrorInfo("ValueError", "bad", "Traceback ..."), None)
    got = turn(store, session, [jobs[0].claim], (failure,), limit=2)
    assert got.completed.accepted == (jobs[0].claim,)
    assert got.failed.accepted == (jobs[1].claim,)
    assert [j.args for j in got.claimed] == [[2], [3]]
    broken = store.job_get(jobs[1].id)
    assert broken.status == Status.FAILED and broken.error is not None
    assert store.job_runs(jobs[1].id)[0].outcome == Outcome.FAILED


def test_a_turn_that_only_acknowledges_claims_nothing(store: Store) -> None:
    store.job_enqueue_many([JobSpec("t", [i]) for i in range(3)])
    session = open_session(store)
    jobs = claim(store, session, limit=2)
    got = turn(store, session, [j.claim for j in jobs], limit=0)
    assert got.claimed == () and len(got.completed.accepted) == 2
    assert [j.status for j in store.job_list().jobs].count(Status.PENDING) == 1
