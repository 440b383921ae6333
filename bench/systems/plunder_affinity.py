"""Scenario 13, affinity: 4 worker processes (``-c 2`` each), 2 of them holding label
``bench=A`` (``--label``), and jobs that prefer it (docs/guide/affinity.md).

* share: a burst of ``AFFINITY_BURST`` jobs of 20 ms preferring A, at once. A job that
  started on another worker while fewer than all 4 of the holders' slots were running
  (by the jobs' own start and end stamps, the database clock) ran elsewhere *while a holder
  had a free slot*; share = jobs on holders / (jobs on holders + those). Target ≥ 95 %.
* wait: both holders busy (4 long jobs that require A fill their slots), then jobs that
  prefer A and plain jobs, one at a time, alternating: enqueue call→task's first line
  (time.monotonic(), one clock for every process). The preferred job's extra wait is
  the difference of the medians; target ≤ 10 ms (it goes elsewhere at once: no backoff).
"""

from __future__ import annotations

import statistics
import time
from typing import Any

from bench.common import Params, stop_all, wait_idle, wait_until
from bench.systems.plunder import Probe, _app, _workers

HOLDERS, OTHERS, CONCURRENCY = 2, 2, 2
LABEL = {"bench": "A"}
AFFINITY_BURST = 400
ROUNDS = 40  # of the wait: one preferred and one plain job each


def affinity(p: Params) -> dict[str, Any]:
    app = _app(p.url)
    probe = Probe(p.url)
    procs: list[Any] = []
    try:
        for count, args in ((HOLDERS, ["--label", "bench=A"]), (OTHERS, [])):
            extra = {**p.extra, "worker_args": args}
            params = Params(**{**p.__dict__, "extra": extra})
            procs += _workers(params, count, "bench.systems.plunder_app:app", CONCURRENCY)
        wait_idle(procs, check=lambda: len(app.store.session_list()) >= len(procs), timeout=120)
        holders = {s.pid for s in app.store.session_list() if s.labels}
        share = _share(app, probe, holders, p.timeout)
        waits = _waits(app, holders)
    finally:
        stop_all(procs, grace=2.0)
        probe.close()
        app.close()
    return share | waits


def _share(app: Any, probe: Probe, holders: set[int], timeout: float) -> dict[str, Any]:
    hold = app.registry.get("bench.hold").options(affinity=LABEL)
    ids = [j.id for j in hold.enqueue_many([(0.02,)] * AFFINITY_BURST)]
    among, by = probe.among("id"), probe.ids(ids)
    done = f"SELECT count(*) FROM plunder_jobs WHERE {among} AND status = 'succeeded'"
    wait_until(lambda: probe.scalar(done, by) == len(ids), timeout=timeout, what="the burst")
    runs = probe.rows(
        f"SELECT run_pid, {probe.epoch('started_at')}, {probe.epoch('finished_at')} "
        f"FROM plunder_jobs WHERE {among}",
        by,
    )
    on = [(s, f) for pid, s, f in runs if pid in holders]
    slots = HOLDERS * CONCURRENCY
    elsewhere = [s for pid, s, _ in runs if pid not in holders]
    free = [s for s in elsewhere if sum(1 for a, b in on if a <= s < b) < slots]
    return {
        "on_holders": len(on),
        "elsewhere": len(elsewhere),
        "elsewhere_holder_free": len(free),
        "share": len(on) / max(1, len(on) + len(free)),
    }


def _waits(app: Any, holders: set[int]) -> dict[str, Any]:
    long = app.registry.get("bench.hold").options(require=LABEL)
    busy = long.enqueue_many([(600.0,)] * (HOLDERS * CONCURRENCY))
    wait_until(
        lambda: all(app.job(j.id).status.value == "running" for j in busy),
        timeout=60,
        what="the holders busy",
    )
    clock = app.registry.get("bench.clock")
    preferred, plain = clock.options(affinity=LABEL), clock.options()
    took: dict[str, list[float]] = {"preferred": [], "plain": []}
    for _ in range(ROUNDS):
        for name, task in (("preferred", preferred), ("plain", plain)):
            sent = time.monotonic()
            first_line = task.enqueue().result(timeout=30)
            took[name].append((first_line - sent) * 1000)
            time.sleep(0.02)
    for job in busy:
        job.cancel()
    pref, base = (statistics.median(took[k]) for k in ("preferred", "plain"))
    return {
        "wait_preferred_ms": pref,
        "wait_plain_ms": base,
        "extra_wait_ms": pref - base,
        "wait_preferred_p95_ms": statistics.quantiles(took["preferred"], n=20)[-1],
    }
