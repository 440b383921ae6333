"""Tasks the worker tests run in real worker processes (``-A tests.worker.tasks:app``)."""

from __future__ import annotations

import asyncio
import os
import signal
import threading
import time

import plunder

app = plunder.App()  # PLUNDER_URL, set by the test that starts the worker


@app.task(name="add")
def add(a: int, b: int) -> int:
    return a + b


@app.task(name="sleepy")
def sleepy(ctx: plunder.Context, seconds: float) -> str:
    ctx.wait_cancelled(seconds)
    return "cancelled" if ctx.cancelled else "slept"


@app.task(name="effect")
def effect(ctx: plunder.Context, token: str, seconds: float) -> str:
    """Sleeps, then writes a row in the same transaction as its acknowledgement."""
    time.sleep(seconds)
    sql = (
        "INSERT INTO effects (token, pid) VALUES (?, ?)"
        if app.url.startswith("sqlite")
        else "INSERT INTO effects (token, pid) VALUES (%s, %s)"
    )
    with ctx.transaction() as conn:
        conn.execute(sql, (token, os.getpid()))
    return token


@app.task(name="poison", retries=1)
def poison() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


@app.task(name="async_add")
async def async_add(a: int, b: int) -> int:
    await asyncio.sleep(0.01)
    return a + b


@app.task(name="async_sleepy", timeout=0.5, retry_on_timeout=False)
async def async_sleepy(seconds: float) -> str:
    await asyncio.sleep(seconds)
    return "slept"


@app.task(name="cpu", pool="process")
def cpu(n: int) -> int:
    return sum(i * i for i in range(n))


@app.task(name="cpu_hang", pool="process", timeout=0.5, retry_on_timeout=False)
def cpu_hang() -> None:
    while True:
        pass


@app.task(name="cpu_streamer", pool="process")
def cpu_streamer(ctx: plunder.Context, n: int) -> dict[str, int]:
    """Streams from a child process: chunks, progress and log lines cross the pipe."""
    for i in range(n):
        ctx.stream({"i": i, "pid": os.getpid()})
        if i % 10 == 0:
            ctx.progress(i, n)
    ctx.logger.info("child %d streamed %d chunks", os.getpid(), n)
    return {"n": n, "pid": os.getpid(), "job": ctx.job_id, "attempt": ctx.attempt}


@app.task(name="cpu_transaction", pool="process", retries=0)
def cpu_transaction(ctx: plunder.Context) -> None:
    with ctx.transaction():
        pass


@app.task(name="thread_slow", timeout=0.3, retries=0)
def thread_slow(ctx: plunder.Context) -> str:
    ctx.wait_cancelled(5)
    return "late"


@app.task(name="slow_llm", queue="llm", timeout=1, retries=0, priority=3)
def slow_llm(ctx: plunder.Context, seconds: float) -> str:
    """Enqueued by name from processes that do not import it (tests of published options)."""
    ctx.wait_cancelled(seconds)
    return "cancelled" if ctx.cancelled else "slept"


@app.task(name="streamer")
def streamer(ctx: plunder.Context, n: int) -> int:
    for i in range(n):
        ctx.stream(f"chunk {i}")
        if i % 10 == 0:
            ctx.progress(i, n)
    ctx.logger.info("streamed %d chunks", n)
    return n


@app.task(name="fails", retries=2, backoff_base=0.01, no_retry=(KeyError,))
def fails(kind: str) -> None:
    if kind == "key":
        raise KeyError("not retried")
    raise RuntimeError("retried")


@app.task(name="unserializable")
def unserializable() -> object:
    return object()


@app.task(name="async_streamer")
async def async_streamer(ctx: plunder.Context, n: int) -> int:
    for i in range(n):
        ctx.stream({"token": i})
        await asyncio.sleep(0)
    return n


AT_ONCE = {"now": 0, "most": 0}  # how many "counted" jobs run at once in this process
_at_once_lock = threading.Lock()


@app.task(name="counted")
def counted(seconds: float) -> None:
    """Sleeps, counting in AT_ONCE how many of its kind run beside it in this process."""
    with _at_once_lock:
        AT_ONCE["now"] += 1
        AT_ONCE["most"] = max(AT_ONCE["most"], AT_ONCE["now"])
    try:
        time.sleep(seconds)
    finally:
        with _at_once_lock:
            AT_ONCE["now"] -= 1
