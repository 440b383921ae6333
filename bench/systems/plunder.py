"""plunder itself, on PostgreSQL or SQLite (the URL decides), with its production defaults:
fencing, run history and wake-ups on, sessions expire after 5 s, the janitor runs every 1 s.

Workers are the real command line: ``python -m plunder --db URL worker -A bench.tasks:app
-c CONCURRENCY``. For no-op jobs a user wants claims of about 100. On SQLite a worker claims
as many jobs as it has free slots, so ``-c 100``; on PostgreSQL a busy worker sends its next
turns while it runs the jobs of the last (turns sent ahead, on by default), each turn
claiming up to a third of the slots, so ``-c 300``.
"""

from __future__ import annotations

import json
import signal
import sqlite3
import sys
import time
from datetime import datetime
from pathlib import Path
from typing import Any

from bench.common import (
    BenchError,
    Params,
    gated_drain,
    percentiles,
    spawn,
    sqlite_unlocked,
    stop_all,
    wait_idle,
    wait_until,
)
from bench.systems import scrape

CONCURRENCY = {"pg": 300, "sqlite": 100}
SETTINGS = {
    "worker": "python -m plunder worker -A bench.tasks:app -c 300 (PostgreSQL), -c 100 (SQLite)"
}


def _concurrency(url: str) -> int:
    return CONCURRENCY["sqlite" if url.startswith("sqlite:") else "pg"]


DEEP_CHUNK = 50_000
HOLD_SECONDS = 120.0


class Probe:
    """Direct reads of plunder's tables (the harness's view of the database)."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.path: str | None = None  # the SQLite file
        if url.startswith("sqlite:"):
            from plunder.store.sqlite.files import parse_url

            self.path = str(parse_url(url)[0])
            self.conn: Any = sqlite3.connect(self.path, isolation_level=None, timeout=30)
            self.mark = "?"
        else:
            import psycopg

            self.conn = psycopg.connect(url, autocommit=True)
            self.mark = "%s"

    def rows(self, sql: str, *params: Any) -> list[tuple[Any, ...]]:
        return list(self.conn.execute(sql.replace("%s", self.mark), params).fetchall())

    def scalar(self, sql: str, *params: Any) -> Any:
        return self.rows(sql, *params)[0][0]

    def epoch(self, column: str) -> str:
        """SQL for a time column as seconds since the epoch (SQLite stores them so)."""
        return column if self.path else f"extract(epoch FROM {column})::float8"

    def among(self, column: str) -> str:
        """SQL for ``column`` among the ids given as the next parameter (``ids(...)``)."""
        return f"{column} IN (SELECT value FROM json_each(%s))" if self.path else f"{column} = ANY(%s)"

    def ids(self, ids: list[int]) -> Any:
        return json.dumps(ids) if self.path else ids

    def unlocked(self) -> bool:
        """No process holds the write lock (always true of PostgreSQL, which locks rows)."""
        return self.path is None or sqlite_unlocked(self.path)

    def close(self) -> None:
        self.conn.close()


def _epoch(value: datetime | float | None) -> float | None:
    if value is None:
        return None
    return value.timestamp() if isinstance(value, datetime) else float(value)


def _app(url: str) -> Any:
    from bench.systems.plunder_app import app

    app.configure(url=url)
    app.store  # noqa: B018 - open and migrate before anything is timed
    return app


def _workers(p: Params, count: int, app_spec: str = "bench.tasks:app", concurrency: int = 0):
    env = {"PLUNDER_URL": p.url, **p.extra.get("env", {})}
    argv = [
        sys.executable,
        "-m",
        "plunder",
        "--db",
        p.url,
        "--log-level",
        "WARNING",
        "worker",
        "-A",
        app_spec,
        "-c",
        str(concurrency or _concurrency(p.url)),
        *p.extra.get("worker_args", []),
    ]
    log = Path(p.workdir) / "worker.log"
    procs, ports = [], []
    for _ in range(count):  # plunder_pg_metrics: each with a metrics port, scraped
        args, port = scrape.worker_args(p)
        procs.append(spawn([*argv, *args], env=env, log=log))
        ports += [port] if port else []
    scrape.follow(procs, ports, p.workdir)
    return procs


def _sessions(app: Any, count: int) -> bool:
    return len(app.store.session_list()) >= count


def enqueue(p: Params) -> dict[str, Any]:
    from bench.systems.plunder_app import app

    _app(p.url)
    noop = app.registry.get("bench.noop")
    calls = [(i,) for i in range(p.jobs)]
    started = time.perf_counter()
    jobs = noop.enqueue_many(calls)
    elapsed = time.perf_counter() - started
    assert len(jobs) == p.jobs
    app.close()
    return {"rate": p.jobs / elapsed, "seconds": elapsed, "jobs": p.jobs}


def _drain(p: Params, workers: int, before: Any = None) -> dict[str, Any]:
    app = _app(p.url)
    noop = app.registry.get("bench.noop")
    probe = Probe(p.url)
    if before is not None:
        before(app, probe)
    low = probe.scalar("SELECT coalesce(max(id), 0) FROM plunder_jobs")
    calls = [(i,) for i in range(p.jobs)]
    try:
        return gated_drain(
            lambda: _workers(p, workers),
            lambda: noop.enqueue_many(calls),
            lambda: probe.scalar(
                "SELECT count(*) FROM plunder_jobs WHERE id > %s "
                "AND status IN ('pending', 'running')",
                low,
            ),
            jobs=p.jobs,
            timeout=p.timeout,
            ready=lambda: _sessions(app, workers),
            last_finish=lambda: _epoch(
                probe.scalar("SELECT max(finished_at) FROM plunder_jobs WHERE id > %s", low)
            ),
            unlocked=probe.unlocked,
        ) | {"concurrency": _concurrency(p.url)}
    finally:
        probe.close()
        app.close()


def drain(p: Params) -> dict[str, Any]:
    return _drain(p, p.workers)


def depth(p: Params) -> dict[str, Any]:
    """Drain ``jobs`` with one worker on top of ``deep`` pending jobs that it must not run:
    half wait in another queue and were enqueued first (so they come first in claim order,
    priority then run_at then id, and every claim has to get past them), half are in the
    worker's own queue but due tomorrow. Statistics are fresh (ANALYZE) and the fill is
    checkpointed before the drain."""
    from plunder.model import JobSpec

    def fill(app: Any, probe: Probe) -> None:
        other, later = p.deep // 2, p.deep - p.deep // 2
        for queue, count, delay in (("other", other, 0.0), ("default", later, 86_400.0)):
            for start in range(0, count, DEEP_CHUNK):
                size = min(DEEP_CHUNK, count - start)
                app.enqueue_specs(
                    [JobSpec("bench.noop", [i], queue=queue, delay=delay) for i in range(size)]
                )
        probe.conn.execute("ANALYZE")
        # the fill's writes flushed now, not by a checkpoint that its WAL would start in
        # the middle of the drain (every page first touched after it then goes to the WAL
        # whole): the drain measures the claim, not where the checkpoints fall
        probe.conn.execute("PRAGMA wal_checkpoint(TRUNCATE)" if probe.path else "CHECKPOINT")

    return _drain(p, 1, before=fill) | {"deep": p.deep}


def latency(p: Params) -> dict[str, Any]:
    """One idle worker; jobs arrive one per enqueue at a steady rate. Enqueue→start is
    ``started_at - created_at``, both stamped by the database clock."""
    app = _app(p.url)
    probe = Probe(p.url)
    procs = _workers(p, 1)
    try:
        wait_idle(procs, check=lambda: _sessions(app, 1))
        time.sleep(0.5)
        count = int(p.rate * p.seconds)
        ids = []
        start = time.monotonic()
        for i in range(count):
            time.sleep(max(0.0, start + i / p.rate - time.monotonic()))
            ids.append(app.enqueue("bench.noop", [i]).id)
        low, high = min(ids), max(ids)
        wait_until(
            lambda: (
                probe.scalar(
                    "SELECT count(*) FROM plunder_jobs WHERE id BETWEEN %s AND %s "
                    "AND status = 'succeeded'",
                    low,
                    high,
                )
                == count
            ),
            timeout=p.timeout,
            what="the latency jobs",
        )
        rows = probe.rows(
            "SELECT created_at, started_at FROM plunder_jobs WHERE id BETWEEN %s AND %s",
            low,
            high,
        )
    finally:
        stop_all(procs)
        probe.close()
        app.close()
    return percentiles([_epoch(s) - _epoch(c) for c, s in rows])  # type: ignore[operator]


def first_line(p: Params) -> dict[str, Any]:
    """One idle worker; jobs arrive one per enqueue at a steady rate. Enqueue→start as a
    user sees it: from just before the producer's enqueue call to the task's first line,
    both by time.monotonic() (the task returns its reading as the job's result)."""
    app = _app(p.url)
    clock = app.registry.get("bench.clock")
    procs = _workers(p, 1, "bench.systems.plunder_app:app")
    try:
        wait_idle(procs, check=lambda: _sessions(app, 1))
        time.sleep(0.5)
        sent: list[tuple[float, Any]] = []
        start = time.monotonic()
        for i in range(int(p.rate * p.seconds)):
            time.sleep(max(0.0, start + i / p.rate - time.monotonic()))
            before = time.monotonic()
            sent.append((before, clock.enqueue()))
        began = [(job.result(timeout=p.timeout), before) for before, job in sent]
    finally:
        stop_all(procs)
        app.close()
    return percentiles([ran - before for ran, before in began])


def fleet(p: Params) -> dict[str, Any]:
    """Scenario 9 (bench.systems.plunder_fleet): ``workers`` idle worker processes, then
    ``jobs`` no-op jobs in batches."""
    from bench.systems import plunder_fleet

    return plunder_fleet.fleet(p)


def affinity(p: Params) -> dict[str, Any]:
    """Scenario 13 (bench.systems.plunder_affinity): jobs preferring a label 2 of 4
    workers hold."""
    from bench.systems import plunder_affinity

    return plunder_affinity.affinity(p)


def cost(p: Params) -> dict[str, Any]:
    """Scenario 17 (bench.systems.plunder_cost): jobs of mixed slot cost on 2 workers."""
    from bench.systems import plunder_cost

    return plunder_cost.cost(p)


def rebalance(p: Params) -> dict[str, Any]:
    """Scenario 12 (bench.systems.plunder_partitions): owners of a partitioned queue
    killed and added while jobs stream in."""
    from bench.systems import plunder_partitions

    return plunder_partitions.rebalance(p)


def rescue(p: Params) -> dict[str, Any]:
    """A worker holds ``hold_jobs`` running jobs and is SIGKILLed; a second worker is
    already running. The time is from the kill until every one of those jobs has started
    again elsewhere (its new attempt's ``started_at``, database clock)."""
    app = _app(p.url)
    probe = Probe(p.url)
    hold = app.registry.get("bench.hold")
    spec = "bench.systems.plunder_app:app"
    victim = _workers(p, 1, spec, concurrency=p.hold_jobs)
    rescuers: list[Any] = []
    try:
        wait_idle(victim, check=lambda: _sessions(app, 1))
        ids = [j.id for j in hold.enqueue_many([(HOLD_SECONDS,)] * p.hold_jobs)]
        marks = ",".join(str(i) for i in ids)
        wait_until(
            lambda: (
                probe.scalar(
                    f"SELECT count(*) FROM plunder_jobs WHERE id IN ({marks}) "
                    "AND status = 'running'"
                )
                == len(ids)
            ),
            timeout=30,
            what="the victim to hold its jobs",
        )
        rescuers = _workers(p, 1, spec, concurrency=p.hold_jobs)
        wait_idle(rescuers, check=lambda: _sessions(app, 2))
        killed = time.time()
        victim[0].send_signal(signal.SIGKILL)
        victim[0].wait()
        wait_until(
            lambda: (
                probe.scalar(
                    f"SELECT count(*) FROM plunder_jobs WHERE id IN ({marks}) "
                    "AND status = 'running' AND attempt >= 2"
                )
                == len(ids)
            ),
            timeout=p.rescue_cap,
            what="the rescue",
        )
        restarted = probe.scalar(f"SELECT max(started_at) FROM plunder_jobs WHERE id IN ({marks})")
    except BenchError:
        raise
    finally:
        stop_all(victim + rescuers, grace=0.0)
        probe.close()
        app.close()
    return {"seconds": _epoch(restarted) - killed, "jobs": len(ids)}  # type: ignore[operator]


POOL_CONCURRENCY = 8  # a process each in the warm pool: about what a 2-core machine holds


def pool(p: Params) -> dict[str, Any]:
    """``jobs`` no-op jobs through one worker with ``-c 8``: its plain-function tasks on
    threads, or (``--pool process`` in its worker_args) in its warm process pool. A first
    round of jobs warms the pool (its children spawned, the app imported) before the
    clock starts, as a long-running worker's would be."""
    app = _app(p.url)
    noop = app.registry.get("bench.noop")
    probe = Probe(p.url)
    marks = {"low": 0}

    def start() -> list[Any]:
        procs = _workers(p, 1, concurrency=POOL_CONCURRENCY)
        wait_idle(procs, check=lambda: _sessions(app, 1))
        for job in noop.enqueue_many([(i,) for i in range(4 * POOL_CONCURRENCY)]):
            job.result(timeout=120)
        marks["low"] = probe.scalar("SELECT coalesce(max(id), 0) FROM plunder_jobs")
        return procs

    calls = [(i,) for i in range(p.jobs)]
    try:
        return gated_drain(
            start,
            lambda: noop.enqueue_many(calls),
            lambda: probe.scalar(
                "SELECT count(*) FROM plunder_jobs WHERE id > %s "
                "AND status IN ('pending', 'running')",
                marks["low"],
            ),
            jobs=p.jobs,
            timeout=p.timeout,
            last_finish=lambda: _epoch(
                probe.scalar(
                    "SELECT max(finished_at) FROM plunder_jobs WHERE id > %s", marks["low"]
                )
            ),
            unlocked=probe.unlocked,
        ) | {"concurrency": POOL_CONCURRENCY}
    finally:
        probe.close()
        app.close()


def limits(p: Params) -> dict[str, Any]:
    """Scenario 11 (bench.systems.plunder_limits): a limit of 10 beside unlimited work."""
    from bench.systems import plunder_limits

    return plunder_limits.limits(p)


def fairness(p: Params) -> dict[str, Any]:
    """Scenario 14 (bench.systems.plunder_fairness): a small tenant's wait behind a
    large one's burst, on a plain queue and on a fair one."""
    from bench.systems import plunder_fairness

    return plunder_fairness.fairness(p)


def ordered(p: Params) -> dict[str, Any]:
    """Scenario 16 (bench.systems.plunder_ordered): ordered keys against unordered."""
    from bench.systems import plunder_ordered

    return plunder_ordered.ordered(p)


def flows(p: Params) -> dict[str, Any]:
    """Scenario 15 (bench.systems.plunder_flows): workflows' latency and a fan-out/in."""
    from bench.systems import plunder_flows

    return plunder_flows.flows(p)


SCENARIOS = {
    "fairness": fairness,
    "flows": flows,
    "limits": limits,
    "ordered": ordered,
    "pool": pool,
    "enqueue": enqueue,
    "drain": drain,
    "latency": latency,
    "rescue": rescue,
    "depth": depth,
    "first_line": first_line,
    "fleet": fleet,
    "rebalance": rebalance,
    "affinity": affinity,
    "cost": cost,
}
