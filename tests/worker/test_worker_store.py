"""A worker's store and deadlines: the worker runs with its connection budget and the
deadlines of its session expiry (config.WorkerDeadlines) whether or not its app's store was
open before it, and the objects that enforce those deadlines read them from one place."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

import plunder
from plunder.config import WorkerDeadlines
from plunder.store import Store
from plunder.worker import Worker, WorkerOptions
from tests.worker.conftest import wait_for

NAME = "deadlined"
APP_NAME = f"plunder:worker:{NAME}"


@pytest.fixture
def app(store_url: str) -> Iterator[plunder.App]:
    app = plunder.App(
        store_url,
        heartbeat_interval=0.2,
        session_expiry=1.5,
        poll_interval=0.05,
        janitor_interval=0.2,
    )

    @app.task(name="add")
    def add(a: int, b: int) -> int:
        return a + b

    try:
        yield app
    finally:
        app.close()


@contextmanager
def running(worker: Worker) -> Iterator[Worker]:
    thread = threading.Thread(target=worker.run, kwargs={"install_signals": False}, daemon=True)
    thread.start()
    try:
        wait_for(lambda: worker.session is not None or not thread.is_alive(), what="a session")
        assert worker.error is None
        yield worker
    finally:
        worker.stop()
        thread.join(timeout=15)
        assert not thread.is_alive()
    assert worker.error is None


def _server_settings(store: Store) -> tuple[str, str]:
    """PostgreSQL: the application name and idle-transaction limit of the store's
    connections, as the server has them."""
    with store.transaction() as conn:
        row = conn.execute(
            "SELECT current_setting('application_name'), "
            "current_setting('idle_in_transaction_session_timeout')"
        ).fetchone()
    return row[0], row[1]


def _worker_backends(url: str) -> int:
    """PostgreSQL: the backends connected under the worker's application name."""
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s", (APP_NAME,)
        ).fetchone()
    assert row is not None
    return int(row[0])


def test_the_worker_and_its_liveness_read_one_set_of_deadlines(app: plunder.App) -> None:
    worker = Worker(app, WorkerOptions(concurrency=1, name=NAME, janitor=False))
    assert worker.deadlines == WorkerDeadlines.of(app.settings)
    assert worker.deadlines.heartbeat_timeout == 0.75
    assert worker._liveness.deadlines is worker.deadlines
    seen: list[Any] = []
    with running(worker):
        (session,) = worker.store.session_list()
        assert session.expiry == worker.deadlines.session_expiry
        if app.url.startswith("postgresql"):
            # the hub's connection, which carries the heartbeats, ends a statement at the
            # heartbeat's deadline on the server's side too
            unregister = app.hub.every(
                0.05,
                lambda conn: seen.append(conn.execute("SHOW statement_timeout").fetchone()),
            )
            wait_for(lambda: seen, what="a call on the hub's connection")
            unregister()
    if app.url.startswith("postgresql"):
        assert seen[0] == ("750ms",)


def test_a_worker_opens_the_apps_store_with_its_budget_and_deadlines(
    app: plunder.App,
) -> None:
    """The app's store not open yet: the worker opens it, with its options, and shares it
    with the app (which closes it)."""
    worker = Worker(app, WorkerOptions(concurrency=1, name=NAME, janitor=False))
    assert worker.store is app.store
    if app.url.startswith("postgresql"):
        assert _server_settings(worker.store) == (APP_NAME, "3s")  # two expiries
    with running(worker):
        assert app.enqueue("add", [2, 3]).result(timeout=10) == 5
    assert app.enqueue("add", [1, 1]).id  # the app's store is still open
    if app.url.startswith("postgresql"):
        assert _worker_backends(app.url) >= 1  # the app's, still open: the app closes it


def test_a_worker_beside_an_open_app_store_runs_on_a_store_of_its_own(
    app: plunder.App,
) -> None:
    """A process that enqueued before it built its worker (a web app with an in-process
    worker) keeps its store as it is, and the worker still gets its budget and deadlines:
    on a store of its own, closed when the worker stops."""
    first = app.enqueue("add", [2, 3])  # opens the app's store, with the app's options
    worker = Worker(app, WorkerOptions(concurrency=1, name=NAME, janitor=False))
    assert worker.store is not app.store
    postgres = app.url.startswith("postgresql")
    if postgres:
        assert _server_settings(worker.store) == (APP_NAME, "3s")
        assert _server_settings(app.store) != (APP_NAME, "3s")  # the app's, untouched
    closed: list[Store] = []
    close = worker.store.close  # SQLite shows no closed connection from outside: recorded
    worker.store.close = lambda: closed.append(worker.store) or close()  # type: ignore[method-assign]
    with running(worker):
        assert first.result(timeout=10) == 5
        assert app.enqueue("add", [4, 5]).result(timeout=10) == 9
        # its heartbeats, on the app's hub, renew the session the worker's store opened
        wait_for(
            lambda: [s.heartbeat_at > s.started_at for s in app.store.session_list()] == [True],
            what="a heartbeat",
        )
        assert closed == []
    assert closed == [worker.store]
    if postgres:
        wait_for(lambda: _worker_backends(app.url) == 0, what="the worker's store closed")
    assert app.enqueue("add", [1, 1]).status == plunder.Status.PENDING  # the app's works on
