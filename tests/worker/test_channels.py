"""What a process listens for. A hub LISTENs on ``plunder_done`` and ``plunder_stream`` only
while someone in its process waits for a result or follows a stream (and for a while
after): every worker's turn names the jobs it completed on ``plunder_done``, so a worker
listening there would receive every other worker's turns. A wait that starts while the
hub is listening elsewhere still sees a completion at once, even one that came before the
LISTEN."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

import plunder
from plunder import hub
from plunder.model import Completion, JobSpec
from plunder.states import Status
from tests.store.helpers import claim, open_session
from tests.worker.conftest import wait_for

LONG = 30.0  # seconds: a poll interval and a hub wait that no test waits out


@pytest.fixture
def app(store_url: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[plunder.App]:
    """An app whose hub serves a worker's wake-ups, and whose waits end only when told:
    neither the waiters' polling nor the hub's own timeout would end them in time."""
    monkeypatch.setattr(hub, "MAX_WAIT", LONG)
    app = plunder.App(store_url, poll_interval=LONG)
    app.hub.on_work(["default"], lambda: None)
    yield app
    app.close()


class Channels:
    """What the hub's own connection LISTENs on, read on the hub's thread."""

    def __init__(self, app: plunder.App) -> None:
        self.seen: list[set[str]] = []
        app.hub.every(0.05, self._read)

    def _read(self, connection: Any) -> None:
        rows = connection.execute("SELECT pg_listening_channels()").fetchall()
        self.seen.append({row[0] for row in rows})

    def now(self) -> set[str]:
        count = len(self.seen)
        wait_for(lambda: len(self.seen) > count + 1, what="a fresh reading")
        return self.seen[-1]


@pytest.fixture
def channels(app: plunder.App, store_url: str, monkeypatch: pytest.MonkeyPatch) -> Channels:
    if not store_url.startswith("postgresql"):
        pytest.skip("LISTEN exists on PostgreSQL only")
    monkeypatch.setattr(hub, "MAX_WAIT", 0.05)  # the readings are periodic calls
    return Channels(app)


def test_a_worker_listens_for_work_only(app: plunder.App, channels: Channels) -> None:
    wait_for(lambda: channels.now() == {"plunder_enqueued"}, what="LISTEN on work only")
    app.store.job_enqueue_many([JobSpec("add", [1, 2])])
    assert channels.now() == {"plunder_enqueued"}


def test_results_are_listened_for_while_awaited_and_for_a_while_after(
    app: plunder.App, channels: Channels, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(hub, "LINGER", 3.0)
    wait_for(lambda: channels.now() == {"plunder_enqueued"}, what="LISTEN on work only")
    unwatch = app.hub.watch("done", 1, lambda: None)
    wait_for(lambda: "plunder_done" in channels.now(), what="LISTEN on results")
    unwatch()
    left = time.monotonic()
    assert "plunder_done" in channels.now()  # a wait right after finds it in place
    wait_for(lambda: channels.now() == {"plunder_enqueued"}, what="UNLISTEN on results")
    assert time.monotonic() - left >= 2.0  # LINGER, less a loaded machine's late turns
    unwatch = app.hub.watch("stream", 1, lambda: None)
    wait_for(lambda: "plunder_stream" in channels.now(), what="LISTEN on streams")
    unwatch()


def test_a_watch_rechecks_once_its_channel_is_listened_on(app: plunder.App, store_url: str) -> None:
    """A waiter checks the job, then waits; a completion between its check and the
    LISTEN sends a notification nobody receives. So once the LISTEN is in place, everyone
    watching that channel re-checks — here with no notification at all. (SQLite's hub
    re-checks after every commit: no channel, no gap.)"""
    if not store_url.startswith("postgresql"):
        pytest.skip("LISTEN exists on PostgreSQL only")
    wait_for(lambda: app.hub.wakeups >= 1, what="the hub's first re-check")
    time.sleep(0.3)  # and then waiting, listening on work only
    rechecked = threading.Event()
    asked = time.monotonic()
    unwatch = app.hub.watch("done", 123456789, rechecked.set)
    try:
        assert rechecked.wait(5.0)  # the hub's own wait would last LONG
        assert time.monotonic() - asked < 5.0
    finally:
        unwatch()


def test_a_result_is_seen_at_once_by_a_process_that_was_not_listening(
    app: plunder.App,
) -> None:
    wait_for(lambda: app.hub.wakeups >= 1, what="the hub's first re-check")
    time.sleep(0.3)  # and then waiting, listening on work only (on PostgreSQL)
    store = app.store
    store.job_enqueue_many([JobSpec("add", [1, 2])])
    (job,) = claim(store, open_session(store), limit=1, tasks=["add"])
    waited: list[float] = []

    def wait() -> None:
        app.job(job.id).wait(timeout=LONG)
        waited.append(time.monotonic())

    waiter = threading.Thread(target=wait)
    waiter.start()
    time.sleep(0.5)  # waiting, and listening
    done = time.monotonic()
    assert len(store.job_complete_many([Completion(job.claim, 3)]).accepted) == 1
    waiter.join(LONG)
    assert waited and waited[0] - done < 2.0, waited
    assert app.job(job.id).status == Status.SUCCEEDED
