"""Periodic jobs under faults (docs/guide/periodic.md): three ``plunder worker`` processes,
each with its janitor, and a schedule ticking every second for 20 s (or
PLUNDER_SCHEDULES_WINDOW seconds). The lease holder is SIGKILLed, then the next holder
SIGSTOPped past its lease and SIGCONTed, and one worker's clock runs 30 s ahead: exactly
one job per tick, no gap, no duplicate, because the ticks are the database clock's and
each is enqueued under the lease in the transaction that moves the schedule past it."""

from __future__ import annotations

import collections
import os
import time
from datetime import datetime, timedelta
from pathlib import Path

from plunder.cron import ScheduleSpec
from plunder.janitor import LEASE_NAME
from plunder.model import Lease
from tests.chaos.harness import Proc, System

CLOCK_AHEAD = Path(__file__).resolve().parent / "clock_ahead"
# seconds of ticks under test: 20 in the suite, the 30 with PLUNDER_SCHEDULES_WINDOW=30
WINDOW = int(os.environ.get("PLUNDER_SCHEDULES_WINDOW", "20"))
NAME = "every-second"


def holder(system: System, procs: list[Proc], *, newer_than: int = 0) -> tuple[Lease, Proc]:
    """The live worker holding the janitor's lease under a term above ``newer_than``."""

    def found() -> tuple[Lease, Proc] | None:
        lease = system.store.lease_get(LEASE_NAME)
        if lease is None or lease.term <= newer_than or lease.expires_at <= system.store.now():
            return None
        for proc in procs:
            if proc.alive and lease.holder.startswith(f"{proc.name}:"):
                return lease, proc
        return None

    result: tuple[Lease, Proc] = system.wait(found, what="a worker holding the janitor lease")
    return result


def until(system: System, at: datetime) -> None:
    """Wait until the database clock reaches ``at``."""
    system.wait(lambda: system.store.now() >= at, timeout=WINDOW + 30, what=f"db time {at}")


def start_ahead(system: System) -> Proc:
    saved = dict(system.env)
    system.env["PYTHONPATH"] = os.pathsep.join([str(CLOCK_AHEAD), saved["PYTHONPATH"]])
    system.env["PLUNDER_TEST_CLOCK_AHEAD"] = "30"
    try:
        return system.start(name="ahead")
    finally:
        system.env.clear()
        system.env.update(saved)


def tick_of(key: str) -> datetime:
    return datetime.fromisoformat(key.split("@", 1)[1].replace("Z", "+00:00"))


def test_one_job_per_tick_through_kill_pause_and_a_clock_ahead(system: System) -> None:
    store = system.store
    (first,) = system.workers(1)
    lease, _ = holder(system, [first])
    spec = ScheduleSpec(
        NAME, "witness", "* * * * * *", queue="q1", kwargs={"uid": "tick"}, catch_up="all"
    )
    start = store.schedule_upsert(spec).next_at
    assert start is not None
    end = start + timedelta(seconds=WINDOW)
    ahead = start_ahead(system)
    others = [first, ahead, system.start()]
    system.wait(lambda: all(system.session_of(p) for p in others), what="worker sessions")
    holders = [first.name]

    until(system, start + timedelta(seconds=5))
    system.kill(first)  # the holder dies: another takes over within the lease
    lease, current = holder(system, others, newer_than=lease.term)
    holders.append(current.name)

    until(system, start + timedelta(seconds=10))
    with system.paused(current):  # the holder freezes past its lease, then wakes
        paused_term = lease.term
        lease, successor = holder(system, others, newer_than=lease.term)
        holders.append(successor.name)
        time.sleep(4 * system.timing.lease)
    system.wait(
        lambda: f"janitor lease term {paused_term} " in current.output(),
        what="the woken holder to notice it lost the lease",
    )

    until(system, end)
    system.wait(
        lambda: (store.schedule_get(NAME).last_at or start) >= end,
        what="the schedule's ticks up to the window's end",
    )
    jobs = [j for j in system.jobs() if j.key and j.key.startswith("plunder.schedule:")]
    keys = [j.key for j in jobs if j.key]
    # a tick is enqueued once it is due by the database clock, never by a worker's clock
    early = [j.id for j in jobs if j.key and j.created_at < tick_of(j.key)]
    per_tick = collections.Counter(tick_of(k) for k in keys)
    expected = [start + timedelta(seconds=s) for s in range(WINDOW + 1)]
    seen = [t for t in per_tick if start <= t <= end]
    gaps = [t for t in expected if t not in per_tick]
    duplicates = sum(n - 1 for n in per_tick.values())
    print(
        f"schedules chaos {system.backend}: ticks expected {len(expected)}, jobs seen "
        f"{sum(per_tick[t] for t in seen)}, gaps {len(gaps)}, duplicates {duplicates}, "
        f"early {len(early)}; "
        f"holders {' -> '.join(holders)}"
    )
    assert "clock ahead by 30s" in ahead.output()
    assert "ahead" in holders, f"the worker 30 s ahead never held the lease: {holders}"
    assert gaps == [] and duplicates == 0, (gaps, per_tick)
    assert early == [], f"jobs enqueued before their tick: {early}"
    assert sorted(per_tick)[0] == start  # nothing before the schedule's first tick
