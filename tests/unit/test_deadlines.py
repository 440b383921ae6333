"""Client-side deadlines (plunder.store.deadlines) on a plain socket pair: a read blocked on
a peer that never answers ends at the deadline or when every call is cut; a call that is
over is never cut afterwards."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator

import pytest

from plunder.store.deadlines import Deadlines


@pytest.fixture
def pair() -> Iterator[tuple[socket.socket, socket.socket]]:
    left, right = socket.socketpair()
    try:
        yield left, right
    finally:
        left.close()
        right.close()


def blocked_read(deadlines: Deadlines, sock: socket.socket, timeout: float | None) -> tuple:
    """recv() on ``sock`` under a deadline; (bytes read, seconds, reason)."""
    started = time.monotonic()
    with deadlines.watch(sock, timeout) as call:
        data = sock.recv(10)
    return data, time.monotonic() - started, call.reason


def test_a_read_on_a_silent_peer_ends_at_its_deadline(pair: tuple) -> None:
    deadlines = Deadlines(lambda sock: sock.fileno())
    data, took, reason = blocked_read(deadlines, pair[0], 0.2)
    assert data == b""  # shut down: the read sees the end of the stream
    assert 0.15 < took < 2.0, took
    assert reason == "no answer within 0.2s"


def test_cut_all_ends_calls_without_a_deadline_but_not_the_callers_own(pair: tuple) -> None:
    deadlines = Deadlines(lambda sock: sock.fileno())
    result: list[tuple] = []
    thread = threading.Thread(target=lambda: result.append(blocked_read(deadlines, pair[0], None)))
    thread.start()
    time.sleep(0.1)  # let it block
    other_left, other_right = socket.socketpair()
    try:
        with deadlines.watch(other_left, None) as mine:
            assert deadlines.cut_all("given up") == 1
        thread.join(timeout=5)
        assert result and result[0][0] == b"" and result[0][2] == "given up"
        assert mine.reason is None  # the caller's own call was left alone
        other_right.sendall(b"ok")
        assert other_left.recv(2) == b"ok"
    finally:
        other_left.close()
        other_right.close()


def test_a_call_that_is_over_is_never_cut(pair: tuple) -> None:
    deadlines = Deadlines(lambda sock: sock.fileno())
    with deadlines.watch(pair[0], 0.1):
        pass
    time.sleep(0.3)
    pair[1].sendall(b"still open")
    assert pair[0].recv(10) == b"still open"
    assert deadlines.cut_all("nothing in flight") == 0
