"""The worker's heartbeat under busy answers: a serialization failure (CockroachDB raises
them at COMMIT) or a deadlock is sent again within one heartbeat interval, so a few in a
row do not cost a healthy worker its session; a lost connection is left to the hub."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest

from plunder import errors
from plunder.model import Heartbeat
from plunder.worker import Worker, WorkerOptions
from tests.worker import tasks

pytestmark = pytest.mark.parametrize("backend", ["sqlite"], indirect=True)
INTERVAL = 1.0


class Flaky:
    """A session_heartbeat that answers busy ``failures`` times, then alive."""

    def __init__(self, failures: int) -> None:
        self.failures = failures
        self.calls: list[float] = []

    def __call__(self, session_id: str, running: Any = (), **_: Any) -> Heartbeat:
        self.calls.append(time.monotonic())
        if len(self.calls) <= self.failures:
            raise errors.StoreBusy("could not serialize access due to concurrent update")
        return Heartbeat(alive=True, expires_at=None)


class Connection:
    def __init__(self, broken: bool = False) -> None:
        self.closed = False
        self.broken = broken


@pytest.fixture
def worker(store_url: str) -> Iterator[Worker]:
    tasks.app.configure(url=store_url, heartbeat_interval=INTERVAL, session_expiry=5 * INTERVAL)
    try:
        yield Worker(tasks.app, WorkerOptions(concurrency=1))
    finally:
        tasks.app.close()


def test_busy_heartbeats_are_sent_again(worker: Worker, monkeypatch: pytest.MonkeyPatch) -> None:
    flaky = Flaky(failures=2)
    monkeypatch.setattr(worker.store, "session_heartbeat", flaky)
    beat, sent = worker._liveness.renew("s", [], Connection())
    assert beat.alive and len(flaky.calls) == 3
    assert sent == pytest.approx(flaky.calls[-1], abs=0.01)  # trust starts at the renewal


def test_busy_retries_stop_when_the_next_heartbeat_is_due(
    worker: Worker, monkeypatch: pytest.MonkeyPatch
) -> None:
    flaky = Flaky(failures=1000)
    monkeypatch.setattr(worker.store, "session_heartbeat", flaky)
    started = time.monotonic()
    with pytest.raises(errors.StoreBusy):
        worker._liveness.renew("s", [], Connection())
    assert len(flaky.calls) >= 3
    assert time.monotonic() - started <= INTERVAL + 0.5  # a sleep may overshoot on a busy box


def test_a_lost_connection_is_not_retried(worker: Worker, monkeypatch: pytest.MonkeyPatch) -> None:
    flaky = Flaky(failures=1)
    monkeypatch.setattr(worker.store, "session_heartbeat", flaky)
    with pytest.raises(errors.StoreBusy):
        worker._liveness.renew("s", [], Connection(broken=True))
    assert len(flaky.calls) == 1
