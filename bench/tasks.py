"""Tasks for the benchmarks (workers load them with ``-A bench.tasks:app``)."""

from __future__ import annotations

import time

import plunder

app = plunder.App()


@app.task(name="bench.noop", retries=0)
def noop(i: int) -> int:
    return i


@app.task(name="bench.limited", retries=0, limit=("bench", 10))
def limited(i: int) -> int:
    """Scenario 11: a 10 ms call to a provider that allows ten at once."""
    time.sleep(0.01)
    return i


@app.task(name="bench.sleep10", retries=0)
def sleep10(i: int) -> int:
    """Scenario 11: bench.limited's work, without its limit."""
    time.sleep(0.01)
    return i
