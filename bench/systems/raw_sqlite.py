"""The raw-sqlite3 bound: the least a job queue can do on one SQLite file, on this machine.

WAL journal and ``synchronous=FULL`` (plunder's default durability). A worker claims a
batch with one guarded statement under ``BEGIN IMMEDIATE`` —

    UPDATE raw_jobs SET status = 'running', … WHERE status = 'pending' AND id IN (
        SELECT id FROM raw_jobs WHERE status = 'pending' ORDER BY id LIMIT 100)
    RETURNING id, args

— commits, runs the no-op, and acknowledges the batch with one ``UPDATE … WHERE id IN
(…)`` in a second ``BEGIN IMMEDIATE`` transaction. Enqueue is one ``executemany`` in one
transaction. An idle worker looks again every 5 ms.
"""

from __future__ import annotations

import sqlite3
import sys
import time
from pathlib import Path
from typing import Any

from bench.common import Params, gated_drain, python_for, spawn, sqlite_unlocked

BATCH = 100
SETTINGS = {"claim batch": BATCH, "journal": "WAL", "synchronous": "FULL"}
NOW = "((julianday('now') - 2440587.5) * 86400.0)"  # epoch seconds, ms precision
SCHEMA = f"""
CREATE TABLE IF NOT EXISTS raw_jobs (
    id INTEGER PRIMARY KEY,
    args TEXT NOT NULL,
    status TEXT NOT NULL DEFAULT 'pending',
    attempt INTEGER NOT NULL DEFAULT 0,
    created_at REAL NOT NULL DEFAULT ({NOW}),
    started_at REAL,
    finished_at REAL
);
CREATE INDEX IF NOT EXISTS raw_jobs_pending ON raw_jobs (id) WHERE status = 'pending';
"""
CLAIM = f"""
UPDATE raw_jobs SET status = 'running', attempt = attempt + 1, started_at = {NOW}
WHERE status = 'pending' AND id IN (
    SELECT id FROM raw_jobs WHERE status = 'pending' ORDER BY id LIMIT ?)
RETURNING id, args
"""


def path_of(url: str) -> str:
    return url.removeprefix("sqlite:///")


def connect(url: str) -> sqlite3.Connection:
    conn = sqlite3.connect(path_of(url), isolation_level=None, timeout=30)
    conn.execute("PRAGMA journal_mode = WAL")
    conn.execute("PRAGMA synchronous = FULL")
    return conn


def setup(url: str) -> None:
    conn = connect(url)
    conn.executescript(SCHEMA)
    conn.close()


def noop(args: str) -> str:
    return args


def worker(url: str, batch: int) -> None:
    conn = connect(url)
    while True:
        conn.execute("BEGIN IMMEDIATE")
        rows = conn.execute(CLAIM, (batch,)).fetchall()
        conn.execute("COMMIT")
        if not rows:
            time.sleep(0.005)
            continue
        done = [row[0] for row in rows if noop(row[1]) is not None]
        conn.execute("BEGIN IMMEDIATE")
        conn.execute(
            f"UPDATE raw_jobs SET status = 'succeeded', finished_at = {NOW} "
            f"WHERE status = 'running' AND id IN ({','.join('?' * len(done))})",
            done,
        )
        conn.execute("COMMIT")


def _enqueue(conn: sqlite3.Connection, count: int) -> None:
    conn.execute("BEGIN IMMEDIATE")
    conn.executemany("INSERT INTO raw_jobs (args) VALUES (?)", ((str(i),) for i in range(count)))
    conn.execute("COMMIT")


def enqueue(p: Params) -> dict[str, Any]:
    setup(p.url)
    conn = connect(p.url)
    started = time.perf_counter()
    _enqueue(conn, p.jobs)
    elapsed = time.perf_counter() - started
    conn.close()
    return {"rate": p.jobs / elapsed, "seconds": elapsed, "jobs": p.jobs}


def drain(p: Params) -> dict[str, Any]:
    setup(p.url)
    conn = connect(p.url)
    argv = [python_for(False), "-m", "bench.systems.raw_sqlite", "worker", p.url, str(BATCH)]
    log = Path(p.workdir) / "worker.log"
    try:
        return gated_drain(
            lambda: [spawn(argv, log=log) for _ in range(p.workers)],
            lambda: _enqueue(conn, p.jobs),
            lambda: conn.execute(
                "SELECT count(*) FROM raw_jobs WHERE status IN ('pending', 'running')"
            ).fetchone()[0],
            jobs=p.jobs,
            timeout=p.timeout,
            last_finish=lambda: conn.execute("SELECT max(finished_at) FROM raw_jobs").fetchone()[0],
            unlocked=lambda: sqlite_unlocked(path_of(p.url)),
        ) | {"batch": BATCH}
    finally:
        conn.close()


SCENARIOS = {"enqueue": enqueue, "drain": drain}

if __name__ == "__main__":
    if sys.argv[1] == "worker":
        worker(sys.argv[2], int(sys.argv[3]))
