"""Turns sent ahead (PostgreSQL): a busy worker sends its next turn before it starts the jobs
of the one just read, and the database commits it meanwhile. Its claims are then running
under the worker's session before the worker knows them: a heartbeat report that saw them
must not have them given back as lost, and a worker that stops must still run them."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import psycopg
import pytest

from plunder.acker import ACK_BATCH
from plunder.model import Claim
from plunder.states import Outcome, Status
from plunder.worker import Worker, WorkerOptions
from tests.store.helpers import claim
from tests.worker import tasks
from tests.worker.conftest import wait_for


@contextmanager
def idle_worker(url: str, concurrency: int) -> Iterator[Worker]:
    """A worker with a session, its loop not running: the test takes its turns."""
    tasks.app.configure(url=url, heartbeat_interval=0.1, session_expiry=5.0)
    worker = Worker(tasks.app, WorkerOptions(concurrency=concurrency))
    worker._open_session()
    try:
        yield worker
    finally:
        worker._close()
        tasks.app.close()


@dataclass(frozen=True)
class Send:
    at: float  # time.monotonic()
    limit: int
    behind: int  # the turns in flight as it was sent


def watch_sends(worker: Worker) -> list[Send]:
    """The turns the worker's pipe sends, as it sends them (none on SQLite)."""
    sends: list[Send] = []
    pipe = worker._turns.pipe
    if pipe is not None:
        real = pipe.send

        def counted(*args: Any, **kwargs: Any) -> bool:
            sends.append(Send(time.monotonic(), kwargs["limit"], pipe.in_flight))
            return real(*args, **kwargs)

        pipe.send = counted  # type: ignore[method-assign]
    return sends


@contextmanager
def running(worker: Worker) -> Iterator[None]:
    """The worker's loop on a thread for the block; stopped after it, and it ended well."""
    thread = threading.Thread(target=worker.run, kwargs={"install_signals": False}, daemon=True)
    thread.start()
    try:
        yield
    finally:
        worker.stop()
        thread.join(timeout=15)
        tasks.app.close()
    assert not thread.is_alive() and worker.error is None


def drained(worker: Worker, count: int) -> list[Any]:
    """``count`` jobs enqueued, each run once with its result, all acknowledged."""
    jobs = tasks.add.enqueue_many([(i, 1) for i in range(count)])
    assert [j.result(timeout=60) for j in jobs] == [i + 1 for i in range(count)]
    wait_for(lambda: worker.stats["succeeded"] == count, timeout=30)
    return jobs


def running_claims(worker: Worker) -> set[Claim]:
    return {j.claim for j in worker.store.job_list(status=Status.RUNNING, limit=500).jobs}


def test_a_busy_worker_sends_turns_ahead_and_runs_each_job_once(store_url: str) -> None:
    tasks.app.configure(url=store_url, heartbeat_interval=0.1, session_expiry=2.0)
    worker = Worker(tasks.app, WorkerOptions(concurrency=30))
    sends = watch_sends(worker)
    with running(worker):
        jobs = drained(worker, 600)
        assert worker.stats["claimed"] == 600 and worker.stats["stale"] == 0
        for job in jobs[::50]:
            assert [r.outcome for r in job.runs] == [Outcome.SUCCEEDED]
            assert job.refresh().attempt == 1
    if store_url.startswith("sqlite"):
        assert worker._turns.pipe is None
    else:  # turns of at most a third of the slots, most of them sent behind another (the
        # slots of the third in flight are free only once every job started has finished);
        # one sent from idle offers every free slot
        limits, behind = [s.limit for s in sends], [s.behind for s in sends]
        ahead = [s.limit for s in sends if s.behind]
        assert len(limits) >= 60 and max(ahead) == 10 and max(limits) <= 30
        assert max(behind) <= 3 - 1 and behind.count(1) >= len(behind) // 2


def test_an_idle_worker_offers_every_free_slot_and_sends_nothing_behind(
    store_url: str,
) -> None:
    """Woken from idle, one turn claims up to every free slot: a share of them that came
    back full would send the next turn at once, while the first job's thread waits."""
    tasks.app.configure(url=store_url, heartbeat_interval=0.1, session_expiry=2.0)
    worker = Worker(tasks.app, WorkerOptions(concurrency=4))
    sends = watch_sends(worker)
    with running(worker):
        wait_for(lambda: worker.session is not None, timeout=10)
        drained(worker, 1)
    if store_url.startswith("sqlite"):
        assert worker._turns.pipe is None
    else:
        assert sends and all(s.limit == 4 and not s.behind for s in sends), sends


def test_each_turn_carries_every_result_waiting_with_more_slots_than_ack_batch(
    store_url: str,
) -> None:
    """Acknowledgements keep up with claims at any concurrency: a turn takes every result
    waiting (at most two per slot), not ACK_BATCH of them. Held to ACK_BATCH, a worker
    with more slots claimed faster than it acknowledged, its finished jobs piled up as
    running in the database, and its drain ran at a third of the speed."""
    tasks.app.configure(url=store_url, heartbeat_interval=0.1, session_expiry=5.0)
    worker = Worker(tasks.app, WorkerOptions(concurrency=ACK_BATCH * 2 + 50))
    left: list[int] = []  # the results a turn left waiting as it went out

    def watched(send: Any) -> Any:
        def counted(done: Any, *args: Any, **kwargs: Any) -> Any:
            if kwargs["limit"]:  # a turn; not the results written alone, ACK_BATCH at a time
                left.append(len(worker._slots.outbox.completions) - len(done))
            return send(done, *args, **kwargs)

        return counted

    if worker._turns.pipe is not None:
        worker._turns.pipe.send = watched(worker._turns.pipe.send)  # type: ignore[method-assign]
    store = worker.store
    store.job_exchange_many = watched(store.job_exchange_many)  # type: ignore[method-assign]
    try:
        with running(worker):
            drained(worker, 2_000)
    finally:
        del store.job_exchange_many  # the class's again
    assert len(left) >= 4 and max(left) == 0


@pytest.mark.parametrize("backend", ["postgres"], indirect=True)
def test_a_busy_worker_has_turns_running_while_it_works(store_url: str) -> None:
    """The turns do overlap the worker's own work: several are in flight at once, and some
    have come back before the worker asks for them (the database ran them meanwhile).
    A pipe that fell back to one turn at a time, or that ran each turn only once asked for
    its answer, fails here."""
    tasks.app.configure(url=store_url, heartbeat_interval=0.1, session_expiry=5.0)
    worker = Worker(tasks.app, WorkerOptions(concurrency=30))
    pipe = worker._turns.pipe
    assert pipe is not None and pipe.depth == 3
    seen: list[tuple[int, bool]] = []  # at each receive: turns in flight, answer in already
    real = pipe.receive

    def counted() -> Any:
        seen.append((pipe.in_flight, pipe.answered()))
        return real()

    pipe.receive = counted  # type: ignore[method-assign]
    with running(worker):
        drained(worker, 1_500)
    in_flight, answered = [n for n, _ in seen], [a for _, a in seen]
    assert len(seen) >= 60 and max(in_flight) >= 2
    assert in_flight.count(1) < len(seen) // 2, f"mostly one turn at a time: {in_flight}"
    # (how many depends on how fast the database is against the worker; none: no overlap)
    assert answered.count(True) >= 3, f"answers came only when asked: {seen}"


@pytest.mark.parametrize("backend", ["postgres"], indirect=True)
def test_an_idle_worker_sends_no_turns_ahead(store_url: str) -> None:
    """Turns go ahead only while they come back full: once the queue is empty the worker
    waits for work instead of sending empty turns."""
    tasks.app.configure(
        url=store_url, heartbeat_interval=0.1, session_expiry=2.0, poll_interval=1.0
    )
    worker = Worker(tasks.app, WorkerOptions(concurrency=20))
    assert worker._turns.pipe is not None
    pipe = worker._turns.pipe
    sends = watch_sends(worker)
    with running(worker):
        drained(worker, 200)
        time.sleep(0.3)  # the last results go out
        quiet = time.monotonic()
        time.sleep(1.0)
        assert len([s for s in sends if s.at > quiet]) <= 2  # a poll a second, not a spin
        assert pipe.in_flight == 0


@pytest.mark.parametrize("backend", ["postgres"], indirect=True)
def test_a_report_that_may_have_seen_the_turn_in_flight_waits_for_it(store_url: str) -> None:
    with idle_worker(store_url, concurrency=6) as worker:
        jobs = tasks.sleepy.enqueue_many([(30,) for _ in range(4)])
        session = worker.session
        assert session is not None
        (orphan,) = claim(worker.store, session, tasks=["sleepy"], limit=1)  # its answer lost
        assert worker._turns.send(6)  # from idle, a claim of every free slot: the other three
        wait_for(lambda: len(running_claims(worker)) == 4, what="the turn committed")
        in_flight = running_claims(worker) - {orphan.claim}
        # a heartbeat's report that came after the turn was sent may have seen its claims
        worker._liveness.report_unknown([orphan.claim, *in_flight])
        worker._give_back_unknown()
        assert running_claims(worker) == {orphan.claim, *in_flight}  # nothing given back
        assert worker._turns.read() == 3  # the turn read, its jobs started
        assert worker._slots.running_ids() == {c.job_id for c in in_flight}
        worker._give_back_unknown()  # now the report is acted on: the orphan goes back
        assert running_claims(worker) >= in_flight
        # (the turn sent ahead as the last was read may claim it again once it is back)
        runs = worker.store.job_runs(orphan.id)
        assert [(r.attempt, r.outcome) for r in runs][:1] == [(orphan.attempt, Outcome.RELEASED)]
        assert orphan.claim not in running_claims(worker)
        for job in jobs:
            job.cancel()


@pytest.mark.parametrize("backend", ["postgres"], indirect=True)
def test_a_worker_stopping_with_a_turn_in_flight_runs_its_jobs(store_url: str) -> None:
    with idle_worker(store_url, concurrency=12) as worker:
        jobs = tasks.add.enqueue_many([(i, 2) for i in range(4)])
        assert worker._turns.send(12)  # a claim of every free slot, which takes the four
        worker.stop()
        worker._drain()
        assert worker.stats["claimed"] == 4 and worker.stats["succeeded"] == 4
        assert [j.result(timeout=5) for j in jobs] == [i + 2 for i in range(4)]


@pytest.mark.parametrize("backend", ["postgres"], indirect=True)
def test_the_results_of_a_turn_cut_in_flight_go_out_with_the_next(store_url: str) -> None:
    """A turn cut on its way may or may not have committed: its results are sent again
    (a completion that committed already is accepted again), nothing runs twice."""
    with idle_worker(store_url, concurrency=12) as worker:
        jobs = tasks.add.enqueue_many([(i, 3) for i in range(4)])
        # from idle, a claim of every free slot: four came, none was sent ahead of them
        assert worker._turns.send(12) and worker._turns.read() == 4
        assert worker._turns.in_flight() == 0
        wait_for(
            lambda: worker._slots.collect(block=False) or len(worker._slots.outbox.completions) == 4
        )
        with psycopg.connect(store_url) as blocker:  # the turn waits on a row lock: in flight
            blocker.execute("SELECT 1 FROM plunder_jobs WHERE id = %s FOR UPDATE", (jobs[0].id,))
            assert worker._turns.send(12)  # the four results, and a claim of nothing
            cutter = threading.Thread(target=worker.store.calls_cut, args=("cut by the test",))
            cutter.start()
            cutter.join()
            assert worker._turns.read() == 0  # failed: "a turn failed", logged
            assert sorted(c.claim.job_id for c in worker._slots.outbox.completions) == sorted(
                j.id for j in jobs
            )
            blocker.rollback()
        worker._turns.turn(12)  # sent again, on a fresh connection
        assert worker._slots.outbox.completions == [] and worker.stats["succeeded"] == 4
        for job in jobs:
            assert job.result(timeout=5) == job.refresh().args[0] + 3
            assert [r.outcome for r in job.runs] == [Outcome.SUCCEEDED]
