"""Scenario 11, a concurrency limit beside unlimited work: 4 worker processes (the real
command line, ``-c 50`` each), idle before the jobs arrive; rounds that alternate

    alone:     ``jobs`` no-op jobs, enqueued in batches of 1,000 ──▶ the last one ends
    beside:    ``limited`` 10 ms jobs of a key limited to 10 at once (bench.limited), then
               the same ``jobs`` no-ops ──▶ the last no-op ends (the limited jobs drain on)
    unlimited: the same, the 10 ms jobs without a limit (bench.sleep10)

* ratio: the no-ops' drain rate beside the limit over their rate alone (the median of the
  rounds of each; target ≥ 0.9): what the limited work and its limit cost the work beside;
* ratio_unlimited: beside the limit over beside the same jobs unlimited: what the limit
  itself costs;
* most at once: the most limited runs that overlapped, from their start and end times in
  the database (the limit: 10), over every round.

The kinds of round take turns in one sitting, each going first in turn, so that the
machine's drift over minutes falls on all alike; the 10 ms jobs left after a round drain
before the next one starts.
"""

from __future__ import annotations

import statistics
import time
from datetime import datetime
from typing import Any

from bench.common import BenchError, Params, stop_all, wait_idle, wait_until
from bench.systems.plunder import Probe, _app, _epoch, _sessions, _workers

WORKERS, CONCURRENCY, CEILING, BATCH = 4, 50, 10, 1_000
ROUNDS = 4  # of each kind
# the kinds of round, and the task of the jobs beside the no-ops in each
KINDS = {"alone": "", "beside": "bench.limited", "unlimited": "bench.sleep10"}


def limits(p: Params) -> dict[str, Any]:
    app = _app(p.url)
    probe = Probe(p.url)
    procs = _workers(p, WORKERS, concurrency=CONCURRENCY)
    limited = int(p.extra.get("limited", max(100, p.jobs // 10)))
    rates: dict[str, list[float]] = {kind: [] for kind in KINDS}
    try:
        wait_idle(procs, check=lambda: _sessions(app, WORKERS), timeout=300)
        for n in range(int(p.extra.get("rounds", ROUNDS))):
            order = list(KINDS)
            for kind in order[n % 3 :] + order[: n % 3]:
                task = KINDS[kind]
                rates[kind].append(_round(p, app, probe, task, limited))
                # the 10 ms jobs left drain before the next round (untimed)
                wait_until(lambda t=task: _left(probe, t) == 0, timeout=p.timeout, what="rest")
        most = _most_at_once(probe)
    finally:
        stop_all(procs)
        probe.close()
        app.close()
    if most > CEILING:
        raise BenchError(f"the limit of {CEILING} was exceeded: {most} limited runs at once")
    alone, beside = statistics.median(rates["alone"]), statistics.median(rates["beside"])
    unlimited = statistics.median(rates["unlimited"])
    return {
        "rate": beside,
        "rate_alone": alone,
        "rate_unlimited": unlimited,
        "ratio": beside / alone,
        "ratio_unlimited": beside / unlimited,
        "rates": rates,
        "most_at_once": most,
        "ceiling": CEILING,
        "jobs": p.jobs,
        "limited": limited,
        "workers": WORKERS,
        "concurrency": CONCURRENCY,
    }


def _round(p: Params, app: Any, probe: Probe, beside: str, count: int) -> float:
    """One round: the no-ops' drain rate, from just before their first batch is enqueued
    to the last one's finished_at (database clock, same machine), with ``count`` jobs of
    the task ``beside`` enqueued just before them (none: "")."""
    noop = app.registry.get("bench.noop")
    low = probe.scalar("SELECT coalesce(max(id), 0) FROM plunder_jobs")
    if beside:
        app.registry.get(beside).enqueue_many([(i,) for i in range(count)])
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
    if not task:
        return 0
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
