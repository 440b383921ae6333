"""The acknowledger on both databases, on its own thread and on the caller's: results are
written in batches and counted, held until written, retried while the database is busy,
turned into failures when it refuses them for good, and forgotten when the session is lost.
A worker whose acknowledgements are held up does not give their jobs back as abandoned."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from plunder import errors
from plunder.acker import Acker
from plunder.model import AckResult, Completion, ErrorInfo, Failure, JobSpec
from plunder.states import Outcome, Status
from plunder.store import Store
from plunder.worker import BACKLOG
from tests.store.helpers import claim, open_session
from tests.worker import tasks
from tests.worker.conftest import wait_for, worker_in_thread


class Gated:
    """The real store, with each acknowledgement held at a gate until the test opens it,
    and the first ``faults`` calls failing with the error a test gives."""

    def __init__(self, store: Store, *, fault: Exception | None = None, faults: int = 0) -> None:
        self.store = store
        self.gate = threading.Event()
        self.gate.set()
        self.waiting = threading.Event()
        self.fault, self.faults, self.calls = fault, faults, 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.store, name)

    def _call(self, write: Callable[..., AckResult], batch: Any, **kw: Any) -> AckResult:
        self.calls += 1
        self.waiting.set()
        assert self.gate.wait(30)
        if self.fault is not None and self.calls <= self.faults:
            raise self.fault
        return write(batch, **kw)

    def job_complete_many(self, batch: Any, **kw: Any) -> AckResult:
        return self._call(self.store.job_complete_many, batch, **kw)

    def job_fail_many(self, batch: Any, **kw: Any) -> AckResult:
        return self._call(self.store.job_fail_many, batch, **kw)


class Counted:
    def __init__(self) -> None:
        self.kinds: list[tuple[str, int, int]] = []

    def __call__(self, ack: AckResult, kind: str) -> None:
        self.kinds.append((kind, len(ack.accepted), len(ack.stale)))


@pytest.fixture(params=[True, False], ids=["threaded", "inline"])
def threaded(request: pytest.FixtureRequest) -> bool:
    return bool(request.param)


@pytest.fixture
def stop() -> Iterator[threading.Event]:
    event = threading.Event()
    yield event
    event.set()


def acker(store: Any, threaded: bool, stop: threading.Event, counted: Counted) -> Acker:
    return Acker(store, threaded=threaded, stopped=stop.is_set, counted=counted)


def results(store: Store, count: int) -> tuple[list[Completion], list[Failure]]:
    """Claims ``count`` jobs; half of them succeed, the other half fail for good."""
    store.job_enqueue_many([JobSpec("t", [i]) for i in range(count)])
    jobs = claim(store, open_session(store), limit=count)
    info = ErrorInfo("ValueError", "no", None)
    half = count // 2
    done = [Completion(job.claim, job.args[0]) for job in jobs[:half]]
    failed = [Failure(job.claim, info, retry_delay=None) for job in jobs[half:]]
    return done, failed


def test_results_are_written_in_batches_and_counted(
    store: Store, threaded: bool, stop: threading.Event
) -> None:
    counted = Counted()
    sender = acker(store, threaded, stop, counted)
    done, failed = results(store, 450)
    sender.send(done, failed)
    assert sender.flush(timeout=30)
    assert sender.backlog() == 0 and sender.held() == set()
    statuses = {store.job_get(c.claim.job_id).status for c in done}
    assert statuses == {Status.SUCCEEDED}
    assert {store.job_get(f.claim.job_id).status for f in failed} == {Status.FAILED}
    # 225 completions and 225 failures, at most ACK_BATCH (200) to a transaction, a batch
    # of each kind in turn
    assert counted.kinds == [("succeeded", 200, 0), ("failed", 200, 0), ("succeeded", 25, 0),
                             ("failed", 25, 0)]  # fmt: skip
    sender.close(timeout=10)


def test_results_are_held_until_written(store: Store, stop: threading.Event) -> None:
    gated = Gated(store)
    gated.gate.clear()
    sender = acker(gated, True, stop, Counted())
    done, failed = results(store, 4)
    sender.send(done, failed)
    assert gated.waiting.wait(10)
    everything = {c.claim.job_id for c in done} | {f.claim.job_id for f in failed}
    assert sender.held() == everything  # two in flight, two waiting for them
    assert sender.backlog() == 4
    assert not sender.flush(timeout=0.1)
    gated.gate.set()
    assert sender.flush(timeout=30)
    assert sender.held() == set()
    assert store.job_get(done[0].claim.job_id).status == Status.SUCCEEDED
    sender.close(timeout=10)


def completed_through(
    store: Store, threaded: bool, stop: threading.Event, fault: Exception, faults: int
) -> tuple[Gated, Counted, list[Completion]]:
    """One completion sent through an acker whose first ``faults`` writes fail."""
    gated, counted = Gated(store, fault=fault, faults=faults), Counted()
    sender = acker(gated, threaded, stop, counted)
    done, _ = results(store, 2)
    sender.send(done, [])
    assert sender.flush(timeout=30)
    return gated, counted, done


def test_a_busy_database_is_retried_until_it_answers(
    store: Store, threaded: bool, stop: threading.Event
) -> None:
    busy = errors.StoreBusy("serialization failure")
    gated, counted, done = completed_through(store, threaded, stop, busy, 2)
    assert gated.calls == 3
    assert counted.kinds == [("succeeded", 1, 0)]
    assert store.job_get(done[0].claim.job_id).status == Status.SUCCEEDED


def test_completions_refused_for_good_become_failures_that_say_why(
    store: Store, threaded: bool, stop: threading.Event
) -> None:
    refused = errors.StoreError("value out of range")
    _, counted, done = completed_through(store, threaded, stop, refused, 1)
    assert counted.kinds == [("failed", 1, 0)]
    job = store.job_get(done[0].claim.job_id)
    assert job.status == Status.FAILED  # its one attempt is spent
    (run,) = store.job_runs(job.id)
    assert run.outcome == Outcome.FAILED and "value out of range" in (run.error or {}).get(
        "message", ""
    )


def test_failures_do_not_wait_behind_a_stream_of_completions(
    store: Store, stop: threading.Event
) -> None:
    """A failure handed over behind many completions goes out with their first batch, not
    after all of them (it would stay running meanwhile, its retry late)."""
    counted = Counted()
    sender = acker(store, True, stop, counted)
    done, failed = results(store, 902)
    sender.send(done, failed[:1])
    assert sender.flush(timeout=30)
    assert counted.kinds[:2] == [("succeeded", 200, 0), ("failed", 1, 0)]
    sender.close(timeout=10)


def test_a_batch_retried_while_the_database_is_busy_is_given_up_when_dropped(
    store: Store, stop: threading.Event
) -> None:
    """The session is lost and a new one opened: the old session's batch, retried while
    the database stays busy, is given up rather than holding up the new session's."""
    gated = Gated(store, fault=errors.StoreBusy("deadlock detected"), faults=1000)
    sender = acker(gated, True, stop, Counted())
    done, _ = results(store, 4)
    sender.send(done, [])
    wait_for(lambda: gated.calls >= 2, what="a retry")
    assert sender.drop() == 2  # the batch on its way is counted: it will be refused
    assert sender.flush(timeout=10)
    assert sender.close(timeout=10)


def test_close_says_when_results_are_left_unwritten(store: Store, stop: threading.Event) -> None:
    """A database out of reach at shutdown: close gives up after its timeout and says so
    (the worker then leaves its session to expire instead of closing it, which would give
    back jobs whose results are still on their way)."""
    gated = Gated(store, fault=errors.StoreUnavailable("connection refused"), faults=1000)
    sender = acker(gated, True, stop, Counted())
    done, _ = results(store, 2)
    sender.send(done, [])
    assert not sender.close(timeout=0.3)
    assert sender.held() == {done[0].claim.job_id}
    stop.set()  # the worker halts: the acker gives up at its next retry
    assert sender.flush(timeout=10)


def test_a_lost_session_gives_up_what_is_on_its_way(store: Store, stop: threading.Event) -> None:
    gated = Gated(store, fault=errors.StoreUnavailable("connection refused"), faults=1000)
    gated.gate.clear()
    sender = acker(gated, True, stop, Counted())
    done, failed = results(store, 4)
    sender.send(done, failed)
    assert gated.waiting.wait(10)
    assert sender.drop() == 4  # two on their way (refused, when they arrive), two not yet
    stop.set()  # the session is lost: the store would refuse them
    gated.gate.set()
    assert sender.flush(timeout=10)
    assert gated.calls == 1
    assert store.job_get(done[0].claim.job_id).status == Status.RUNNING  # rescued later


def test_a_worker_keeps_jobs_whose_results_are_on_their_way(store_url: str) -> None:
    """The heartbeat reports jobs the database has running under the session and no task
    of the worker holds. A job whose completion waits for the database is one of them, and
    must not be given back to the queue (it would run twice)."""
    if not store_url.startswith("postgresql"):
        pytest.skip("SQLite acknowledges and claims in one transaction, on the main thread")
    with worker_in_thread(store_url, concurrency=1, parallel_acks=True) as worker:
        gated = Gated(worker.store)
        gated.gate.clear()
        worker._acker._store = gated  # type: ignore[assignment]
        job = tasks.add.enqueue(2, 2)
        assert gated.waiting.wait(20)
        threading.Event().wait(1.0)  # ten heartbeats, each reporting the job
        assert worker.store.job_get(job.id).status == Status.RUNNING
        gated.gate.set()
        assert job.result(timeout=20) == 4
        wait_for(lambda: worker.stats["succeeded"] == 1, what="counted")
        assert worker.stats["sessions"] == 1
        assert [r.outcome for r in job.runs] == [Outcome.SUCCEEDED]
        assert job.refresh().attempt == 1


def test_claims_wait_while_acknowledgements_fall_behind(store_url: str) -> None:
    """Results written slower than tasks finish: the worker stops claiming until the
    database catches up, so the finished jobs still running in the database stay bounded."""
    if not store_url.startswith("postgresql"):
        pytest.skip("SQLite acknowledges and claims in one transaction, on the main thread")

    class Slow(Gated):
        def _call(self, write: Callable[..., AckResult], batch: Any, **kw: Any) -> AckResult:
            threading.Event().wait(0.2)
            return write(batch, **kw)

    with worker_in_thread(store_url, concurrency=50, parallel_acks=True) as worker:
        worker._acker._store = Slow(worker.store)  # type: ignore[assignment]
        tasks.add.enqueue_many([(i, 0) for i in range(4000)])
        peak, deadline = 0, time.monotonic() + 4
        while time.monotonic() < deadline:
            peak = max(peak, worker._acker.backlog())
            threading.Event().wait(0.02)
        worker._acker._store = worker.store  # type: ignore[assignment]
        wait_for(lambda: worker.stats["succeeded"] == 4000, timeout=60)
    # a claim takes at most the free slots (50) once the backlog is under the bound
    assert BACKLOG <= peak <= BACKLOG + 2 * 50, peak
