"""bench.tasks' app plus a task that holds its slot, for the kill-to-rescue scenario."""

from __future__ import annotations

import time

from bench.tasks import app

__all__ = ["app", "hold"]


@app.task(name="bench.hold", retries=3)
def hold(seconds: float) -> None:
    time.sleep(seconds)
