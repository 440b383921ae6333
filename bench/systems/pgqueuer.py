"""PgQueuer (asyncpg), at its fastest documented settings that keep its durability.

* Driver: asyncpg (``AsyncpgDriver``), event loop: uvloop — what PgQueuer's own
  ``tools/benchmark.py`` uses.
* Tables: ``durability=durable`` (its default; ``balanced``/``volatile`` make tables
  UNLOGGED, which an immediate shutdown empties — plunder has no such mode).
* Worker: one ``QueueManager`` per process, an ``async def`` no-op entrypoint,
  ``batch_size=BATCH`` (dequeue batch, also its completion-log buffer size), no
  concurrency limits. Other settings are its defaults: ``heartbeat_timeout`` 30 s (a
  picked job whose heartbeat is older is re-picked by any worker: its crash recovery),
  ``dequeue_timeout`` 30 s.
* Enqueue: ``Queries.enqueue`` with lists (one statement for the batch).

A finished job is deleted from ``pgqueuer`` and logged in ``pgqueuer_log`` with its
``created`` time (database clock); enqueue→start is the 'picked' log row minus the
'queued' one.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

import psycopg

from bench.common import (
    BenchError,
    Params,
    gated_drain,
    percentiles,
    spawn,
    stop_all,
    wait_idle,
    wait_until,
)

BATCH = int(os.environ.get("BENCH_PGQUEUER_BATCH", "100"))
SETTINGS = {"driver": "asyncpg + uvloop", "batch_size": BATCH, "durability": "durable"}
HOLD_SECONDS = 120.0


def _loop_run(coro: Any) -> Any:
    try:
        import uvloop

        return uvloop.run(coro)
    except ImportError:
        return asyncio.run(coro)


async def _queries(url: str) -> Any:
    import asyncpg
    from pgqueuer import Queries
    from pgqueuer.db import AsyncpgDriver

    return Queries(AsyncpgDriver(await asyncpg.connect(url)))


async def _install(url: str) -> None:
    queries = await _queries(url)
    await queries.install()


async def _worker(url: str, batch: int) -> None:
    import asyncpg
    from pgqueuer import PgQueuer
    from pgqueuer.db import AsyncpgDriver

    pgq = PgQueuer(AsyncpgDriver(await asyncpg.connect(url)))

    @pgq.entrypoint("noop")
    async def noop(job: Any) -> None:
        return None

    @pgq.entrypoint("hold")
    async def hold(job: Any) -> None:
        await asyncio.sleep(HOLD_SECONDS)

    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, pgq.shutdown.set)
    await pgq.run(batch_size=batch)


def worker(url: str, batch: int) -> None:
    _loop_run(_worker(url, batch))


def _workers(p: Params, count: int, batch: int = BATCH) -> list[Any]:
    argv = [sys.executable, "-m", "bench.systems.pgqueuer", "worker", p.url, str(batch)]
    return [spawn(argv, log=Path(p.workdir) / "worker.log") for _ in range(count)]


async def _enqueue(url: str, count: int, entrypoint: str = "noop") -> list[int]:
    queries = await _queries(url)
    ids = await queries.enqueue(
        [entrypoint] * count, [str(i).encode() for i in range(count)], [0] * count
    )
    return [int(i) for i in ids]


def enqueue(p: Params) -> dict[str, Any]:
    _loop_run(_install(p.url))

    async def timed() -> float:
        queries = await _queries(p.url)
        entrypoints = ["noop"] * p.jobs
        payloads = [str(i).encode() for i in range(p.jobs)]
        priorities = [0] * p.jobs
        started = time.perf_counter()
        await queries.enqueue(entrypoints, payloads, priorities)
        return time.perf_counter() - started

    elapsed = _loop_run(timed())
    return {"rate": p.jobs / elapsed, "seconds": elapsed, "jobs": p.jobs}


def drain(p: Params) -> dict[str, Any]:
    _loop_run(_install(p.url))
    conn = psycopg.connect(p.url, autocommit=True)

    def scalar(sql: str) -> Any:
        return conn.execute(sql).fetchone()[0]  # type: ignore[index]

    try:
        return gated_drain(
            lambda: _workers(p, p.workers),
            lambda: _loop_run(_enqueue(p.url, p.jobs)),
            lambda: scalar("SELECT count(*) FROM pgqueuer"),
            jobs=p.jobs,
            timeout=p.timeout,
            last_finish=lambda: scalar(
                "SELECT max(created) FROM pgqueuer_log WHERE status = 'successful'"
            ).timestamp(),
        ) | {"batch_size": BATCH}
    finally:
        conn.close()


def latency(p: Params) -> dict[str, Any]:
    _loop_run(_install(p.url))
    conn = psycopg.connect(p.url, autocommit=True)
    procs = _workers(p, 1)
    count = int(p.rate * p.seconds)

    async def produce() -> None:
        queries = await _queries(p.url)
        start = time.monotonic()
        for i in range(count):
            await asyncio.sleep(max(0.0, start + i / p.rate - time.monotonic()))
            await queries.enqueue("noop", str(i).encode(), 0)

    try:
        wait_idle(procs)
        time.sleep(0.5)
        _loop_run(produce())
        wait_until(
            lambda: (
                conn.execute(
                    "SELECT count(*) FROM pgqueuer_log WHERE status = 'successful'"
                ).fetchone()[0]  # type: ignore[index]
                == count
            ),
            timeout=p.timeout,
            what="the latency jobs",
        )
        rows = conn.execute(
            "SELECT extract(epoch FROM p.created - q.created)::float8 "
            "FROM pgqueuer_log q JOIN pgqueuer_log p ON p.job_id = q.job_id "
            "WHERE q.status = 'queued' AND p.status = 'picked'"
        ).fetchall()
    finally:
        stop_all(procs)
        conn.close()
    return percentiles([r[0] for r in rows])


def rescue(p: Params) -> dict[str, Any]:
    """Its recovery at defaults: a picked job whose heartbeat is older than
    ``heartbeat_timeout`` (30 s) is re-picked by the next dequeue of any worker."""
    _loop_run(_install(p.url))
    conn = psycopg.connect(p.url, autocommit=True)

    def scalar(sql: str, *args: Any) -> Any:
        return conn.execute(sql, args).fetchone()[0]  # type: ignore[index]

    victim = _workers(p, 1, batch=10)
    rescuers: list[Any] = []
    try:
        wait_idle(victim)
        ids = _loop_run(_enqueue(p.url, p.hold_jobs, "hold"))
        wait_until(
            lambda: (
                scalar(
                    "SELECT count(*) FROM pgqueuer WHERE id = ANY(%s) AND status = 'picked'", ids
                )
                == len(ids)
            ),
            timeout=30,
            what="the victim to hold its jobs",
        )
        rescuers = _workers(p, 1, batch=10)
        wait_idle(rescuers)
        killed = time.time()
        victim[0].send_signal(signal.SIGKILL)
        victim[0].wait()
        wait_until(
            lambda: (
                scalar(
                    "SELECT count(*) FROM pgqueuer WHERE id = ANY(%s) AND status = 'picked' "
                    "AND updated > to_timestamp(%s)",
                    ids,
                    killed,
                )
                == len(ids)
            ),
            timeout=p.rescue_cap,
            interval=0.2,
            what="the rescue",
        )
        restarted = scalar("SELECT max(updated) FROM pgqueuer WHERE id = ANY(%s)", ids)
    except BenchError:
        raise
    finally:
        stop_all(victim + rescuers, grace=0.0)
        conn.close()
    return {"seconds": restarted.timestamp() - killed, "jobs": len(ids)}


SCENARIOS = {"enqueue": enqueue, "drain": drain, "latency": latency, "rescue": rescue}

if __name__ == "__main__":
    if sys.argv[1] == "worker":
        worker(sys.argv[2], int(sys.argv[3]))
