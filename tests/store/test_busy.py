"""A busy database is waited out with the fixed busy backoff, up to a bounded total: a held
SQLite write lock, lost PostgreSQL connections, serialization failures at COMMIT. A failed
COMMIT never leaves a transaction (or SQLite's write lock) behind."""

from __future__ import annotations

import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

import psycopg
import pytest

import plunder
from plunder import errors
from plunder.model import Completion, JobSpec
from plunder.states import Status
from plunder.store import Store
from tests.store.helpers import claim, enqueue, open_session, raw_connect

T = TypeVar("T")
HOLD = 0.5  # how long the other connection keeps the lock, well past busy_timeout


@pytest.fixture
def pool() -> Iterator[ThreadPoolExecutor]:
    with ThreadPoolExecutor(max_workers=1) as executor:
        yield executor


def started(pool: ThreadPoolExecutor, fn: Callable[[], T]) -> Future[T]:
    """Run ``fn`` in the pool; return once it is about to start."""
    begun = threading.Event()

    def run() -> T:
        begun.set()
        return fn()

    future = pool.submit(run)
    assert begun.wait(10)
    return future


def sqlite_path(url: str) -> str:
    return url[len("sqlite:///") :]


def count_jobs(url: str) -> int:
    conn = raw_connect(url)
    try:
        return int(conn.execute("SELECT count(*) FROM plunder_jobs").fetchone()[0])
    finally:
        conn.close()


# -- SQLite: another connection holds the write lock ---------------------------------------
@pytest.mark.parametrize("backend", ["sqlite"])
def test_sqlite_waits_out_a_held_write_lock(store_url: str, pool: ThreadPoolExecutor) -> None:
    store = plunder.open_store(store_url, busy_timeout=0.05)
    locker = sqlite3.connect(sqlite_path(store_url), isolation_level=None)
    try:
        locker.execute("BEGIN IMMEDIATE")
        t0 = time.monotonic()
        future = started(pool, lambda: store.job_enqueue_many([JobSpec("t", ["waited"])]))
        time.sleep(HOLD)  # the lock is held this long on purpose; nothing is waited for here
        assert not future.done(), "the enqueue did not wait for the write lock"
        locker.execute("ROLLBACK")
        (job,) = future.result(timeout=10)
        assert time.monotonic() - t0 >= HOLD
        assert store.job_get(job.id).args == ["waited"]
        assert count_jobs(store_url) == 1
    finally:
        locker.close()
        store.close()


@pytest.mark.parametrize("backend", ["sqlite"])
def test_sqlite_gives_up_with_store_busy_after_busy_total(
    store_url: str, pool: ThreadPoolExecutor
) -> None:
    store = plunder.open_store(store_url, busy_timeout=0.05, busy_total=0.5)
    locker = sqlite3.connect(sqlite_path(store_url), isolation_level=None)
    try:
        locker.execute("BEGIN IMMEDIATE")
        t0 = time.monotonic()
        future = started(pool, lambda: store.job_enqueue_many([JobSpec("t")]))
        with pytest.raises(errors.StoreBusy) as caught:
            future.result(timeout=10)  # the lock is still held: the store must give up
        elapsed = time.monotonic() - t0
        locker.execute("ROLLBACK")
    finally:
        locker.close()
    try:
        assert 0.5 <= elapsed < 5
        assert type(caught.value) is errors.StoreBusy  # not sqlite3's "database is locked"
        assert not isinstance(caught.value, sqlite3.Error)
        assert isinstance(caught.value.__cause__, sqlite3.OperationalError)
        assert count_jobs(store_url) == 0
        store.job_enqueue_many([JobSpec("t")])  # the lock is free: the same store works
        assert count_jobs(store_url) == 1
    finally:
        store.close()


def test_sqlite_first_connection_waits_for_a_lock_taken_before_wal(
    tmp_path: Path, pool: ThreadPoolExecutor
) -> None:
    """Switching a fresh file to WAL needs an exclusive lock, and SQLite answers BUSY at once
    (ignoring busy_timeout) while another connection writes; the store must back off and
    retry that too, as it does when racing processes open a new database."""
    path = tmp_path / "fresh.db"
    locker = sqlite3.connect(path, isolation_level=None)
    store = plunder.open_store(f"sqlite:///{path}", busy_timeout=0.05)
    try:
        locker.execute("CREATE TABLE other (x INTEGER)")
        locker.execute("BEGIN IMMEDIATE")
        locker.execute("INSERT INTO other VALUES (1)")
        future = started(pool, store.migrate)
        time.sleep(HOLD)  # hold the lock on purpose
        assert not future.done(), "migrate did not wait for the lock"
        locker.execute("COMMIT")
        assert future.result(timeout=10) == store.schema_check()
    finally:
        locker.close()
        store.close()


# -- a COMMIT that fails ---------------------------------------------------------------------
def test_a_failed_commit_rolls_back_and_leaves_no_lock(store: Store, store_url: str) -> None:
    """A task's own writes can make COMMIT itself fail (here a deferred foreign key). The
    transaction must be rolled back: the job stays running, the store keeps working, and on
    SQLite no connection is left holding the write lock."""
    conn = raw_connect(store_url)
    conn.execute("CREATE TABLE parent (id INTEGER PRIMARY KEY)")
    conn.execute(
        "CREATE TABLE child (parent_id INTEGER REFERENCES parent (id) "
        "DEFERRABLE INITIALLY DEFERRED)"
    )
    if store.dialect == "postgres":
        conn.commit()
    conn.close()
    (job,) = enqueue(store, JobSpec("t"))
    session = open_session(store)
    (got,) = claim(store, session)

    def orphan(tx_conn: Any) -> None:
        tx_conn.execute("INSERT INTO child (parent_id) VALUES (42)")  # no parent 42

    ack = store.job_complete_many([Completion(got.claim, "r", effects=orphan)])
    assert ack.accepted == () and ack.stale == ()
    ((claim_, exc),) = ack.effect_errors  # reported for the caller to fail the job
    assert claim_ == got.claim and isinstance(exc, errors.StoreError)
    assert "foreign key" in str(exc).lower()
    after = store.job_get(job.id)  # the same thread's connection is usable again
    assert (after.status, after.attempt, after.result) == (Status.RUNNING, 1, None)
    other = plunder.open_store(store_url, busy_total=0.5)
    try:
        other.job_enqueue_many([JobSpec("t")])  # no write lock left behind
    finally:
        other.close()
    assert store.job_complete_many([Completion(got.claim, "r")]).accepted == (got.claim,)
    assert count_rows(store_url, "child") == 0


def count_rows(url: str, table: str) -> int:
    conn = raw_connect(url)
    try:
        return int(conn.execute(f"SELECT count(*) FROM {table}").fetchone()[0])
    finally:
        conn.close()


# -- PostgreSQL: lost connections --------------------------------------------------------------
def terminate_store_connections(url: str) -> list[int]:
    """Kill every backend the store has open in this database; wait until they are gone."""
    with psycopg.connect(url, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT pid, pg_terminate_backend(pid, 5000) FROM pg_stat_activity "
            "WHERE application_name = 'plunder' AND datname = current_database() "
            "AND pid <> pg_backend_pid()"
        ).fetchall()
    assert rows and all(ok for _, ok in rows)
    return [pid for pid, _ in rows]


def store_backends(url: str) -> set[int]:
    with psycopg.connect(url, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT pid FROM pg_stat_activity "
            "WHERE application_name = 'plunder' AND datname = current_database()"
        ).fetchall()
    return {pid for (pid,) in rows}


def use_connections(store: Store, n: int) -> None:
    """Make the pool hold ``n`` connections by running ``n`` operations at once."""
    barrier = threading.Barrier(n)

    def hold(tx_conn: Any) -> None:
        barrier.wait(timeout=10)

    def work() -> None:
        store.job_enqueue_many([JobSpec("t")])
        session = open_session(store)
        (got,) = store.job_claim_many(session.id, queues=["default"], tasks=["t"], limit=1)
        store.job_complete_many([Completion(got.claim, None, effects=hold)])

    with ThreadPoolExecutor(max_workers=n) as executor:
        for future in [executor.submit(work) for _ in range(n)]:
            future.result(timeout=30)


@pytest.mark.parametrize("backend", ["postgres"])
def test_postgres_retries_on_a_fresh_connection_after_losing_them(store_url: str) -> None:
    store = plunder.open_store(store_url)
    try:
        use_connections(store, 3)
        killed = terminate_store_connections(store_url)
        assert len(killed) >= 3
        (job,) = store.job_enqueue_many([JobSpec("t", ["after the kill"])])
        assert store.job_get(job.id).args == ["after the kill"]
        assert store.job_list(limit=10).jobs[0].id == job.id
        assert store_backends(store_url).isdisjoint(killed)
        assert count_jobs(store_url) == 4
    finally:
        store.close()


@pytest.mark.parametrize("backend", ["postgres"])
def test_postgres_lost_connection_is_store_busy_without_retry_budget(store_url: str) -> None:
    """The control for the test above: the kill really breaks the pooled connection."""
    store = plunder.open_store(store_url, busy_total=0)
    try:
        store.now()
        terminate_store_connections(store_url)
        with pytest.raises(errors.StoreBusy) as caught:
            store.job_enqueue_many([JobSpec("t")])
        assert isinstance(caught.value.__cause__, psycopg.OperationalError)
        assert count_jobs(store_url) == 0
    finally:
        store.close()


# -- PostgreSQL: serialization failures at COMMIT, as CockroachDB raises them --------------------
def inject_at_commit(url: str, table: str, event: str, times: int, action: str) -> None:
    """Run the PL/pgSQL ``action`` at COMMIT of the first ``times`` transactions that
    ``event`` a row of ``table`` (a deferred constraint trigger). The countdown is a
    sequence: nextval() is not rolled back."""
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("CREATE SEQUENCE chaos_calls")
        conn.execute(
            f"""
            CREATE FUNCTION chaos_at_commit() RETURNS trigger LANGUAGE plpgsql AS $$
            BEGIN
                IF nextval('chaos_calls') <= {int(times)} THEN
                    {action}
                END IF;
                RETURN NULL;
            END $$
            """
        )
        conn.execute(
            f"CREATE CONSTRAINT TRIGGER chaos AFTER {event} ON {table} "
            "DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION chaos_at_commit()"
        )


def inject_40001(url: str, table: str, event: str, failures: int) -> None:
    """Make the first ``failures`` commits that ``event`` a row of ``table`` fail with
    SQLSTATE 40001 at COMMIT."""
    inject_at_commit(
        url,
        table,
        event,
        failures,
        "RAISE EXCEPTION 'injected serialization failure' USING ERRCODE = '40001';",
    )


def chaos_calls(url: str) -> int:
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute("SELECT last_value, is_called FROM chaos_calls").fetchone()
    assert row is not None
    return int(row[0]) if row[1] else 0


@pytest.mark.parametrize("backend", ["postgres"])
def test_postgres_enqueue_is_retried_after_serialization_failures(store_url: str) -> None:
    inject_40001(store_url, "plunder_jobs", "INSERT", failures=3)
    store = plunder.open_store(store_url, busy_interval=0.01)
    try:
        specs = [JobSpec("t", [i], key=f"k{i}" if i % 2 else None) for i in range(5)]
        jobs = store.job_enqueue_many(specs)
        assert [j.args for j in jobs] == [[i] for i in range(5)]
        # three commits failed at their first row's trigger; the fourth ran all five
        assert chaos_calls(store_url) == 3 + 5
        page = store.job_list(limit=100).jobs
        assert sorted(j.args[0] for j in page) == list(range(5))  # no duplicates
        assert {j.id for j in page} == {j.id for j in jobs}
    finally:
        store.close()


@pytest.mark.parametrize("backend", ["postgres"])
def test_postgres_claim_and_complete_survive_serialization_failures(store_url: str) -> None:
    store = plunder.open_store(store_url, busy_interval=0.01)
    try:
        (job,) = enqueue(store, JobSpec("t"))
        session = open_session(store)
        inject_40001(store_url, "plunder_jobs", "UPDATE", failures=4)
        (got,) = claim(store, session)  # its first commits fail; retried as a whole
        ack = store.job_complete_many([Completion(got.claim, "ok")])
        assert ack.accepted == (got.claim,) and ack.stale == ()
        assert chaos_calls(store_url) >= 4 + 2
        done = store.job_get(job.id)
        assert (done.status, done.attempt, done.result) == (Status.SUCCEEDED, 1, "ok")
        (run,) = store.job_runs(job.id)  # rolled-back claims left no history rows
        assert run.attempt == 1 and run.outcome == plunder.Outcome.SUCCEEDED
    finally:
        store.close()


@pytest.mark.parametrize("backend", ["postgres"])
def test_postgres_endless_serialization_failures_end_in_store_busy(store_url: str) -> None:
    inject_40001(store_url, "plunder_jobs", "INSERT", failures=1_000_000)
    store = plunder.open_store(store_url, busy_total=0.3, busy_interval=0.02)
    try:
        t0 = time.monotonic()
        with pytest.raises(errors.StoreBusy) as caught:
            store.job_enqueue_many([JobSpec("t")])
        assert 0.3 <= time.monotonic() - t0 < 5
        assert isinstance(caught.value.__cause__, psycopg.errors.SerializationFailure)
        assert chaos_calls(store_url) >= 2  # it did retry before giving up
        assert count_jobs(store_url) == 0
    finally:
        store.close()


def _lose_connection_at_commit(url: str, times: int) -> None:
    """The first ``times`` commits that insert a job lose their connection at COMMIT (the
    backend is terminated from a deferred trigger): the client gets no answer."""
    inject_at_commit(
        url,
        "plunder_jobs",
        "INSERT",
        times,
        # the termination lands in the sleep
        "PERFORM pg_terminate_backend(pg_backend_pid()); PERFORM pg_sleep(1);",
    )


@pytest.mark.parametrize("backend", ["postgres"])
def test_an_enqueue_whose_commit_went_unanswered_is_not_repeated(store_url: str) -> None:
    """A retry after a lost COMMIT could store the jobs twice (the first one may have
    committed): without keys the store says the outcome is unknown instead; with keys it
    retries, and a key inserts at most once."""
    store = plunder.open_store(store_url, busy_interval=0.01)
    store.migrate()
    _lose_connection_at_commit(store_url, times=2)
    try:
        with pytest.raises(errors.OutcomeUnknown, match="may or may not be stored"):
            store.job_enqueue_many([JobSpec("t", [1]), JobSpec("t", [2], key="k2")])
        assert chaos_calls(store_url) == 1  # tried once, not repeated
        keyed = store.job_enqueue_many([JobSpec("t", [3], key="k3")])
        assert chaos_calls(store_url) == 3  # cut once more, then retried and committed
        assert [j.args for j in keyed] == [[3]]
        assert count_jobs(store_url) == 1
    finally:
        store.close()


@pytest.mark.parametrize("backend", ["postgres"])
def test_a_one_statement_enqueue_whose_answer_was_lost_is_not_repeated(store_url: str) -> None:
    """Jobs without keys that share their options are inserted by one statement that
    commits on its own (no BEGIN, no COMMIT): a connection lost while it runs may have
    lost the answer to a commit, so the outcome is unknown there too, and it is not run
    again. The server ended no other connection: the store's pool is the same after."""
    store = plunder.open_store(store_url, busy_interval=0.01)
    store.migrate()
    _lose_connection_at_commit(store_url, times=1)
    try:
        with pytest.raises(errors.OutcomeUnknown, match="may or may not be stored"):
            store.job_enqueue_many([JobSpec("t", [1]), JobSpec("t", [2])])
        assert chaos_calls(store_url) == 1  # tried once, not repeated
        (job,) = store.job_enqueue_many([JobSpec("t", [3])])
        assert chaos_calls(store_url) == 2
        assert [j.id for j in store.job_list(limit=10).jobs] == [job.id]
    finally:
        store.close()


@pytest.mark.parametrize("backend", ["postgres"])
def test_an_insert_that_committed_on_its_own_but_returned_too_few_rows_says_so(
    store_url: str,
) -> None:
    """A trigger of the user's skips one of the rows: the jobs it let through are stored
    by a statement that committed on its own, so the enqueue must not look like a plain
    failure (a caller would repeat it and store them twice)."""
    store = plunder.open_store(store_url)
    store.migrate()
    with psycopg.connect(store_url, autocommit=True) as conn:
        conn.execute(
            "CREATE FUNCTION skip_two() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
            "IF NEW.args = '[2]' THEN RETURN NULL; END IF; RETURN NEW; END $$"
        )
        conn.execute(
            "CREATE TRIGGER skip_two BEFORE INSERT ON plunder_jobs "
            "FOR EACH ROW EXECUTE FUNCTION skip_two()"
        )
    try:
        with pytest.raises(errors.OutcomeUnknown, match=r"fewer rows.*do not repeat"):
            store.job_enqueue_many([JobSpec("t", [1]), JobSpec("t", [2])])
        assert count_jobs(store_url) == 1
    finally:
        store.close()
