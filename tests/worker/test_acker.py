"""Results written outside a turn, on both databases: in batches of each kind in turn and
counted, retried while the database is busy, turned into failures when it refuses them for
good, and given up when the session is lost or a deadline passes."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from plunder import errors
from plunder.acker import Acker
from plunder.model import AckResult, Completion, ErrorInfo, Failure, JobSpec
from plunder.states import Outcome, Status
from plunder.store import Store
from plunder.store.link import StoreLink
from tests.store.helpers import claim, open_session


class Faulty:
    """The real store, whose first ``faults`` acknowledgements fail with ``fault``."""

    def __init__(self, store: Store, *, fault: Exception | None = None, faults: int = 0) -> None:
        self.store = store
        self.fault, self.faults, self.calls = fault, faults, 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.store, name)

    def job_exchange_many(self, *args: Any, **kw: Any) -> Any:
        self.calls += 1
        if self.fault is not None and self.calls <= self.faults:
            raise self.fault
        return self.store.job_exchange_many(*args, **kw)


class Counted:
    def __init__(self) -> None:
        self.kinds: list[tuple[str, int, int]] = []

    def __call__(self, ack: AckResult, kind: str) -> None:
        self.kinds.append((kind, len(ack.accepted), len(ack.stale)))


@pytest.fixture
def stop() -> Iterator[threading.Event]:
    event = threading.Event()
    yield event
    event.set()


SESSION: dict[int, str] = {}  # the session results() claimed under, by store


def acker(store: Any, stop: threading.Event, counted: Counted) -> Acker:
    """Results written under the session of the last ``results()`` on that store."""
    real = getattr(store, "store", store)
    return Acker(
        StoreLink(store), session=lambda: SESSION[id(real)], stopped=stop.is_set, counted=counted
    )


def results(store: Store, count: int) -> tuple[list[Completion], list[Failure]]:
    """Claims ``count`` jobs; half of them succeed, the other half fail for good."""
    store.job_enqueue_many([JobSpec("t", [i]) for i in range(count)])
    session = open_session(store)
    SESSION[id(store)] = session.id
    jobs = claim(store, session, limit=count)
    info = ErrorInfo("ValueError", "no", None)
    half = count // 2
    done = [Completion(job.claim, job.args[0]) for job in jobs[:half]]
    failed = [Failure(job.claim, info, retry_delay=None) for job in jobs[half:]]
    return done, failed


def test_results_are_written_in_batches_and_counted(store: Store, stop: threading.Event) -> None:
    counted = Counted()
    done, failed = results(store, 450)
    assert acker(store, stop, counted).write(done, failed)
    statuses = {store.job_get(c.claim.job_id).status for c in done}
    assert statuses == {Status.SUCCEEDED}
    assert {store.job_get(f.claim.job_id).status for f in failed} == {Status.FAILED}
    # 225 completions and 225 failures, at most ACK_BATCH (200) to a transaction, a batch
    # of each kind in turn
    assert counted.kinds == [("succeeded", 200, 0), ("failed", 200, 0), ("succeeded", 25, 0),
                             ("failed", 25, 0)]  # fmt: skip


def completed_through(
    store: Store, stop: threading.Event, fault: Exception, faults: int
) -> tuple[Faulty, Counted, list[Completion]]:
    """One completion written through a store whose first ``faults`` writes fail."""
    faulty, counted = Faulty(store, fault=fault, faults=faults), Counted()
    done, _ = results(store, 2)
    assert acker(faulty, stop, counted).write(done, [])
    return faulty, counted, done


def test_a_busy_database_is_retried_until_it_answers(store: Store, stop: threading.Event) -> None:
    busy = errors.StoreBusy("serialization failure")
    faulty, counted, done = completed_through(store, stop, busy, 2)
    assert faulty.calls == 3
    assert counted.kinds == [("succeeded", 1, 0)]
    assert store.job_get(done[0].claim.job_id).status == Status.SUCCEEDED


def test_completions_refused_for_good_become_failures_that_say_why(
    store: Store, stop: threading.Event
) -> None:
    refused = errors.StoreError("value out of range")
    _, counted, done = completed_through(store, stop, refused, 1)
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
    """A failure behind many completions goes out after their first batch, not after all
    of them (it would stay running meanwhile, its retry late)."""
    counted = Counted()
    done, failed = results(store, 902)
    assert acker(store, stop, counted).write(done, failed[:1])
    assert counted.kinds[:2] == [("succeeded", 200, 0), ("failed", 1, 0)]


def test_a_deadline_gives_up_results_the_database_cannot_take(
    store: Store, stop: threading.Event
) -> None:
    """A database out of reach at shutdown: the write gives up at its deadline and says so
    (the worker then leaves its session to expire instead of closing it, which would give
    back jobs whose results were never written)."""
    faulty = Faulty(store, fault=errors.StoreUnavailable("connection refused"), faults=1000)
    done, _ = results(store, 2)
    started = time.monotonic()
    assert not acker(faulty, stop, Counted()).write(done, [], deadline=started + 0.3)
    assert 0.3 <= time.monotonic() - started < 5
    assert faulty.calls >= 2
    assert store.job_get(done[0].claim.job_id).status == Status.RUNNING  # rescued later


def test_a_lost_session_gives_up_what_is_being_retried(store: Store, stop: threading.Event) -> None:
    """The session is lost while the database is busy: the results would be refused, so
    the retries end rather than hold up the worker's new session."""
    faulty = Faulty(store, fault=errors.StoreBusy("deadlock detected"), faults=1000)
    done, failed = results(store, 4)
    threading.Timer(0.2, stop.set).start()
    assert not acker(faulty, stop, Counted()).write(done, failed)
    assert faulty.calls >= 2
    assert {store.job_get(c.claim.job_id).status for c in done} == {Status.RUNNING}
