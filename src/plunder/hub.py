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

The hub LISTENs only on the channels someone in its process watches: ``plunder_enqueued``
while workers serve queues, ``plunder_done`` and ``plunder_stream`` while anyone waits for
a result or follows a stream, and for LINGER seconds after the last one left (so a loop
of waits does not LISTEN and UNLISTEN at every job). The database notifies on a channel
only while some listening connection names it in ``plunder_listeners`` (the store's
listening connection does so before it LISTENs), so a channel nobody hears costs no
notifications. Every worker's turn names the jobs it completed on ``plunder_done``; a
worker process that listened there would receive the turns of every other worker. A
watch on a channel not yet listened on interrupts the wait in progress; once the LISTEN is
in place, everyone watching the channel re-checks, so nothing that happened between their
own check and the LISTEN goes unseen.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from plunder import errors, payload
from plunder.store.base import Notifications, Store
from plunder.store.engine import CHANNEL_DONE, CHANNEL_ENQUEUED, CHANNEL_STREAM

log = logging.getLogger("plunder.hub")
Callback = Callable[[], None]
MAX_WAIT = 0.5  # the hub thread looks at its stop flag and periodic calls at least this often
LINGER = 60.0  # seconds a channel stays listened on after the last one watching it left


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
        self._needed: dict[str, float] = {}  # channel -> when someone last watched it
        self._listening: frozenset[str] | None = None  # what the current wait listens on
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
        self._notes.interrupt()
        thread = self._thread
        if thread is None:
            self._notes.close()
        elif thread is not threading.current_thread():
            # the thread closes the listener as it ends, also when a call of its own
            # outlasts this join (closing it under that call would not end the call)
            thread.join(timeout=5)

    # -- registrations --------------------------------------------------------------------
    def on_work(self, queues: list[str], callback: Callback) -> Callable[[], None]:
        """Call ``callback`` when work may have appeared in one of ``queues``. Returns the
        function that unregisters it."""
        entry = (frozenset(payload.base_queue(q) for q in queues), callback)  # "q~3": q
        with self._lock:
            self._work.append(entry)
            self._need(CHANNEL_ENQUEUED)
        self.start()
        return lambda: self._remove(self._work, entry)

    def watch(self, kind: str, job_id: int, callback: Callback) -> Callable[[], None]:
        """Call ``callback`` when job ``job_id`` finishes (``kind="done"``) or writes stream
        events (``kind="stream"``). Returns the function that unregisters it."""
        table = self._jobs if kind == "done" else self._streams
        with self._lock:
            table.setdefault(job_id, []).append(callback)
            self._need(CHANNEL_DONE if kind == "done" else CHANNEL_STREAM)
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
    ) -> Callable[[], None]:
        """Run ``call(connection)`` on the hub thread every ``interval`` seconds, with the
        hub's dedicated connection (so heartbeats need no connection of their own). A call
        still waiting for the database after ``deadline`` seconds has the connection cut
        under it (it raises StoreBusy, and the next call reconnects): a peer that hangs
        would otherwise stop the hub, and every later call, for good. Returns the function
        that unregisters it (a call already under way finishes)."""
        periodic = _Periodic(interval, call, deadline)
        with self._lock:
            self._periodic.append(periodic)
            if self._listening is not None:
                self._notes.interrupt()  # the wait under way ends now: the call is due
        self.start()
        return lambda: self._remove(self._periodic, periodic)

    def _remove(self, registrations: list[Any], entry: Any) -> None:
        with self._lock:
            for i, registered in enumerate(registrations):
                if registered is entry:  # by identity: two may be equal
                    del registrations[i]
                    return

    def _need(self, channel: str) -> None:
        """Under the lock: ``channel`` is watched; a wait that does not listen on it ends
        now, and the next one LISTENs there."""
        self._needed[channel] = time.monotonic()
        if self._listening is not None and channel not in self._listening:
            self._notes.interrupt()

    def _channels(self) -> frozenset[str]:
        """Under the lock: the channels to listen on, watched now or within LINGER."""
        now = time.monotonic()
        for channel, watchers in (
            (CHANNEL_ENQUEUED, self._work),
            (CHANNEL_DONE, self._jobs),
            (CHANNEL_STREAM, self._streams),
        ):
            if watchers:
                self._needed[channel] = now
        return frozenset(c for c, at in self._needed.items() if now - at < LINGER)

    # -- the thread -----------------------------------------------------------------------
    def _loop(self) -> None:
        try:
            while not self._stop.is_set():
                try:
                    self._turn()
                except Exception:  # the hub carries heartbeats: it must outlive any failure
                    log.exception("hub: a wait or dispatch failed; going on")
                    self._stop.wait(MAX_WAIT)
        finally:
            self._notes.close()

    def _turn(self) -> None:
        self._run_periodic()
        with self._lock:
            next_due = min((p.due for p in self._periodic), default=None)
            channels = self._listening = self._channels()
        wait = MAX_WAIT if next_due is None else min(MAX_WAIT, next_due - time.monotonic())
        notes = self._notes.wait(max(0.0, wait), channels)
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
                elif channel == CHANNEL_ENQUEUED:
                    # "*": too many queues to name, or listened on anew
                    # a partition's queue ("q~3") wakes the workers of its queue
                    queues = {payload.base_queue(q) for q in note.split(",")}
                    callbacks += [
                        cb for wanted, cb in self._work if "*" in queues or wanted & queues
                    ]
                else:
                    table = self._jobs if channel == CHANNEL_DONE else self._streams
                    if note == "*":  # listened on anew: everyone watching re-checks
                        callbacks += [cb for cbs in table.values() for cb in cbs]
                    for item in note.split(","):
                        if item.isdigit():
                            callbacks += table.get(int(item), [])
        for callback in callbacks:
            callback()
        if callbacks:
            time.sleep(0)  # the GIL to the thread just woken, before this one's next wait
