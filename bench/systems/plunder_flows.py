"""Scenario 15, workflows: one idle worker process (the real command line), then

plain:    ``rate`` jobs/s for ``seconds``, one per enqueue: enqueue call → the task's
          first line (time.monotonic() both), the latency a child is held to;
children: as many workflows of two jobs (a no-op parent → a child), one per enqueue at
          the same rate: the parent's finished_at (stamped by the database in the
          transaction that acknowledged it) → the child's first line (time.time(), the
          same machine's clock);
fan:      one workflow of a root, ``fan`` no-op children and a last job waiting for all
          of them (a fan-out and fan-in), enqueued in one call: its jobs/s from just
          before the enqueue to the last job's first line, and the enqueue's time;
fan-in:   then with ``FAN_WORKERS`` worker processes: ``fan`` no-op parents of one last
          job, all pending at once (parents ending together in several transactions, each
          settling the one child), the first start → the child's end; beside as many plain
          no-ops drained by the same workers, alternating, and the deadlocks PostgreSQL
          counted meanwhile.
"""

from __future__ import annotations

import time
from typing import Any

import plunder
from bench.common import Params, percentiles, stop_all, wait_idle
from bench.systems.plunder import Probe, _app, _epoch, _sessions, _workers

FAN = 10_000
FAN_WORKERS = 4
FAN_IN_ROUNDS = 2  # fan-in and plain drains, alternating


def flows(p: Params) -> dict[str, Any]:
    app = _app(p.url)
    probe = Probe(p.url)
    procs = _workers(p, 1, "bench.systems.plunder_app:app")
    fan = int(p.extra.get("fan", FAN))
    try:
        wait_idle(procs, check=lambda: _sessions(app, 1))
        time.sleep(0.5)
        plain = _plain(p, app)
        children = _children(p, app, probe)
        rate, seconds, enqueued = _fan(p, app, fan)
        procs += _workers(p, FAN_WORKERS - 1, "bench.systems.plunder_app:app")
        wait_idle(procs, check=lambda: _sessions(app, FAN_WORKERS))
        fan_in = _fan_in(app, probe, fan)
    finally:
        stop_all(procs)
        probe.close()
        app.close()
    return {
        "rate": rate,
        "seconds": seconds,
        "enqueue_seconds": enqueued,
        "fan": fan,
        **{f"plain_{k}": v for k, v in plain.items()},
        **{f"child_{k}": v for k, v in children.items()},
        **fan_in,
    }


def _steady(p: Params) -> Any:
    """The moments to send at: ``rate`` per second for ``seconds``."""
    start = time.monotonic()
    for i in range(int(p.rate * p.seconds)):
        time.sleep(max(0.0, start + i / p.rate - time.monotonic()))
        yield i


def _plain(p: Params, app: Any) -> dict[str, float]:
    clock = app.registry.get("bench.clock")
    sent = []
    for _ in _steady(p):
        before = time.monotonic()
        sent.append((before, clock.enqueue()))
    return percentiles([job.result(timeout=p.timeout) - before for before, job in sent])


def _children(p: Params, app: Any, probe: Probe) -> dict[str, float]:
    noop, wall = app.registry.get("bench.noop"), app.registry.get("bench.wall")
    sent = []
    for i in _steady(p):
        flow = plunder.Flow(app)
        parent = flow.add(noop, i)
        child = flow.add(wall, after=parent)
        workflow = flow.enqueue()
        sent.append((workflow.job(parent).id, workflow.job(child)))
    gaps = []
    for parent_id, child in sent:
        began = child.result(timeout=p.timeout)
        acked = _epoch(
            probe.scalar("SELECT finished_at FROM plunder_jobs WHERE id = %s", parent_id)
        )
        assert acked is not None
        gaps.append(began - acked)
    return percentiles(gaps)


def _fan(p: Params, app: Any, fan: int) -> tuple[float, float, float]:
    noop, wall = app.registry.get("bench.noop"), app.registry.get("bench.wall")
    flow = plunder.Flow(app)
    root = flow.add(noop, -1)
    last = flow.chord([plunder.call(noop, i) for i in range(fan)], plunder.call(wall), after=root)
    started = time.time()
    workflow = flow.enqueue()
    enqueued = time.time() - started
    ended = workflow.job(last).result(timeout=p.timeout)
    return (fan + 2) / (ended - started), ended - started, enqueued


def _fan_in(app: Any, probe: Probe, fan: int) -> dict[str, float]:
    """Jobs/s of ``fan`` parents → one child and of ``fan`` plain jobs, several workers;
    the best of FAN_IN_ROUNDS each, alternating; deadlocks counted by PostgreSQL."""
    noop = app.registry.get("bench.noop")
    deadlocks = "SELECT deadlocks FROM pg_stat_database WHERE datname = current_database()"
    before = probe.scalar(deadlocks) if probe.path is None else 0
    fan_in, plain = [], []
    for _ in range(FAN_IN_ROUNDS):
        flow = plunder.Flow(app)
        parents = flow.group(*[plunder.call(noop, i) for i in range(fan)])
        flow.add(noop, -1, after=parents)
        ids = flow.enqueue().ids
        fan_in.append((fan + 1) / _drained(probe, ids))
        ids = [job.id for job in noop.enqueue_many([(i,) for i in range(fan)])]
        plain.append(fan / _drained(probe, ids))
    after = probe.scalar(deadlocks) if probe.path is None else 0
    return {"fan_in_rate": max(fan_in), "fan_plain_rate": max(plain),
            "fan_in_deadlocks": after - before}  # fmt: skip


def _drained(probe: Probe, ids: list[int]) -> float:
    """Seconds from the first of ``ids`` starting to the last ending (the database's
    clock), that is, without their enqueue."""
    first, last = min(ids), max(ids)
    count = "SELECT count(*) FROM plunder_jobs WHERE id BETWEEN %s AND %s AND finished_at IS NULL"
    while probe.scalar(count, first, last):
        time.sleep(0.01)
    started, ended = probe.rows(
        "SELECT min(started_at), max(finished_at) FROM plunder_jobs WHERE id BETWEEN %s AND %s",
        first,
        last,
    )[0]
    return float(_epoch(ended) - _epoch(started))  # type: ignore[operator]
