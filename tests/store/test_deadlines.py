"""A PostgreSQL store's own deadlines, through a proxy that can hang (the kernel still
ACKs, so neither keepalives nor tcp_user_timeout would ever end the wait): a call is cut at
``call_timeout``, the listening connection at the deadline its owner gives, and
``calls_cut()`` ends a task's own transaction. ``idle_timeout`` reaches the server. SQLite
has no peer that can hang: nothing to cut."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import psycopg
import pytest

from plunder import errors
from plunder.config import Settings, WorkerDeadlines
from plunder.janitor import LEASE_NAME
from plunder.store import Store, open_store
from tests.chaos.chaosproxy import ChaosProxy

POSTGRES = pytest.mark.parametrize("backend", ["postgres"])


@pytest.fixture
def proxy(store_url: str) -> Iterator[ChaosProxy]:
    host, port = store_url.split("@", 1)[1].split("/", 1)[0].rsplit(":", 1)
    with ChaosProxy(host, int(port)) as running:
        yield running


@POSTGRES
def test_a_call_on_a_hung_peer_is_cut_at_its_deadline(store_url: str, proxy: ChaosProxy) -> None:
    store = open_store(proxy.url_for(store_url), call_timeout=0.5, busy_total=0.0)
    try:
        store.now()  # connected
        proxy.mode = "blackhole"
        started = time.monotonic()
        with pytest.raises(errors.StoreBusy, match=r"no answer within 0.5s"):
            store.now()
        assert time.monotonic() - started < 3.0
    finally:
        proxy.mode = "pass"
        store.close()


@POSTGRES
def test_the_listening_connection_is_cut_at_its_owners_deadline(
    store_url: str, proxy: ChaosProxy
) -> None:
    store = open_store(proxy.url_for(store_url))
    notes = store.notifications(listen=True, application_name="plunder:test:listen")
    try:
        with notes.connection_for(0.5) as conn:
            conn.execute("SELECT 1")
        proxy.mode = "blackhole"
        started = time.monotonic()
        with (
            pytest.raises(errors.StoreBusy, match=r"no answer within 0.5s"),
            notes.connection_for(0.5) as conn,
        ):
            store.session_heartbeat("no-such-session", conn=conn)
        assert time.monotonic() - started < 3.0
        proxy.mode = "pass"
        with notes.connection_for(0.5) as conn:  # reconnected
            assert conn.execute("SELECT 2").fetchone() == (2,)
    finally:
        proxy.mode = "pass"
        notes.close()
        store.close()


@POSTGRES
def test_calls_cut_ends_a_tasks_own_transaction(store_url: str) -> None:
    store = open_store(store_url)
    outcome: list[BaseException] = []
    inside = threading.Event()

    def task() -> None:
        try:
            with store.transaction() as conn:
                inside.set()
                conn.execute("SELECT pg_sleep(30)")
        except BaseException as exc:
            outcome.append(exc)

    thread = threading.Thread(target=task)
    try:
        thread.start()
        assert inside.wait(10)
        time.sleep(0.2)  # into pg_sleep
        assert store.calls_cut("the session was lost") == 1
        thread.join(timeout=5)
        assert not thread.is_alive()
        assert outcome and isinstance(outcome[0], errors.StoreBusy), outcome
        assert "the session was lost" in str(outcome[0])
        assert store.now()  # the pool goes on with a fresh connection
    finally:
        store.close()


@POSTGRES
def test_idle_timeout_reaches_the_server(store_url: str) -> None:
    store = open_store(store_url, idle_timeout=1.5)
    try:
        with store.transaction() as conn:
            row = conn.execute("SHOW idle_in_transaction_session_timeout").fetchone()
        assert row == ("1500ms",)
    finally:
        store.close()


@POSTGRES
def test_a_pass_left_open_does_not_hold_up_a_takeover(store_url: str) -> None:
    """A janitor paused in the middle of a pass holds its lease FOR SHARE; with the idle
    limit its janitor store asks for, the server ends that transaction and a successor
    takes the expired lease instead of waiting for good."""
    settings = Settings(url=store_url, session_expiry=0.5, heartbeat_interval=0.1)
    deadlines = WorkerDeadlines.of(settings)
    # as a worker's janitor works: on the worker's store, within its connections
    worker = open_store(store_url, pool_size=1, **deadlines.store_options())
    holder = worker.limited(
        call_timeout=deadlines.janitor_timeout, idle_timeout=deadlines.janitor_timeout
    )
    other = open_store(store_url)
    try:
        lease = holder.lease_acquire(LEASE_NAME, "paused", settings.lease_ttl)
        assert lease is not None
        # the task's own statement meets the end of its transaction (the driver's error)
        with pytest.raises((errors.StoreError, psycopg.Error)), holder.transaction() as conn:
            conn.execute("SELECT term FROM plunder_leases WHERE name = %s FOR SHARE", (LEASE_NAME,))
            time.sleep(settings.lease_ttl)  # the lease runs out while the pass is open
            started = time.monotonic()
            taken = other.lease_acquire(LEASE_NAME, "successor", settings.lease_ttl)
            waited = time.monotonic() - started
            assert taken is not None and taken.term == lease.term + 1
            assert waited < settings.lease_ttl + 1.0, waited
            conn.execute("SELECT 1")  # the paused holder wakes up: its transaction is gone
    finally:
        holder.close()
        worker.close()
        other.close()


@POSTGRES
def test_a_limited_store_keeps_its_limits_on_the_same_connections(store_url: str) -> None:
    """A limited view of a store (a worker's janitor) works on the store's own pool: its
    transactions carry its idle limit, the store's keep theirs, its calls are not among
    those a lost session cuts, and closing it leaves the pool open."""
    store = open_store(store_url, pool_size=1, idle_timeout=30.0, call_timeout=30.0)
    view = store.limited(call_timeout=5.0, idle_timeout=1.5, application_name="it:janitor")
    show = (
        "SELECT current_setting('idle_in_transaction_session_timeout'), pg_backend_pid(), "
        "current_setting('application_name')"
    )
    try:
        with store.transaction() as conn:
            own, pid, name = conn.execute(show).fetchone()
        with view.transaction() as conn:
            assert conn.execute(show).fetchone() == ("1500ms", pid, "it:janitor")  # one conn
        with store.transaction() as conn:
            assert conn.execute(show).fetchone() == (own, pid, name) == ("30s", pid, "plunder")
        with view.transaction() as conn:
            assert store.calls_cut("the session was lost") == 0  # not the view's call
            assert conn.execute("SELECT 1").fetchone() == (1,)
        assert view.lease_acquire(LEASE_NAME, "view", 5.0) is not None
        view.close()
        assert store.now() and store.lease_get(LEASE_NAME).holder == "view"
    finally:
        store.close()


@pytest.mark.parametrize("backend", ["sqlite"])
def test_sqlite_has_nothing_to_cut(store: Store) -> None:
    notes = store.notifications(listen=False, application_name="unused")
    try:
        with notes.connection_for(0.1) as conn:
            assert conn.execute("SELECT 1").fetchone()[0] == 1
        assert store.calls_cut("nothing") == 0
    finally:
        notes.close()
