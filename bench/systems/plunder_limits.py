"""Scenario 11, a concurrency limit beside unlimited work: 4 worker processes (the real
command line, ``-c 50`` each), idle before the jobs arrive; rounds, each of three drains
back to back:

    alone:     ``jobs`` no-op jobs, enqueued in batches of 1,000 ──▶ the last one ends
    beside:    ``limited`` 10 ms jobs of a key limited to 10 at once (bench.limited), then
               the same ``jobs`` no-ops ──▶ the last no-op ends (the limited jobs drain on)
    unlimited: the same, the 10 ms jobs without a limit (bench.sleep10)

* ratio: the median over the rounds of each round's no-op drain rate beside the limit over
  its rate alone (target ≥ 0.9): what the limited work and its limit cost the work beside;
* ratio_unlimited: the same, beside the limit over beside the same jobs unlimited: what
  the limit itself costs;
* rate, rate_alone, rate_unlimited: the median rate of each kind, for the record;
* most at once: the most limited runs that overlapped, from their start and end times in
  the database (the limit: 10), the most of any round.

The estimator, and why. This machine's speed drifts over minutes (other work shares its
two cores), so a ratio of two medians taken over a whole sitting mixes that drift into
the comparison; each round's ratio compares drains seconds apart instead, and the kind
that goes first turns each round (6 rounds: each kind twice in each place). And every
drain starts from the same table: before each one (untimed) the jobs of the last have
drained, their rows are deleted and, on PostgreSQL, the table vacuumed. Kept, a sitting's
finished rows grew the table by 22,000 a drain, and every later drain paid for what the
rows it did not read left in the indexes (the dead index entries a claim walks until a
VACUUM, which the janitor now runs: docs/decisions/0027-vacuum-the-claim-index.md), so
the rates fell round after round whatever the kind; so did the harness's own poll for a
drain's end, then a count that read the whole table 20 times a second (see _active). That
is a cost of retention, not of the limit; scenario 11 measures the limit.
"""

from __future__ import annotations

import statistics
import time
from datetime import datetime
from typing import Any

from bench.common import BenchError, Params, stop_all, wait_idle, wait_until
from bench.systems.plunder import Probe, _app, _epoch, _sessions, _workers

WORKERS, CONCURRENCY, CEILING, BATCH = 4, 50, 10, 1_000
ROUNDS = 6  # each of three drains, so that each kind goes first, second and third twice
# the kinds of drain, and the task of the jobs beside the no-ops in each
KINDS = {"alone": "", "beside": "bench.limited", "unlimited": "bench.sleep10"}


def limits(p: Params) -> dict[str, Any]:
    app = _app(p.url)
    probe = Probe(p.url)
    procs = _workers(p, WORKERS, concurrency=CONCURRENCY)
    limited = int(p.extra.get("limited", max(100, p.jobs // 10)))
    rates: dict[str, list[float]] = {kind: [] for kind in KINDS}
    most = 0
    try:
        wait_idle(procs, check=lambda: _sessions(app, WORKERS), timeout=300)
        for n in range(int(p.extra.get("rounds", ROUNDS))):
            order = list(KINDS)
            for kind in order[n % 3 :] + order[: n % 3]:
                task = KINDS[kind]
                rates[kind].append(_drain(p, app, probe, task, limited))
                # the 10 ms jobs left drain before the next drain starts (untimed)
                wait_until(lambda t=task: not _active(probe, t), timeout=p.timeout, what="rest")
                if task == "bench.limited":
                    most = max(most, _most_at_once(probe))
                _clear(probe)
    finally:
        stop_all(procs)
        probe.close()
        app.close()
    if most > CEILING:
        raise BenchError(f"the limit of {CEILING} was exceeded: {most} limited runs at once")
    pairs = list(zip(rates["alone"], rates["beside"], rates["unlimited"], strict=True))
    ratios = [beside / alone for alone, beside, _ in pairs]
    ratios_unlimited = [beside / unlimited for _, beside, unlimited in pairs]
    return {
        "rate": statistics.median(rates["beside"]),
        "rate_alone": statistics.median(rates["alone"]),
        "rate_unlimited": statistics.median(rates["unlimited"]),
        "ratio": statistics.median(ratios),
        "ratio_unlimited": statistics.median(ratios_unlimited),
        "rates": rates,
        "ratios": ratios,
        "ratios_unlimited": ratios_unlimited,
        "most_at_once": most,
        "ceiling": CEILING,
        "jobs": p.jobs,
        "limited": limited,
        "workers": WORKERS,
        "concurrency": CONCURRENCY,
    }


def _drain(p: Params, app: Any, probe: Probe, beside: str, count: int) -> float:
    """One drain: the no-ops' rate, from just before their first batch is enqueued to the
    last one's finished_at (database clock, same machine), with ``count`` jobs of the task
    ``beside`` enqueued just before them (none: "")."""
    noop = app.registry.get("bench.noop")
    if beside:
        app.registry.get(beside).enqueue_many([(i,) for i in range(count)])
    started = time.time()
    for first in range(0, p.jobs, BATCH):
        noop.enqueue_many([(i,) for i in range(first, min(p.jobs, first + BATCH))])
    wait_until(lambda: not _active(probe, "bench.noop"), timeout=p.timeout, what="the drain")
    end = _epoch(
        probe.scalar("SELECT max(finished_at) FROM plunder_jobs WHERE task = 'bench.noop'")
    )
    return p.jobs / ((end if end is not None else time.time()) - started)


def _clear(probe: Probe) -> None:
    """The finished jobs of the last drain deleted (all of its jobs have ended), their
    runs with them, and PostgreSQL's table vacuumed: the next drain starts from the same
    table as the first."""
    probe.rows("DELETE FROM plunder_runs WHERE job_id IN (SELECT id FROM plunder_jobs "
               "WHERE status = 'succeeded') RETURNING job_id")  # fmt: skip
    probe.rows("DELETE FROM plunder_jobs WHERE status = 'succeeded' RETURNING id")
    if probe.path is None:
        probe.conn.execute("VACUUM plunder_jobs")


def _active(probe: Probe, task: str) -> bool:
    """Whether a job of ``task`` is pending or running: a probe of each of the partial
    indexes of pending and of running jobs. (A count of them read the whole table, 20 times
    a second on the cores the drain runs on: 27 ms a read once the table held 220,000
    finished jobs.)"""
    if not task:
        return False
    return bool(
        probe.scalar(
            "SELECT EXISTS (SELECT 1 FROM plunder_jobs WHERE status = 'pending' AND task = %s) "
            "OR EXISTS (SELECT 1 FROM plunder_jobs WHERE status = 'running' AND task = %s)",
            task,
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
