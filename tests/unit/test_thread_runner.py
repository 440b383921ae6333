"""The thread pool of plain-function tasks: every job gets a thread of its own however
long the jobs before it take, idle threads exit, and no job is lost when a call to the
queue meets a thread that is just giving up. (That short jobs share a few threads is
tested through a worker, in tests/worker/test_inprocess.py.)"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

import plunder
from plunder.context import Context
from plunder.execution import Finished, Handle, ThreadRunner
from plunder.model import JobSpec
from plunder.store import Store
from tests.store.helpers import claim, open_session

app = plunder.App()
gate = threading.Event()
seen: dict[int, int] = {}  # thread -> how many jobs it ran
running = threading.Semaphore(0)


@app.task(name="t")
def work(kind: str) -> str:
    seen[threading.get_ident()] = seen.get(threading.get_ident(), 0) + 1
    if kind == "block":
        running.release()
        gate.wait(30)
    return kind


@pytest.fixture
def store(sqlite_store: Store) -> Store:
    return sqlite_store


@pytest.fixture(autouse=True)
def _reset() -> Iterator[None]:
    gate.clear()
    seen.clear()
    while running.acquire(blocking=False):
        pass
    yield
    gate.set()  # never leave a blocked thread behind


def handles(store: Store, kinds: list[str]) -> list[Handle]:
    store.job_enqueue_many([JobSpec("t", [kind]) for kind in kinds])
    jobs = claim(store, open_session(store), limit=len(kinds))
    task = app.registry.get("t")
    return [Handle(job=job, task=task, ctx=Context(job, store)) for job in jobs]


def outcomes_of(outcomes: queue.SimpleQueue[Any], count: int) -> list[Finished]:
    return [outcomes.get(timeout=10) for _ in range(count)]


def test_every_blocking_job_runs_at_once_on_a_thread_of_its_own(store: Store) -> None:
    outcomes: queue.SimpleQueue[Any] = queue.SimpleQueue()
    runner = ThreadRunner(outcomes)
    for handle in handles(store, ["block"] * 40):
        runner.start(handle)
    for _ in range(40):  # all forty are running together
        assert running.acquire(timeout=10)
    assert len(seen) == 40
    gate.set()
    assert all(o.ok and o.result == "block" for o in outcomes_of(outcomes, 40))


def test_a_stuck_job_holds_up_none_of_the_jobs_after_it(store: Store) -> None:
    outcomes: queue.SimpleQueue[Any] = queue.SimpleQueue()
    runner = ThreadRunner(outcomes)
    stuck, *quick = handles(store, ["block"] + ["quick"] * 20)
    runner.start(stuck)
    assert running.acquire(timeout=10)
    for handle in quick:
        runner.start(handle)
    done = outcomes_of(outcomes, 20)
    assert sorted(o.job.id for o in done) == sorted(h.job.id for h in quick)
    gate.set()
    (last,) = outcomes_of(outcomes, 1)
    assert last.job.id == stuck.job.id


def test_idle_threads_exit_and_a_later_job_still_runs(store: Store) -> None:
    outcomes: queue.SimpleQueue[Any] = queue.SimpleQueue()
    runner = ThreadRunner(outcomes)
    runner.IDLE_SECONDS = 0.1
    for handle in handles(store, ["quick"] * 20):
        runner.start(handle)
    outcomes_of(outcomes, 20)
    deadline = time.monotonic() + 10
    while runner._sleeping and time.monotonic() < deadline:
        time.sleep(0.02)
    assert runner._sleeping == [] and runner._called == 0
    (late,) = handles(store, ["quick"])
    runner.start(late)
    assert outcomes_of(outcomes, 1)[0].job.id == late.job.id


def test_no_job_is_lost_when_calls_meet_threads_giving_up(store: Store) -> None:
    """Idle threads give up after a millisecond while jobs keep arriving in small bursts:
    a thread called just as its wait ends must still come (the race the runner handles)."""
    outcomes: queue.SimpleQueue[Any] = queue.SimpleQueue()
    runner = ThreadRunner(outcomes)
    runner.IDLE_SECONDS = 0.001
    started = 0
    for burst in range(150):
        for handle in handles(store, ["quick"] * (1 + burst % 4)):
            runner.start(handle)
            started += 1
        time.sleep(0.0005 * (burst % 5))
    assert len(outcomes_of(outcomes, started)) == started
    assert outcomes.empty()


class _NoThreads:
    """threading.Thread.start failing as in a process out of threads, after ``allowed``
    successful starts."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, allowed: int) -> None:
        self.allowed = allowed
        real = threading.Thread.start

        def start(thread: threading.Thread) -> None:
            if thread.name == "plunder-task":
                if self.allowed <= 0:
                    raise RuntimeError("can't start new thread")
                self.allowed -= 1
            real(thread)

        monkeypatch.setattr(threading.Thread, "start", start)


def test_a_job_whose_thread_cannot_be_made_does_not_start_and_blocks_nothing(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    outcomes: queue.SimpleQueue[Any] = queue.SimpleQueue()
    runner = ThreadRunner(outcomes)
    first, second = handles(store, ["quick", "quick"])
    _NoThreads(monkeypatch, allowed=0)
    with pytest.raises(RuntimeError, match="new thread"):
        runner.start(first)  # the worker fails this job with that error
    assert not runner._jobs and runner._called == 0
    monkeypatch.undo()
    runner.start(second)
    (done,) = outcomes_of(outcomes, 1)
    assert done.job.id == second.job.id
    assert seen and sum(seen.values()) == 1  # the first never ran


def test_jobs_started_together_that_no_thread_can_take_come_back_with_why(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    outcomes: queue.SimpleQueue[Any] = queue.SimpleQueue()
    runner = ThreadRunner(outcomes)
    batch = handles(store, ["quick", "quick", "quick"])
    _NoThreads(monkeypatch, allowed=0)
    refused = runner.start_many(batch)
    assert [handle for handle, _ in refused] == batch  # the worker fails each with why
    assert all(isinstance(exc, RuntimeError) for _, exc in refused)
    assert not runner._jobs and runner._called == 0
    monkeypatch.undo()
    assert runner.start_many(handles(store, ["quick", "quick"])) == []
    assert len(outcomes_of(outcomes, 2)) == 2


def test_jobs_behind_a_thread_that_cannot_be_made_run_when_one_is_free(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    outcomes: queue.SimpleQueue[Any] = queue.SimpleQueue()
    runner = ThreadRunner(outcomes)
    blocker, quick = handles(store, ["block", "quick"])
    _NoThreads(monkeypatch, allowed=1)
    with runner._lock:  # both queued before the first thread looks
        runner._jobs.extend([blocker, quick])
        assert runner._call()  # a thread must be made
    runner._spawn()
    assert running.acquire(timeout=10)  # the blocker runs; calling the next thread failed
    time.sleep(0.1)
    assert runner._called == 0 and list(runner._jobs) == [quick]
    monkeypatch.undo()
    gate.set()
    assert sorted(o.job.id for o in outcomes_of(outcomes, 2)) == sorted(
        [blocker.job.id, quick.job.id]
    )
