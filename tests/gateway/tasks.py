"""Tasks a remote worker process runs in the gateway tests (``-A tests.gateway.tasks:app``);
its App has no database URL: PLUNDER_URL names the gateway."""

from __future__ import annotations

import os
import time

import plunder

app = plunder.App()


@app.task(name="words", queue="llm", retries=0)
def words(ctx: plunder.Context, prompt: str) -> str:
    for word in prompt.split():
        ctx.stream(word)
    return prompt.upper()


@app.task(name="hold", queue="llm", retries=2)
def hold(seconds: float) -> str:
    time.sleep(seconds)
    return "held"


@app.task(name="whoami", queue="llm", retries=2)
def whoami(seconds: float) -> int:
    """Holds its slot, then says which process ran it."""
    time.sleep(seconds)
    return os.getpid()


@app.task(name="short", queue="llm", retries=0)
def short(n: int) -> int:
    time.sleep(0.005)
    return n


@app.task(name="gather", queue="llm", retries=0)
def gather(ctx: plunder.Context, tag: str) -> list[object]:
    """A workflow's job: its tag, then each parent's id and result in id order (read
    through the gateway: this worker has no database)."""
    return [tag, [[job_id, result] for job_id, result in sorted(ctx.parent_results.items())]]
