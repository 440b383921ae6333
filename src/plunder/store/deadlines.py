"""Client-side deadlines for database calls, kept by this process's own clock.

A server-side ``statement_timeout`` cannot end a call whose peer hangs (a stalled proxy or
middlebox, a frozen host): the query or its answer never arrives, and since the kernel
keeps acknowledging, neither TCP keepalives nor ``tcp_user_timeout`` ever fire. The call
would wait forever, and so would the worker thread that made it. So every call registers
its connection's socket here, and a call still running at its deadline has the socket
shut down: the blocked read ends at once ("server closed the connection"), the driver
marks the connection broken, and the call fails like any lost connection.

```
 caller ── watch(socket, timeout) ─▶ registered ── call returns ─▶ unregistered
                                         │
 watcher thread ── deadline passed ──────┴─▶ shutdown(socket)  (or: cut_all(), at once)
```

Unregistering takes the same lock as cutting, so a socket is never shut down after its
call returned to the pool and another call took the connection. A call without a timeout
is registered too, so that :meth:`Deadlines.cut_all` can end it (a worker that lost its
session gives up everything it has in flight: the database would refuse it anyway).
"""

from __future__ import annotations

import itertools
import os
import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

Fileno = Callable[[Any], int]  # a connection's socket; raises once the connection is gone
Cancel = Callable[[Any], None]  # asks the server to cancel the statement running on a connection


@dataclass
class Call:
    conn: Any
    timeout: float | None
    deadline: float | None
    thread: int
    reason: str | None = None  # why it was cut, once it was
    final: bool = False  # given up for good: not to be tried again (see cut_all)


def shut_down(descriptor: int) -> bool:
    """Shut the socket down both ways (through a duplicate descriptor: the owner's stays
    valid and is closed by its owner); False if that failed."""
    try:
        duplicate = os.dup(descriptor)
    except OSError:
        return False
    sock = socket.socket(fileno=duplicate)
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        return False
    finally:
        sock.close()
    return True


class Deadlines:
    """The calls in flight on one store's connections; ``fileno(conn)`` gives a
    connection's socket descriptor, ``cancel(conn)`` cancels its statement on the server."""

    def __init__(self, fileno: Fileno, cancel: Cancel | None = None) -> None:
        self._fileno = fileno
        self._cancel = cancel
        self._lock = threading.Condition()
        self._calls: dict[int, Call] = {}
        self._ids = itertools.count()
        self._thread: threading.Thread | None = None
        self._pid = os.getpid()
        self._wake_at: float | None = None

    @contextmanager
    def watch(self, conn: Any, timeout: float | None) -> Iterator[Call]:
        """Register a call on ``conn`` for the block; the yielded record's ``reason`` says,
        after an error, whether the call was cut and why."""
        deadline = None if timeout is None else time.monotonic() + timeout
        call = Call(conn, timeout, deadline, threading.get_ident())
        key = next(self._ids)
        with self._lock:
            self._calls[key] = call
            if deadline is not None:
                self._ensure_thread()
                if self._wake_at is None or deadline < self._wake_at:
                    self._lock.notify()
        try:
            yield call
        finally:
            with self._lock:
                del self._calls[key]

    def cut_all(self, reason: str, *, final: bool = False) -> int:
        """Cut every call in flight now, except the calling thread's own (it is here, so
        it waits for no answer); how many were cut. ``final``: the calls are given up, not
        tried again on a fresh connection (a worker that halts)."""
        me = threading.get_ident()
        with self._lock:
            calls = [c for c in self._calls.values() if c.reason is None and c.thread != me]
            for call in calls:
                call.final = final
            return sum(self._cut(call, reason) for call in calls)

    def reason_of(self, conn: Any) -> str | None:
        """Why a call in flight on ``conn`` was cut, or None if none was."""
        with self._lock:
            return next((c.reason for c in self._calls.values() if c.conn is conn), None)

    def _cut(self, call: Call, reason: str) -> bool:
        call.reason = reason
        if call.final and self._cancel is not None:
            # a statement given up for good must not go on: one waiting on a lock would
            # commit once the lock is free, the cut socket notwithstanding
            self._cancel(call.conn)
        try:
            descriptor = self._fileno(call.conn)
        except Exception:  # the connection is closed already: nothing to cut
            return False
        return shut_down(descriptor)

    def _ensure_thread(self) -> None:
        if self._thread is None or self._pid != os.getpid():  # threads do not survive fork
            self._pid = os.getpid()
            self._thread = threading.Thread(
                target=self._watch_loop, name="plunder-deadlines", daemon=True
            )
            self._thread.start()

    def _watch_loop(self) -> None:
        with self._lock:
            while True:
                now = time.monotonic()
                pending = []
                for call in self._calls.values():
                    if call.reason is not None or call.deadline is None:
                        continue
                    if call.deadline <= now:
                        self._cut(call, f"no answer within {call.timeout:g}s")
                    else:
                        pending.append(call.deadline)
                self._wake_at = min(pending, default=None)
                self._lock.wait(None if self._wake_at is None else self._wake_at - now)
