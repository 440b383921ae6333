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
