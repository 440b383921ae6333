"""What a running task sees: its job, a cancellation flag, a stream and progress reporter,
a logger whose lines land in the run's history, and ``transaction()`` for writes that
commit together with the job's acknowledgement.

Stream events and progress are buffered in memory and written by the worker in batches
(every ~50 ms or 4 KiB, whichever comes first), fenced like every other worker write: if
the claim is no longer current the events are discarded and the task is told to stop.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any, ClassVar, TypeVar

from plunder import errors, payload
from plunder.model import Claim, Completion, JobRecord
from plunder.store.base import Store

log = logging.getLogger("plunder.context")
T = TypeVar("T")
MAX_LOG_LINES = 200
FLUSH_BYTES = 4096


class _Unset:
    def __repr__(self) -> str:
        return "UNSET"


UNSET: Any = _Unset()  # transaction(result=...) not given


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
        self._acknowledged_result: Any = None
        self._open: _OpenTransaction | None = None  # transaction() begun, not yet ended
        self._tx_thread: TxThread | None = None  # an async transaction's thread
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
    def transaction(self, *, result: Any = UNSET) -> TaskTransaction:
        """``with ctx.transaction() as conn:`` (``async with`` in an ``async def`` task):
        writes made on ``conn`` commit in one transaction with this job's acknowledgement,
        whose result is the value the task returns, or not at all.

        Without ``result`` the transaction stays open after the block and commits when the
        task returns, with the returned value as the job's result; an exception raised
        after the block rolls the writes back and fails the attempt like any other. Keep
        the code after the block short: the transaction (on SQLite, the database's write
        lock) is held until the task returns. With ``result`` the transaction commits at
        the end of the block with that result, and a task that then returns anything else
        is refused: the job keeps ``result`` and the worker logs the refusal as an error.

        If the claim is no longer current the writes are rolled back and
        :class:`StaleClaim` is raised. If the database refuses the COMMIT (a serialization
        failure) or the connection is lost, :class:`StoreBusy` is raised and the attempt
        fails; if nothing was committed, the next attempt runs the task, and the block,
        again. On PostgreSQL a worker's transaction that sits idle (no statement running)
        for longer than two session expiries is ended by the server, so that a worker cut
        off in the middle of it cannot hold its locks for good.

        ``with`` yields the driver's connection (sqlite3 or psycopg). ``async with`` yields
        an :class:`AsyncConnection` whose statements run on a thread of the transaction's
        own, so the worker's event loop never waits on the database.
        """
        return TaskTransaction(self, result)

    def finish(self, returned: Any) -> None:
        """Called by the worker on the task's thread once the task returned ``returned``:
        commit a transaction left open with it as the result, or check it against the
        result a ``transaction(result=...)`` committed (PlunderError if it differs)."""
        thread = self._tx_thread
        if thread is None:
            self._settle(returned)
            return
        self._tx_thread = None
        try:
            thread.submit(lambda: self._settle(returned)).result()
        finally:
            thread.give_back()

    async def finish_async(self, returned: Any) -> None:
        """:meth:`finish` for an ``async def`` task, on the worker's event loop: the commit
        runs on the transaction's own thread."""
        thread = self._tx_thread
        if thread is None:
            self._settle(returned)  # a plain ``with`` in an async task: it blocks as it did
            return
        self._tx_thread = None
        try:
            await thread.call(lambda: self._settle(returned))
        finally:
            thread.give_back()

    def abandon(self, exc: BaseException) -> BaseException:
        """Called by the worker when the task raised ``exc`` (or was cancelled): roll back
        a transaction still open. Returns the error to report: ``exc``, or the rollback's
        own error, chained to it. For an async transaction the rollback is queued on its
        thread without waiting (a cancelled task must not wait), and a failure is logged."""
        thread, self._tx_thread = self._tx_thread, None
        if thread is not None:
            done = thread.submit(lambda: self._rollback(exc))
            done.add_done_callback(lambda f: _rolled_back(f, self.job_id, thread))
            return exc
        try:
            self._rollback(exc)
        except BaseException as rollback_error:
            return rollback_error
        return exc

    def _begin(self, result: Any) -> Any:
        if self.acknowledged or self._open is not None:
            raise errors.PlunderError(
                f"job {self.job_id} already has its transaction; a task gets one per attempt"
            )
        self.flush()
        manager = self._store.transaction()
        conn = manager.__enter__()
        self._open = _OpenTransaction(manager, conn, result)
        return conn

    def _block_ended(self, exc: BaseException | None) -> None:
        """The ``with`` block ended: roll back on an exception, commit now if the result
        was given, else stay open until the task returns."""
        open_ = self._open
        if open_ is None:
            return
        if exc is not None:
            self._rollback(exc)
        elif open_.result is not UNSET:
            self._commit(open_.result)

    def _settle(self, returned: Any) -> None:
        if self._open is not None:
            self._commit(returned)
        elif self.acknowledged:
            self._check_returned(returned)

    def _check_returned(self, returned: Any) -> None:
        kept = payload.encode(self._acknowledged_result, what="result")
        if payload.encode(returned, what="result") != kept:
            raise errors.PlunderError(
                f"job {self.job_id} returned a value other than the result its transaction "
                f"committed ({kept[:80]}); the return value is refused: return what "
                "ctx.transaction(result=...) was given, or leave result= out"
            )

    def _commit(self, result: Any) -> None:
        open_, self._open = self._open, None
        assert open_ is not None
        try:
            ack = self._store.job_complete_many([Completion(self.claim, result)], conn=open_.conn)
            if self.claim not in ack.accepted:
                raise errors.StaleClaim(
                    f"job {self.job_id} attempt {self.attempt} is no longer claimed by this "
                    "worker; the transaction was rolled back",
                    job_id=self.job_id,
                    attempt=self.attempt,
                    session_id=self.claim.session_id,
                )
        except BaseException as exc:
            _exit_raising(open_.manager, exc)
            raise
        open_.manager.__exit__(None, None, None)
        self.acknowledged = True
        self._acknowledged_result = result

    def _rollback(self, exc: BaseException) -> None:
        open_, self._open = self._open, None
        if open_ is not None:
            _exit_raising(open_.manager, exc)


@dataclass(slots=True)
class _OpenTransaction:
    manager: AbstractContextManager[Any]
    conn: Any
    result: Any


def _exit_raising(manager: AbstractContextManager[Any], exc: BaseException) -> None:
    """Roll ``manager``'s transaction back with ``exc``; an error of the rollback's own
    (not ``exc`` passed through) is raised, chained to ``exc``."""
    try:
        manager.__exit__(type(exc), exc, exc.__traceback__)
    except BaseException as raised:
        if raised is not exc:
            raise


def _rolled_back(done: Future[None], job_id: int, thread: TxThread) -> None:
    thread.give_back()
    error = done.exception()
    if error is not None:
        log.error("job %d: rolling back its transaction failed: %r", job_id, error)


class TaskTransaction:
    """What ``ctx.transaction()`` returns: a context manager for ``with`` and, in an
    ``async def`` task, for ``async with`` (see :meth:`Context.transaction`)."""

    def __init__(self, ctx: Context, result: Any) -> None:
        self._ctx = ctx
        self._result = result

    def __enter__(self) -> Any:
        return self._ctx._begin(self._result)

    def __exit__(self, kind: Any, exc: BaseException | None, tb: Any) -> None:
        self._ctx._block_ended(exc)

    async def __aenter__(self) -> AsyncConnection:
        ctx = self._ctx
        if ctx._tx_thread is None:  # kept until the task ends: finish/abandon give it back
            ctx._tx_thread = TxThread.take()
        thread = ctx._tx_thread
        conn = await thread.call(lambda: ctx._begin(self._result))
        return AsyncConnection(conn, thread)

    async def __aexit__(self, kind: Any, exc: BaseException | None, tb: Any) -> None:
        ctx = self._ctx
        assert ctx._tx_thread is not None
        await ctx._tx_thread.call(lambda: ctx._block_ended(exc))


class AsyncConnection:
    """The connection of ``async with ctx.transaction() as conn``: a thin wrapper whose
    statements run on the transaction's own thread (one thread per open transaction: a
    SQLite connection is used by one thread at a time), never on the event loop."""

    def __init__(self, conn: Any, thread: TxThread) -> None:
        self.sync = conn  # the driver's connection, for code that runs on the thread
        self._thread = thread

    async def execute(self, sql: str, params: Any = None) -> list[Any]:
        """Run one statement in the transaction; its rows (empty for none)."""

        def run(conn: Any) -> list[Any]:
            cursor = conn.execute(sql) if params is None else conn.execute(sql, params)
            return list(cursor.fetchall()) if cursor.description is not None else []

        return await self.run(run)

    async def run(self, fn: Callable[[Any], T]) -> T:
        """``fn(conn)`` on the transaction's thread, with the driver's connection."""
        return await self._thread.call(lambda: fn(self.sync))


class TxThread:
    """A thread that runs every database call of one async transaction, kept for later
    ones when it ends (each thread keeps its own SQLite connection)."""

    _idle: ClassVar[list[TxThread]] = []
    _idle_lock: ClassVar[threading.Lock] = threading.Lock()

    def __init__(self) -> None:
        self._executor = ThreadPoolExecutor(1, thread_name_prefix="plunder-transaction")

    @classmethod
    def take(cls) -> TxThread:
        with cls._idle_lock:
            if cls._idle:
                return cls._idle.pop()
        return cls()

    def give_back(self) -> None:
        with self._idle_lock:
            self._idle.append(self)

    def submit(self, fn: Callable[[], T]) -> Future[T]:
        return self._executor.submit(fn)

    async def call(self, fn: Callable[[], T]) -> T:
        return await asyncio.wrap_future(self.submit(fn))
