"""What a running task sees: its job, a cancellation flag, a stream and progress reporter,
a logger whose lines land in the run's history, and ``transaction()`` for writes that
commit together with the job's acknowledgement.

Stream events and progress are buffered in memory and written by the worker in batches
(every ~50 ms or 4 KiB, whichever comes first), fenced like every other worker write: if
the claim is no longer current the events are discarded and the task is told to stop.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from plunder import errors, payload
from plunder.model import Claim, Completion, JobRecord
from plunder.store.base import Store

MAX_LOG_LINES = 200
FLUSH_BYTES = 4096


class _LineCapture(logging.Handler):
    def __init__(self, lines: list[str]) -> None:
        super().__init__(logging.DEBUG)
        self.lines = lines
        self.setFormatter(logging.Formatter(LOG_FORMAT))

    def emit(self, record: logging.LogRecord) -> None:
        keep_line(self.lines, self.format(record))


LOG_FORMAT = "%(asctime)s %(levelname)s %(message)s"


def keep_line(lines: list[str], line: str) -> None:
    lines.append(line)
    if len(lines) > MAX_LOG_LINES * 2:  # keep memory bounded; the store keeps the tail
        del lines[: len(lines) - MAX_LOG_LINES]


class JobIdentity:
    """Which job, attempt and queue a task is running (both kinds of context have it)."""

    job: JobRecord

    @property
    def job_id(self) -> int:
        return self.job.id

    @property
    def attempt(self) -> int:
        return self.job.attempt

    @property
    def queue(self) -> str:
        return self.job.queue


class Context(JobIdentity):
    """Handed to a task that declares a parameter annotated ``plunder.Context``."""

    def __init__(self, job: JobRecord, store: Store, *, on_flush_needed: Any = None) -> None:
        self.job = job
        self.claim: Claim = job.claim
        self._store = store
        self._cancelled = False
        self._cancel_event: threading.Event | None = None  # made by the first waiter only
        self._lock = threading.Lock()
        self._flush_lock = threading.Lock()  # keeps concurrent flushes in order
        self._pending: list[tuple[str, Any]] = []
        self._pending_bytes = 0
        self._wake = on_flush_needed
        self.acknowledged = False  # set when transaction() committed the acknowledgement
        self.cancel_reason: str | None = None
        self.log_lines: list[str] = []
        self._logger: logging.Logger | None = None

    @property
    def logger(self) -> logging.Logger:
        """A logger whose lines land in this run's history (and in the worker's log)."""
        if self._logger is None:
            logger = logging.Logger(f"plunder.task.{self.job.task}", logging.DEBUG)
            logger.parent = logging.getLogger("plunder.task")
            logger.addHandler(_LineCapture(self.log_lines))
            self._logger = logger
        return self._logger

    # -- cancellation ---------------------------------------------------------------------
    @property
    def cancelled(self) -> bool:
        """True once the job was cancelled, timed out, or its claim was lost; a long task
        should check it and return early. Its result would be refused anyway."""
        return self._cancelled

    def cancel(self, reason: str) -> None:
        with self._lock:
            if self._cancelled:
                return
            self.cancel_reason = reason
            self._cancelled = True
            event = self._cancel_event
        if event is not None:
            event.set()

    def wait_cancelled(self, timeout: float | None = None) -> bool:
        """Sleep up to ``timeout`` seconds, waking early if the task is cancelled."""
        with self._lock:
            if self._cancel_event is None:
                self._cancel_event = threading.Event()
                if self._cancelled:
                    self._cancel_event.set()
            event = self._cancel_event
        return event.wait(timeout)

    # -- stream and progress --------------------------------------------------------------
    def stream(self, data: Any) -> None:
        """Append a chunk that subscribers see as it is written (after the next flush)."""
        self._add("chunk", data)

    def progress(self, current: float, total: float | None = None) -> None:
        self._add("progress", {"current": current, "total": total})

    def _add(self, kind: str, data: Any) -> None:
        text = payload.encode(data, what="stream data")
        if isinstance(data, list | dict):  # a snapshot: the task may change its object later,
            data = payload.decode(text)  # and the worker writes the event after it returns
        self._append(kind, data, len(text))

    def add_encoded(self, kind: str, text: str) -> None:
        """Buffer an event that a process-pool task's child already encoded."""
        if kind not in ("chunk", "progress"):
            raise ValueError(f"unknown stream event kind {kind!r}")
        self._append(kind, payload.decode(text), len(text))

    def add_log_line(self, line: str) -> None:
        """A log line of a process-pool task's child, for this run's history."""
        keep_line(self.log_lines, line)

    def _append(self, kind: str, data: Any, size: int) -> None:
        with self._lock:
            self._pending.append((kind, data))
            self._pending_bytes += size
            full = self._pending_bytes >= FLUSH_BYTES
        if full and self._wake is not None:
            self._wake()

    def take_events(self) -> list[tuple[str, Any]]:
        with self._lock:
            events, self._pending, self._pending_bytes = self._pending, [], 0
        return events

    def flush(self) -> None:
        """Write buffered events now (the worker also does this on a timer)."""
        if not self._pending and not self._flush_lock.locked():
            return  # nothing buffered and no flush under way (most tasks stream nothing)
        with self._flush_lock:
            self._flush_locked()

    def _flush_locked(self) -> None:
        events = self.take_events()
        if events:
            try:
                self._store.stream_append(self.claim, events)
            except errors.StaleClaim:
                self.cancel("the claim is no longer current")
                raise
            except errors.StoreError:
                with self._lock:  # keep them, in order, for the next flush
                    self._pending[:0] = events
                raise

    # -- exactly-once effects -------------------------------------------------------------
    @contextmanager
    def transaction(self, *, result: Any = None) -> Iterator[Any]:
        """Writes made on the yielded connection commit together with this job's
        acknowledgement, or not at all.

        The job is acknowledged (succeeded) when the block ends, with ``result`` as its
        result; if the task then returns something else, that replaces it. If the claim is
        no longer current the block's writes are rolled back and :class:`StaleClaim` is
        raised. Put the block at the end of the task: an exception after it cannot
        un-acknowledge the job. If the database refuses the COMMIT (a serialization
        failure) or the connection is lost, :class:`StoreBusy` is raised and the attempt
        fails like any other; if nothing was committed, the job's next attempt runs the
        task, and the block, again. On PostgreSQL a worker's transaction that sits idle (no
        statement running) for longer than two session expiries is ended by the server, so
        that a worker cut off in the middle of it cannot hold its locks for good.
        """
        if self.acknowledged:
            raise errors.PlunderError("this job was already acknowledged by a transaction")
        self.flush()
        with self._store.transaction() as conn:
            yield conn
            ack = self._store.job_complete_many([Completion(self.claim, result)], conn=conn)
            if self.claim not in ack.accepted:
                raise errors.StaleClaim(
                    f"job {self.job_id} attempt {self.attempt} is no longer claimed by this "
                    "worker; the transaction was rolled back",
                    job_id=self.job_id,
                    attempt=self.attempt,
                    session_id=self.claim.session_id,
                )
        self.acknowledged = True
