"""What a running task sees: its job, a cancellation flag, a stream and progress reporter,
a logger whose lines land in the run's history, and ``transaction()`` for writes that
commit together with the job's acknowledgement.

Stream events and progress are buffered and written by the worker in batches (~50 ms or
4 KiB), fenced like every other worker write: if the claim is no longer current, the
events are discarded and the task is told to stop."""

from __future__ import annotations

import asyncio
import functools
import logging
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import AbstractContextManager
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, ClassVar, NoReturn, Protocol, TypeVar

from plunder import errors, graph, logs, payload
from plunder.labels import Labelling
from plunder.model import AckResult, Claim, Completion, JobRecord
from plunder.protocol import WorkerProtocol

log = logging.getLogger("plunder.context")
T = TypeVar("T")
FLUSH_BYTES = 4096


class Sink(Protocol):
    """Where a task's stream events go, and its transaction comes from: the store (the
    jobs are in the app's database), or a LinkSink."""

    def stream_append(
        self, claim: Claim, events: Sequence[tuple[str, Any]], *, conn: Any = None
    ) -> Any: ...

    def transaction(self) -> AbstractContextManager[Any]: ...

    def job_complete_many(self, completions: Sequence[Completion], *, conn: Any) -> AckResult: ...

    def job_pause_limit(self, claim: Claim, key: str, seconds: float) -> datetime: ...

    def job_parent_results(
        self, job_id: int, *, claim: Claim | None = None
    ) -> dict[int, tuple[str, Any]]: ...


class LinkSink:
    """A task's stream over the worker protocol (a worker whose jobs come through another
    link than the app's database): no database connection to give the task."""

    def __init__(self, link: WorkerProtocol) -> None:
        self._link = link

    def stream_append(
        self, claim: Claim, events: Sequence[tuple[str, Any]], *, conn: Any = None
    ) -> None:
        self._link.append(claim, events)

    def transaction(self) -> AbstractContextManager[Any]:
        raise errors.ConfigError(
            "ctx.transaction() needs the database, and this worker's jobs come through "
            "another link: write from a worker connected to the database"
        )

    def job_pause_limit(self, claim: Claim, key: str, seconds: float) -> datetime:
        return self._link.pause_limit(claim, key, seconds)

    def job_parent_results(
        self, job_id: int, *, claim: Claim | None = None
    ) -> dict[int, tuple[str, Any]]:
        if claim is None or claim.job_id != job_id:
            raise errors.ConfigError("parents' results come through the link by a claim only")
        return {p.job_id: (p.status, p.result) for p in self._link.parent_results(claim)}

    def job_complete_many(self, completions: Sequence[Completion], *, conn: Any) -> AckResult:
        raise errors.ConfigError("no transaction to acknowledge in (see transaction())")


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


class Context(JobIdentity, Labelling):
    """Handed to a task that declares a parameter annotated ``plunder.Context``."""

    def __init__(self, job: JobRecord, store: Sink, *, on_flush_needed: Any = None) -> None:
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
        self.released = False  # set when pause_limit() gave the job back
        self._acknowledged_result: Any = None
        self._open: _OpenTransaction | None = None  # transaction() begun, not yet ended
        self.cancel_reason: str | None = None
        self.log_lines: list[str] = []
        self._logger: logging.Logger | None = None

    @property
    def logger(self) -> logging.Logger:
        """A logger whose lines land in this run's history (and in the worker's log)."""
        if self._logger is None:
            logger = logging.Logger(f"plunder.task.{self.job.task}", logging.DEBUG)
            logger.parent = logging.getLogger("plunder.task")
            logger.addHandler(logs.LineCapture(self.log_lines))
            logger.addFilter(logs.JobFields(self.job))
            self._logger = logger
        return self._logger

    def pause_limit(
        self, key: str | None = None, *, until: datetime | None = None, seconds: float = 0.0
    ) -> NoReturn:
        """Pause limit ``key`` (default: this job's) until ``until`` (an aware datetime) or
        for ``seconds``: none of its jobs starts meanwhile (a longer pause already set
        stays), and this job goes back to wait with them, without spending an attempt.
        Raises LimitPaused, which ends the task: let it propagate."""
        key = key or self.job.limit_key
        if key is None:
            raise errors.ConfigError(f"job {self.job.id} has no limit key: name the key to pause")
        if until is not None:
            seconds = (until - datetime.now(UTC)).total_seconds()
        ends = self._store.job_pause_limit(self.claim, key, max(0.0, seconds))
        self.acknowledged = self.released = True
        raise errors.LimitPaused(f"limit {key!r} paused until {ends:%Y-%m-%d %H:%M:%S} UTC")

    @property
    def parent_results(self) -> dict[int, Any]:
        """Each parent's result by job id, for a job of a workflow (see plunder.graph)."""
        return graph.results_of(self._store, self.claim)

    # -- cancellation ---------------------------------------------------------------------
    @property
    def cancelled(self) -> bool:
        """True once the job was cancelled, timed out, or its claim was lost. A plain
        function task stops only when it looks (a thread cannot be killed): a long one
        should check this, or sleep in ``wait_cancelled``, and return early. Its result
        would be refused anyway, and its worker slot stays taken until it returns."""
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
        """Sleep up to ``timeout`` seconds, waking early if the task is cancelled (True
        then): the way a plain function task waits and still stops when told."""
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
        logs.keep_line(self.log_lines, line)

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

    def _take_outside_block(self) -> list[tuple[str, Any]]:
        """The events buffered, unless a transaction block is open: those made in it go
        out with its commit (see _end), never beside it on another connection
        (on SQLite that write would wait for the block's lock, and lose them)."""
        with self._lock:
            if self._open is not None:
                return []
            events, self._pending, self._pending_bytes = self._pending, [], 0
        return events

    def flush(self) -> None:
        """Write buffered events now (the worker also does this on a timer)."""
        if not self._pending and not self._flush_lock.locked():
            return  # nothing buffered and no flush under way (most tasks stream nothing)
        with self._flush_lock:
            self._flush_locked()

    def _flush_locked(self) -> None:
        events = self._take_outside_block()
        if events and self.acknowledged:  # the job's stream ended with its transaction
            log.warning(
                "job %d: %d stream events made after its transaction acknowledged it were "
                "discarded (stream before the transaction block ends)",
                self.job_id,
                len(events),
            )
        elif events:
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
    def transaction(self, *, result: Any = None) -> TaskTransaction:
        """``with ctx.transaction(result=value) as conn:`` (``async with`` in an ``async
        def`` task): writes made on ``conn`` commit at the end of the block in one
        transaction with this job's acknowledgement, whose result is ``value``, or not at
        all. The job has succeeded from that commit on; it is the attempt's only result.

        The task must then return ``value`` (or an equal value): a task that returns
        anything else has its return refused. The job keeps ``value``, and the worker logs
        an ERROR naming the job (logger ``plunder.worker``); the job's record cannot show
        it, since the commit closed the run. Stream events made in the block commit with it;
        those made after the block are discarded with a warning (the job's stream ended
        with it); other plunder calls (enqueues, reads) work as anywhere else.

        If the claim is no longer current the writes are rolled back and
        :class:`StaleClaim` is raised. If the database refuses the COMMIT (a serialization
        failure) or the connection is lost, :class:`StoreBusy` is raised and the attempt
        fails; if nothing was committed, the next attempt runs the task, and the block,
        again. On PostgreSQL a worker's transaction that sits idle (no statement running)
        for longer than two session expiries is ended by the server, so that a worker cut
        off in the middle of it cannot hold its locks for good.

        ``with`` yields the driver's connection (sqlite3 or psycopg) and is refused on a
        thread that runs an event loop: an ``async def`` task uses ``async with``, which
        yields an :class:`AsyncConnection` whose statements, and the commit, run on a
        thread of the transaction's own, so the event loop never waits on the database.
        """
        return TaskTransaction(self, result)

    def refused_return(self, returned: Any) -> str | None:
        """Why ``returned`` cannot be this acknowledged job's result (it differs from the
        result its transaction committed), or None when it is that result."""
        kept = payload.encode(self._acknowledged_result, what="result")
        try:
            given = payload.encode(returned, what="result")
        except errors.PayloadError as exc:
            given = str(exc)
        if given == kept:
            return None
        return (
            f"job {self.job_id} returned {given[:80]}, not the result its transaction "
            f"committed ({kept[:80]}); the return value is refused and the job keeps the "
            "committed result: return what ctx.transaction(result=...) was given"
        )

    def _begin(self, result: Any) -> Any:
        if self.acknowledged or self._open is not None:
            raise errors.PlunderError(
                f"job {self.job_id} already has its transaction; a task gets one per attempt"
            )
        self.flush()
        manager = self._store.transaction()
        conn = manager.__enter__()
        with self._lock:  # from here, flushes leave the buffer to the block (see above)
            self._open = _OpenTransaction(manager, conn, result)
        return conn

    def _end(self, exc: BaseException | None) -> None:
        """The block ended: roll back on an exception, else commit with the acknowledgement."""
        with self._lock:
            open_, self._open = self._open, None
            # the events made in the block commit with it: none is left for a flush beside it
            events: list[tuple[str, Any]] = []
            if open_ is not None and exc is None:
                events, self._pending, self._pending_bytes = self._pending, [], 0
        if open_ is None:
            return
        if exc is not None:
            _exit_raising(open_.manager, exc)
            return
        completion = Completion(self.claim, open_.result, logs=tuple(self.log_lines))
        try:
            if events:
                self._store.stream_append(self.claim, events, conn=open_.conn)
            ack = self._store.job_complete_many([completion], conn=open_.conn)
            if self.claim not in ack.accepted:
                raise errors.StaleClaim(
                    f"job {self.job_id} attempt {self.attempt} is no longer claimed by this "
                    "worker; the transaction was rolled back",
                    job_id=self.job_id,
                    attempt=self.attempt,
                    session_id=self.claim.session_id,
                )
        except BaseException as error:
            if events:  # not written: the next flush tries them again, as any others
                with self._lock:
                    self._pending[:0] = events
            _exit_raising(open_.manager, error)
            raise
        open_.manager.__exit__(None, None, None)
        self._acknowledged_result = open_.result
        self.acknowledged = True


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


class TaskTransaction:
    """What ``ctx.transaction()`` returns: a context manager for ``with`` and, in an
    ``async def`` task, for ``async with`` (see :meth:`Context.transaction`)."""

    def __init__(self, ctx: Context, result: Any) -> None:
        self._ctx = ctx
        self._result = result
        self._thread: TxThread | None = None  # ``async with``'s, from enter to exit

    def __enter__(self) -> Any:
        if _loop_running():
            raise errors.PlunderError(
                f"job {self._ctx.job_id}: `with ctx.transaction()` would block the event "
                "loop and share its connection; in an async def task use `async with`"
            )
        return self._ctx._begin(self._result)

    def __exit__(self, kind: Any, exc: BaseException | None, tb: Any) -> None:
        self._ctx._end(exc)

    async def __aenter__(self) -> AsyncConnection:
        ctx = self._ctx
        thread = self._thread = TxThread.take()
        try:
            conn = await thread.settle(lambda: ctx._begin(self._result))
        except BaseException as exc:  # cancelled while it began: it ends here, rolled back
            try:
                await thread.settle(functools.partial(ctx._end, exc))
            finally:
                self._give_back()
            raise
        return AsyncConnection(conn, thread)

    async def __aexit__(self, kind: Any, exc: BaseException | None, tb: Any) -> None:
        assert self._thread is not None
        try:
            await self._thread.settle(lambda: self._ctx._end(exc))
        finally:
            self._give_back()

    def _give_back(self) -> None:
        thread, self._thread = self._thread, None
        if thread is not None:
            thread.give_back()


def _loop_running() -> bool:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


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
        """``fn(conn)`` on the transaction's thread, with the driver's connection. If the
        task is cancelled meanwhile, the call still ends on the thread (its transaction is
        rolled back after it)."""
        return await asyncio.wrap_future(self._thread.submit(lambda: fn(self.sync)))


class TxThread:
    """A thread that runs every database call of one async transaction, taken when it
    begins and given back when it ends (each thread keeps its own SQLite connection).
    Calls run one at a time, in the order they were made."""

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

    async def settle(self, fn: Callable[[], T]) -> T:
        """``fn()`` on the thread, awaited to its end even if the caller is cancelled
        meanwhile (a begin, commit or rollback must not be left half-way or skipped); the
        cancellation is raised once it has ended."""
        done = asyncio.wrap_future(self.submit(fn))
        cancelled: asyncio.CancelledError | None = None
        while not done.done():
            try:
                await asyncio.wait([done])  # a cancelled wait leaves ``done`` running
            except asyncio.CancelledError as exc:
                cancelled = exc
        error = done.exception()
        if cancelled is not None:
            raise cancelled from error
        if error is not None:
            raise error
        return done.result()
