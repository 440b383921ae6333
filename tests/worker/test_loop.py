"""The worker's one claim loop as a whole: its slots, its session, stopping, failing and
suspects. Real worker processes and real signals, and workers on threads of the test's
process where a worker must be made to fail or lose its session."""

from __future__ import annotations

import faulthandler
import logging
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

import plunder
from plunder.model import SUSPECT_LOSSES, JobSpec
from plunder.states import Status
from plunder.store import Store
from plunder.worker import Worker, WorkerOptions
from tests.support import procs
from tests.worker import tasks
from tests.worker.conftest import Workers, wait_for


def _sessions(store: Store, pid: int) -> dict[str, str]:
    """name -> session id of the process's sessions."""
    return {s.name: s.id for s in store.session_list() if s.pid == pid}


def _running_under(store: Store, session_id: str) -> int:
    jobs = store.job_list(status="running", limit=1000).jobs
    return sum(1 for job in jobs if job.session_id == session_id)


def test_a_worker_runs_as_many_jobs_as_its_slots_and_no_more(
    store: Store, workers: Workers
) -> None:
    proc = workers.start("-c", "5", "--grace", "10", name="slotted")
    wait_for(lambda: len(_sessions(store, proc.pid)) == 1, what="a session")
    ids = _sessions(store, proc.pid)
    assert set(ids) == {"slotted"}
    jobs = store.job_enqueue_many([JobSpec("sleepy", [3.0]) for _ in range(7)])
    wait_for(lambda: _running_under(store, ids["slotted"]) == 5, what="the slots full")
    proc.send_signal(signal.SIGTERM)  # the worker finishes what it runs, and claims no more
    assert proc.wait(timeout=15) == 0
    done = [store.job_get(job.id) for job in jobs]
    assert sum(job.status == Status.SUCCEEDED for job in done) == 5
    assert sum(job.status == Status.PENDING for job in done) == 2
    ran_on = {store.job_runs(job.id)[0].worker for job in jobs if store.job_runs(job.id)}
    assert ran_on == {"slotted"}
    assert _sessions(store, proc.pid) == {}  # closed, not left to expire


def test_a_second_signal_stops_the_worker_at_once(store: Store, workers: Workers) -> None:
    proc = workers.start("-c", "2", "--grace", "60", name="signalled")
    wait_for(lambda: len(_sessions(store, proc.pid)) == 1, what="a session")
    (sid,) = _sessions(store, proc.pid).values()
    store.job_enqueue_many([JobSpec("sleepy", [60.0]) for _ in range(2)])
    wait_for(lambda: _running_under(store, sid) == 2, what="both jobs running")
    proc.send_signal(signal.SIGTERM)
    time.sleep(0.3)  # the first signal is in: the worker waits for its jobs (grace 60 s)
    assert proc.poll() is None
    stopped = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:  # what the worker last wrote says where it stands
        output = procs.stacks(proc, workers.path(0))
        raise AssertionError(f"no exit 10 s after the second signal:\n{output}") from None
    assert time.monotonic() - stopped < 5
    assert "second signal: stopping at once" in workers.log(0)


@pytest.fixture
def app(store_url: str) -> Iterator[plunder.App]:
    tasks.app.configure(
        url=store_url,
        heartbeat_interval=0.1,
        session_expiry=3.0,  # exact session counts: a loaded machine must not lose one
        poll_interval=0.05,
        janitor_interval=0.1,
    )
    yield tasks.app
    tasks.app.close()


class Running:
    """A worker on a thread of this process; ``error`` is what its run() raised."""

    def __init__(self, worker: Worker) -> None:
        self.worker = worker
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            self.worker.run(install_signals=False)
        except BaseException as exc:
            self.error = exc

    def join(self, timeout: float = 15) -> None:
        self.thread.join(timeout=timeout)
        if self.thread.is_alive():  # where every thread of this process stands says why
            with tempfile.TemporaryFile("w+") as out:
                faulthandler.dump_traceback(out, all_threads=True)
                out.seek(0)
                raise AssertionError(f"run() still runs after {timeout}s:\n{out.read()}")

    def until(self, condition: Callable[[], object], what: str) -> None:
        """Wait for ``condition``, then stop the worker gracefully and wait for it."""
        try:
            wait_for(condition, what=what)
        finally:
            self.worker.stop()
            self.join()


def test_a_worker_that_fails_stops_its_tasks_closes_its_session_and_run_raises_its_error(
    app: plunder.App, store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    worker = Worker(app, WorkerOptions(concurrency=2, grace=0.5))
    step = worker.step
    broken = threading.Event()

    def broken_step() -> None:
        if broken.is_set():
            raise RuntimeError("the worker broke")
        step()

    monkeypatch.setattr(worker, "step", broken_step)
    jobs = store.job_enqueue_many([JobSpec("sleepy", [30.0], max_attempts=3) for _ in range(2)])
    running = Running(worker)
    wait_for(lambda: len(worker._slots.handles()) == 2, what="both jobs running")
    handles = worker._slots.handles()
    session = worker.session
    assert session is not None
    broken.set()
    running.join()
    assert isinstance(running.error, RuntimeError) and str(running.error) == "the worker broke"
    # every task was told to stop, and the session closed, so both jobs are back in the
    # queue, the attempt not counted
    assert all(handle.ctx.cancelled for handle in handles)
    assert session.id not in {s.id for s in store.session_list()}
    for job in jobs:
        back = store.job_get(job.id)
        assert back.status == Status.PENDING and back.attempts_left == 3


def test_stop_at_once_ends_the_worker_without_waiting_for_its_jobs(
    app: plunder.App, store: Store
) -> None:
    running = Running(Worker(app, WorkerOptions(concurrency=2, grace=60)))
    store.job_enqueue_many([JobSpec("sleepy", [30.0]) for _ in range(2)])
    wait_for(lambda: len(running.worker._slots.handles()) == 2, what="both jobs running")
    handles = running.worker._slots.handles()
    running.worker.stop(graceful=False)
    running.join(timeout=5)  # not the 60 s grace, nor the 30 s jobs
    assert running.error is None
    assert all(handle.ctx.cancelled for handle in handles)


def test_suspects_run_one_at_a_time(
    app: plunder.App, store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A suspect may be the job that killed its last worker; whatever runs beside it in
    the process dies with it: a worker with free slots still runs one at a time."""
    monkeypatch.setattr(tasks, "AT_ONCE", {"now": 0, "most": 0})
    jobs = store.job_enqueue_many([JobSpec("counted", [0.3], max_attempts=9) for _ in range(3)])
    for time_lost in range(SUSPECT_LOSSES):  # claimed by a worker that died, twice
        dying = store.session_open(
            name=f"dying-{time_lost}", host="h", pid=1, queues=["default"], expiry=30
        )
        claimed = store.job_claim_many(dying.id, queues=["default"], tasks=["counted"], limit=3)
        assert len(claimed) == 3
        store.session_close(dying.id, lost=True)
    assert all(store.job_get(job.id).suspect for job in jobs)
    running = Running(Worker(app, WorkerOptions(concurrency=4)))
    running.until(
        lambda: all(store.job_get(job.id).status == Status.SUCCEEDED for job in jobs),
        "the suspects done",
    )
    assert tasks.AT_ONCE["most"] == 1


def test_a_worker_that_loses_its_session_opens_another_and_goes_on(
    app: plunder.App, store: Store
) -> None:
    worker = Worker(app, WorkerOptions(concurrency=4))
    running = Running(worker)
    try:
        wait_for(lambda: worker.session, what="a session")
        assert worker.session is not None
        lost = worker.session.id
        store.session_close(lost)  # as the janitor would after an expiry
        wait_for(
            lambda: worker.session is not None and worker.session.id != lost,
            what="a new session",
        )
        jobs = store.job_enqueue_many([JobSpec("add", [i, 2]) for i in range(50)])
        wait_for(
            lambda: all(store.job_get(job.id).status == Status.SUCCEEDED for job in jobs),
            what="jobs done after the loss",
        )
    finally:
        worker.stop()
        running.join()
    assert running.error is None
    assert worker.stats["sessions"] == 2


def test_a_worker_that_closed_its_session_cuts_nothing_on_a_later_heartbeat(
    app: plunder.App, store: Store, monkeypatch: pytest.MonkeyPatch, caplog: Any
) -> None:
    """A heartbeat on its way as the worker closes its session finds the session closed,
    which must not read as a lost session: losing one cuts every call of the store, which
    the app's other users share. And the worker leaves the hub (the app's, which outlives
    it): no heartbeats after it stopped."""
    cuts: list[str] = []
    beats: list[float] = []
    worker = Worker(app, WorkerOptions(concurrency=2))
    monkeypatch.setattr(
        worker.store, "calls_cut", lambda reason, final=False: cuts.append(reason) or 0
    )
    beat = worker._liveness.beat
    monkeypatch.setattr(
        worker._liveness, "beat", lambda conn: beats.append(time.monotonic()) or beat(conn)
    )
    thread = threading.Thread(target=worker.run, kwargs={"install_signals": False})
    thread.start()
    wait_for(lambda: worker.session is not None, what="a session")
    wait_for(lambda: beats, what="a first heartbeat")  # a loaded machine may be slow to it
    caplog.set_level(logging.ERROR, logger="plunder.worker")
    worker.stop()
    thread.join(timeout=15)
    assert not thread.is_alive()
    stopped_at = time.monotonic()
    time.sleep(1.0)  # ten heartbeat intervals, the hub still running
    assert [at for at in beats if at > stopped_at] == []
    assert cuts == []
    assert not worker._session_lost.is_set()
    assert "is gone" not in caplog.text
