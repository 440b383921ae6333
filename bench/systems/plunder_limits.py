"""Scenario 11, a concurrency limit beside unlimited work: 4 worker processes (the real
command line, ``-c 50`` each), idle before the jobs arrive; rounds that alternate

    alone:  ``jobs`` no-op jobs, enqueued in batches of 1,000 ──▶ the last one ends
    beside: ``limited`` 10 ms jobs of a key limited to 10 at once (bench.limited), then
            the same ``jobs`` no-ops ──▶ the last no-op ends (the limited jobs drain on)

* ratio: the no-ops' drain rate beside the limit over their rate alone (the median of the
  rounds of each; target ≥ 0.9): what the limit costs the work beside it;
* most at once: the most limited runs that overlapped, from their start and end times in
  the database (the limit: 10), over every round.

Alone and beside alternate in one sitting, so that the machine's drift over minutes falls
on both alike.
"""

from __future__ import annotations

import statistics
import time
from datetime import datetime
from typing import Any

from bench.common import BenchError, Params, stop_all, wait_idle, wait_until
from bench.systems.plunder import Probe, _app, _epoch, _sessions, _workers

WORKERS, CONCURRENCY, CEILING, BATCH = 4, 50, 10, 1_000
ROUNDS = 3  # of each kind


def limits(p: Params) -> dict[str, Any]:
    app = _app(p.url)
    probe = Probe(p.url)
    procs = _workers(p, WORKERS, concurrency=CONCURRENCY)
    limited = int(p.extra.get("limited", max(100, p.jobs // 10)))
    rates: dict[str, list[float]] = {"alone": [], "beside": []}
    try:
        wait_idle(procs, check=lambda: _sessions(app, WORKERS), timeout=300)
        for _ in range(int(p.extra.get("rounds", ROUNDS))):
            for kind in ("alone", "beside"):
                rates[kind].append(_round(p, app, probe, limited if kind == "beside" else 0))
        wait_until(lambda: _left(probe, "bench.limited") == 0, timeout=p.timeout, what="limited")
        most = _most_at_once(probe)
    finally:
        stop_all(procs)
        probe.close()
        app.close()
    if most > CEILING:
        raise BenchError(f"the limit of {CEILING} was exceeded: {most} limited runs at once")
    alone, beside = statistics.median(rates["alone"]), statistics.median(rates["beside"])
    return {
        "rate": beside,
        "rate_alone": alone,
        "ratio": beside / alone,
        "ratios": [b / a for a, b in zip(rates["alone"], rates["beside"], strict=True)],
        "most_at_once": most,
        "ceiling": CEILING,
        "jobs": p.jobs,
        "limited": limited,
        "workers": WORKERS,
        "concurrency": CONCURRENCY,
    }


def _round(p: Params, app: Any, probe: Probe, limited: int) -> float:
    """One round: the no-ops' drain rate, from just before their first batch is enqueued
    to the last one's finished_at (database clock, same machine)."""
    noop = app.registry.get("bench.noop")
    low = probe.scalar("SELECT coalesce(max(id), 0) FROM plunder_jobs")
    if limited:
        app.registry.get("bench.limited").enqueue_many([(i,) for i in range(limited)])
    started = time.time()
    for first in range(0, p.jobs, BATCH):
        noop.enqueue_many([(i,) for i in range(first, min(p.jobs, first + BATCH))])
    wait_until(lambda: _left(probe, "bench.noop") == 0, timeout=p.timeout, what="the drain")
    end = _epoch(
        probe.scalar(
            "SELECT max(finished_at) FROM plunder_jobs WHERE id > %s AND task = 'bench.noop'",
            low,
        )
    )
    return p.jobs / ((end if end is not None else time.time()) - started)


def _left(probe: Probe, task: str) -> int:
    return int(
        probe.scalar(
            "SELECT count(*) FROM plunder_jobs WHERE task = %s "
            "AND status IN ('pending', 'running')",
            task,
        )
    )


def _most_at_once(probe: Probe) -> int:
    """The most runs of limited jobs that overlapped: each succeeded run is on its job
    (started_at, finished_at), every other in plunder_runs."""
    spans = probe.rows(
        "SELECT started_at, finished_at FROM plunder_jobs WHERE task = 'bench.limited' "
        "AND status = 'succeeded' UNION ALL SELECT r.started_at, r.finished_at "
        "FROM plunder_runs AS r JOIN plunder_jobs AS j ON j.id = r.job_id "
        "WHERE j.task = 'bench.limited'"
    )
    edges: list[tuple[float, int]] = []
    for start, end in spans:
        edges += [(_seconds(start), 1), (_seconds(end), -1)]
    edges.sort()  # an end before a start at the same time
    most = now = 0
    for _, step in edges:
        now += step
        most = max(most, now)
    return most


def _seconds(value: datetime | float) -> float:
    found = _epoch(value)
    if found is None:
        raise BenchError("a limited run without its start or end")
    return found
