"""Lanes: one worker process whose slots are split among several claim loops, each a worker
with its own session. Real worker processes and real signals, and lanes on threads of the
test's process where a lane must be made to fail or lose its session."""

from __future__ import annotations

import logging
import signal
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

import plunder
from plunder import errors
from plunder.lanes import Lanes
from plunder.model import SUSPECT_LOSSES, JobSpec
from plunder.states import Outcome, Status
from plunder.store import Store
from plunder.worker import Worker, WorkerOptions
from tests.worker import tasks
from tests.worker.conftest import Workers, wait_for


def _sessions(store: Store, pid: int) -> dict[str, str]:
    """name -> session id of the process's sessions."""
    return {s.name: s.id for s in store.session_list() if s.pid == pid}


def _running_under(store: Store, session_id: str) -> int:
    jobs = store.job_list(status="running", limit=1000).jobs
    return sum(1 for job in jobs if job.session_id == session_id)


def test_each_lane_holds_a_session_and_its_share_of_the_slots(
    store: Store, workers: Workers
) -> None:
    proc = workers.start("-c", "5", "--lanes", "2", "--grace", "10", name="laned")
    sessions = wait_for(lambda: len(_sessions(store, proc.pid)) == 2, what="two sessions")
    assert sessions
    ids = _sessions(store, proc.pid)
    assert set(ids) == {"laned/1", "laned/2"}
    jobs = store.job_enqueue_many([JobSpec("sleepy", [3.0]) for _ in range(7)])
    # 3 slots and 2: each lane runs as many as its share, and no more
    wait_for(
        lambda: (
            (_running_under(store, ids["laned/1"]), _running_under(store, ids["laned/2"])) == (3, 2)
        ),
        what="both lanes full",
    )
    proc.send_signal(signal.SIGTERM)  # the lanes finish what they run, and claim no more
    assert proc.wait(timeout=15) == 0
    done = [store.job_get(job.id) for job in jobs]
    assert sum(job.status == Status.SUCCEEDED for job in done) == 5
    assert sum(job.status == Status.PENDING for job in done) == 2
    ran_on = {store.job_runs(job.id)[0].worker for job in jobs[:5] if store.job_runs(job.id)}
    assert ran_on <= {"laned/1", "laned/2"}
    assert _sessions(store, proc.pid) == {}  # both closed, not left to expire


def test_a_second_signal_stops_every_lane_at_once(store: Store, workers: Workers) -> None:
    proc = workers.start("-c", "2", "--lanes", "2", "--grace", "60", name="laned")
    wait_for(lambda: len(_sessions(store, proc.pid)) == 2, what="two sessions")
    ids = list(_sessions(store, proc.pid).values())
    store.job_enqueue_many([JobSpec("sleepy", [60.0]) for _ in range(2)])
    wait_for(lambda: all(_running_under(store, sid) == 1 for sid in ids), what="a job each")
    proc.send_signal(signal.SIGTERM)
    time.sleep(0.3)  # the first signal is in: the lanes wait for their jobs (grace 60 s)
    assert proc.poll() is None
    stopped = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=10)
    assert time.monotonic() - stopped < 5
    assert "stopping every lane at once" in workers.log(0)


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
    """Lanes on a thread of this process; ``error`` is what their run() raised."""

    def __init__(self, lanes: Lanes) -> None:
        self.lanes = lanes
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            self.lanes.run(install_signals=False)
        except BaseException as exc:
            self.error = exc

    def join(self) -> None:
        self.thread.join(timeout=15)
        assert not self.thread.is_alive()

    def until(self, condition: Callable[[], object], what: str) -> None:
        """Wait for ``condition``, then stop the lanes gracefully and wait for them."""
        try:
            wait_for(condition, what=what)
        finally:
            self.lanes.stop()
            self.join()


def test_lanes_drain_a_queue_together(app: plunder.App, store: Store) -> None:
    jobs = store.job_enqueue_many([JobSpec("add", [i, 1]) for i in range(300)])
    running = Running(Lanes(app, WorkerOptions(concurrency=8), lanes=2))
    running.until(lambda: running.lanes.stats["succeeded"] == 300, "the queue drained")
    assert running.error is None
    assert all(store.job_get(job.id).result == i + 1 for i, job in enumerate(jobs))
    # the second lane's own store is closed for good (a late call from a task that outlived
    # its lane opens no pool that nobody would close); the first lane's is the app's
    first, second = running.lanes.lanes
    assert first.store is app.store and second.store is not app.store
    with pytest.raises(errors.StoreUnavailable, match="closed for good"):
        second.store.job_get(jobs[0].id)
    assert app.store.job_get(jobs[0].id).result == 1


def test_every_lane_takes_its_part(app: plunder.App, store: Store) -> None:
    """No lane can run more than its share at once, so jobs that take a while spread over
    every lane (short ones may not: one lane can drain a small queue before another has
    opened its session, and on SQLite one lane may hold the file for the others' turns)."""
    store.job_enqueue_many([JobSpec("sleepy", [0.2]) for _ in range(40)])
    running = Running(Lanes(app, WorkerOptions(concurrency=4), lanes=2))
    running.until(lambda: running.lanes.stats["succeeded"] == 40, "the queue drained")
    assert running.error is None
    by_lane = [lane.stats["succeeded"] for lane in running.lanes.lanes]
    assert all(count >= 5 for count in by_lane), by_lane


def test_a_lane_that_fails_stops_its_tasks_and_the_others_and_run_raises_its_error(
    app: plunder.App, store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    lanes = Lanes(app, WorkerOptions(concurrency=2, grace=0.5), lanes=2)
    first, failing = lanes.lanes
    step = failing.step
    broken = threading.Event()

    def broken_step() -> None:
        if broken.is_set():
            raise RuntimeError("lane 2 broke")
        step()

    monkeypatch.setattr(failing, "step", broken_step)
    jobs = store.job_enqueue_many([JobSpec("sleepy", [30.0], max_attempts=3) for _ in range(2)])
    running = Running(lanes)
    wait_for(lambda: len(first._running) == 1 and len(failing._running) == 1, what="a job each")
    handles = [*first._running.values(), *failing._running.values()]
    broken.set()
    running.join()
    assert isinstance(running.error, RuntimeError) and str(running.error) == "lane 2 broke"
    # every task was told to stop (the failed lane's at once, the other's past its grace),
    # and both sessions closed, so both jobs are back in the queue, the attempt not counted
    assert all(handle.ctx.cancelled for handle in handles)
    assert {s.id for s in store.session_list()}.isdisjoint(
        {first.session.id, failing.session.id}  # type: ignore[union-attr]
    )
    for job in jobs:
        back = store.job_get(job.id)
        assert back.status == Status.PENDING and back.attempts_left == 3


def test_stop_at_once_ends_every_lane_without_waiting_for_its_jobs(
    app: plunder.App, store: Store
) -> None:
    running = Running(Lanes(app, WorkerOptions(concurrency=2, grace=60), lanes=2))
    store.job_enqueue_many([JobSpec("sleepy", [30.0]) for _ in range(2)])
    wait_for(lambda: all(len(lane._running) == 1 for lane in running.lanes.lanes), what="jobs")
    handles = [h for lane in running.lanes.lanes for h in lane._running.values()]
    stopped = time.monotonic()
    running.lanes.stop(graceful=False)
    running.join()
    assert time.monotonic() - stopped < 5  # not the 60 s grace, nor the 30 s jobs
    assert running.error is None
    assert all(handle.ctx.cancelled for handle in handles)


def test_suspects_run_one_at_a_time_in_the_whole_process(
    app: plunder.App, store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A suspect may be the job that killed its last worker; whatever runs beside it in
    the process dies with it, whichever lane runs it."""
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
    running = Running(Lanes(app, WorkerOptions(concurrency=4), lanes=2))
    running.until(
        lambda: all(store.job_get(job.id).status == Status.SUCCEEDED for job in jobs),
        "the suspects done",
    )
    assert tasks.AT_ONCE["most"] == 1


def test_a_lane_that_loses_its_session_opens_another_while_the_others_go_on(
    app: plunder.App, store: Store
) -> None:
    running = Running(Lanes(app, WorkerOptions(concurrency=4), lanes=2))
    first, second = running.lanes.lanes
    cuts: list[str] = []
    second.store.calls_cut = lambda reason: cuts.append(reason) or 0  # type: ignore[method-assign]
    try:
        wait_for(lambda: first.session and second.session, what="both sessions")
        assert first.session is not None and second.session is not None
        lost, kept = first.session.id, second.session.id
        store.session_close(lost)  # as the janitor would after an expiry
        wait_for(
            lambda: first.session is not None and first.session.id != lost,
            what="a new session for lane 1",
        )
        assert second.session.id == kept
        assert kept in {s.id for s in store.session_list()}
        jobs = store.job_enqueue_many([JobSpec("add", [i, 2]) for i in range(50)])
        wait_for(
            lambda: all(store.job_get(job.id).status == Status.SUCCEEDED for job in jobs),
            what="jobs done after the loss",
        )
    finally:
        running.lanes.stop()
        running.join()
    assert running.error is None
    assert first.stats["sessions"] == 2 and second.stats["sessions"] == 1
    assert cuts == []  # the lost session cut its own lane's calls, not the other's


def test_a_worker_that_closed_its_session_cuts_nothing_on_a_later_heartbeat(
    app: plunder.App, store: Store, monkeypatch: pytest.MonkeyPatch, caplog: Any
) -> None:
    """A heartbeat on its way as the worker closes its session finds the session closed,
    which must not read as a lost session: losing one cuts every call of the store, which
    lanes and the app's other users share. And the worker leaves the hub (the app's, which
    outlives it): no heartbeats after it stopped."""
    cuts: list[str] = []
    beats: list[float] = []
    worker = Worker(app, WorkerOptions(concurrency=2))
    monkeypatch.setattr(worker.store, "calls_cut", lambda reason: cuts.append(reason) or 0)
    beat = worker._liveness.beat
    monkeypatch.setattr(
        worker._liveness, "beat", lambda conn: beats.append(time.monotonic()) or beat(conn)
    )
    thread = threading.Thread(target=worker.run, kwargs={"install_signals": False})
    thread.start()
    wait_for(lambda: worker.session is not None, what="a session")
    caplog.set_level(logging.ERROR, logger="plunder.worker")
    worker.stop()
    thread.join(timeout=15)
    assert not thread.is_alive()
    assert beats, "the heartbeat never ran"
    stopped_at = time.monotonic()
    time.sleep(1.0)  # ten heartbeat intervals, the hub still running
    assert [at for at in beats if at > stopped_at] == []
    assert cuts == []
    assert not worker._session_lost.is_set()
    assert "is gone" not in caplog.text


@pytest.mark.parametrize(("concurrency", "lanes"), [(1, 2), (4, 0), (4, -1)])
def test_lanes_that_cannot_be_are_refused(app: plunder.App, concurrency: int, lanes: int) -> None:
    with pytest.raises(errors.ConfigError, match="lanes"):
        Lanes(app, WorkerOptions(concurrency=concurrency), lanes=lanes)


def test_lane_outcomes_are_fenced_by_their_own_session(app: plunder.App, store: Store) -> None:
    """Each lane claims and completes under its own session: the run history names the
    lane and its session for every job, every job ran once, and both lanes took part."""
    jobs = store.job_enqueue_many([JobSpec("sleepy", [0.1]) for _ in range(24)])
    running = Running(Lanes(app, WorkerOptions(concurrency=4, name="fenced"), lanes=2))
    sessions: dict[str, str] = {}
    try:
        wait_for(lambda: all(lane.session for lane in running.lanes.lanes), what="sessions")
        sessions = {lane.session.id: lane.name for lane in running.lanes.lanes}  # type: ignore[union-attr]
        wait_for(lambda: running.lanes.stats["succeeded"] == 24, what="the jobs done")
    finally:
        running.lanes.stop()
        running.join()
    names = set()
    for job in jobs:
        (run,) = store.job_runs(job.id)
        assert run.outcome == Outcome.SUCCEEDED and sessions[run.session_id] == run.worker
        names.add(run.worker)
    assert names == {"fenced/1", "fenced/2"}
