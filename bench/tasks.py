"""Tasks for the benchmarks (workers load them with ``-A bench.tasks:app``)."""

from __future__ import annotations

import plunder

app = plunder.App()


@app.task(name="bench.noop", retries=0)
def noop(i: int) -> int:
    return i
