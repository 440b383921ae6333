"""Procrastinate (psycopg 3), at its fastest documented settings.

* Connector: ``PsycopgConnector`` with a pool as large as the worker's concurrency (its
  default pool has 4 connections, which would cap a larger concurrency).
* Worker: one process, ``concurrency=CONCURRENCY`` (each slot fetches one job per
  statement: Procrastinate has no batch fetch), ``listen_notify=True`` (default), an
  ``async def`` no-op task, jobs kept after they finish (``delete_jobs="never"``, its
  default — the same history plunder keeps).
* Enqueue: ``Task.batch_defer_async`` (one statement for the batch).

Crash recovery: none by default. Its documentation gives a recipe — a periodic task that
retries the jobs of workers whose heartbeat (every 10 s) is older than 30 s — scheduled
``*/10 * * * *`` (every ten minutes). The rescue scenario runs that recipe with the
heartbeat defaults but every 5 s (``* * * * * */5``, Procrastinate's seconds column),
so that the mechanism, not the cron, is what is measured.

Every state change is an event in ``procrastinate_events`` with its time (database
clock): enqueue→start is 'started' minus 'deferred', a drain ends at the last
'succeeded'.
"""

from __future__ import annotations

import asyncio
import os
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

CONCURRENCY = int(os.environ.get("BENCH_PROCRASTINATE_CONCURRENCY", "10"))
SETTINGS = {"concurrency": CONCURRENCY, "pool": CONCURRENCY + 2, "listen_notify": True}
HOLD_SECONDS = 120.0
RECIPE_CRON = "* * * * * */5"


def make_app(url: str, pool: int = CONCURRENCY + 2) -> Any:
    import procrastinate

    app = procrastinate.App(
        connector=procrastinate.PsycopgConnector(conninfo=url, min_size=2, max_size=pool)
    )

    @app.task(name="noop", queue="default")
    async def noop(i: int) -> None:
        return None

    @app.task(name="hold", queue="default")
    async def hold(i: int) -> None:
        await asyncio.sleep(HOLD_SECONDS)

    @app.periodic(cron=RECIPE_CRON)
    @app.task(name="retry_stalled_jobs", queueing_lock="retry_stalled_jobs", pass_context=True)
    async def retry_stalled_jobs(context: Any, timestamp: int) -> None:
        # the documented recipe, verbatim but for the schedule (see the module docstring)
        stalled_jobs = await app.job_manager.get_stalled_jobs()
        for job in stalled_jobs:
            await app.job_manager.retry_job(job)

    return app


def worker(url: str, concurrency: int) -> None:
    app = make_app(url, pool=concurrency + 2)

    async def run() -> None:
        async with app.open_async():
            await app.run_worker_async(concurrency=concurrency, queues=["default"])

    asyncio.run(run())


def _install(url: str) -> None:
    app = make_app(url)

    async def run() -> None:
        async with app.open_async():
            await app.schema_manager.apply_schema_async()

    asyncio.run(run())


def _defer(url: str, count: int, task: str = "noop") -> float:
    app = make_app(url)

    async def run() -> float:
        async with app.open_async():
            calls = [{"i": i} for i in range(count)]
            started = time.perf_counter()
            await app.tasks[task].batch_defer_async(*calls)
            return time.perf_counter() - started

    return float(asyncio.run(run()))


def _workers(p: Params, count: int, concurrency: int = CONCURRENCY) -> list[Any]:
    argv = [sys.executable, "-m", "bench.systems.procrastinate", "worker", p.url, str(concurrency)]
    return [spawn(argv, log=Path(p.workdir) / "worker.log") for _ in range(count)]


def enqueue(p: Params) -> dict[str, Any]:
    _install(p.url)
    elapsed = _defer(p.url, p.jobs)
    return {"rate": p.jobs / elapsed, "seconds": elapsed, "jobs": p.jobs}


def drain(p: Params) -> dict[str, Any]:
    _install(p.url)
    conn = psycopg.connect(p.url, autocommit=True)

    def scalar(sql: str) -> Any:
        return conn.execute(sql).fetchone()[0]  # type: ignore[index]

    try:
        return gated_drain(
            lambda: _workers(p, p.workers),
            lambda: _defer(p.url, p.jobs),
            lambda: scalar(
                "SELECT count(*) FROM procrastinate_jobs WHERE status IN ('todo', 'doing')"
            ),
            jobs=p.jobs,
            timeout=p.timeout,
            last_finish=lambda: scalar(
                "SELECT max(at) FROM procrastinate_events WHERE type = 'succeeded'"
            ).timestamp(),
        ) | {"concurrency": CONCURRENCY}
    finally:
        conn.close()


def latency(p: Params) -> dict[str, Any]:
    _install(p.url)
    conn = psycopg.connect(p.url, autocommit=True)
    procs = _workers(p, 1)
    count = int(p.rate * p.seconds)
    app = make_app(p.url)

    async def produce() -> None:
        async with app.open_async():
            start = time.monotonic()
            for i in range(count):
                await asyncio.sleep(max(0.0, start + i / p.rate - time.monotonic()))
                await app.tasks["noop"].defer_async(i=i)

    try:
        wait_idle(procs)
        time.sleep(0.5)
        asyncio.run(produce())
        wait_until(
            lambda: (
                conn.execute(
                    "SELECT count(*) FROM procrastinate_jobs WHERE status = 'succeeded' "
                    "AND task_name = 'noop'"
                ).fetchone()[0]  # type: ignore[index]
                == count
            ),
            timeout=p.timeout,
            what="the latency jobs",
        )
        rows = conn.execute(
            "SELECT extract(epoch FROM s.at - d.at)::float8 FROM procrastinate_events d "
            "JOIN procrastinate_events s ON s.job_id = d.job_id "
            "JOIN procrastinate_jobs j ON j.id = d.job_id AND j.task_name = 'noop' "
            "WHERE d.type = 'deferred' AND s.type = 'started'"
        ).fetchall()
    finally:
        stop_all(procs)
        conn.close()
    return percentiles([r[0] for r in rows])


def rescue(p: Params) -> dict[str, Any]:
    _install(p.url)
    conn = psycopg.connect(p.url, autocommit=True)

    def scalar(sql: str, *args: Any) -> Any:
        return conn.execute(sql, args).fetchone()[0]  # type: ignore[index]

    victim = _workers(p, 1, concurrency=p.hold_jobs)
    rescuers: list[Any] = []
    try:
        wait_idle(victim)
        _defer(p.url, p.hold_jobs, "hold")
        ids = [
            r[0] for r in conn.execute("SELECT id FROM procrastinate_jobs WHERE task_name = 'hold'")
        ]
        wait_until(
            lambda: (
                scalar(
                    "SELECT count(*) FROM procrastinate_jobs WHERE id = ANY(%s) AND status = 'doing'",
                    ids,
                )
                == len(ids)
            ),
            timeout=30,
            what="the victim to hold its jobs",
        )
        rescuers = _workers(p, 1, concurrency=p.hold_jobs + 2)
        wait_idle(rescuers)
        killed = time.time()
        victim[0].kill()
        victim[0].wait()
        started_again = (
            "SELECT {} FROM procrastinate_events WHERE job_id = ANY(%s) "
            "AND type = 'started' AND at > to_timestamp(%s)"
        )
        wait_until(
            lambda: scalar(started_again.format("count(DISTINCT job_id)"), ids, killed) == len(ids),
            timeout=p.rescue_cap,
            interval=0.2,
            what="the rescue",
        )
        restarted = scalar(started_again.format("max(at)"), ids, killed)
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
