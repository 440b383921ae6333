"""The Client's calls on kept connections (plunder.store.http.lines), against a real
socket server that answers the way a test needs: what a request looks like on the wire,
a kept connection the gateway closed, a refused connection and a gateway that never
answers, each with the error it must give."""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import pytest

from plunder import errors
from plunder.store.http.client import Client


@dataclass
class Server:
    """A loopback server: each connection gets ``answers`` answers (then it is closed,
    or held without an answer when ``answers`` is 0)."""

    answers: int
    url: str = ""
    lines: list[str] = field(default_factory=list)  # the request lines received
    connections: int = 0
    closed: threading.Event = field(default_factory=threading.Event)


def _serve(server: Server, listener: socket.socket, stop: threading.Event) -> None:
    held: list[socket.socket] = []
    listener.settimeout(0.1)
    while not stop.is_set():
        try:
            conn, _ = listener.accept()
        except TimeoutError:
            continue
        server.connections += 1
        held.append(conn)
        if not server.answers:
            continue  # taken, never answered
        with conn:
            for _ in range(server.answers):
                if not _answer(server, conn):
                    break  # the client closed it
            else:
                conn.shutdown(socket.SHUT_RDWR)
        server.closed.set()
    for conn in held:
        conn.close()


def _answer(server: Server, conn: socket.socket) -> bool:
    """Read a request and answer it; False if the connection ended first."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = conn.recv(65536)
        if not chunk:
            return False
        data += chunk
    head, _, rest = data.partition(b"\r\n\r\n")
    lines = head.decode().split("\r\n")
    server.lines.append(lines[0])
    length = next(
        (int(x.split(":")[1]) for x in lines if x.lower().startswith("content-length")), 0
    )
    while len(rest) < length:
        rest += conn.recv(65536)
    conn.sendall(b'HTTP/1.1 200 OK\r\nContent-Length: 7\r\n\r\n{"a":1}')
    return True


@pytest.fixture
def serve() -> Iterator[Callable[[int], Server]]:
    stops: list[tuple[threading.Event, threading.Thread, socket.socket]] = []

    def start(answers: int) -> Server:
        listener = socket.create_server(("127.0.0.1", 0))
        server = Server(answers, f"http://127.0.0.1:{listener.getsockname()[1]}")
        stop = threading.Event()
        thread = threading.Thread(target=_serve, args=(server, listener, stop), daemon=True)
        thread.start()
        stops.append((stop, thread, listener))
        return server

    yield start
    for stop, thread, listener in stops:
        stop.set()
        thread.join()
        listener.close()


def test_a_request_goes_out_quoted_with_its_query(serve: Callable[[int], Server]) -> None:
    server = serve(5)
    client = Client(server.url, "plk_x_y")
    assert client.call("GET", "/v1/tasks/a b?c#é", params={"wait": 1.5, "x": True}) == {"a": 1}
    client.close()
    assert server.lines == ["GET /v1/tasks/a%20b%3Fc%23%C3%A9?wait=1.5&x=true HTTP/1.1"]


def test_calls_share_a_kept_connection(serve: Callable[[int], Server]) -> None:
    server = serve(3)
    client = Client(server.url, "plk_x_y")
    for _ in range(3):
        assert client.call("POST", "/v1/jobs", json={"jobs": []}, idempotent=False) == {"a": 1}
    client.close()
    assert server.connections == 1


def test_a_kept_connection_the_gateway_closed_is_not_used(serve: Callable[[int], Server]) -> None:
    """Not even for a request that is not safe to send twice: nothing was sent on it."""
    server = serve(1)
    client = Client(server.url, "plk_x_y")
    assert client.call("POST", "/v1/jobs", json={}, idempotent=False) == {"a": 1}
    assert server.closed.wait(10)  # the gateway closed it after its answer
    assert client.call("POST", "/v1/jobs", json={}, idempotent=False) == {"a": 1}
    client.close()
    assert server.connections == 2


def test_a_refused_connection_is_unavailable_not_unknown() -> None:
    listener = socket.create_server(("127.0.0.1", 0))
    url = f"http://127.0.0.1:{listener.getsockname()[1]}"
    listener.close()  # nobody listens there now
    client = Client(url, "plk_x_y", busy_total=0.3)
    with pytest.raises(errors.StoreUnavailable):
        client.call("POST", "/v1/jobs", json={}, idempotent=False)
    client.close()


def test_a_request_written_and_never_answered_has_an_unknown_outcome(
    serve: Callable[[int], Server],
) -> None:
    server = serve(0)
    client = Client(server.url, "plk_x_y", busy_total=5.0)
    with pytest.raises(errors.OutcomeUnknown, match="no answer within"):
        client.call("POST", "/v1/jobs", json={}, idempotent=False, timeout=0.5)
    client.close()
