"""Sessions, heartbeats, reaping dead workers, job timeouts and leases."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest

from plunder import errors
from plunder.model import JobSpec
from plunder.states import Outcome, Status
from plunder.store import Store, open_store
from tests.store.helpers import claim, complete, enqueue, later, open_session, raw_connect


def test_session_ids_are_unguessable_and_unique(store: Store) -> None:
    ids = {open_session(store).id for _ in range(50)}
    assert len(ids) == 50
    assert all(len(i) >= 22 for i in ids)  # >= 128 random bits in url-safe base64


def test_heartbeat_extends_expiry_by_the_database_clock(store: Store) -> None:
    t0 = store.now()
    session = open_session(store, expiry=5, now=t0)
    assert session.expires_at == later(t0, 5)
    beat = store.session_heartbeat(session.id, now=later(t0, 4))
    assert beat.alive and beat.expires_at == later(t0, 9)
    assert not store.session_heartbeat(session.id, now=later(t0, 9.5)).alive  # too late
    assert not store.session_heartbeat("no-such-session").alive


def test_heartbeat_names_claims_that_are_no_longer_current(store: Store) -> None:
    enqueue(store, JobSpec("t", [1]), JobSpec("t", [2]))
    session = open_session(store)
    keep, cancel = claim(store, session)
    store.job_cancel(cancel.id)
    beat = store.session_heartbeat(session.id, [keep.claim, cancel.claim])
    assert beat.stop == (cancel.claim,)


def test_heartbeat_names_running_jobs_the_worker_did_not_report(store: Store) -> None:
    enqueue(store, *(JobSpec("t", [i]) for i in range(4)))
    session = open_session(store)
    other = open_session(store, name="other")
    reported, *lost = claim(store, session, limit=3)
    (elsewhere,) = claim(store, other)
    beat = store.session_heartbeat(session.id, [reported.claim])
    # not the other session's job, nor a reported one
    assert beat.unknown == tuple(j.claim for j in sorted(lost, key=lambda j: j.id))
    everything = [reported.claim, *(j.claim for j in lost)]
    assert store.session_heartbeat(session.id, everything).unknown == ()
    assert store.session_heartbeat(other.id, [elsewhere.claim]).unknown == ()


def test_close_releases_running_jobs_at_once(store: Store) -> None:
    enqueue(store, JobSpec("t", [1]), JobSpec("t", [2]))
    leaving = open_session(store)
    staying = open_session(store, name="staying")
    jobs = claim(store, leaving)
    assert sorted(store.session_close(leaving.id)) == sorted(j.id for j in jobs)
    assert {s.id for s in store.session_list()} == {staying.id}
    again = claim(store, staying)
    assert sorted(j.id for j in again) == sorted(j.id for j in jobs)
    assert all(j.attempt == 2 for j in again)


def test_reaping_straddles_the_expiry_boundary(store: Store) -> None:
    t0 = store.now()
    enqueue(
        store,
        JobSpec("t", [1], max_attempts=2),
        JobSpec("t", [2], max_attempts=1),
        JobSpec("t", [3], max_attempts=2),
        now=t0,
    )
    dying = open_session(store, expiry=5, now=t0)
    retry, last = claim(store, dying, limit=2, now=t0)
    alive = open_session(store, expiry=10, now=t0)
    (safe,) = claim(store, alive, now=t0)
    lease = store.lease_acquire("janitor", "j", 60, now=t0)
    assert lease is not None
    assert store.session_reap_many(lease, now=later(t0, 4.9)).count == 0
    swept = store.session_reap_many(lease, now=later(t0, 5.1))
    assert swept.sessions == (dying.id,)
    assert swept.retried == (retry.id,) and swept.finished == (last.id,)
    assert store.job_get(retry.id).status == Status.PENDING
    assert store.job_get(last.id).status == Status.TIMED_OUT
    assert store.job_get(safe.id).status == Status.RUNNING
    (run,) = store.job_runs(retry.id)
    assert run.outcome == Outcome.LOST and run.error is not None
    assert run.error["type"] == "plunder.SessionLost"
    assert store.session_reap_many(lease, now=later(t0, 5.2)).count == 0  # idempotent
    (again,) = claim(store, alive, now=later(t0, 5.3))  # claimable at once
    assert again.id == retry.id and again.attempt == 2


def test_job_timeouts_straddle_the_deadline(store: Store) -> None:
    t0 = store.now()
    enqueue(
        store,
        JobSpec("t", [1], timeout=10, max_attempts=2),
        JobSpec("t", [2], timeout=10, max_attempts=2, retry_on_timeout=False),
        JobSpec("t", [3], timeout=30),
        JobSpec("t", [4]),
        now=t0,
    )
    session = open_session(store, expiry=300, now=t0)
    retried, final, slow, forever = claim(store, session, now=t0)
    lease = store.lease_acquire("janitor", "j", 600, now=t0)
    assert lease is not None
    assert store.job_timeout_many(lease, now=later(t0, 9.9)).count == 0
    swept = store.job_timeout_many(lease, now=later(t0, 10.1))
    assert swept.retried == (retried.id,) and swept.finished == (final.id,)
    assert store.job_get(final.id).status == Status.TIMED_OUT
    assert store.job_get(slow.id).status == Status.RUNNING
    assert store.job_get(forever.id).status == Status.RUNNING
    assert store.job_runs(retried.id)[0].outcome == Outcome.TIMED_OUT
    beat = store.session_heartbeat(
        session.id, [j.claim for j in (retried, final, slow)], now=later(t0, 11)
    )
    assert set(beat.stop) == {retried.claim, final.claim}  # the worker is told to stop them
    assert not complete(store, retried.claim, "late", now=later(t0, 11))


def test_lease_terms_grow_with_every_change_of_holder(store: Store) -> None:
    t0 = store.now()
    first = store.lease_acquire("janitor", "a", 5, now=t0)
    assert first is not None and first.term == 1
    assert store.lease_acquire("janitor", "b", 5, now=later(t0, 1)) is None
    renewed = store.lease_acquire("janitor", "a", 5, now=later(t0, 2))
    assert renewed is not None and renewed.term == 1 and renewed.expires_at == later(t0, 7)
    taken = store.lease_acquire("janitor", "b", 5, now=later(t0, 7.5))
    assert taken is not None and taken.term == 2 and taken.holder == "b"
    with pytest.raises(errors.StaleLease):
        store.lease_renew(first, 5, now=later(t0, 8))
    assert store.lease_renew(taken, 5, now=later(t0, 8)).expires_at == later(t0, 13)
    assert store.lease_release(taken, now=later(t0, 9))
    third = store.lease_acquire("janitor", "a", 5, now=later(t0, 9.5))
    assert third is not None and third.term == 3
    assert store.lease_get("janitor") == third


def test_a_lease_locked_by_a_pass_in_progress_is_not_waited_for(
    store: Store, store_url: str, backend: str
) -> None:
    """A holder stopped in the middle of a pass keeps the lease row locked (lease_check's
    FOR SHARE) until the server ends its transaction. Trying for the lease meanwhile takes
    none at once, expired or not (a worker would wait with a pooled connection its claims
    need), and takes it once that transaction has ended."""
    if backend == "sqlite":
        pytest.skip("SQLite: a pass in progress holds the database's one write lock")
    t0 = store.now()
    first = store.lease_acquire("janitor", "a", 5, now=t0)
    assert first is not None
    conn = raw_connect(store_url)  # the pass, as lease_check leaves it
    conn.execute("SELECT term FROM plunder_leases WHERE name = 'janitor' FOR SHARE")
    try:
        with ThreadPoolExecutor(1) as pool:
            for at in (1, 6):  # live, then expired
                trying = pool.submit(store.lease_acquire, "janitor", "b", 5, now=later(t0, at))
                try:
                    assert trying.result(timeout=5) is None
                finally:
                    if not trying.done():  # waiting on the lock: end the pass to free it
                        conn.rollback()
    finally:
        conn.rollback()
        conn.close()
    taken = store.lease_acquire("janitor", "b", 5, now=later(t0, 6))
    assert taken is not None and taken.term == 2 and taken.holder == "b"


def test_the_reaper_passes_by_a_session_row_held_by_a_heartbeat_in_progress(
    store: Store, store_url: str, backend: str
) -> None:
    """A worker stopped in the middle of a heartbeat holds its session row until the
    server ends its transaction: the reaper passes it by at once (waiting, it would hold a
    pooled connection its own worker's claims need) and reaps it once that has ended."""
    if backend == "sqlite":
        pytest.skip("SQLite: a heartbeat in progress holds the database's one write lock")
    t0 = store.now()
    stopped = open_session(store, expiry=2, name="stopped", now=t0)
    dead = open_session(store, expiry=2, name="dead", now=t0)
    lease = store.lease_acquire("janitor", "a", 30, now=t0)
    assert lease is not None
    conn = raw_connect(store_url)  # the heartbeat, as its first statement leaves it
    conn.execute("UPDATE plunder_sessions SET name = name WHERE id = %s", (stopped.id,))
    try:
        with ThreadPoolExecutor(1) as pool:
            reaping = pool.submit(store.session_reap_many, lease, now=later(t0, 3))
            try:
                assert reaping.result(timeout=5).sessions == (dead.id,)
            finally:
                if not reaping.done():  # waiting on the lock: end the heartbeat to free it
                    conn.rollback()
    finally:
        conn.rollback()
        conn.close()
    assert store.session_reap_many(lease, now=later(t0, 3)).sessions == (stopped.id,)


def test_janitor_writes_under_a_stale_term_are_refused(store: Store) -> None:
    t0 = store.now()
    enqueue(store, JobSpec("t", timeout=1), now=t0)
    session = open_session(store, expiry=2, now=t0)
    (job,) = claim(store, session, now=t0)
    old = store.lease_acquire("janitor", "a", 5, now=t0)
    assert old is not None
    new = store.lease_acquire("janitor", "b", 5, now=later(t0, 6))
    assert new is not None
    for sweep in (store.session_reap_many, store.job_timeout_many):
        with pytest.raises(errors.StaleLease):
            sweep(old, now=later(t0, 6))
    with pytest.raises(errors.StaleLease):
        store.job_prune_many(old, older_than=0, now=later(t0, 6))
    assert store.job_get(job.id).status == Status.RUNNING  # nothing changed
    assert store.session_reap_many(new, now=later(t0, 6)).count == 2


def test_a_session_lost_by_its_worker_counts_the_attempts(store: Store) -> None:
    (job,) = enqueue(store, JobSpec("t", max_attempts=2))
    first = open_session(store)
    (got,) = claim(store, first)
    assert store.session_close(first.id, lost=True) == [got.id]
    assert store.job_get(job.id).status == Status.PENDING
    assert store.job_runs(job.id)[0].outcome == Outcome.LOST
    second = open_session(store)
    (again,) = claim(store, second)
    assert store.session_close(second.id, lost=True) == [again.id]
    assert store.job_get(job.id).status == Status.TIMED_OUT  # attempts spent: it ends


def test_the_reaper_ends_running_jobs_whose_session_no_longer_exists(
    store: Store, store_url: str
) -> None:
    from tests.store.helpers import raw_connect

    (job,) = enqueue(store, JobSpec("t", max_attempts=2))
    session = open_session(store)
    claim(store, session)
    conn = raw_connect(store_url)  # a claim that committed after its session was reaped
    try:
        conn.execute("DELETE FROM plunder_sessions")
        conn.commit()
    finally:
        conn.close()
    lease = store.lease_acquire("janitor", "j", 60)
    assert lease is not None
    swept = store.session_reap_many(lease)
    assert swept.retried == (job.id,)
    assert store.job_runs(job.id)[0].outcome == Outcome.LOST


def test_a_closed_store_reconnects_but_a_retired_one_refuses(store_url: str) -> None:
    """``close()`` lets the next call open connections again; ``retire()`` is for good,
    and costs nothing stored."""
    mine = open_store(store_url)
    try:
        (job,) = enqueue(mine, JobSpec("t"))
        mine.close()
        assert mine.job_get(job.id).status == Status.PENDING  # reopened
        mine.retire()
        with pytest.raises(errors.StoreUnavailable, match="closed for good"):
            mine.job_get(job.id)
        with pytest.raises(errors.StoreUnavailable, match="closed for good"):
            enqueue(mine, JobSpec("t"))
    finally:
        mine.close()
    other = open_store(store_url)
    try:
        assert other.job_get(job.id).status == Status.PENDING
        assert [j.id for j in other.job_list().jobs] == [job.id]
    finally:
        other.close()
