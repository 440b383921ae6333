"""A call with its own deadline (a heartbeat's) ends by it, against a gateway that takes
the connection and never answers."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator

import pytest

from plunder import errors
from plunder.store.http.client import Client


@pytest.fixture
def hung_gateway() -> Iterator[str]:
    """A listening socket that accepts connections and never writes a byte."""
    server = socket.create_server(("127.0.0.1", 0))
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        server.settimeout(0.1)
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except TimeoutError:
                continue
            held.append(conn)

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.getsockname()[1]}"
    stop.set()
    thread.join()
    for conn in held:
        conn.close()
    server.close()


def test_a_call_with_a_timeout_ends_by_it_on_a_hung_gateway(hung_gateway: str) -> None:
    client = Client(hung_gateway, "plk_x_y", busy_total=30.0)
    started = time.monotonic()
    with pytest.raises(errors.StoreUnavailable):
        client.call("POST", "/v1/sessions/s/heartbeat", json={}, timeout=1.0)
    took = time.monotonic() - started
    client.close()
    assert 0.9 <= took < 2.0, took


def test_a_call_without_a_timeout_tries_again_until_its_budget(hung_gateway: str) -> None:
    client = Client(hung_gateway, "plk_x_y", busy_total=1.5, call_timeout=0.4)
    started = time.monotonic()
    with pytest.raises(errors.StoreUnavailable):
        client.call("GET", "/v1/health")
    took = time.monotonic() - started
    client.close()
    # several tries of 0.4 s each, with the busy pauses between them, until 1.5 s are spent
    assert 1.5 <= took < 3.0, took
