"""Scenario 16, ordered keys: 4 worker processes (the real command line, ``-q ordq -c
50`` each) on a queue of 8 partitions, idle before the jobs arrive; rounds that alternate

    unordered: ``jobs`` keyed no-op jobs (``keys`` keys, in turn), in batches of 1,000
               ──▶ the last one ends
    ordered:   the same jobs with ``ordered=True``: one job of a key at a time, in order

* rate and rate_unordered: the drain rates (median of the rounds of each), from just before
  the first batch is enqueued to the last job's finished_at (database clock);
* ratio: ordered over unordered;
* overlaps and out_of_order: over every ordered round, from the runs' start and end
  times in the database, the runs of a key that overlapped another of the same key, and
  the jobs that started before a job of their key enqueued earlier (both must be 0).
"""

from __future__ import annotations

import itertools
import statistics
import time
from collections import defaultdict
from typing import Any

from bench.common import BenchError, Params, stop_all, wait_idle, wait_until
from bench.systems.plunder import Probe, _app, _epoch, _sessions, _workers

WORKERS, CONCURRENCY, PARTITIONS, BATCH, ROUNDS = 4, 50, 8, 1_000, 3
KINDS = ("unordered", "ordered")


def ordered(p: Params) -> dict[str, Any]:
    app = _app(p.url)
    app.partition("ordq", PARTITIONS)
    probe = Probe(p.url)
    extra = {**p.extra, "worker_args": ["-q", "ordq"]}
    params = Params(**{**p.__dict__, "extra": extra})
    procs = _workers(params, WORKERS, concurrency=CONCURRENCY)
    jobs = int(p.extra.get("ordered_jobs", min(p.jobs, 5_000)))
    keys = int(p.extra.get("keys", 100))
    rates: dict[str, list[float]] = {kind: [] for kind in KINDS}
    lows: list[int] = []
    try:
        wait_idle(procs, check=lambda: _sessions(app, WORKERS), timeout=300)
        for n in range(int(p.extra.get("rounds", ROUNDS))):
            for kind in KINDS[n % 2 :] + KINDS[: n % 2]:
                low = int(probe.scalar("SELECT coalesce(max(id), 0) FROM plunder_jobs"))
                if kind == "ordered":
                    lows.append(low)
                rates[kind].append(_round(p, app, probe, kind, jobs, keys, low))
        overlaps, out_of_order = _check(probe)
    finally:
        stop_all(procs)
        probe.close()
        app.close()
    if overlaps or out_of_order:
        raise BenchError(f"ordered keys broken: {overlaps} overlaps, {out_of_order} out of order")
    rate, unordered = statistics.median(rates["ordered"]), statistics.median(rates["unordered"])
    return {
        "rate": rate,
        "rate_unordered": unordered,
        "ratio": rate / unordered,
        "rates": rates,
        "overlaps": overlaps,
        "out_of_order": out_of_order,
        "jobs": jobs,
        "keys": keys,
        "workers": WORKERS,
        "concurrency": CONCURRENCY,
    }


def _round(p: Params, app: Any, probe: Probe, kind: str, jobs: int, keys: int, low: int) -> float:
    noop = app.registry.get("bench.noop").options(queue="ordq", ordered=kind == "ordered")
    makers = [noop.options(partition_key=f"k{k}") for k in range(keys)]
    started = time.time()
    for first in range(0, jobs, BATCH):
        batch = range(first, min(jobs, first + BATCH))
        app.enqueue_specs([makers[i % keys].spec((i,)) for i in batch])
    left = "SELECT count(*) FROM plunder_jobs WHERE id > %s AND status IN ('pending', 'running')"
    wait_until(lambda: int(probe.scalar(left, low)) == 0, timeout=p.timeout, what="the drain")
    end = _epoch(probe.scalar("SELECT max(finished_at) FROM plunder_jobs WHERE id > %s", low))
    return jobs / ((end if end is not None else time.time()) - started)


def _check(probe: Probe) -> tuple[int, int]:
    """Over every ordered job (they have a limit key): runs of one key that overlapped,
    and jobs that started before an earlier job of their key."""
    rows = probe.rows(
        "SELECT limit_key, id, started_at, finished_at FROM plunder_jobs "
        "WHERE limit_key IS NOT NULL AND status = 'succeeded'"
    )
    by_key: dict[str, list[tuple[float, float, int]]] = defaultdict(list)
    for key, job_id, start, end in rows:
        by_key[key].append((_epoch(start) or 0.0, _epoch(end) or 0.0, int(job_id)))
    overlaps = out_of_order = 0
    for runs in by_key.values():
        runs.sort()
        for before, after in itertools.pairwise(runs):
            overlaps += before[1] > after[0]
            out_of_order += before[2] > after[2]
    return overlaps, out_of_order
