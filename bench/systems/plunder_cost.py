"""Scenario 17, slot cost (docs/decisions/0019-slot-cost.md): 2 worker processes
(``-c 8`` each) and a burst of jobs of mixed cost, enqueued one after another in a shuffled order
(a fixed seed): ``COST_JOBS`` jobs, of cost 1 (20 ms), 2 (40 ms), 4 (80 ms) and 8 (80 ms).

* utilisation: Σ cost × duration / (slots × wall), each run's duration from its start to
  its end as the database stamps them (``started_at``, ``finished_at``: the claim and the
  acknowledgement, so a little more than the task ran), the wall from the first start to
  the last end: the share of the fleet's slots that the jobs held;
* most at once: the most slots held at once on one worker, from the same stamps (an
  acknowledgement may commit after the claim that reused its slot, so it may read above 8
  without any worker running more than 8: the worker's own count is the test suite's);
* the longest wait (``started_at - created_at``) of the jobs of cost 8 beside that of the
  jobs of cost 1: a costly job is not starved by the cheap ones behind it.
"""

from __future__ import annotations

import random
import time
from typing import Any

from bench.common import Params, stop_all, wait_idle, wait_until
from bench.systems.plunder import Probe, _app, _workers

WORKERS, CONCURRENCY = 2, 8
COST_JOBS = 600
MIX = ((1, 0.02), (2, 0.04), (4, 0.08), (8, 0.08))  # (cost, seconds)


def cost(p: Params) -> dict[str, Any]:
    app = _app(p.url)
    probe = Probe(p.url)
    procs = _workers(p, WORKERS, "bench.systems.plunder_app:app", CONCURRENCY)
    try:
        wait_idle(procs, check=lambda: len(app.store.session_list()) >= WORKERS, timeout=120)
        count = int(p.extra.get("cost_jobs", 60 if p.jobs < 1_000 else COST_JOBS))
        started = time.monotonic()
        ids = _burst(app, count)
        enqueued = time.monotonic() - started
        among, by = probe.among("id"), probe.ids(ids)
        done = f"SELECT count(*) FROM plunder_jobs WHERE {among} AND status = 'succeeded'"
        wait_until(lambda: probe.scalar(done, by) == len(ids), timeout=p.timeout, what="all")
        started_at = probe.epoch("started_at")
        runs = probe.rows(
            f"SELECT cost, run_pid, {started_at}, {probe.epoch('finished_at')}, "
            f"{started_at} - {probe.epoch('created_at')} FROM plunder_jobs WHERE {among}",
            by,
        )
    finally:
        stop_all(procs, grace=2.0)
        probe.close()
        app.close()
    return _measured(runs) | {"enqueue_seconds": enqueued}


def _burst(app: Any, count: int) -> list[int]:
    hold = app.registry.get("bench.hold")
    mix = [MIX[i % len(MIX)] for i in range(count)]
    random.Random(17).shuffle(mix)
    ids = []
    for slots, seconds in mix:  # one enqueue per cost: the order kept by ids
        ids.append(hold.options(cost=slots).enqueue(seconds).id)
    return ids


def _measured(runs: list[Any]) -> dict[str, Any]:
    start = min(r[2] for r in runs)
    end = max(r[3] for r in runs)
    held = sum(c * (f - s) for c, _, s, f, _ in runs)
    most = 0
    for pid in {r[1] for r in runs}:
        mine = [(c, s, f) for c, p, s, f, _ in runs if p == pid]
        most = max(most, max(sum(c for c, s, f in mine if s <= at < f) for _, at, _ in mine))
    waits = {c: max(w for k, _, _, _, w in runs if k == c) for c, _ in MIX}
    return {
        "utilisation": held / (WORKERS * CONCURRENCY * (end - start)),
        "most_at_once": most,
        "seconds": end - start,
        "rate": len(runs) / (end - start),
        "wait_max_cost8_ms": waits[8] * 1000,
        "wait_max_cost1_ms": waits[1] * 1000,
        "jobs": len(runs),
    }
