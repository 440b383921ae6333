"""Scenario 14, fairness between tenants: for a plain queue and then a fair one, in one
sitting,

    tenant a enqueues ``jobs`` no-ops (batches of 1,000; no worker runs yet: a burst
    that is all pending at once) ──▶ 2 worker processes start ──▶ 1 s after their
    sessions opened, tenant b enqueues ``small`` (100) ──▶ b's jobs all end ──▶ a's
    backlog drains (untimed) ──▶ the workers stop

* b's wait: each b job's ``started_at - created_at`` (the database's clock), p50/p99;
* a's drain rate on each queue, from the workers' start: what fairness costs the bulk.

On the plain queue b's jobs wait behind a's backlog (oldest first); on the fair one a
claim takes the groups in turn, so b's wait should not grow with a's backlog.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

from bench.common import Params, percentiles, spawn, stop_all, wait_until
from bench.systems.plunder import Probe, _app, _concurrency, _epoch

WORKERS, BATCH, SMALL, LATER = 2, 1_000, 100, 1.0
QUEUES = {"plain": "bench.tenant_plain", "fair": "bench.tenant"}


def fairness(p: Params) -> dict[str, Any]:
    from bench.systems import plunder_fair_app  # noqa: F401 (registers the tenants' tasks)

    app = _app(p.url)
    app.fair("bench_fair")
    probe = Probe(p.url)
    small = int(p.extra.get("small", SMALL))
    out: dict[str, Any] = {"jobs": p.jobs, "small": small, "workers": WORKERS}
    try:
        for kind, task_name in QUEUES.items():
            out[kind] = _round(p, app, probe, task_name, small)
    finally:
        probe.close()
        app.close()
    out["rate"] = out["fair"]["a_rate"]
    out["b_p99_plain_ms"] = out["plain"]["b_wait"]["p99"]
    out["b_p99_fair_ms"] = out["fair"]["b_wait"]["p99"]
    return out


def _workers(p: Params) -> list[Any]:
    argv = [sys.executable, "-m", "plunder", "--db", p.url, "--log-level", "WARNING",
            "worker", "-A", "bench.systems.plunder_fair_app:app", "-q", "bench_plain,bench_fair",
            "-c", str(_concurrency(p.url))]  # fmt: skip
    log = Path(p.workdir) / "worker.log"
    return [spawn(argv, env={"PLUNDER_URL": p.url}, log=log) for _ in range(WORKERS)]


def _round(p: Params, app: Any, probe: Probe, task_name: str, small: int) -> dict[str, Any]:
    task = app.registry.get(task_name)
    a_ids: list[int] = []
    for first in range(0, p.jobs, BATCH):
        calls = [("a", i) for i in range(first, min(p.jobs, first + BATCH))]
        a_ids += [j.id for j in task.options(group="a").enqueue_many(calls)]
    left = "SELECT count(*) FROM plunder_jobs WHERE id BETWEEN %s AND %s AND status <> 'succeeded'"
    procs = _workers(p)
    try:
        started = time.time()
        wait_until(lambda: len(app.store.session_list()) >= WORKERS, timeout=300, what="workers")
        time.sleep(LATER)
        calls = [("b", i) for i in range(small)]
        b_ids = [j.id for j in task.options(group="b").enqueue_many(calls)]
        b_low, b_high = min(b_ids), max(b_ids)
        wait_until(lambda: probe.scalar(left, b_low, b_high) == 0, timeout=p.timeout, what="b")
        a_left_at_b = int(probe.scalar(left, min(a_ids), max(a_ids)))
        wait_until(
            lambda: probe.scalar(left, min(a_ids), max(a_ids)) == 0, timeout=p.timeout, what="a"
        )
    finally:
        stop_all(procs)
    rows = probe.rows(
        "SELECT created_at, started_at FROM plunder_jobs WHERE id BETWEEN %s AND %s",
        b_low,
        b_high,
    )
    waits = [_epoch(s) - _epoch(c) for c, s in rows]
    end = _epoch(
        probe.scalar(
            "SELECT max(finished_at) FROM plunder_jobs WHERE id BETWEEN %s AND %s",
            min(a_ids),
            max(a_ids),
        )
    )
    return {
        "b_wait": percentiles(waits),
        "a_rate": p.jobs / (end - started),
        "a_left_when_b_done": a_left_at_b,
    }
