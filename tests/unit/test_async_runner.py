"""The event-loop runner of ``async def`` tasks: a stop that races the hand-over of its
job to the loop, and a runner whose loop is already closed."""

from __future__ import annotations

import asyncio
import queue
import threading

import pytest

import plunder
from plunder.context import Context
from plunder.execution import AsyncRunner, Finished, Handle
from plunder.model import JobSpec
from plunder.store import Store
from tests.store.helpers import claim, open_session

app = plunder.App()
finished: list[int] = []
began = threading.Event()


@app.task(name="t")
async def naps(seconds: float) -> str:
    await asyncio.sleep(seconds)
    finished.append(1)
    return "slept"


@app.task(name="swallows")
async def swallows(seconds: float) -> str:
    """Swallows its cancellation and naps ``seconds`` more."""
    began.set()
    try:
        await asyncio.sleep(60)
    except asyncio.CancelledError:
        await asyncio.sleep(seconds)
    return "went on"


@pytest.fixture
def store(sqlite_store: Store) -> Store:
    return sqlite_store


def handles(store: Store, count: int, seconds: float) -> list[Handle]:
    store.job_enqueue_many([JobSpec("t", [seconds]) for _ in range(count)])
    jobs = claim(store, open_session(store), limit=count)
    task = app.registry.get("t")
    return [Handle(job=job, task=task, ctx=Context(job, store)) for job in jobs]


def test_a_stop_queued_before_the_hand_over_still_cancels_the_task(store: Store) -> None:
    # Another thread (the hub, the watchdog) stops a job the main thread has started but
    # not yet handed to the loop: its cancel runs first and finds no task.
    finished.clear()
    outcomes: queue.SimpleQueue[object] = queue.SimpleQueue()
    runner = AsyncRunner(outcomes)
    (handle,) = handles(store, 1, 0.2)
    loop = runner._ensure_loop()
    blocked = threading.Event()
    loop.call_soon_threadsafe(blocked.wait)  # hold the loop so the order below is exact
    runner._arriving.append(handle)  # what start() does before it schedules the hand-over
    runner.stop(handle, "lost")
    loop.call_soon_threadsafe(runner._hand_over)
    blocked.set()

    async def left() -> int:
        await asyncio.sleep(0.4)  # longer than the task would take to finish
        return len(asyncio.all_tasks()) - 1

    assert asyncio.run_coroutine_threadsafe(left(), loop).result(timeout=5) == 0
    assert handle.future is not None and handle.future.cancelled()
    assert finished == []
    # its outcome still comes (the worker frees the job's slot on it), though no line of
    # its coroutine ran
    outcome = outcomes.get(timeout=5)
    assert isinstance(outcome, Finished) and not outcome.ok
    assert isinstance(outcome.error, asyncio.CancelledError)
    assert outcomes.empty()
    runner.close()


def test_a_closed_loop_refuses_every_start_and_ignores_stops(store: Store) -> None:
    outcomes: queue.SimpleQueue[object] = queue.SimpleQueue()
    runner = AsyncRunner(outcomes)
    first, second = handles(store, 2, 0.0)
    runner._ensure_loop()
    runner.close()
    for handle in (first, second):  # each is refused, none is silently left behind
        with pytest.raises(RuntimeError, match="closed"):
            runner.start(handle)
    runner.stop(first, "shutting down")  # its tasks were cancelled when the loop closed
    assert first.ctx.cancelled


def test_a_coroutine_that_swallows_its_cancellation_reports_when_it_returns(
    store: Store,
) -> None:
    outcomes: queue.SimpleQueue[object] = queue.SimpleQueue()
    runner = AsyncRunner(outcomes)
    store.job_enqueue_many([JobSpec("swallows", [0.3])])
    (job,) = claim(store, open_session(store), limit=1, tasks=("swallows",))
    handle = Handle(job=job, task=app.registry.get("swallows"), ctx=Context(job, store))
    runner.start(handle)
    assert began.wait(5)
    runner.stop(handle, "timed out")
    with pytest.raises(queue.Empty):  # still running: no outcome frees its slot yet
        outcomes.get(timeout=0.1)
    outcome = outcomes.get(timeout=5)
    assert isinstance(outcome, Finished) and outcome.ok and outcome.result == "went on"
    assert outcomes.empty()
    runner.close()
