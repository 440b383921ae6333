"""Async producers and followers leave the caller's event loop free: a heartbeat coroutine
keeps ticking while they wait on the store."""

from __future__ import annotations

import asyncio
import sqlite3
import threading
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

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
