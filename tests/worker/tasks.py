"""Tasks the worker tests run in real worker processes (``-A tests.worker.tasks:app``)."""

from __future__ import annotations

import asyncio
import os
import signal
import threading
import time
from pathlib import Path

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
    with ctx.transaction(result=token) as conn:
        conn.execute(sql, (token, os.getpid()))
    return token


def _effect_sql() -> str:
    mark = "?" if app.url.startswith("sqlite") else "%s"
    return f"INSERT INTO effects (token, pid) VALUES ({mark}, {mark})"


@app.task(name="effect_then_return", retries=0)
def effect_then_return(ctx: plunder.Context, token: str, gate: str) -> dict[str, str]:
    """Writes a row in its transaction, which commits it with the job's result; then
    returns that result once the file ``gate`` exists (it makes ``gate``.reached first)."""
    with ctx.transaction(result={"token": token}) as conn:
        conn.execute(_effect_sql(), (token, os.getpid()))
    Path(gate + ".reached").touch()
    while not Path(gate).exists() and not ctx.wait_cancelled(0.01):
        pass
    return {"token": token}


@app.task(name="async_effect_then_return", retries=0)
async def async_effect_then_return(ctx: plunder.Context, token: str, gate: str) -> dict[str, str]:
    """effect_then_return as an ``async def`` task with ``async with``."""
    async with ctx.transaction(result={"token": token}) as conn:
        await conn.execute(_effect_sql(), (token, os.getpid()))
    Path(gate + ".reached").touch()
    while not Path(gate).exists():
        await asyncio.sleep(0.01)
    return {"token": token}


@app.task(name="async_plain_with", retries=0)
async def async_plain_with(ctx: plunder.Context) -> None:
    with ctx.transaction():
        pass


@app.task(name="returns_other", retries=0)
def returns_other(ctx: plunder.Context) -> int:
    with ctx.transaction(result=1):
        pass
    return 2


@app.task(name="streams_in_transaction", retries=0)
def streams_in_transaction(ctx: plunder.Context) -> str:
    """Streams inside its transaction block, with no flush of its own."""
    ctx.stream("before ")
    with ctx.transaction(result="done"):
        ctx.stream("inside")
        ctx.progress(1, 1)
    return "done"


def write_whole(out: str, text: str) -> None:
    """``text`` into ``out`` at once, whole: a test waiting for the file never reads it
    created but still empty."""
    Path(f"{out}.tmp").write_text(text)
    os.replace(f"{out}.tmp", out)


@app.task(name="calls_after_transaction", retries=0)
def calls_after_transaction(ctx: plunder.Context, token: str, seconds: float, out: str) -> None:
    """Writes a row in its transaction, then (the job acknowledged) enqueues another job,
    streams and flushes, sleeps ``seconds`` and returns the acknowledged result (None)."""
    with ctx.transaction() as conn:
        conn.execute(_effect_sql(), (token, os.getpid()))
    child = add.enqueue(1, 2)
    ctx.stream("after the block")
    ctx.flush()
    time.sleep(seconds)
    write_whole(out, str(child.id))


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


@app.task(name="flaky_streamer", retries=1, backoff_base=0.01)
def flaky_streamer(ctx: plunder.Context, n: int) -> int:
    """Streams ``n`` chunks on each attempt; the first attempt then fails."""
    for i in range(n):
        ctx.stream(f"attempt {ctx.attempt} chunk {i}")
    ctx.progress(n, n)
    ctx.flush()
    if ctx.attempt == 1:
        raise RuntimeError("the first attempt fails")
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


@app.task(name="stream_then_wait", retries=0)
def stream_then_wait(ctx: plunder.Context, seconds: float) -> None:
    """Streams one chunk, then keeps running until cancelled or ``seconds`` pass."""
    ctx.stream("first")
    ctx.flush()
    ctx.wait_cancelled(seconds)


@app.task(name="flaky_quiet", retries=1, backoff_base=0.01)
def flaky_quiet(ctx: plunder.Context, n: int) -> int:
    """The first attempt streams ``n`` chunks and fails; the retry streams nothing."""
    if ctx.attempt == 1:
        for i in range(n):
            ctx.stream(f"partial {i}")
        ctx.flush()
        raise RuntimeError("the first attempt fails")
    return n


@app.task(name="stubborn", retries=0)
def stubborn(seconds: float, out: str) -> None:
    """Ignores cancellation: sleeps ``seconds`` whatever happens, then writes the time it
    returned (wall clock) to ``out``."""
    time.sleep(seconds)
    write_whole(out, repr(time.time()))


@app.task(name="started_at", retries=0)
def started_at(out: str) -> None:
    """Writes the time it started (wall clock) to ``out``."""
    write_whole(out, repr(time.time()))


@app.task(name="child_pid", pool="process")
def child_pid() -> int:
    return os.getpid()


@app.task(name="child_hang", pool="process", timeout=0.5, retry_on_timeout=False, retries=0)
def child_hang(out: str) -> None:
    """Writes its process id to ``out``, then spins, ignoring cancellation."""
    write_whole(out, str(os.getpid()))
    while True:
        pass


@app.task(name="child_gate", pool="process", retries=0)
def child_gate(ctx: plunder.Context, out: str, gate: str) -> int:
    """Writes its process id to ``out``, streams it, then returns it once ``gate`` exists."""
    write_whole(out, str(os.getpid()))
    ctx.stream({"pid": os.getpid()})
    while not Path(gate).exists():
        time.sleep(0.01)
    return os.getpid()


@app.task(name="provider_call", limit=("provider", 1), retries=0)
def provider_call(ctx: plunder.Context, pause: float) -> int:
    """A call to a rate-limited provider: told to wait ``pause`` seconds on its first
    attempt (a 429 with a reset time), it pauses its limit key and waits with the others."""
    if pause and ctx.attempt == 1:
        ctx.pause_limit(seconds=pause)
    return ctx.attempt


@app.task(name="ordered_in_transaction", ordered=True, retries=0)
def ordered_in_transaction(ctx: plunder.Context, i: int) -> int:
    """An ordered job (give it a partition_key) whose result commits in its transaction."""
    with ctx.transaction(result=i):
        pass
    return i


@app.task(name="gather")
def gather(ctx: plunder.Context, tag: str) -> list[object]:
    """A workflow's job: its tag, then each parent's id and result in id order."""
    return [tag, [[job_id, result] for job_id, result in sorted(ctx.parent_results.items())]]


@app.task(name="whoami")
def whoami(seconds: float = 0.0) -> int:
    """The worker process that ran it, after ``seconds``."""
    time.sleep(seconds)
    return os.getpid()


@app.task(name="load_model")
def load_model(ctx: plunder.Context, model: str) -> int:
    """Says that this worker now holds ``model`` (label model=...), as a model farm would
    once the weights are loaded."""
    ctx.add_label("model", model)
    return os.getpid()


@app.task(name="unload_model")
def unload_model(ctx: plunder.Context) -> int:
    ctx.remove_label("model")
    return os.getpid()


@app.task(name="span")
def span(seconds: float = 0.0) -> list[float]:
    """The worker process that ran it, and when it started and ended (time.time(): one
    clock for every process on the machine), after ``seconds``."""
    started = time.time()
    time.sleep(seconds)
    return [os.getpid(), started, time.time()]
