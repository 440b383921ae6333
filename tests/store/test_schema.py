"""Schema: a missing, current or too-new schema is recognised; migrations applied one by
one produce exactly the fresh schema; racing migrators all succeed and leave one schema."""

from __future__ import annotations

import re
import sqlite3
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import psycopg
import pytest

import plunder
from plunder import errors
from plunder.model import JobSpec
from plunder.store import queries
from tests.conftest import _pg_database, _pg_drop
from tests.store.helpers import raw_connect

Snapshot = dict[str, list[tuple[Any, ...]]]


# -- what a schema is, per dialect -----------------------------------------------------------
def normalized(sql: str | None) -> str:
    """DDL text without comments, without layout and without quotes around names (SQLite
    quotes the name of a table it renamed, as a rebuild does)."""
    if sql is None:
        return ""
    sql = re.sub(r"--[^\n]*", "", sql)
    sql = re.sub(r'"(\w+)"', r"\1", sql)
    sql = re.sub(r"\s+", " ", sql).strip()
    return re.sub(r"\s*([(),])\s*", r"\1", sql)


def snapshot(url: str) -> Snapshot:
    conn = raw_connect(url)
    try:
        if url.startswith("sqlite"):
            rows = conn.execute("SELECT type, name, tbl_name, sql FROM sqlite_master").fetchall()
            return {"sqlite_master": sorted((t, n, tb, normalized(sql)) for t, n, tb, sql in rows)}
        return {name: sorted(conn.execute(sql).fetchall()) for name, sql in PG_CATALOG.items()}
    finally:
        conn.close()


PG_TABLES = "SELECT oid FROM pg_class WHERE relname LIKE 'plunder\\_%' AND relkind = 'r'"
PG_CATALOG = {
    "columns": """
        SELECT table_name, column_name, data_type, udt_name, is_nullable,
               coalesce(column_default, ''), is_identity, coalesce(identity_generation, '')
        FROM information_schema.columns
        WHERE table_schema = current_schema() AND table_name LIKE 'plunder\\_%'""",
    "indexes": """
        SELECT tablename, indexname, indexdef FROM pg_indexes
        WHERE schemaname = current_schema() AND tablename LIKE 'plunder\\_%'""",
    "constraints": f"""
        SELECT conrelid::regclass::text, conname, contype, pg_get_constraintdef(oid)
        FROM pg_constraint WHERE conrelid IN ({PG_TABLES})""",
    "tables": """
        SELECT relname, relkind, relpersistence FROM pg_class
        WHERE relname LIKE 'plunder\\_%' AND relnamespace = current_schema()::regnamespace""",
}


def execute(url: str, sql: str) -> None:
    conn = raw_connect(url)
    try:
        conn.execute(sql)
        if not url.startswith("sqlite"):
            conn.commit()
    finally:
        conn.close()


@pytest.fixture
def second_empty_url(backend: str, tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[str]:
    if backend == "sqlite":
        yield f"sqlite:///{tmp_path / 'second.db'}"
        return
    cluster = request.getfixturevalue("pg_cluster")
    name = _pg_database(cluster, None)
    try:
        yield cluster.url(name)
    finally:
        _pg_drop(cluster, name)


def migrated(url: str, *, fresh_schema: bool = True) -> int:
    store = plunder.open_store(url)
    try:
        return store.migrate(fresh_schema=fresh_schema)  # type: ignore[call-arg]
    finally:
        store.close()


# -- version checks -----------------------------------------------------------------------------
def test_an_empty_database_is_migrated_to_the_latest_version(empty_url: str) -> None:
    store = plunder.open_store(empty_url)
    try:
        with pytest.raises(errors.SchemaError, match="plunder init"):
            store.schema_check()
        latest = len(queries.migrations(store.dialect))
        assert store.migrate() == latest
        assert store.schema_check() == latest
        before = snapshot(empty_url)
        assert store.migrate() == latest  # again: nothing to do
        assert snapshot(empty_url) == before
        assert store.schema_check() == latest
    finally:
        store.close()


def test_operations_on_an_empty_database_ask_for_plunder_init(empty_url: str) -> None:
    store = plunder.open_store(empty_url)
    try:
        with pytest.raises(errors.SchemaError, match="plunder init"):
            store.job_get(1)
    finally:
        store.close()


def test_a_newer_schema_is_refused_and_left_alone(store_url: str) -> None:
    execute(store_url, "UPDATE plunder_schema SET version = 999 WHERE id = 1")
    before = snapshot(store_url)
    store = plunder.open_store(store_url)
    try:
        with pytest.raises(errors.SchemaError, match="newer") as check:
            store.schema_check()
        assert "999" in str(check.value)
        with pytest.raises(errors.SchemaError, match="newer"):
            store.migrate()
    finally:
        store.close()
    assert snapshot(store_url) == before
    conn = raw_connect(store_url)
    try:
        assert conn.execute("SELECT id, version FROM plunder_schema").fetchall() == [(1, 999)]
    finally:
        conn.close()


# -- migrations agree with the fresh schema -----------------------------------------------------
def test_migrations_one_by_one_produce_the_fresh_schema(
    empty_url: str, second_empty_url: str
) -> None:
    latest = migrated(empty_url, fresh_schema=False)
    assert migrated(second_empty_url) == latest
    stepwise, fresh = snapshot(empty_url), snapshot(second_empty_url)
    assert all(fresh.values()), "the snapshot saw nothing"
    assert stepwise == fresh


@pytest.mark.parametrize(
    "change",
    [
        "CREATE INDEX plunder_jobs_extra ON plunder_jobs (task)",
        "ALTER TABLE plunder_sessions ADD COLUMN extra TEXT",
        "DROP INDEX plunder_jobs_running",
    ],
)
def test_the_schema_comparison_sees_a_difference(
    empty_url: str, second_empty_url: str, change: str
) -> None:
    """The control for the test above: a schema that differs in one index or column is
    told apart."""
    migrated(empty_url)
    migrated(second_empty_url)
    assert snapshot(empty_url) == snapshot(second_empty_url)
    execute(second_empty_url, change)
    assert snapshot(empty_url) != snapshot(second_empty_url)


@pytest.mark.parametrize("backend", ["postgres"])
@pytest.mark.parametrize(
    "change",
    [
        "ALTER TABLE plunder_jobs ALTER COLUMN priority SET DEFAULT 1",
        "ALTER TABLE plunder_jobs DROP CONSTRAINT plunder_jobs_max_attempts_check",
        "ALTER TABLE plunder_runs ALTER COLUMN logs DROP NOT NULL",
        "ALTER TABLE plunder_leases ALTER COLUMN term TYPE INTEGER",
        "ALTER TABLE plunder_leases SET UNLOGGED",
    ],
)
def test_the_postgres_comparison_sees_defaults_constraints_and_types(
    empty_url: str, second_empty_url: str, change: str
) -> None:
    migrated(empty_url)
    migrated(second_empty_url)
    execute(second_empty_url, change)
    assert snapshot(empty_url) != snapshot(second_empty_url)


# -- racing migrators ---------------------------------------------------------------------------
def test_racing_migrators_all_succeed_and_leave_one_schema(
    empty_url: str, second_empty_url: str
) -> None:
    racers = 4
    stores = [plunder.open_store(empty_url) for _ in range(racers)]
    barrier = threading.Barrier(racers)

    def race(store: Any) -> int:
        barrier.wait(timeout=10)
        return int(store.migrate())

    try:
        if stores[0].dialect == "postgres":
            for store in stores:
                store.now()  # connected already: they race on the DDL itself
        with ThreadPoolExecutor(max_workers=racers) as pool:
            versions = list(pool.map(race, stores))
    finally:
        for store in stores:
            store.close()
    latest = len(queries.migrations("sqlite" if empty_url.startswith("sqlite") else "postgres"))
    assert versions == [latest] * racers
    migrated(second_empty_url)
    assert snapshot(empty_url) == snapshot(second_empty_url)


@pytest.mark.parametrize("backend", ["postgres"])
def test_postgres_migrate_survives_losing_the_create_race(empty_url: str) -> None:
    """Another migrator's CREATE TABLE IF NOT EXISTS is not committed yet when ours runs:
    ours waits on the catalog and then fails with a unique violation on pg_type. Migrate
    must recover from that."""
    other = psycopg.connect(empty_url)
    store = plunder.open_store(empty_url)
    try:
        other.execute(queries.load("postgres")["schema_table_create"])  # not committed yet
        with ThreadPoolExecutor(max_workers=1) as pool:
            future = pool.submit(store.migrate)
            wait_for_lock_wait(empty_url)
            other.commit()
            assert future.result(timeout=30) == store.schema_check()
    finally:
        other.close()
        store.close()


def wait_for_lock_wait(url: str, timeout: float = 10) -> None:
    """Until one of the store's backends waits on a lock (polled: PostgreSQL offers no
    notification of this)."""
    deadline = time.monotonic() + timeout
    with psycopg.connect(url, autocommit=True) as conn:
        while time.monotonic() < deadline:
            row = conn.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'plunder' "
                "AND datname = current_database() AND wait_event_type = 'Lock'"
            ).fetchone()
            if row and row[0]:
                return
            time.sleep(0.01)
    pytest.fail("the store never waited on the other migrator's lock")


# -- the SQLite table rebuild (version 8) -------------------------------------------------------
# the jobs' columns before version 12, which the rebuilds keep as they were
JOB_COLUMNS = (
    "id, queue, task, args, kwargs, priority, status, attempt, max_attempts, timeout, "
    "backoff_base, backoff_cap, retry_on_timeout, key, run_at, created_at, started_at, "
    "finished_at, deadline_at, session_id, result, error, failed_sessions, losses, run_worker, "
    "run_host, run_pid, run_logs"
)


def rows_of(url: str) -> dict[str, Any]:
    conn = raw_connect(url)
    try:
        return {
            table: conn.execute(f"SELECT {columns} FROM {table} ORDER BY 1, 2").fetchall()
            for table, columns in (
                ("plunder_jobs", JOB_COLUMNS),
                ("plunder_runs", "*"),
                ("plunder_events", "*"),
                ("sqlite_sequence", "*"),
            )
        }
    finally:
        conn.close()


def version_7_rows(url: str) -> list[int]:
    """Jobs in every state (as the store of version 7 wrote them: written here, as this
    plunder's store writes columns that version lacks), a key, a history row, stream events
    and a pruned last id. Returns the job ids, the pruned one last."""
    conn = raw_connect(url)
    try:
        conn.execute(
            "INSERT INTO plunder_sessions (id, name, host, pid, queues, expiry, started_at, "
            "heartbeat_at, expires_at) VALUES ('s', 'w', 'h', 1, '[\"default\"]', 60, 1, 1, 61)"
        )
        jobs = []
        for key, status, result, error in [
            (None, "succeeded", '"done"', None),
            (None, "failed", None, '{"type":"E","message":"bad","traceback":""}'),
            (None, "running", None, None),
            (None, "pending", None, None),
            ("k", "pending", None, None),
            (None, "pending", None, None),
        ]:
            started = "1" if status != "pending" else "NULL"
            row = conn.execute(
                "INSERT INTO plunder_jobs (queue, task, status, attempt, key, run_at, created_at,"
                f" started_at, session_id, result, error) VALUES ('default', 't', ?, ?, ?, 1, 1,"
                f" {started}, ?, ?, ?) RETURNING id",
                (status, int(started != "NULL"), key, None if key else "s", result, error),
            ).fetchone()
            jobs.append(int(row[0]))
        conn.execute(
            "INSERT INTO plunder_runs (job_id, attempt, session_id, worker, host, pid, "
            "started_at, finished_at, outcome, error) VALUES (?, 1, 's', 'w', 'h', 1, 1, 2, "
            "'failed', '{}')",
            (jobs[1],),
        )
        for kind, data in (("chunk", '"a"'), ("progress", '{"current":1}')):
            conn.execute(
                "INSERT INTO plunder_events (job_id, attempt, kind, data, created_at) "
                "VALUES (?, 1, ?, ?, 1)",
                (jobs[2], kind, data),
            )
        conn.execute("DELETE FROM plunder_jobs WHERE id = ?", (jobs[-1],))  # pruned
        return jobs
    finally:
        conn.close()


@pytest.mark.parametrize("backend", ["sqlite"])
def test_the_sqlite_rebuild_keeps_every_row_id_and_reference(
    empty_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Versions 8 and 12 rebuild plunder_jobs (and 8 plunder_runs). Jobs in every state, a
    key, a history row, stream events and a pruned last id all come through them as they
    were: the next job does not reuse the pruned id, the runs and events still belong to
    their jobs (deleting a job deletes them), and the store enforces foreign keys again
    after. The columns version 12 adds take their defaults."""
    every = queries.migrations("sqlite")
    monkeypatch.setattr(queries, "migrations", lambda dialect: every[:7])
    old = plunder.open_store(empty_url)
    try:
        assert old.migrate(fresh_schema=False) == 7
    finally:
        old.close()
    jobs = version_7_rows(empty_url)
    before = rows_of(empty_url)
    assert before["plunder_runs"] and before["plunder_events"]
    assert before["sqlite_sequence"] != []
    monkeypatch.undo()

    store = plunder.open_store(empty_url)
    try:
        assert store.migrate() == len(every)
        assert store.schema_check() == len(every)
        assert rows_of(empty_url) == before
        (fresh,) = store.job_enqueue_many([JobSpec("t")])
        assert fresh.id == jobs[-1] + 1  # the pruned id is not used again
        (again,) = store.job_enqueue_many([JobSpec("t", key="k")])
        assert again.id == jobs[4]  # the key still names its one active job
        assert store.driver.connection().execute("PRAGMA foreign_keys").fetchone()[0] == 1
        assert store.job_get(jobs[3]).retry_on_lost and store.job_get(jobs[3]).expires_at is None
    finally:
        store.close()
    conn = raw_connect(empty_url)
    try:
        assert conn.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
        assert conn.execute("PRAGMA foreign_key_check").fetchall() == []
        conn.execute("PRAGMA foreign_keys=ON")
        with pytest.raises(sqlite3.IntegrityError, match="CHECK"):
            conn.execute("UPDATE plunder_jobs SET status = 'lost' WHERE id = ?", (jobs[0],))
        with pytest.raises(sqlite3.IntegrityError, match="CHECK"):
            conn.execute("UPDATE plunder_runs SET outcome = 'done'")
        conn.execute("DELETE FROM plunder_jobs WHERE id IN (?, ?)", (jobs[1], jobs[2]))
        assert conn.execute("SELECT count(*) FROM plunder_runs").fetchone()[0] == 0
        assert conn.execute("SELECT count(*) FROM plunder_events").fetchone()[0] == 0
    finally:
        conn.close()
