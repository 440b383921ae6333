"""Tasks the worker process of the browser tests runs (``-A tests.browser.tasks:app``)."""

from __future__ import annotations

import os
import time
from pathlib import Path

import plunder

app = plunder.App()


@app.task(name="noop", queue="drain", retries=0)
def noop(n: int, pause: float = 0.0) -> int:
    time.sleep(pause)
    return n


@app.task(name="tokens", queue="llm", retries=0)
def tokens(ctx: plunder.Context, count: int, gap: float) -> str:
    """Streams ``count`` tokens, ``gap`` seconds apart."""
    for i in range(count):
        ctx.stream(f"tok{i} ")
        if ctx.wait_cancelled(gap):
            return "cancelled"
    return "done"


@app.task(name="sleepy", queue="default", retries=0)
def sleepy(ctx: plunder.Context, marker: str) -> str:
    """Runs until cancelled, then leaves ``marker`` (a file) to say it stopped."""
    ctx.wait_cancelled(120)
    Path(marker).write_text(str(os.getpid()))
    return "stopped"
