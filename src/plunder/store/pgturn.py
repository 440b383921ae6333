"""A worker's turns on PostgreSQL: the statement (job_exchange), what its rows mean, and
turns *sent ahead* on a connection the worker holds, run by a thread of the pipe's own.

A turn — the results of the jobs that finished and a claim of new ones, one statement that
commits on its own — keeps the database busy for a couple of milliseconds, and the worker's
Python (reading the rows into records, starting the jobs, collecting their outcomes) for
about as long. Run one after the other they add up. Sent ahead, they overlap:

```
 worker ─ send(N+1) ─▶ reads N's rows, starts N's jobs, collects outcomes ─ receive(N+1) ─▶
            │                                                                  ▲
 pipe's thread └─ runs N+1 (it commits) ─ runs N+2, if sent ── (idle) ─────────┘
```

``send`` hands the turn to the pipe's thread, which runs the turns one after another on the
held connection, each in its own transaction, and keeps each answer's rows unparsed;
``receive`` waits for the oldest turn's answer, never for a later one's. A turn's jobs are
started only after its answer arrived, that is, after it committed. Until then its claims
are invisible to the worker: a heartbeat that reads them meanwhile must not take them for
lost (see Worker), and its results are on their way, held like any results not yet
written. (psycopg's public pipeline mode cannot do this: ``Pipeline.sync()`` and a
cursor's fetch there wait for the results of every statement sent, the later turns' too.)

A turn that fails (an error, a lost or cut connection) ends the pipe's connection: it is
closed, the turns after it never run, and the next send opens another. Whether the failed
turn committed may be unknown; the results of the turns in flight are sent again by the
caller (an acknowledgement that committed already is recognised as such), and claims that
did commit are given back once the heartbeat reports them.
"""

from __future__ import annotations

import collections
import contextlib
import functools
import select
import threading
import time
from collections.abc import Callable, Sequence
from contextlib import ExitStack
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Protocol, TypeVar

import psycopg
from psycopg.rows import tuple_row

from plunder import errors
from plunder.model import SUSPECT_LOSSES, AckResult, Claim, Completion, JobRecord
from plunder.store import convert
from plunder.store.deadlines import Call, Deadlines, shut_down
from plunder.store.engine import Tx
from plunder.store.pgtx import PgTx, array_literal, plan_once
from plunder.store.sqlbase import CLAIM_LEVELS, Claimed

Encoded = list[tuple[Completion, str]]  # completions with their results encoded
MAX_IN_FLIGHT = 3  # turns a pipe may have in flight
IDLE_LINGER = 1.0  # seconds the pipe's thread waits for another turn before it ends
TAKE_WAIT = 0.05  # seconds a send waits at most for the free thread to take its turn
T = TypeVar("T")


class PipeStore(Protocol):
    """What turns need of the PostgreSQL store (``PostgresStore`` is one). Declared here so
    that this module does not import the store that imports it."""

    @property
    def url(self) -> str: ...
    @property
    def queries(self) -> dict[str, str]: ...
    @property
    def _pool_size(self) -> int: ...
    @property
    def _deadlines(self) -> Deadlines: ...
    @property
    def _call_timeout(self) -> float | None: ...
    def _get_pool(self) -> Any: ...
    def _pipe_connection(self) -> psycopg.Connection[Any] | None: ...
    def _check_claim(self, queues: Sequence[str], limit: int) -> None: ...
    def _encode_results(self, completions: Sequence[Completion]) -> Encoded: ...
    def _claimed(self, claimed: tuple[list[str], list[Sequence[Any]]]) -> list[JobRecord]: ...
    def _settle(self, tx: Tx, items: Encoded, clock: Any) -> tuple[list[Claim], list[Claim]]: ...
    def _translate(self, exc: Exception) -> Exception | None: ...
    def _run(
        self,
        op: Callable[[Tx], T],
        *,
        write: bool = True,
        conn: Any = None,
        repeatable: bool = True,
        single: bool = False,
    ) -> T: ...


def turn_params(
    plain: Encoded,
    session_id: str,
    *,
    queues: Sequence[str],
    tasks: Sequence[str],
    limit: int,
    take_suspect: bool,
) -> dict[str, Any]:
    """job_exchange's parameters, but for ``now``."""
    columns = convert.completion_columns(plain)
    return {
        **{key: array_literal(values) if values else "{}" for key, values in columns.items()},
        "session_id": session_id,
        "queues": list(dict.fromkeys(queues)),  # a queue named twice is read once
        "tasks": list(tasks),
        "limit": int(limit),
        "take_suspect": bool(take_suspect),
        "suspect_losses": SUSPECT_LOSSES,
        "levels": CLAIM_LEVELS,
    }


class Answer:
    """A turn's rows as they came back (it committed): on each, how many jobs it completed,
    then a claimed job's columns (one row of NULLs when it claimed none). ``read()`` gives
    them (names, rows); a turn sent ahead is read, and its rows made records, only after
    the caller has sent its next turn."""

    def __init__(
        self,
        store: PipeStore,
        plain: Encoded,
        session_id: str,
        read: Callable[[], Claimed],
        claimed: int,
        *,
        limit: int = 0,
        take_suspect: bool = False,
    ) -> None:
        self.store = store
        self.plain = plain
        self.session_id = session_id
        self.claimed = claimed  # how many jobs it claimed
        self.limit = limit  # how many it asked for
        self.take_suspect = take_suspect  # whether it could bring a suspect
        self._read = read
        self._table: Claimed | None = None

    @classmethod
    def of(cls, store: PipeStore, plain: Encoded, session_id: str, table: Claimed) -> Answer:
        """The answer of rows read already."""
        claimed = sum(1 for row in table[1] if row[1] is not None)
        return cls(store, plain, session_id, lambda: table, claimed)

    @property
    def completions(self) -> list[Completion]:
        """The completions it carried."""
        return [c for c, _ in self.plain]

    def table(self) -> Claimed:
        if self._table is None:
            self._table = self._read()
        return self._table

    def jobs(self) -> list[JobRecord]:
        """The jobs it claimed, in claim order."""
        names, rows = self.table()
        return self.store._claimed((names[1:], [row[1:] for row in rows if row[1] is not None]))

    def settle(self, now: datetime | None = None) -> AckResult:
        """What became of its completions: looked at one by one if it completed fewer than
        it was given (refused, or a retry of one that committed). Raises SessionGone if it
        neither completed nor claimed anything and the session is gone."""
        store, plain = self.store, self.plain
        rows = self.table()[1]
        acked = int(rows[0][0]) if rows else 0
        if acked == len(plain):
            completed = AckResult(tuple(c.claim for c, _ in plain), ())
        else:
            ok, refused = store._run(lambda tx: store._settle(tx, plain, tx.clock(now)))
            completed = AckResult(tuple(ok), tuple(refused))
        if not acked and not self.claimed:  # as a claim: nothing found, the session may be gone
            alive = store._run(
                lambda tx: tx.one("session_alive", session_id=self.session_id, now=tx.clock(now)),
                single=True,
            )
            if alive is None:
                raise errors.SessionGone(f"session {self.session_id} has expired or was closed")
        return completed


@dataclass(eq=False)
class _Turn:
    """A turn handed to the pipe's thread, and what became of it there."""

    conn: psycopg.Connection[Any]
    params: dict[str, Any]
    plain: Encoded
    session_id: str
    watch: ExitStack  # the call's deadline, from send to receive
    call: Call
    sent_at: float  # time.monotonic()
    limit: int
    take_suspect: bool
    done: threading.Event = field(default_factory=threading.Event)
    taken: threading.Event = field(default_factory=threading.Event)  # by the thread
    started: bool = False  # the thread has taken it, or it was withdrawn
    cursor: psycopg.Cursor[Any] | None = None  # its rows, once it committed, unread
    table: Claimed | None = None  # or read already (its first run on the connection)
    claimed: int = 0
    error: Exception | None = None


def _exchange(store: PipeStore, turn: _Turn) -> None:
    """Run one turn on its connection (in autocommit: the statement commits on its own);
    its rows are parsed only when the worker reads them."""
    conn, params = turn.conn, {**turn.params, "now": None}
    prepare, planned = plan_once(conn, "job_exchange")
    if planned is not None:  # its first run here, planned by the indexes (see plan_once):
        with conn.transaction():  # the setting and the statement in one transaction
            turn.table = PgTx(conn, store.queries).table("job_exchange", **params)
        turn.claimed = sum(1 for row in turn.table[1] if row[1] is not None)
        return
    cursor = conn.cursor(row_factory=tuple_row)
    cursor.execute(store.queries["job_exchange"], params, binary=True, prepare=prepare)
    result = cursor.pgresult
    if result is None or not result.nfields:
        raise errors.StoreError(f"{store.url}: a turn came back without rows")
    # how many it claimed, without reading its rows yet: one row of NULLs is none
    turn.claimed = result.ntuples if result.ntuples != 1 or result.get_value(0, 1) else 0
    turn.cursor = cursor


class _Runner:
    """The thread that runs a pipe's turns, one after another in the order they were sent,
    each on the connection it names. It lingers IDLE_LINGER seconds for the next turn,
    then ends; the next send starts another."""

    def __init__(self, store: PipeStore) -> None:
        self._store = store
        self._lock = threading.Condition()
        self._queue: collections.deque[_Turn] = collections.deque()
        self._thread: threading.Thread | None = None
        self._busy = False  # running a turn

    def put(self, turn: _Turn) -> None:
        """Queue the turn. If the thread is free, wait until it has taken the turn: it sends
        the statement before it lets go of the interpreter, which a busy caller would
        otherwise hold for a while (the turn would wait for it, not go ahead)."""
        with self._lock:
            free = not self._busy and not self._queue
            self._queue.append(turn)
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._loop, name="plunder-turns", daemon=True
                )
                self._thread.start()
            else:
                self._lock.notify()
        if free:
            turn.taken.wait(TAKE_WAIT)

    def withdraw(self, turns: Sequence[_Turn]) -> _Turn | None:
        """Take back the turns not started yet (they never run); the one running now, if
        it is one of them: the caller cuts its connection and waits for it."""
        with self._lock:
            for turn in turns:
                if not turn.started:
                    self._queue.remove(turn)
                    turn.started = True
                    turn.done.set()
            return next((t for t in turns if not t.done.is_set()), None)

    def _loop(self) -> None:
        while True:
            with self._lock:
                if not self._lock.wait_for(lambda: self._queue, timeout=IDLE_LINGER):
                    self._thread = None
                    return
                turn = self._queue.popleft()
                turn.started = self._busy = True
                turn.taken.set()
            try:
                self._run(turn)
            finally:
                with self._lock:
                    self._busy = False

    def _run(self, turn: _Turn) -> None:
        try:
            _exchange(self._store, turn)
        except Exception as exc:  # handed to the receiver, which raises it
            turn.error = exc
            with self._lock:  # the turns after it on its connection never run
                for later in [t for t in self._queue if t.conn is turn.conn]:
                    self._queue.remove(later)
                    later.started = True
                    later.error = errors.StoreError("an earlier turn failed")
                    later.done.set()
        finally:
            turn.done.set()


class TurnPipe:
    """One worker's turns sent ahead on one held connection (see the module docstring).
    Up to ``depth`` turns in flight, answered in the order they were sent; only the
    worker's main thread uses it (its own thread runs the turns)."""

    def __init__(self, store: PipeStore) -> None:
        self._store = store
        self._conn: psycopg.Connection[Any] | None = None
        self._runner = _Runner(store)
        self._flights: collections.deque[_Turn] = collections.deque()
        self._columns: list[str] | None = None  # of the answers (see _names)

    @property
    def sent_at(self) -> float | None:
        """When the oldest turn in flight was sent (``time.monotonic()``); None: none is."""
        return self._flights[0].sent_at if self._flights else None

    @property
    def in_flight(self) -> int:
        """How many turns are in flight."""
        return len(self._flights)

    @property
    def depth(self) -> int:
        """How many turns may be in flight at once."""
        return MAX_IN_FLIGHT

    @property
    def claiming(self) -> int:
        """The slots the turns in flight may fill: the sum of their claim limits."""
        return sum(f.limit for f in self._flights)

    @property
    def suspect(self) -> bool:
        """Whether a turn in flight may bring a suspect."""
        return any(f.take_suspect for f in self._flights)

    def completions(self) -> list[Completion]:
        """The completions of the turns in flight, oldest first."""
        return [c for f in self._flights for c, _ in f.plain]

    def answered(self) -> bool:
        """Whether the oldest turn in flight has (begun to) come back: ``receive`` would
        not wait for the database. False with none in flight."""
        if not self._flights:
            return False
        oldest = self._flights[0]
        if oldest.done.is_set():
            return True
        if not oldest.taken.is_set():
            return False
        try:  # its answer is arriving: the thread reads it once it gets to run
            readable, _, _ = select.select([oldest.conn.fileno()], [], [], 0)
        except (OSError, ValueError, psycopg.Error):
            return True  # broken: receive says how
        return bool(readable)

    def ready(self, *, queues: Sequence[str], tasks: Sequence[str]) -> int:
        """Prepare the turns' statement on every connection of the pool (opened up to its
        size, held together so that each is a different one), as a worker starts. The
        first turn on a connection parses and plans the statement, and in a new server
        process reads the catalog for it as well, a cost otherwise paid at the start of a
        burst by the worker's first turns (docs/decisions/0004-turns-sent-ahead.md). This
        turn names no session, so it claims and acknowledges nothing and writes nothing.
        How many connections it made ready (none behind a transaction pooler, where
        statements are not prepared)."""
        if self._conn is not None:
            raise RuntimeError("the pipe holds a connection already: ready() comes first")
        store = self._store
        params = turn_params([], "", queues=queues, tasks=tasks, limit=1, take_suspect=False)
        held: list[psycopg.Connection[Any]] = []
        try:
            for _ in range(store._pool_size):
                conn = store._pipe_connection()
                if conn is None:
                    return 0
                held.append(conn)
                if conn.prepare_threshold is None:
                    return 0
            for conn in held:
                with store._deadlines.watch(conn, store._call_timeout) as call:
                    try:
                        PgTx(conn, store.queries).table("job_exchange", **params, now=None)
                    except psycopg.Error as exc:
                        conn.close()  # the pool replaces it
                        raise self._error(exc, call) from exc
            return len(held)
        finally:
            for conn in held:
                store._get_pool().putconn(conn)

    def send(
        self,
        completions: Sequence[Completion],
        *,
        session_id: str,
        queues: Sequence[str],
        tasks: Sequence[str],
        limit: int,
        take_suspect: bool,
    ) -> bool:
        """Send a turn: these completions (plain, without effects) and a claim of up to
        ``limit`` jobs. False: nothing was sent, and no turn can be sent ahead on this
        database (a transaction pooler: plunder's settings are made per transaction there).
        Raises the store's errors; after one, whether it reached the database is unknown,
        and nothing is in flight (the turns that were are never read: see ``close``)."""
        if len(self._flights) >= MAX_IN_FLIGHT:
            raise RuntimeError(f"{len(self._flights)} turns are in flight already: receive first")
        if any(c.effects is not None for c in completions):
            raise ValueError("completions with effects go through job_complete_many")
        store = self._store
        store._check_claim(queues, limit)
        plain = store._encode_results(completions)
        params = turn_params(
            plain, session_id, queues=queues, tasks=tasks, limit=limit, take_suspect=take_suspect
        )
        conn = self._open()
        if conn is None:
            return False
        watch = ExitStack()
        call = watch.enter_context(store._deadlines.watch(conn, store._call_timeout))
        turn = _Turn(conn, params, plain, session_id, watch, call, time.monotonic(),
                     limit, take_suspect)  # fmt: skip
        self._flights.append(turn)
        self._runner.put(turn)
        return True

    def receive(self) -> Answer:
        """The answer to the oldest turn in flight, once it committed. Raises the store's
        errors; after one, whether it committed is unknown, and nothing is in flight."""
        if not self._flights:
            raise RuntimeError("no turn is in flight")
        turn = self._flights[0]
        try:
            with turn.watch:
                turn.done.wait()
        except BaseException:
            self.close(discard=True)
            raise
        self._flights.popleft()
        if turn.error is not None:
            self.close(discard=True)
            exc = turn.error
            if isinstance(exc, psycopg.Error):
                raise self._error(exc, turn.call) from exc
            raise exc
        return Answer(
            self._store,
            turn.plain,
            turn.session_id,
            functools.partial(self._read, turn),
            turn.claimed,
            limit=turn.limit,
            take_suspect=turn.take_suspect,
        )

    def _read(self, turn: _Turn) -> Claimed:
        """A turn's rows (they are here already: only parsing them is left), with the
        column names: every turn is the same statement, so those are read once (psycopg
        makes a description's columns anew at each look, with a type lookup for each)."""
        if turn.table is not None:
            return turn.table
        cursor = turn.cursor
        assert cursor is not None and cursor.pgresult is not None
        if self._columns is None or len(self._columns) != cursor.pgresult.nfields:
            assert cursor.description is not None
            self._columns = [column.name for column in cursor.description]
        return self._columns, list(cursor.fetchall())

    def close(self, *, discard: bool = False) -> list[Completion]:
        """Give the connection back to the pool: closed first if a turn is in flight (its
        answer is never read) or ``discard``. The completions of the turns never read: the
        caller sends them again (each may have committed, or not)."""
        conn = self._conn
        self._conn = None
        flights, self._flights = list(self._flights), collections.deque()
        running = self._runner.withdraw(flights)
        if running is not None:  # cut: its answer is never read
            with contextlib.suppress(psycopg.Error, OSError):  # closed already: cut too
                shut_down(running.conn.fileno())
            running.done.wait()
        for flight in flights:
            flight.watch.close()
        unread = [c for f in flights for c, _ in f.plain]
        if conn is None:
            return unread
        if flights or discard or conn.broken:
            conn.close()
        self._store._get_pool().putconn(conn)
        return unread

    def _open(self) -> psycopg.Connection[Any] | None:
        """The held connection, or another once none is in flight: a turn sent behind one
        that failed (its connection closed by the failure) fails with it, and ``receive``
        says so, instead of the failed one being dropped unseen."""
        if self._conn is not None and (self._flights or not self._conn.closed):
            return self._conn
        self.close(discard=True)
        self._conn = self._store._pipe_connection()
        return self._conn

    def _error(self, exc: psycopg.Error, call: Call | None) -> Exception:
        if call is not None and call.reason is not None:
            return errors.StoreBusy(f"{self._store.url}: {call.reason}; the connection was cut")
        translated = self._store._translate(exc)
        return translated if translated is not None else errors.StoreError(str(exc))
