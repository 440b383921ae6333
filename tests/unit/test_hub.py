"""The hub outlives a database it cannot reach, and says so once, not at every wait."""

from __future__ import annotations

import logging
import socket
import time

import pytest

import plunder
from plunder import hub


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])  # nothing listens there once it is closed


def test_an_unreachable_database_is_logged_once_without_a_traceback(
    caplog: pytest.LogCaptureFixture,
) -> None:
    store = plunder.open_store(f"postgresql://plunder@127.0.0.1:{_closed_port()}/none")
    center = hub.Hub(store, listen=True)
    try:
        with caplog.at_level(logging.INFO, logger="plunder"):
            center.on_work(["default"], lambda: None)
            time.sleep(hub.MAX_WAIT * 3.5)  # several failed waits
        assert caplog.text.count("cannot open the listening connection") == 1, caplog.text
        assert len(caplog.records) == 1, caplog.text
        assert "Traceback" not in caplog.text
    finally:
        center.close()
        store.close()


def test_registrations_end_when_unregistered(tmp_path: object) -> None:
    """``every`` and ``on_work`` return the function that unregisters them: the hub belongs
    to the app and outlives each worker that registered there."""
    store = plunder.open_store(f"sqlite:///{tmp_path}/hub.db")
    center = hub.Hub(store, listen=False)
    calls: list[str] = []
    try:
        stop_beat = center.every(0.02, lambda conn: calls.append("beat"))
        center.every(0.02, lambda conn: calls.append("other"))
        stop_work = center.on_work(["default"], lambda: calls.append("work"))
        deadline = time.monotonic() + 5
        while calls.count("beat") < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert calls.count("beat") >= 2
        stop_beat()
        stop_work()
        stop_work()  # twice is harmless
        time.sleep(0.05)  # a call already under way finishes
        calls.clear()
        center._dispatch([("plunder_enqueued", "default")])
        time.sleep(0.2)  # ten intervals
        assert "beat" not in calls and "work" not in calls
        assert "other" in calls  # the registration left in place still runs
    finally:
        center.close()
        store.close()
