"""The hub: one thread and one dedicated database connection per process, shared by every
worker slot and every result or stream waiter in that process.

```
 database ── NOTIFY (PostgreSQL) / data_version (SQLite) ──▶ hub thread ──▶ callbacks
   plunder_enqueued <queues>   → the workers serving those queues ("*": every worker)
   plunder_done <job ids>      → result waiters of those jobs
   plunder_stream <job ids>    → stream followers of those jobs
   "*" (reconnected, SQLite)   → everyone re-checks once
 and between waits, periodic calls on the same connection (the worker's heartbeat), each
 cut if it outlives its deadline
```

Notifications only lower latency. Every waiter also re-checks the database at least every
``poll_interval``, so a lost notification (a reconnect, a pooler that drops LISTEN)
delays work by at most that long and never loses it.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from plunder import errors
from plunder.store.base import Notifications, Store

log = logging.getLogger("plunder.hub")
Callback = Callable[[], None]
MAX_WAIT = 0.5  # the hub thread looks at its stop flag and periodic calls at least this often


def _name(call: Callable[..., Any]) -> str:
    return str(getattr(call, "__qualname__", call))


@dataclass
class _Periodic:
    interval: float
    call: Callable[[Any], None]
    deadline: float | None = None
    due: float = field(default_factory=time.monotonic)
    failures: int = 0  # in a row


class Hub:
    def __init__(
        self,
        store: Store,
        *,
        listen: bool,
        application_name: str = "plunder:listen",
        statement_timeout: float | None = None,
    ) -> None:
        self._notes: Notifications = store.notifications(
            listen=listen, application_name=application_name, statement_timeout=statement_timeout
        )
        self._lock = threading.Lock()
        self._work: list[tuple[frozenset[str], Callback]] = []
        self._jobs: dict[int, list[Callback]] = {}
        self._streams: dict[int, list[Callback]] = {}
        self._periodic: list[_Periodic] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.wakeups = 0

    @property
    def listening(self) -> bool:
        return self._notes.listen

    def start(self) -> None:
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, name="plunder-hub", daemon=True)
                self._thread.start()

    def close(self) -> None:
        self._stop.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=5)
        self._notes.close()

    # -- registrations --------------------------------------------------------------------
    def on_work(self, queues: list[str], callback: Callback) -> None:
        """Call ``callback`` when work may have appeared in one of ``queues``."""
        with self._lock:
            self._work.append((frozenset(queues), callback))
        self.start()

    def watch(self, kind: str, job_id: int, callback: Callback) -> Callable[[], None]:
        """Call ``callback`` when job ``job_id`` finishes (``kind="done"``) or writes stream
        events (``kind="stream"``). Returns the function that unregisters it."""
        table = self._jobs if kind == "done" else self._streams
        with self._lock:
            table.setdefault(job_id, []).append(callback)
        self.start()

        def cancel() -> None:
            with self._lock:
                callbacks = table.get(job_id, [])
                if callback in callbacks:
                    callbacks.remove(callback)
                if not callbacks:
                    table.pop(job_id, None)

        return cancel

    def every(
        self, interval: float, call: Callable[[Any], None], *, deadline: float | None = None
    ) -> None:
        """Run ``call(connection)`` on the hub thread every ``interval`` seconds, with the
        hub's dedicated connection (so heartbeats need no connection of their own). A call
        still waiting for the database after ``deadline`` seconds has the connection cut
        under it (it raises StoreBusy, and the next call reconnects): a peer that hangs
        would otherwise stop the hub, and every later call, for good."""
        with self._lock:
            self._periodic.append(_Periodic(interval, call, deadline))
        self.start()

    # -- the thread -----------------------------------------------------------------------
    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                self._turn()
            except Exception:  # the hub carries heartbeats: it must outlive any one failure
                log.exception("hub: a wait or dispatch failed; going on")
                self._stop.wait(MAX_WAIT)

    def _turn(self) -> None:
        self._run_periodic()
        with self._lock:
            next_due = min((p.due for p in self._periodic), default=None)
        wait = MAX_WAIT if next_due is None else min(MAX_WAIT, next_due - time.monotonic())
        notes = self._notes.wait(max(0.0, wait))
        if notes:
            self._dispatch(notes)

    def _run_periodic(self) -> None:
        now = time.monotonic()
        with self._lock:
            due = [p for p in self._periodic if p.due <= now]
        for periodic in due:
            periodic.due = now + periodic.interval
            try:
                with self._notes.connection_for(periodic.deadline) as connection:
                    periodic.call(connection)
            except errors.StoreError as exc:
                # the database is out of reach: one line when it starts (not one per call,
                # nor a traceback), one when it ends
                if not periodic.failures:
                    log.warning("periodic call %s failed: %s", _name(periodic.call), exc)
                periodic.failures += 1
            except Exception:
                log.exception("periodic call %r failed", periodic.call)
            else:
                if periodic.failures:
                    log.info(
                        "periodic call %s works again after %d failures",
                        _name(periodic.call),
                        periodic.failures,
                    )
                periodic.failures = 0

    def _dispatch(self, notes: list[tuple[str, str]]) -> None:
        self.wakeups += 1
        callbacks: list[Callback] = []
        with self._lock:
            for channel, note in notes:
                if channel == "*":
                    callbacks += [cb for _, cb in self._work]
                    callbacks += [cb for cbs in self._jobs.values() for cb in cbs]
                    callbacks += [cb for cbs in self._streams.values() for cb in cbs]
                elif channel == "plunder_enqueued":
                    queues = set(note.split(","))  # "*": too many queues to name
                    callbacks += [
                        cb for wanted, cb in self._work if "*" in queues or wanted & queues
                    ]
                else:
                    table = self._jobs if channel == "plunder_done" else self._streams
                    for item in note.split(","):
                        if item.isdigit():
                            callbacks += table.get(int(item), [])
        for callback in callbacks:
            callback()
