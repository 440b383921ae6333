"""Reads for people: listings with keyset pagination, queue stats, live sessions, pruning."""

from __future__ import annotations

import time

import pytest

from plunder import errors
from plunder.janitor import Pruner
from plunder.model import JobSpec
from plunder.states import Status
from plunder.store import Store
from tests.store.helpers import claim, complete, enqueue, later, open_session


def test_listing_filters_and_pages_through_everything_once(store: Store) -> None:
    specs = [JobSpec("t" if i % 2 else "u", [i], queue="a" if i % 3 else "b") for i in range(45)]
    store.job_enqueue_many(specs)
    seen: list[int] = []
    after = None
    while True:
        page = store.job_list(limit=10, after=after)
        seen += [j.id for j in page.jobs]
        if page.next_after is None:
            break
        after = page.next_after
    assert len(seen) == 45 and seen == sorted(seen, reverse=True)
    only = store.job_list(queue="b", task="u", limit=1000).jobs
    assert {(j.queue, j.task) for j in only} == {("b", "u")}
    assert len(only) == len([s for s in specs if s.queue == "b" and s.task == "u"])
    assert store.job_list(status="running").jobs == ()
    with pytest.raises(errors.InvalidName, match="unknown job status"):
        store.job_list(status="bogus")
    assert store.job_list(queue="' OR '1'='1").jobs == ()  # a literal, never SQL


def test_queue_stats_count_by_status_and_age_the_oldest_pending(store: Store) -> None:
    t0 = store.now()
    enqueue(store, JobSpec("t", [1]), JobSpec("t", [2]), JobSpec("t", [3], queue="q2"), now=t0)
    session = open_session(store, expiry=300, now=t0)
    (job,) = claim(store, session, limit=1, now=later(t0, 1))
    assert complete(store, job.claim, now=later(t0, 1))
    stats = {s.queue: s for s in store.queue_stats(now=later(t0, 10))}
    assert stats["default"].counts[Status.PENDING] == 1
    assert stats["default"].counts[Status.SUCCEEDED] == 1
    assert stats["default"].total == 2
    assert stats["q2"].oldest_pending_age == pytest.approx(10, abs=0.01)


def test_queue_active_counts_pending_and_running_as_queue_stats_does(store: Store) -> None:
    t0 = store.now()
    specs = [JobSpec("t", [i]) for i in range(4)] + [JobSpec("t", [9], queue="q2")]
    enqueue(store, *specs, JobSpec("t", [5], delay=3600), now=t0)  # pending, due later
    session = open_session(store, expiry=300, now=t0)
    running, done = claim(store, session, limit=2, now=later(t0, 1))
    assert complete(store, done.claim, now=later(t0, 1))
    store.partition_declare("parted", 2)
    enqueue(store, JobSpec("t", [7], queue="parted", partition_key="k"), now=later(t0, 5))
    at = later(t0, 10)
    active = {s.queue: s for s in store.queue_active(now=at)}
    full = {s.queue: s for s in store.queue_stats(now=at)}
    assert set(active) == {"default", "q2", "parted"}
    for queue, stats in active.items():
        assert stats.counts == {
            "pending": full[queue].counts[Status.PENDING],
            "running": full[queue].counts[Status.RUNNING],
        }
        assert stats.oldest_pending_age == pytest.approx(full[queue].oldest_pending_age, abs=0.01)
    assert active["default"].counts == {"pending": 3, "running": 1}
    assert active["q2"].oldest_pending_age == pytest.approx(10, abs=0.01)
    assert active["parted"].oldest_pending_age == pytest.approx(5, abs=0.01)
    assert running.status is Status.RUNNING


def test_session_list_shows_only_live_sessions(store: Store) -> None:
    t0 = store.now()
    short = open_session(store, expiry=1, now=t0)
    long = open_session(store, expiry=60, now=t0)
    assert {s.id for s in store.session_list(now=t0)} == {short.id, long.id}
    assert {s.id for s in store.session_list(now=later(t0, 2))} == {long.id}


def test_prune_deletes_finished_jobs_past_retention_with_their_history(store: Store) -> None:
    t0 = store.now()
    old, fresh, pending = enqueue(store, JobSpec("t", [1]), JobSpec("t", [2]), JobSpec("u"), now=t0)
    session = open_session(store, expiry=10_000, now=t0)
    first, second = claim(store, session, now=t0)
    assert complete(store, first.claim, now=t0)
    assert complete(store, second.claim, now=later(t0, 3000))
    lease = store.lease_acquire("janitor", "j", 10_000, now=t0)
    assert lease is not None
    assert store.job_prune_many(lease, older_than=3600, now=later(t0, 3700)) == 1
    with pytest.raises(errors.JobNotFound):
        store.job_get(old.id)
    assert store.job_runs(old.id) == []
    assert store.job_get(fresh.id).status == Status.SUCCEEDED
    assert store.job_get(pending.id).status == Status.PENDING


def test_sqlite_prune_reads_the_table_outside_the_write_lock(store: Store, backend: str) -> None:
    """Finding what to prune reads the whole table when there is nothing to prune; on SQLite
    no other process could write meanwhile if it held the write lock. Only the delete of what
    it found, under the fence, takes the lock."""
    if backend != "sqlite":
        pytest.skip("SQLite's write lock")
    (job,) = enqueue(store, JobSpec("t", [1]))
    session = open_session(store, expiry=10_000)
    (claimed,) = claim(store, session, limit=1)
    assert complete(store, claimed.claim)
    lease = store.lease_acquire("janitor", "j", 10_000)
    assert lease is not None
    time.sleep(0.01)  # past the database clock's resolution (SQLite's: a millisecond)
    conn = store.driver.connection()  # type: ignore[attr-defined]
    statements: list[str] = []
    conn.set_trace_callback(statements.append)
    try:
        assert store.job_prune_many(lease, older_than=0.0) == 1
    finally:
        conn.set_trace_callback(None)
    scan = [n for n, sql in enumerate(statements) if "ORDER BY id" in sql]
    write = [n for n, sql in enumerate(statements) if sql.startswith("BEGIN IMMEDIATE")]
    deleted = [n for n, sql in enumerate(statements) if "DELETE FROM plunder_jobs" in sql]
    assert len(scan) == len(write) == 1 and deleted, statements
    assert scan[0] < write[0] < deleted[0]
    with pytest.raises(errors.JobNotFound):
        store.job_get(job.id)


def test_the_janitor_prunes_a_backlog_a_batch_a_pass_then_hourly(store: Store) -> None:
    """A backlog of finished jobs larger than one batch is pruned at every pass, a batch at a
    time, until a batch comes back short; then the pruner waits its hour again."""
    enqueue(store, *[JobSpec("t", [i]) for i in range(12)])
    session = open_session(store, expiry=10_000)
    jobs = claim(store, session, limit=12)
    assert all(complete(store, job.claim) for job in jobs)
    lease = store.lease_acquire("janitor", "j", 10_000)
    assert lease is not None
    time.sleep(0.01)  # past the database clock's resolution (SQLite's: a millisecond)
    pruner = Pruner(retention=0.0, limit=5)
    assert [pruner.run_once(store, lease) for _ in range(4)] == [5, 5, 2, 0]
    enqueue(store, JobSpec("t", ["later"]))
    (job,) = claim(store, session, limit=1)
    assert complete(store, job.claim)
    assert pruner.run_once(store, lease) == 0  # within the hour of a short batch
    pruner.every = 0.0
    time.sleep(0.01)  # past the database clock's resolution (SQLite's: a millisecond)
    assert pruner.run_once(store, lease) == 1
