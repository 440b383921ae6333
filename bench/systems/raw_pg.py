"""The raw-psycopg bound: the least a job queue can do on this database, on this machine.

One table, one partial index in claim order per queue, no history, no sessions, no fencing.
A worker claims a batch with one statement —

    UPDATE raw_jobs SET status = 'running', … WHERE id IN (
        SELECT id FROM raw_jobs WHERE queue = … AND status = 'pending' AND run_at <= now
        ORDER BY priority DESC, run_at, id FOR UPDATE SKIP LOCKED LIMIT 100) RETURNING id, args

— runs the no-op, and acknowledges the batch with one ``UPDATE … WHERE id = ANY(…)``; each
statement is its own transaction (fsync on). Enqueue is one ``COPY`` plus a ``NOTIFY`` in
the same transaction; idle workers wait on ``LISTEN``. The first-line latency's consumer
(``seen_worker``) notes time.monotonic() once its claim returns, where plunder's task would
run its first line.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

import psycopg

from bench.common import (
    Params,
    gated_drain,
    percentiles,
    python_for,
    spawn,
    stop_all,
    wait_idle,
    wait_until,
)

BATCH = 100
SETTINGS = {"claim batch": BATCH}
SCHEMA = """
CREATE TABLE IF NOT EXISTS raw_jobs (
    id BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    queue TEXT NOT NULL DEFAULT 'default',
    args TEXT NOT NULL,
    priority INTEGER NOT NULL DEFAULT 0,
    status TEXT NOT NULL DEFAULT 'pending',
    attempt INTEGER NOT NULL DEFAULT 0,
    run_at TIMESTAMPTZ NOT NULL DEFAULT statement_timestamp(),
    created_at TIMESTAMPTZ NOT NULL DEFAULT statement_timestamp(),
    started_at TIMESTAMPTZ,
    finished_at TIMESTAMPTZ,
    seen DOUBLE PRECISION  -- the first-line latency's consumer: time.monotonic() after its claim
);
CREATE INDEX IF NOT EXISTS raw_jobs_claim ON raw_jobs (queue, priority DESC, run_at, id)
    WHERE status = 'pending';
"""
CLAIM = """
UPDATE raw_jobs SET status = 'running', attempt = attempt + 1, started_at = statement_timestamp()
WHERE id IN (
    SELECT id FROM raw_jobs
    WHERE queue = 'default' AND status = 'pending' AND run_at <= statement_timestamp()
    ORDER BY priority DESC, run_at, id
    FOR UPDATE SKIP LOCKED
    LIMIT %s)
RETURNING id, args
"""
ACK = """
UPDATE raw_jobs SET status = 'succeeded', finished_at = statement_timestamp()
WHERE id = ANY(%s) AND status = 'running'
"""
ACK_SEEN = """
UPDATE raw_jobs SET status = 'succeeded', finished_at = statement_timestamp(), seen = v.seen
FROM unnest(%s::bigint[], %s::float8[]) AS v (id, seen)
WHERE raw_jobs.id = v.id AND raw_jobs.status = 'running'
"""


def _connect(url: str) -> psycopg.Connection[Any]:
    return psycopg.connect(url, autocommit=True)


def setup(url: str) -> None:
    with _connect(url) as conn:
        conn.execute(SCHEMA)


def noop(args: str) -> str:
    return args


def worker(url: str, batch: int) -> None:
    """Claim, run, acknowledge; when nothing is due, wait for a NOTIFY (or 1 s)."""
    conn = _connect(url)
    listener = _connect(url)
    listener.execute("LISTEN raw_jobs")
    while True:
        rows = conn.execute(CLAIM, (batch,)).fetchall()
        if not rows:
            for _ in listener.notifies(timeout=1.0, stop_after=1):
                pass
            continue
        done = [row[0] for row in rows if noop(row[1]) is not None]
        conn.execute(ACK, (done,))


def seen_worker(url: str) -> None:
    """The first-line bound's consumer: on a notification, claim with one UPDATE …
    RETURNING, note time.monotonic() per claimed row, and store it with the row's
    acknowledgement."""
    conn = _connect(url)
    listener = _connect(url)
    listener.execute("LISTEN raw_jobs")
    while True:
        rows = conn.execute(CLAIM, (BATCH,)).fetchall()
        if not rows:
            for _ in listener.notifies(timeout=1.0, stop_after=1):
                pass
            continue
        seen = [time.monotonic() for _ in rows]
        conn.execute(ACK_SEEN, ([row[0] for row in rows], seen))


def _enqueue(conn: psycopg.Connection[Any], count: int) -> None:
    with conn.transaction():
        with conn.cursor().copy("COPY raw_jobs (args) FROM STDIN") as copy:
            for i in range(count):
                copy.write_row((str(i),))
        conn.execute("NOTIFY raw_jobs")


def enqueue(p: Params) -> dict[str, Any]:
    setup(p.url)
    with _connect(p.url) as conn:
        started = time.perf_counter()
        _enqueue(conn, p.jobs)
        elapsed = time.perf_counter() - started
    return {"rate": p.jobs / elapsed, "seconds": elapsed, "jobs": p.jobs}


def _workers(p: Params, count: int, kind: str = "worker") -> list[Any]:
    argv = [python_for(False), "-m", "bench.systems.raw_pg", kind, p.url, str(BATCH)]
    return [spawn(argv, log=Path(p.workdir) / "worker.log") for _ in range(count)]


def _drain(p: Params, workers: int, deep: int = 0) -> dict[str, Any]:
    setup(p.url)
    conn = _connect(p.url)
    if deep:
        other, later = deep // 2, deep - deep // 2
        conn.execute(
            "INSERT INTO raw_jobs (queue, args) SELECT 'other', i::text "
            "FROM generate_series(1, %s) AS i",
            (other,),
        )
        conn.execute(
            "INSERT INTO raw_jobs (args, run_at) SELECT i::text, now() + interval '1 day' "
            "FROM generate_series(1, %s) AS i",
            (later,),
        )
        conn.execute("ANALYZE raw_jobs")
        conn.execute("CHECKPOINT")  # as plunder's depth fill: not in the middle of the drain
    low = conn.execute("SELECT coalesce(max(id), 0) FROM raw_jobs").fetchone()[0]  # type: ignore[index]

    def scalar(sql: str) -> Any:
        return conn.execute(sql, (low,)).fetchone()[0]  # type: ignore[index]

    try:
        return gated_drain(
            lambda: _workers(p, workers),
            lambda: _enqueue(conn, p.jobs),
            lambda: scalar(
                "SELECT count(*) FROM raw_jobs WHERE id > %s AND status IN ('pending', 'running')"
            ),
            jobs=p.jobs,
            timeout=p.timeout,
            last_finish=lambda: scalar(
                "SELECT max(finished_at) FROM raw_jobs WHERE id > %s"
            ).timestamp(),
        ) | {"batch": BATCH}
    finally:
        conn.close()


def drain(p: Params) -> dict[str, Any]:
    return _drain(p, p.workers)


def depth(p: Params) -> dict[str, Any]:
    """Same deep table as plunder's: half in another queue enqueued first, half in the
    worker's queue due tomorrow. This schema's index leads with the queue, so the claim
    never walks the other queue's rows."""
    return _drain(p, 1, deep=p.deep) | {"deep": p.deep}


def latency(p: Params) -> dict[str, Any]:
    """One idle worker on LISTEN; each job is one INSERT + NOTIFY transaction.
    Enqueue→start is ``started_at - created_at``, both by the database clock."""
    setup(p.url)
    conn = _connect(p.url)
    procs = _workers(p, 1)
    try:
        wait_idle(procs)
        time.sleep(0.5)
        count = int(p.rate * p.seconds)
        ids = []
        start = time.monotonic()
        for i in range(count):
            time.sleep(max(0.0, start + i / p.rate - time.monotonic()))
            with conn.transaction():
                row = conn.execute(
                    "INSERT INTO raw_jobs (args) VALUES (%s) RETURNING id", (str(i),)
                ).fetchone()
                conn.execute("NOTIFY raw_jobs")
            ids.append(row[0])  # type: ignore[index]
        low, high = min(ids), max(ids)
        wait_until(
            lambda: (
                conn.execute(
                    "SELECT count(*) FROM raw_jobs WHERE id BETWEEN %s AND %s "
                    "AND status = 'succeeded'",
                    (low, high),
                ).fetchone()[0]  # type: ignore[index]
                == count
            ),
            timeout=p.timeout,
            what="the latency jobs",
        )
        rows = conn.execute(
            "SELECT extract(epoch FROM started_at - created_at)::float8 FROM raw_jobs "
            "WHERE id BETWEEN %s AND %s",
            (low, high),
        ).fetchall()
    finally:
        stop_all(procs)
        conn.close()
    return percentiles([r[0] for r in rows])


def first_line(p: Params) -> dict[str, Any]:
    """One idle consumer on LISTEN; each job is one INSERT + NOTIFY transaction. From just
    before the producer's transaction to the consumer's time.monotonic() after its claim
    (one clock for every process on the machine)."""
    setup(p.url)
    conn = _connect(p.url)
    procs = _workers(p, 1, "seen-worker")
    try:
        wait_idle(procs)
        time.sleep(0.5)
        sent: dict[int, float] = {}
        start = time.monotonic()
        for i in range(int(p.rate * p.seconds)):
            time.sleep(max(0.0, start + i / p.rate - time.monotonic()))
            before = time.monotonic()
            with conn.transaction():
                row = conn.execute(
                    "INSERT INTO raw_jobs (args) VALUES (%s) RETURNING id", (str(i),)
                ).fetchone()
                conn.execute("NOTIFY raw_jobs")
            sent[row[0]] = before  # type: ignore[index]
        query = "SELECT id, seen FROM raw_jobs WHERE id = ANY(%s) AND status = 'succeeded'"
        rows: list[tuple[int, float]] = []

        def all_seen() -> bool:
            rows[:] = conn.execute(query, (list(sent),)).fetchall()
            return len(rows) == len(sent)

        wait_until(all_seen, timeout=p.timeout, what="the latency jobs")
    finally:
        stop_all(procs)
        conn.close()
    return percentiles([seen - sent[job] for job, seen in rows])


SCENARIOS = {
    "enqueue": enqueue,
    "drain": drain,
    "latency": latency,
    "depth": depth,
    "first_line": first_line,
}

if __name__ == "__main__":
    if sys.argv[1] == "worker":
        worker(sys.argv[2], int(sys.argv[3]))
    elif sys.argv[1] == "seen-worker":
        seen_worker(sys.argv[2])
