"""Async producers and followers leave the caller's event loop free: a heartbeat coroutine
keeps ticking while they wait on the store."""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

import pytest

from tests.store.helpers import raw_connect
from tests.worker import tasks
from tests.worker.conftest import worker_in_thread

T = TypeVar("T")


async def _ticks_while(wait: Callable[[], Awaitable[T]]) -> tuple[T, int]:
    """What ``wait()`` returned, and how often a coroutine beside it ran meanwhile."""
    ticks = 0
    done = asyncio.Event()

    async def heartbeat() -> None:
        nonlocal ticks
        while not done.is_set():
            ticks += 1
            await asyncio.sleep(0.005)

    beat = asyncio.create_task(heartbeat())
    await asyncio.sleep(0)
    before = ticks
    try:
        value = await wait()
    finally:
        done.set()
        await beat
    return value, ticks - before


@contextmanager
def _jobs_locked_for(url: str, seconds: float) -> Iterator[None]:
    """Another connection blocks every insert of a job for ``seconds``."""
    if url.startswith("sqlite"):  # released from the timer's thread
        conn: Any = sqlite3.connect(url[len("sqlite:///") :], check_same_thread=False)
        conn.execute("BEGIN IMMEDIATE")
    else:
        conn = raw_connect(url)
        conn.execute("LOCK TABLE plunder_jobs IN SHARE ROW EXCLUSIVE MODE")
    release = threading.Timer(seconds, conn.rollback)
    release.start()
    try:
        yield
    finally:
        release.join()
        conn.close()


def test_enqueue_async_and_stream_async_leave_the_loop_running(store_url: str) -> None:
    async def main() -> None:
        with _jobs_locked_for(store_url, 0.3):
            job, ticks = await _ticks_while(lambda: tasks.sleepy.enqueue_async(0.3))
        assert ticks >= 5, f"the loop ran {ticks} times while enqueue_async waited"
        by_name, _ = await _ticks_while(lambda: tasks.app.enqueue_async("add", [2, 3]))
        many, _ = await _ticks_while(lambda: tasks.add.enqueue_many_async([(1, 1), (2, 2)]))

        async def follow() -> list[Any]:
            return [event async for event in job.stream_async(timeout=20)]

        events, ticks = await _ticks_while(follow)
        assert events == []  # sleepy streams nothing: the wait was for the job's end
        assert ticks >= 5, f"the loop ran {ticks} times while stream_async waited"
        assert await job.result_async(timeout=20) == "slept"
        assert await by_name.result_async(timeout=20) == 5
        assert [await j.result_async(timeout=20) for j in many] == [2, 4]

    with worker_in_thread(store_url):
        asyncio.run(main())


def test_stream_async_yields_what_stream_yields(store_url: str) -> None:
    async def main() -> None:
        job = await tasks.streamer.enqueue_async(20)
        live = [event async for event in job.stream_async(timeout=20)]
        assert live == list(job.stream(timeout=5))
        assert [e.data for e in live if e.kind == "chunk"] == [f"chunk {i}" for i in range(20)]

    with worker_in_thread(store_url):
        asyncio.run(main())


def _run_within(main: Callable[[], Awaitable[None]], seconds: float) -> None:
    """asyncio.run(main()) on a thread; it must return (loop shut down, its threads
    joined) within ``seconds``."""
    errors: list[BaseException] = []

    def run() -> None:
        try:
            asyncio.run(main())
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), f"asyncio.run still running after {seconds}s"
    if errors:
        raise errors[0]


@pytest.mark.parametrize("how", ["cancel", "break"])
def test_leaving_stream_async_early_is_prompt(store_url: str, how: str) -> None:
    """A consumer of a job that keeps running is cancelled while it waits, or breaks out
    after the first event: it ends at once, and asyncio.run returns with no thread left
    blocked in the stream."""
    with worker_in_thread(store_url):
        job = tasks.stream_then_wait.enqueue(60)
        first = threading.Event()

        async def consume() -> None:
            async with contextlib.aclosing(job.stream_async()) as events:
                async for _ in events:
                    first.set()
                    if how == "break":
                        break

        async def main() -> None:
            consumer = asyncio.create_task(consume())
            await asyncio.to_thread(first.wait, 20)
            assert first.is_set(), "no first event"
            started = time.monotonic()
            if how == "cancel":
                await asyncio.sleep(0.2)  # the consumer is waiting for a next event
                consumer.cancel()
                with pytest.raises(asyncio.CancelledError):
                    await consumer
            else:
                await consumer
            assert time.monotonic() - started < 1.0

        try:
            _run_within(main, 3.0)
        finally:
            job.cancel()
