"""Opening a store from Python: a database that refuses for good says why at once, one
that is down is tried a bounded time, plunder prints nothing unless the application set
up logging, a missing SQLite file is made only when asked, and a caller's own connection
is left as it was."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

import plunder
from plunder import errors
from plunder.model import JobSpec
from plunder.store import Store, open_store
from tests.store.helpers import raw_connect, refused_logins
from tests.support import pgcluster

ROOT = Path(__file__).resolve().parents[2]


def run_python(code: str, timeout: float = 60) -> tuple[subprocess.CompletedProcess[str], float]:
    """``code`` in a fresh interpreter with no logging set up, as a user's script runs."""
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={k: v for k, v in os.environ.items() if k != "PLUNDER_URL"},
        timeout=timeout,
        check=False,
    )
    return done, time.monotonic() - started


OPEN = """
    import pathlib, sys, time, psycopg, plunder
    started = time.monotonic()  # the open alone, not the interpreter's start
    try:
        plunder.App(sys.argv[1] if len(sys.argv) > 1 else {url!r}{extra}).store
    except plunder.{error} as exc:
        pathlib.Path({took!r}).write_text(repr(time.monotonic() - started))
        assert isinstance(exc.__cause__, psycopg.Error), repr(exc.__cause__)
        print(exc)
    else:
        raise SystemExit("opened")
"""


@refused_logins
def test_a_refused_login_raises_at_once_and_prints_nothing(
    pg_cluster: pgcluster.Cluster, url_of: Any, cause: str, tmp_path: Path
) -> None:
    took = tmp_path / "took"
    code = OPEN.format(url=url_of(pg_cluster), extra="", error="StoreRefused", took=str(took))
    done, _ = run_python(code)
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""
    assert cause in done.stdout and len(done.stdout.splitlines()) == 1
    assert float(took.read_text()) < 2.5


def test_a_refused_port_is_tried_a_bounded_time_and_prints_nothing(tmp_path: Path) -> None:
    url = f"postgresql://postgres@127.0.0.1:{pgcluster.free_port()}/postgres"
    took = tmp_path / "took"
    code = OPEN.format(
        url=url, extra=", connect_timeout=2", error="StoreUnavailable", took=str(took)
    )
    done, _ = run_python(code)
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""
    assert "refused" in done.stdout and len(done.stdout.splitlines()) == 1
    assert 0.9 < float(took.read_text()) < 6  # tried more than once, for about connect_timeout


def test_plunders_loggers_print_only_where_the_application_set_up_logging() -> None:
    code = """
        import logging, plunder
        logging.getLogger("plunder.store").warning("unseen")
        logging.basicConfig(format="%(message)s")
        logging.getLogger("plunder.store").warning("seen")
    """
    done, _ = run_python(code)
    assert done.returncode == 0 and done.stderr == "seen\n"


def test_a_missing_sqlite_file_is_created_only_when_asked(tmp_path: Path) -> None:
    path = tmp_path / "typo.db"
    refusing = open_store(f"sqlite:///{path}", create=False)
    try:
        with pytest.raises(errors.StoreUnavailable, match=f"no database at {path}"):
            refusing.schema_check()
    finally:
        refusing.close()
    with pytest.raises(errors.StoreUnavailable, match="no database at"):
        plunder.App(f"sqlite:///{path}", create=False).store  # noqa: B018
    assert list(tmp_path.iterdir()) == []
    app = plunder.App(f"sqlite:///{path}")  # an embedded app just works
    try:
        assert app.store.schema_check() == app.store.latest_version
    finally:
        app.close()
    existing = plunder.App(f"sqlite:///{path}", create=False)
    try:
        assert existing.store.schema_check() == existing.store.latest_version
    finally:
        existing.close()


def _factory(conn: Any) -> Any:
    return conn.row_factory


def test_enqueue_in_leaves_the_callers_connection_as_it_was(store: Store, store_url: str) -> None:
    conn = raw_connect(store_url)
    try:
        before = _factory(conn)
        if store_url.startswith("sqlite"):
            conn.execute("BEGIN IMMEDIATE")
        store.job_enqueue_many([JobSpec("t", [1])], conn=conn)
        assert _factory(conn) is before
        with pytest.raises(errors.PayloadError):
            store.job_enqueue_many([JobSpec("t", [float("nan")])], conn=conn)
        assert _factory(conn) is before
        conn.commit() if not store_url.startswith("sqlite") else conn.execute("COMMIT")
        # a row factory of the caller's own is left in place too, and not relied on
        conn.row_factory = _tuple_factory(store_url)
        mine = conn.row_factory
        store.job_enqueue_many([JobSpec("t", [2])], conn=conn)
        assert conn.row_factory is mine
        if not store_url.startswith("sqlite"):
            conn.commit()
    finally:
        conn.close()
    assert sorted(j.args[0] for j in store.job_list().jobs) == [1, 2]


def _tuple_factory(url: str) -> Any:
    if url.startswith("sqlite"):
        return lambda cursor, row: list(row)
    from psycopg.rows import tuple_row

    return tuple_row


def test_enqueue_in_within_the_callers_write_transaction_before_the_store_opened(
    tmp_path: Path,
) -> None:
    """A fresh process (no store open yet) whose first enqueue_in runs inside its own
    BEGIN IMMEDIATE: the schema is checked without the write lock the caller holds."""
    path = tmp_path / "app.db"
    made, _ = run_python(f"import plunder; plunder.App('sqlite:///{path}').store")
    assert made.returncode == 0, made.stderr
    code = f"""
        import sqlite3, time, plunder
        app = plunder.App('sqlite:///{path}')
        @app.task(name="t")
        def t(x): return x
        conn = sqlite3.connect({str(path)!r}, isolation_level=None)
        conn.execute("BEGIN IMMEDIATE")
        started = time.monotonic()
        job = t.enqueue_in(conn, 7)
        conn.execute("COMMIT")
        print(job.id, round(time.monotonic() - started, 3))
    """
    done, _ = run_python(code, timeout=120)
    assert done.returncode == 0, done.stderr
    job_id, took = done.stdout.split()
    assert float(took) < 2.0
    store = open_store(f"sqlite:///{path}")
    try:
        assert store.job_get(int(job_id)).args == [7]
    finally:
        store.close()
