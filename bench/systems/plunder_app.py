"""bench.tasks' app plus a task that holds its slot, for the kill-to-rescue scenario, and
one that reads the clock, for the enqueue→first-line latency."""

from __future__ import annotations

import time

from bench.tasks import app

__all__ = ["app", "clock", "hold", "wall"]


@app.task(name="bench.hold", retries=3)
def hold(seconds: float) -> None:
    time.sleep(seconds)


@app.task(name="bench.clock", retries=0)
def clock() -> float:
    """When this task's first line ran, by time.monotonic(): one clock for every process on
    the machine, so the producer's own reading before its enqueue call compares with it."""
    return time.monotonic()


@app.task(name="bench.wall", retries=0)
def wall() -> float:
    """When this task's first line ran, by time.time(): what a workflow's child compares
    with its parent's finished_at, which the database stamped on the same machine."""
    return time.time()
