"""Enqueue: batches, idempotency keys, joining the caller's transaction, bad input."""

from __future__ import annotations

import math
import sqlite3
import threading

import pytest

from plunder import errors
from plunder.model import JobSpec
from plunder.states import Status
from plunder.store import Store, open_store
from tests.store.helpers import (
    claim,
    complete,
    count_orders,
    enqueue,
    later,
    open_session,
    raw_connect,
    user_table,
)


def test_enqueue_returns_pending_jobs_in_input_order(store: Store) -> None:
    jobs = enqueue(
        store,
        JobSpec("t", [1]),
        JobSpec("t", [2], queue="other", priority=7),
        JobSpec("u", [], {"x": 1}, max_attempts=3, timeout=2.5),
    )
    assert [j.args for j in jobs] == [[1], [2], []]
    assert [j.id for j in jobs] == sorted(j.id for j in jobs)
    assert all(j.status == Status.PENDING and j.attempt == 0 for j in jobs)
    assert jobs[1].queue == "other" and jobs[1].priority == 7
    assert jobs[2].kwargs == {"x": 1} and jobs[2].max_attempts == 3 and jobs[2].timeout == 2.5
    assert store.job_get(jobs[0].id) == jobs[0]


def test_enqueued_record_is_what_is_stored_for_each_delay(store: Store) -> None:
    t0 = store.now()
    specs = [JobSpec("t", [d], delay=d) for d in (0, 0.001, 2.5, 86_400 * 365.25, 1 / 3)]
    for now in (None, t0):
        jobs = store.job_enqueue_many(specs, now=now)
        assert [store.job_get(j.id) for j in jobs] == jobs
        assert all(j.run_at >= j.created_at for j in jobs)
    ids = store.job_enqueue_ids(specs)
    assert ids == sorted(ids) and ids[0] > jobs[-1].id
    assert [store.job_get(i).args for i in ids] == [s.args for s in specs]


def test_ids_are_never_used_twice_even_after_the_newest_jobs_are_pruned(store: Store) -> None:
    t0 = store.now()
    jobs = enqueue(store, *[JobSpec("t", [i]) for i in range(3)], now=t0)
    session = open_session(store, expiry=10_000, now=t0)
    for job in claim(store, session, now=t0):
        assert complete(store, job.claim, now=t0)
    lease = store.lease_acquire("janitor", "j", 10_000, now=t0)
    assert lease is not None
    assert store.job_prune_many(lease, older_than=60, now=later(t0, 120)) == 3
    again = enqueue(store, JobSpec("t", ["again"]), JobSpec("t", ["and again"], key="k"))
    assert min(j.id for j in again) > max(j.id for j in jobs)


def test_enqueue_on_a_connection_with_no_transaction_open_commits_on_its_own(
    store: Store, store_url: str
) -> None:
    """SQLite's autocommit connection: the enqueue is one transaction of its own on it
    (PostgreSQL's driver always has one open: see the joining tests)."""
    if not store_url.startswith("sqlite"):
        pytest.skip("a psycopg connection outside autocommit always has a transaction open")
    conn = raw_connect(store_url)
    try:
        specs = [JobSpec("t", [i]) for i in range(3)] + [JobSpec("t", ["k"], key="k")] * 2
        jobs = store.job_enqueue_many(specs, conn=conn)
        assert not conn.in_transaction
        assert jobs[3] == jobs[4] and jobs[3].key == "k"
        ids = store.job_enqueue_ids([JobSpec("t", ["more"])], conn=conn)
        assert not conn.in_transaction
    finally:
        conn.close()
    assert [store.job_get(j.id) for j in jobs] == jobs
    assert store.job_get(ids[0]).args == ["more"]


def test_enqueue_on_sqlite3s_default_mode_joins_the_transaction_it_begins(
    store: Store, store_url: str
) -> None:
    """sqlite3's default (legacy) mode begins a transaction at the first write: the enqueue
    begins it, and the caller's commit or rollback decides."""
    if not store_url.startswith("sqlite"):
        pytest.skip("sqlite3's transaction modes")
    user_table(store_url)
    for commit in (False, True):
        conn = sqlite3.connect(store_url[len("sqlite:///") :])  # isolation_level=""
        try:
            (job,) = store.job_enqueue_many([JobSpec("t", [commit])], conn=conn)
            assert conn.in_transaction
            conn.execute("INSERT INTO orders (note) VALUES ('x')")
            conn.commit() if commit else conn.rollback()
        finally:
            conn.close()
        if commit:
            assert store.job_get(job.id) == job
        else:
            with pytest.raises(errors.JobNotFound):
                store.job_get(job.id)
    assert count_orders(store_url) == 1


def test_enqueue_in_a_deferred_transaction_waits_for_the_write_lock(
    store: Store, store_url: str
) -> None:
    """A caller's plain BEGIN reads nothing before the enqueue takes the write lock: a
    writer that commits meanwhile is waited for, not a reason to fail."""
    if not store_url.startswith("sqlite"):
        pytest.skip("SQLite's write lock")
    holding, release = threading.Event(), threading.Event()

    def write_meanwhile() -> None:
        other = raw_connect(store_url)
        try:
            other.execute("BEGIN IMMEDIATE")
            store.job_enqueue_many([JobSpec("t", ["other"])], conn=other)
            holding.set()
            release.wait(5)
            other.execute("COMMIT")
        finally:
            other.close()

    writer = threading.Thread(target=write_meanwhile)
    writer.start()
    conn = raw_connect(store_url)
    try:
        assert holding.wait(5)
        conn.execute("BEGIN")
        threading.Timer(0.3, release.set).start()
        jobs = store.job_enqueue_many([JobSpec("t", [i]) for i in range(3)], conn=conn)
        conn.execute("COMMIT")
    finally:
        release.set()
        writer.join()
        conn.close()
    assert [store.job_get(j.id) for j in jobs] == jobs
    assert [j.args for j in store.job_list().jobs] == [[2], [1], [0], ["other"]]


def test_enqueue_many_in_one_call(store: Store) -> None:
    jobs = store.job_enqueue_many([JobSpec("t", [i]) for i in range(2000)])
    assert [j.args[0] for j in jobs] == list(range(2000))
    assert len({j.id for j in jobs}) == 2000
    assert store.queue_stats()[0].counts["pending"] == 2000


def test_key_names_at_most_one_active_job(store: Store) -> None:
    first, same, other = enqueue(
        store,
        JobSpec("t", [1], key="order-42"),
        JobSpec("t", [2], key="order-42"),
        JobSpec("t", [3], key="b"),
    )
    assert same.id == first.id and same.args == [1]
    assert other.id != first.id
    again = enqueue(store, JobSpec("t", [9], key="order-42"))[0]
    assert again.id == first.id
    assert store.queue_stats()[0].counts["pending"] == 2


def test_keys_repeated_across_a_large_batch(store: Store) -> None:
    # SQLite inserts a batch in statements of several hundred rows: repeats within one
    # statement and across two must both name the first job with the key
    specs = [JobSpec("t", [i], key=f"k{i % 700}") for i in range(1201)]
    jobs = store.job_enqueue_many(specs)
    assert [j.args for j in jobs[:700]] == [[i] for i in range(700)]
    assert [j.id for j in jobs[700:]] == [j.id for j in jobs[:501]]
    assert all(j.key == f"k{i % 700}" for i, j in enumerate(jobs))
    assert len({j.id for j in jobs}) == 700
    assert store.queue_stats()[0].counts["pending"] == 700
    assert all(store.job_get(j.id) == j for j in jobs[:3] + jobs[-3:])


@pytest.mark.parametrize("runs", [2, 10], ids=["few-runs", "mixed"])
def test_batches_mixing_options_keep_input_order(store: Store, runs: int) -> None:
    # a batch inserts a run of jobs with the same options in one statement, and a batch
    # with more runs than the store allows (SQLite four, PostgreSQL one) in one statement
    # with each row's own options: ids follow the input order either way, each job keeps
    # its own options, and a key repeated in a later run names the first job
    options = [
        {"queue": "a"},
        {"queue": "b", "priority": 3},
        {"queue": "a", "timeout": 1.5, "max_attempts": 2},
    ]
    specs = [JobSpec("t", [i], **options[(i // (30 // runs)) % 3]) for i in range(30)] + [
        JobSpec("t", ["k1"], key="k"),
        JobSpec("u", ["k2"], queue="b", key="k"),
    ]
    jobs = store.job_enqueue_many(specs)
    assert [j.args for j in jobs[:-1]] == [[i] for i in range(30)] + [["k1"]]
    assert [j.id for j in jobs[:-1]] == sorted(j.id for j in jobs[:-1])
    assert jobs[-1].id == jobs[-2].id and jobs[-1].task == "t"
    for spec, job in zip(specs[:-1], jobs[:-1], strict=True):
        stored = store.job_get(job.id)
        assert stored == job
        assert (job.queue, job.priority, job.timeout, job.max_attempts) == (
            spec.queue,
            spec.priority,
            spec.timeout,
            spec.max_attempts,
        )
    ids = store.job_enqueue_ids(specs)
    assert len(set(ids)) == 31 and ids[-1] == ids[-2] == jobs[-1].id  # the key is taken


def test_enqueue_ids_answers_what_enqueue_many_would(store: Store) -> None:
    """Ids only, in input order: a new job's own id, and for a key that names an active
    job (earlier in the store or earlier in the batch) that job's id."""
    (earlier,) = enqueue(store, JobSpec("t", ["earlier"], key="taken"))
    specs = [JobSpec("t", [i], key=f"k{i % 3}" if i % 2 else None) for i in range(1200)]
    specs[5:5] = [JobSpec("t", ["again"], key="taken")]
    ids = store.job_enqueue_ids(specs)
    assert len(ids) == len(specs) and all(type(i) is int for i in ids)
    assert ids[5] == earlier.id
    records = {}
    after = None
    while True:
        page = store.job_list(after=after, limit=1000)
        records.update((r.id, r) for r in page.jobs)
        if page.next_after is None:
            break
        after = page.next_after
    for spec, job_id in zip(specs, ids, strict=True):
        if spec.key is None:
            assert records[job_id].args == spec.args
        else:  # the first spec with the key, or the job already holding it
            first = next(
                s for s in [JobSpec("t", ["earlier"], key="taken"), *specs] if s.key == spec.key
            )
            assert records[job_id].args == first.args and records[job_id].key == spec.key
    fresh = [i for spec, i in zip(specs, ids, strict=True) if spec.key is None]
    assert fresh == sorted(fresh) and len(set(fresh)) == len(fresh)
    assert store.queue_stats()[0].counts["pending"] == len(fresh) + 4  # keys k0 k1 k2 taken


def test_enqueue_ids_joins_the_callers_transaction(store: Store, store_url: str) -> None:
    sqlite = store_url.startswith("sqlite")
    conn = raw_connect(store_url)
    try:
        if sqlite:
            conn.execute("BEGIN IMMEDIATE")
        (job_id,) = store.job_enqueue_ids([JobSpec("t", ["rolled back"])], conn=conn)
        conn.execute("ROLLBACK") if sqlite else conn.rollback()
    finally:
        conn.close()
    with pytest.raises(errors.JobNotFound):
        store.job_get(job_id)
    assert store.job_list().jobs == ()


def test_enqueue_ids_refuses_bad_input_and_stores_nothing(store: Store) -> None:
    with pytest.raises(errors.PayloadError):
        store.job_enqueue_ids([JobSpec("t", ["good"]), JobSpec("t", [math.nan])])
    assert store.job_list().jobs == ()
    assert store.job_enqueue_ids([]) == []


def test_key_is_free_again_once_the_job_finished(store: Store) -> None:
    from tests.store.helpers import claim, complete, open_session

    first = enqueue(store, JobSpec("t", [1], key="k"))[0]
    session = open_session(store)
    (job,) = claim(store, session)
    assert complete(store, job.claim, "done")
    second = enqueue(store, JobSpec("t", [2], key="k"))[0]
    assert second.id != first.id and second.status == Status.PENDING


def test_enqueue_joins_the_callers_transaction(store: Store, store_url: str) -> None:
    user_table(store_url)
    sqlite = store_url.startswith("sqlite")
    for commit in (False, True):
        conn = raw_connect(store_url)
        try:
            if sqlite:
                conn.execute("BEGIN IMMEDIATE")
            conn.execute("INSERT INTO orders (note) VALUES ('x')")
            store.job_enqueue_many([JobSpec("t", [commit])], conn=conn)
            conn.execute("COMMIT" if commit else "ROLLBACK") if sqlite else (
                conn.commit() if commit else conn.rollback()
            )
        finally:
            conn.close()
    page = store.job_list()
    assert [j.args for j in page.jobs] == [[True]]
    assert count_orders(store_url) == 1


BAD_SPECS = [
    (JobSpec("t", [object()]), errors.PayloadError),
    (JobSpec("t", [math.nan]), errors.PayloadError),
    (JobSpec("t", [math.inf]), errors.PayloadError),
    (JobSpec("t", ["\ud800"]), errors.PayloadError),
    (JobSpec("t", ["x" * (1024 * 1024 + 1)]), errors.PayloadError),
    (JobSpec("t", [10**5000]), errors.PayloadError),
    (JobSpec("t", {"a": 1}), errors.PayloadError),  # type: ignore[arg-type]
    (JobSpec("t", [], {1: 2}), errors.PayloadError),  # type: ignore[dict-item]
    (JobSpec("t", queue=""), errors.InvalidName),
    (JobSpec("t", queue="a b"), errors.InvalidName),
    (JobSpec("t", queue="alpha/../beta"), errors.InvalidName),
    (JobSpec("t", queue="alpha%"), errors.InvalidName),
    (JobSpec("t", queue="alpha\x00beta"), errors.InvalidName),
    (JobSpec("t", queue="\u0430lpha"), errors.InvalidName),  # Cyrillic a
    (JobSpec("t", queue="x" * 129), errors.InvalidName),
    (JobSpec("t; DROP TABLE plunder_jobs"), errors.InvalidName),
    (JobSpec("t", key="k\x00"), errors.InvalidName),
    (JobSpec("t", key=""), errors.InvalidName),
    (JobSpec("t", priority=True), ValueError),
    (JobSpec("t", priority=2**40), ValueError),
    (JobSpec("t", max_attempts=0), ValueError),
    (JobSpec("t", timeout=-1), ValueError),
    (JobSpec("t", timeout=math.nan), ValueError),
    (JobSpec("t", delay=-5), ValueError),
    (JobSpec("t", timeout=1e13), ValueError),  # would overflow PostgreSQL's timestamps
    (JobSpec("t", delay=1e12), ValueError),
    (JobSpec("t", backoff_cap=1e15), ValueError),
]


@pytest.mark.parametrize(("spec", "error"), BAD_SPECS, ids=[str(i) for i in range(len(BAD_SPECS))])
def test_bad_input_is_refused_and_nothing_is_half_stored(
    store: Store, spec: JobSpec, error: type[Exception]
) -> None:
    enqueue(store, JobSpec("t", ["kept"]))
    with pytest.raises(error) as caught:
        store.job_enqueue_many([JobSpec("t", ["good"]), spec])
    assert str(caught.value)
    page = store.job_list()
    assert [j.args for j in page.jobs] == [["kept"]]


def test_payloads_round_trip_exactly(store: Store) -> None:
    args = [
        "nul\x00inside",
        "snow \u2603 and \U0001f600",
        "back\\u0000slash",
        2**62,
        -0.5,
        None,
        True,
        {"z": 1, "a": [1, {"b": None}]},
    ]
    kwargs = {"zeta": 1, "alpha": 2, "mid": "x"}
    job = enqueue(store, JobSpec("t", args, kwargs))[0]
    again = store.job_get(job.id)
    assert again.args == args
    assert list(again.kwargs) == ["zeta", "alpha", "mid"]  # key order kept


def test_unknown_job_is_a_clear_error(store: Store) -> None:
    with pytest.raises(errors.JobNotFound, match="no job 999"):
        store.job_get(999)


def test_enqueue_in_the_callers_transaction_with_the_partitions_not_read_yet(
    store: Store, store_url: str
) -> None:
    """A store's first enqueue inside the caller's transaction reads the partitioned queues
    in that transaction (SQLite cannot begin a second on the same connection)."""
    store.partition_declare("q", 4)
    fresh = open_store(store_url)
    try:
        with fresh.transaction() as conn:
            (first,) = fresh.job_enqueue_ids([JobSpec("t", [1])], conn=conn)
            (routed,) = fresh.job_enqueue_many(
                [JobSpec("t", [2], queue="q", partition_key="a")], conn=conn
            )
        assert fresh.job_get(first).status is Status.PENDING
        assert routed.queue.startswith("q~")
        assert fresh.job_get(routed.id).queue == routed.queue
    finally:
        fresh.close()
