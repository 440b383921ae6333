"""The PostgreSQL store keeps nothing in a database session, so a transaction pooler
(pgbouncer in transaction mode) may run each of its transactions on any server connection:
no server-side prepared statements behind one (and none after a server reports them mixed
up), and a statement timeout set inside each transaction rather than with the ``options``
startup parameter (which pgbouncer refuses). A task's own
transaction whose COMMIT is refused raises plunder's StoreBusy, never the driver's error.
The whole system behind a real pgbouncer is the chaos suite's S19."""

from __future__ import annotations

import psycopg
import pytest

import plunder
from plunder import errors
from plunder.model import JobSpec
from plunder.states import Status
from tests.store.test_busy import count_jobs, inject_40001

pytestmark = pytest.mark.parametrize("backend", ["postgres"])


def _prepared(store: plunder.Store) -> int:
    with store.transaction() as conn:
        row = conn.execute("SELECT count(*) FROM pg_prepared_statements").fetchone()
    assert row is not None
    return int(row[0])


@pytest.mark.parametrize("startup_options", [True, False], ids=["server", "pooler"])
def test_statements_are_prepared_only_where_no_pooler_is_seen(
    store_url: str, startup_options: bool
) -> None:
    store = plunder.open_store(store_url, pool_size=1)
    if not startup_options:
        store.driver._accepts_options = False  # as pgbouncer in transaction mode answers
    try:
        for _ in range(10):  # psycopg prepares a statement after its fifth run
            store.now()
            store.job_enqueue_many([JobSpec("t")])
        assert (_prepared(store) > 0) is startup_options
    finally:
        store.close()


def test_a_prepared_statement_mix_up_turns_preparing_off_and_retries(
    store_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A pooler that lends server connections without tracking prepared statements makes
    the server answer "prepared statement … does not exist": the call is retried
    unprepared, and nothing is prepared again."""
    store = plunder.open_store(store_url, pool_size=1)
    try:
        for _ in range(10):
            store.now()
        assert _prepared(store) > 0
        with store.transaction() as conn:  # behind psycopg's back, as another server would
            conn.pgconn.exec_(b"DEALLOCATE ALL")
        assert store.now() is not None  # refused once, then retried unprepared
        assert "mixed up prepared statements" in caplog.text
        for _ in range(10):
            store.now()
            store.job_enqueue_many([JobSpec("t")])
        assert _prepared(store) == 0
        assert count_jobs(store_url) == 10
    finally:
        store.close()


@pytest.mark.parametrize("startup_options", [True, False], ids=["options", "pooler"])
def test_the_statement_timeout_bounds_every_transaction(
    store_url: str, startup_options: bool
) -> None:
    """Settings travel in the startup ``options`` where the server takes them; where it
    refuses them (pgbouncer; S19 runs the real one), each transaction makes them itself
    and nothing stays on the connection after it."""
    store = plunder.open_store(store_url, pool_size=1, statement_timeout=0.25)
    if not startup_options:
        store.driver._accepts_options = False  # as a transaction pooler answers
    try:
        with store.transaction() as conn:
            assert conn.execute("SHOW statement_timeout").fetchone() == ("250ms",)
            # JIT compiled the claim on a deep queue for 50 ms a call (its estimate passed
            # jit_above_cost): plunder's transactions never JIT
            assert conn.execute("SHOW jit").fetchone() == ("off",)
        with pytest.raises(psycopg.errors.QueryCanceled), store.transaction() as conn:
            conn.execute("SELECT pg_sleep(2)")  # the block's own error passes through as is
        notes = store.notifications(listen=False, application_name="t", statement_timeout=0.25)
        try:
            conn = notes.connection
            session = store.session_open(name="w", host="h", pid=1, queues=["q"], expiry=5.0)
            assert store.session_heartbeat(session.id, conn=conn).alive
            if startup_options:
                assert conn.execute("SHOW statement_timeout").fetchone() == ("250ms",)
            else:  # made by each of plunder's transactions; the connection keeps nothing
                assert getattr(conn, "per_transaction", None) == {
                    "statement_timeout": 250,
                }
                assert conn.execute("SHOW statement_timeout").fetchone() == ("0",)
        finally:
            notes.close()
    finally:
        store.close()


def test_a_task_transaction_refused_at_commit_is_store_busy(store_url: str) -> None:
    inject_40001(store_url, "plunder_jobs", "INSERT", failures=1)
    store = plunder.open_store(store_url)
    try:
        with pytest.raises(errors.StoreBusy) as caught, store.transaction() as conn:
            store.job_enqueue_many([JobSpec("t")], conn=conn)
        assert isinstance(caught.value.__cause__, psycopg.errors.SerializationFailure)
        assert count_jobs(store_url) == 0
        with pytest.raises(ZeroDivisionError), store.transaction():  # the block's own: as is
            _ = 1 / 0
    finally:
        store.close()


@pytest.mark.parametrize("startup_options", [True, False], ids=["server", "pooler"])
def test_a_claim_leaves_its_connection_as_it_found_it(
    store_url: str, startup_options: bool
) -> None:
    """A claim with nothing to acknowledge is one statement, run as a transaction of its
    own where the server took plunder's settings at startup (the pool's connections are in
    autocommit mode: no BEGIN and COMMIT round trips); behind a pooler it stays an explicit
    transaction that makes the settings. Either way the connection goes back to the pool
    idle and in autocommit mode, after a claim, an empty one and a refused one."""
    store = plunder.open_store(store_url, pool_size=1, statement_timeout=5.0)
    if not startup_options:
        store.driver._accepts_options = False  # as a transaction pooler answers

    def check_idle_connection() -> None:
        with store.driver.pool().connection() as conn:  # pool_size=1: the claim's own
            assert conn.autocommit is True  # as the pool made it
            # behind the pooler, the settings are still made in each transaction
            assert bool(getattr(conn, "per_transaction", None)) is not startup_options
            assert conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE

    try:
        store.job_enqueue_many([JobSpec("t", [i]) for i in range(3)])
        session = store.session_open(name="w", host="h", pid=1, queues=["default"], expiry=30)
        jobs = store.job_claim_many(session.id, queues=["default"], tasks=["t"], limit=5)
        assert len(jobs) == 3
        assert all(store.job_get(j.id).status == Status.RUNNING for j in jobs)
        assert all(len(store.job_runs(j.id)) == 1 for j in jobs)  # written by the claim
        check_idle_connection()
        assert store.job_claim_many(session.id, queues=["default"], tasks=["t"], limit=5) == []
        check_idle_connection()
        store.session_close(session.id)
        with pytest.raises(errors.SessionGone):
            store.job_claim_many(session.id, queues=["default"], tasks=["t"], limit=5)
        check_idle_connection()
    finally:
        store.close()
