"""The worker's loop over the worker protocol alone, against a test double of it
(tests.support.memlink): no database is reachable from these workers (their app's URL
names a directory that does not exist), so everything they do goes through the protocol."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest

import plunder
from plunder.context import LinkSink
from plunder.protocol import Hello
from plunder.states import Status
from plunder.worker import Worker, WorkerOptions
from tests.support.memlink import MemoryLink
from tests.worker.conftest import wait_for

NOWHERE = "sqlite:////nonexistent-plunder-dir/never.db"


@pytest.fixture
def app() -> plunder.App:
    app = plunder.App(NOWHERE, heartbeat_interval=0.05, session_expiry=1.0, poll_interval=0.05)
    return app


@contextmanager
def working(app: plunder.App, link: MemoryLink, concurrency: int = 4) -> Iterator[Worker]:
    worker = Worker(app, WorkerOptions(concurrency=concurrency), link=link)
    thread = threading.Thread(target=worker.run, kwargs={"install_signals": False}, daemon=True)
    thread.start()
    try:
        wait_for(lambda: worker.session is not None, what="a session")
        yield worker
    finally:
        worker.stop()
        thread.join(timeout=15)
        assert not thread.is_alive(), "the worker did not stop"
    if worker.error is not None:
        raise worker.error


def task(app: plunder.App, fn: Callable[..., Any], name: str | None = None) -> str:
    """Register ``fn`` (a lambda or a test's local function) under a plain name."""
    return app.task(name=name or fn.__name__)(fn).name


def test_a_worker_drains_jobs_through_the_protocol_alone(app: plunder.App) -> None:
    add = task(app, lambda a, b: a + b, name="add")
    link = MemoryLink()
    ids = [link.enqueue(add, i, i) for i in range(50)]
    with working(app, link):
        wait_for(lambda: link.statuses() == {Status.SUCCEEDED: 50}, what="50 jobs done")
    assert [link.jobs[i].result for i in ids] == [2 * i for i in range(50)]
    assert link.calls[0] == "open" and link.calls[-1] == "close"
    assert "heartbeat" in link.calls
    # the app never opened its store: nothing went around the protocol
    assert app._store is None


def test_a_claim_never_asks_for_more_than_the_free_slots(app: plunder.App) -> None:
    """Slots bound the work: with -c 3, at most three run at once, and no claim asks for
    more slots than are free."""
    running, peak, lock = [0], [0], threading.Lock()

    def busy() -> None:
        with lock:
            running[0] += 1
            peak[0] = max(peak[0], running[0])
        time.sleep(0.02)
        with lock:
            running[0] -= 1

    name = task(app, busy)
    link = MemoryLink()
    for _ in range(30):
        link.enqueue(name)
    with working(app, link, concurrency=3):
        wait_for(lambda: link.statuses() == {Status.SUCCEEDED: 30}, what="30 jobs done")
    assert peak[0] == 3
    assert link.claims and max(link.claims) <= 3


def test_a_failure_goes_back_with_its_error_type(app: plunder.App) -> None:
    def broken() -> None:
        raise KeyError("missing")

    name = task(app, broken)
    link = MemoryLink()
    job = link.enqueue(name)
    with working(app, link):
        wait_for(lambda: link.status(job) == Status.FAILED, what="the failure")
    assert link.jobs[job].error == {"type": "KeyError"}


def test_a_cancelled_claim_is_stopped_and_its_result_not_written(app: plunder.App) -> None:
    """The heartbeat says the claim is no longer current: the task is told to stop (it
    sees ``ctx.cancelled``), and nothing it returns is written."""
    started, saw_cancel = threading.Event(), threading.Event()

    def patient(ctx: plunder.Context) -> str:
        started.set()
        if ctx.wait_cancelled(timeout=10):
            saw_cancel.set()
        return "too late"

    name = task(app, patient)
    link = MemoryLink()
    job = link.enqueue(name)
    with working(app, link) as worker:
        assert started.wait(5)
        link.cancel(job)
        assert saw_cancel.wait(5)
        wait_for(lambda: worker._slots.busy() == 0, what="its slot back")
    assert link.jobs[job].status == Status.CANCELLED and link.jobs[job].result is None


def test_a_lost_session_is_replaced_and_work_goes_on(app: plunder.App) -> None:
    """The session expires under the worker: it stops what runs, opens a new session,
    and finishes the work under it."""
    release = threading.Event()

    def gated(i: int) -> int:
        release.wait(10)
        return i

    name = task(app, gated)
    link = MemoryLink()
    jobs = [link.enqueue(name, i) for i in range(3)]
    with working(app, link) as worker:
        wait_for(lambda: link.statuses().get(Status.RUNNING) == 3, what="three running")
        first = worker.session
        assert first is not None
        link.expire(first.id)
        wait_for(
            lambda: worker.session is not None and worker.session.id != first.id,
            what="a new session",
        )
        release.set()
        wait_for(lambda: link.statuses() == {Status.SUCCEEDED: 3}, what="all three done")
    assert worker.stats["sessions"] == 2
    assert {link.jobs[j].session_id for j in jobs} == {None}


def test_stream_events_go_through_the_protocol_fenced(app: plunder.App) -> None:
    def chatty(ctx: plunder.Context) -> None:
        ctx.stream("one")
        ctx.progress(1, 2)
        ctx.stream("two")

    name = task(app, chatty)
    link = MemoryLink()
    job = link.enqueue(name)
    with working(app, link):
        wait_for(lambda: link.status(job) == Status.SUCCEEDED, what="the job")
    kinds = [(claim.job_id, kind) for claim, kind, _ in link.events]
    assert (job, "progress") in kinds
    assert [data for _, kind, data in link.events if kind != "progress"] == ["one", "two"]


def test_a_task_transaction_is_refused_without_a_database(app: plunder.App) -> None:
    def writer(ctx: plunder.Context) -> None:
        with ctx.transaction():
            pass

    name = task(app, writer)
    link = MemoryLink()
    job = link.enqueue(name)
    with working(app, link):
        wait_for(lambda: link.status(job) == Status.FAILED, what="the failure")
    assert link.jobs[job].error == {"type": "plunder.errors.ConfigError"}


def test_a_graceful_stop_closes_the_session_and_gives_back_what_did_not_start(
    app: plunder.App,
) -> None:
    name = task(app, lambda: None, name="noop")
    link = MemoryLink()
    with working(app, link) as worker:
        wait_for(lambda: "heartbeat" in link.calls, what="a heartbeat")
        session = worker.session
    assert session is not None and session.id not in link.sessions
    assert link.calls[-1] == "close"
    assert name in session.tasks


def test_no_turn_goes_out_once_the_session_is_given_up(app: plunder.App) -> None:
    """The watchdog judged the session lost (the database may still think it alive): the
    results waiting would be refused, and a claim under that session would only be lost
    again, its attempts counted. No exchange goes out until a new session is open."""
    from plunder.slots import Slots
    from plunder.turns import Turns

    name = task(app, lambda: None, name="noop")
    link = MemoryLink()
    link.enqueue(name)
    session = link.open(Hello("w", "h", 1, ("default",), (), 5.0, 4))
    given_up = threading.Event()
    slots = Slots(4, pool=None, task=app.registry.get, sink=LinkSink(link), on_stream=lambda: None)
    turns = Turns(
        link, slots, depth=1, queues=["default"], tasks=[name], session=lambda: session,
        stopping=lambda: False, given_up=given_up.is_set, lost=lambda: None,
        counted=lambda ack, kind: None, stats={"claimed": 0}, pause=lambda: None,
    )  # fmt: skip
    given_up.set()
    assert turns.turn(4) == 0
    assert link.calls == ["open"] and link.statuses() == {Status.PENDING: 1}
    given_up.clear()
    assert turns.turn(4) == 1  # the same turn, once the session is trusted again
    slots.close()


def test_a_heartbeat_of_a_session_renewed_meanwhile_is_not_acted_on() -> None:
    """A heartbeat sent for the old session comes back 'gone' after the worker has opened a
    new one: it says nothing about the new session, which must not be thrown away."""
    from plunder.config import Settings, WorkerDeadlines
    from plunder.liveness import Liveness

    link = MemoryLink()
    hello = Hello("w", "h", 1, ("default",), (), 5.0, 4)
    current = [link.open(hello)]
    lost: list[str] = []

    class Renewing(MemoryLink):
        def heartbeat(self, beat: Any, *, via: Any = None) -> Any:
            link.expire(current[0].id)  # lost, and renewed while this beat was out
            current[0] = link.open(hello)
            return link.heartbeat(beat, via=via)

    liveness = Liveness(
        Renewing(), WorkerDeadlines.of(Settings()), session=lambda: current[0],
        quiet=lambda: False, claims=list, stop=lambda claims: None,
        lost=lambda: lost.append("lost"),
    )  # fmt: skip
    liveness.beat(None)
    assert lost == []
    liveness.beat(None)  # the same, about the session it was sent for: still not ours
    assert lost == []


def test_a_session_lost_while_stopping_ends_the_worker_without_a_new_one(
    app: plunder.App,
) -> None:
    """SIGTERM, then the session is lost while the running job finishes, and the database
    is out of reach: the worker stops (the job runs again elsewhere) instead of waiting to
    open a session it would only close."""
    from plunder import errors

    started = threading.Event()

    def patient(ctx: plunder.Context) -> None:
        started.set()
        ctx.wait_cancelled(timeout=10)

    class Unreachable(MemoryLink):
        def open(self, hello: Hello) -> Any:
            if "open" in self.calls:
                raise errors.StoreUnavailable("connection refused")
            return super().open(hello)

    name = task(app, patient)
    link = Unreachable()
    job = link.enqueue(name)
    worker = Worker(app, WorkerOptions(concurrency=2, grace=30.0), link=link)
    thread = threading.Thread(target=worker.run, kwargs={"install_signals": False}, daemon=True)
    thread.start()
    assert started.wait(5)
    worker.stop()  # graceful: the job may finish within 30 s
    assert worker.session is not None
    link.expire(worker.session.id)
    thread.join(timeout=5)
    alive = thread.is_alive()
    worker.stop(graceful=False)
    assert not alive, "the worker went on trying to open a session while stopping"
    assert link.calls.count("open") == 1
    assert link.status(job) == Status.PENDING  # back in the queue, for another worker
