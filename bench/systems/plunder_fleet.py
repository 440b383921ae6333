"""Scenario 9, cost as the fleet grows: plunder on PostgreSQL with ``workers`` worker
processes (the real command line, ``-c 50`` each), all started and idle before the jobs
arrive.

    start N workers ──▶ idle (sessions open) ──▶ idle CPU over ``idle`` s ──▶ enqueue
    ``jobs`` in batches of ``batch`` (one producer) ──▶ last job finished

* idle CPU: each worker process's utime + stime (/proc/<pid>/stat) over ``idle`` seconds
  of idleness, as % of one core (mean and most of the processes);
* connections: rows of pg_stat_activity whose application_name starts ``plunder:worker:``
  (the worker's own, its wake-up hub's and its janitor's), per worker process (the name
  carries the pid), while idle and the most seen while the jobs drain;
* drain rate: from just before the first batch is enqueued to the last job's
  ``finished_at`` (database clock, same machine); the workers run while the producer
  enqueues, as they would in use.
"""

from __future__ import annotations

import statistics
import subprocess
import time
from typing import Any

from bench.common import (
    CLOCK_TICKS,
    BenchError,
    Params,
    cpu_ticks,
    stop_all,
    wait_idle,
    wait_until,
)
from bench.systems.plunder import Probe, _app, _epoch, _sessions, _workers

CONCURRENCY = 50
STARTUP = 300.0  # 16 interpreters importing plunder at once on a shared 2-core machine
APP_PREFIX = "plunder:worker:"
CONNECTIONS = (
    "SELECT application_name FROM pg_stat_activity "
    "WHERE datname = current_database() AND application_name LIKE %s"
)


class Connections:
    """Counts each worker process's connections; keeps the most seen on one process and
    the most seen on all of them together."""

    def __init__(self, probe: Probe, procs: list[subprocess.Popen[bytes]]) -> None:
        self.probe = probe
        self.pids = {str(p.pid) for p in procs}
        self.most = 0
        self.most_total = 0

    def per_process(self) -> int:
        """The most connections any one worker process holds right now."""
        counts: dict[str, int] = {}
        for (name,) in self.probe.rows(CONNECTIONS, APP_PREFIX + "%"):
            # application_name: plunder:worker:<host>:<pid>[:listen|:janitor]
            parts = name.removeprefix(APP_PREFIX).split(":")
            pid = parts[1] if len(parts) > 1 and parts[1] in self.pids else "?"
            counts[pid] = counts.get(pid, 0) + 1
        if "?" in counts:
            raise BenchError(f"worker connections with no worker's pid: {counts['?']}")
        now = max(counts.values(), default=0)
        self.most = max(self.most, now)
        self.most_total = max(self.most_total, sum(counts.values()))
        return now


def idle_cpu(procs: list[subprocess.Popen[bytes]], seconds: float) -> tuple[float, float]:
    """Mean and most CPU of the processes over ``seconds``, in % of one core. The kernel
    counts whole ticks (10 ms): the share is taken over the nominal ``seconds``, not the
    few milliseconds more that the sleep lasted, so that 5 ticks in 5 s read 1.0 %, not
    just under it."""
    before = {p.pid: cpu_ticks(p.pid) for p in procs}
    time.sleep(seconds)
    after = {p.pid: cpu_ticks(p.pid) for p in procs}
    shares = [(after[pid] - before[pid]) / CLOCK_TICKS / seconds * 100 for pid in before]
    return statistics.mean(shares), max(shares)


def _alive(procs: list[subprocess.Popen[bytes]], when: str) -> None:
    for p in procs:
        if p.poll() is not None:
            raise BenchError(f"a worker exited with {p.returncode} {when}")


def fleet(p: Params) -> dict[str, Any]:
    app = _app(p.url)
    probe = Probe(p.url)
    procs = _workers(p, p.workers, concurrency=CONCURRENCY)
    try:
        wait_idle(procs, check=lambda: _sessions(app, p.workers), timeout=STARTUP)
        cpu, cpu_most = idle_cpu(procs, p.idle)
        _alive(procs, "while idle")
        held = Connections(probe, procs)
        conns_idle, conns_idle_total = held.per_process(), held.most_total
        held.most = held.most_total = 0  # from here on: while the jobs drain
        drain = _drain(p, app, probe, held)
        _alive(procs, "during the drain")
    finally:
        stop_all(procs)
        probe.close()
        app.close()
    return drain | {
        "jobs": p.jobs,
        "workers": p.workers,
        "concurrency": CONCURRENCY,
        "idle_cpu": cpu,
        "idle_cpu_max": cpu_most,
        "conns_idle": conns_idle,
        "conns_drain": held.most,
        "conns_idle_mean": conns_idle_total / p.workers,
        "conns_drain_mean": held.most_total / p.workers,
    }


def _drain(p: Params, app: Any, probe: Probe, held: Connections) -> dict[str, float]:
    """Enqueue the jobs in batches while the workers run; the rate until the last ends."""
    noop = app.registry.get("bench.noop")
    low = probe.scalar("SELECT coalesce(max(id), 0) FROM plunder_jobs")
    started = time.time()
    for first in range(0, p.jobs, p.batch):
        noop.enqueue_many([(i,) for i in range(first, min(p.jobs, first + p.batch))])
        if first % (10 * p.batch) == 0:
            held.per_process()
    enqueued = time.time() - started

    def drained() -> bool:
        held.per_process()
        left = probe.scalar(
            "SELECT count(*) FROM plunder_jobs WHERE id > %s AND status IN ('pending', 'running')",
            low,
        )
        return bool(left == 0)

    wait_until(drained, timeout=p.timeout, interval=0.1, what="the drain")
    end = _epoch(probe.scalar("SELECT max(finished_at) FROM plunder_jobs WHERE id > %s", low))
    seconds = (end if end is not None else time.time()) - started
    return {"rate": p.jobs / seconds, "seconds": seconds, "enqueue_seconds": enqueued}
