"""A worker's turns on PostgreSQL: the statement (job_exchange), what its rows mean, and
turns *sent ahead* on a connection the worker holds in pipeline mode.

A turn — the results of the jobs that finished and a claim of new ones, one statement that
commits on its own — keeps the database busy for a couple of milliseconds, and the worker's
Python (reading the rows into records, starting the jobs, collecting their outcomes) for
about as long. Run one after the other they add up. Sent ahead, they overlap:

```
 worker ─ send(N+1) ─▶ reads N's rows, starts N's jobs, collects outcomes ─ receive(N+1) ─▶
            │                                                                  ▲
 database   └── runs N+1, commits it at its Sync ── (idle, or the next turn) ──┘
```

The statement goes out with its Sync at once, so the server commits it as soon as it has
run it; ``receive`` only reads the answer. A turn's jobs are started only after its answer
arrived, that is, after it committed. Until then its claims are invisible to the worker: a
heartbeat that reads them meanwhile must not take them for lost (see Liveness.give_back), and its
results are on their way, held like any results not yet written.

More turns may follow the first before the first is read (up to ``depth`` in flight): the
server runs each as soon as it has committed the one before, without waiting for the
worker. Answers are read oldest first, and reading one never waits for the next: the turns
go through libpq's pipeline mode on psycopg's public ``pq`` module (see
plunder.store.postgres.pipe).

A turn that fails (an error, a lost or cut connection) ends the pipe's connection: it is
closed, the turns after it are never read either, and the next send opens another. Whether
those turns committed may be unknown; their results are sent again by the caller (an
acknowledgement that committed already is recognised as such), and claims that did commit
are given back once the heartbeat reports them.
"""

from __future__ import annotations

import collections
import time
from collections.abc import Callable, Mapping, Sequence
from contextlib import ExitStack
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import psycopg

from plunder import errors
from plunder.model import SUSPECT_LOSSES, AckResult, Claim, Completion, JobRecord
from plunder.store import convert
from plunder.store.deadlines import Call, Deadlines
from plunder.store.driver import CLAIM_LEVELS, Claimed
from plunder.store.postgres import pipe
from plunder.store.postgres.tx import array_literal

Encoded = list[tuple[Completion, str]]  # completions with their results encoded
MAX_IN_FLIGHT = 3  # turns a pipe may have in flight
STATEMENT = "plunder_turn"  # the turn's prepared statement, on each connection that prepares


@dataclass(frozen=True)
class PipeSupport:
    """What turns need of the PostgreSQL store, which builds it (``PgTurns``): its
    settings, and its operations as callables, so that turns name none of its members."""

    url: str
    queries: Mapping[str, str]
    pool_size: int
    deadlines: Deadlines
    call_timeout: float | None  # each turn's deadline, from send to receive
    # a pooled connection to hold, prepared as the pool prepares; None behind a
    # transaction pooler (each transaction must make plunder's settings there)
    hold: Callable[[], psycopg.Connection[Any] | None]
    give_back: Callable[[psycopg.Connection[Any]], None]  # to the pool
    check_claim: Callable[[Sequence[str], int], None]  # raises on a bad queue or limit
    encode: Callable[[Sequence[Completion]], Encoded]  # the completions' results encoded
    records: Callable[[Claimed], list[JobRecord]]  # claimed rows as job records
    # which completions were accepted (and which refused), in a transaction of its own
    settle: Callable[[Encoded, datetime | None], tuple[list[Claim], list[Claim]]]
    alive: Callable[[str, datetime | None], bool]  # whether a session is alive
    translate: Callable[[Exception], Exception | None]  # a driver error as plunder's
    # whether a claim names a fair queue: such a turn is not sent ahead (see send)
    fair: Callable[[Sequence[str]], bool] = lambda _queues: False


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
    """A turn's rows as they came back (it committed): on each, how many jobs it completed
    and whether one had children, then a claimed job's columns (one row of NULLs when it
    claimed none). ``read()`` gives
    them (names, rows); a turn sent ahead is read, and its rows made records, only after
    the caller has sent its next turn."""

    def __init__(
        self,
        support: PipeSupport,
        plain: Encoded,
        session_id: str,
        read: Callable[[], Claimed],
        claimed: int,
        *,
        limit: int = 0,
        take_suspect: bool = False,
        children: bool | None = None,
    ) -> None:
        self.support = support
        self.plain = plain
        self.session_id = session_id
        self.claimed = claimed  # how many jobs it claimed
        self.limit = limit  # how many it asked for
        self.take_suspect = take_suspect  # whether it could bring a suspect
        self._read = read
        self._table: Claimed | None = None
        self._children = children  # None: read from its rows when asked

    @classmethod
    def of(cls, support: PipeSupport, plain: Encoded, session_id: str, table: Claimed) -> Answer:
        """The answer of rows read already."""
        claimed = sum(1 for row in table[1] if row[2] is not None)
        return cls(support, plain, session_id, lambda: table, claimed)

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
        return self.support.records((names[2:], [row[2:] for row in rows if row[2] is not None]))

    @property
    def children(self) -> bool:
        """Whether a job it completed had children: some may be pending now, which its
        claim could not see (it read the statement's snapshot)."""
        if self._children is None:
            rows = self.table()[1]
            self._children = bool(rows and rows[0][1])
        return self._children

    def settle(self, now: datetime | None = None) -> AckResult:
        """What became of its completions: looked at one by one if it completed fewer than
        it was given (refused, or a retry of one that committed). Raises SessionGone if it
        neither completed nor claimed anything and the session is gone."""
        plain = self.plain
        rows = self.table()[1]
        acked = int(rows[0][0]) if rows else 0
        if acked == len(plain):
            completed = AckResult(tuple(c.claim for c, _ in plain), ())
        else:
            ok, refused = self.support.settle(plain, now)
            completed = AckResult(tuple(ok), tuple(refused))
        # as a claim: nothing found, the session may be gone
        if not acked and not self.claimed and not self.support.alive(self.session_id, now):
            raise errors.SessionGone(f"session {self.session_id} has expired or was closed")
        return completed


@dataclass
class _Flight:
    plain: Encoded
    session_id: str
    watch: ExitStack  # the call's deadline, from send to receive
    call: Call
    commands: int  # the commands it sent before its Sync (see pipe.Wire.read)
    sent_at: float  # time.monotonic()
    limit: int
    take_suspect: bool


class TurnPipe:
    """One worker's turns sent ahead on one held connection (see the module docstring).
    Up to ``depth`` turns in flight, answered in the order they were sent; only the
    worker's main thread uses it."""

    def __init__(self, support: PipeSupport) -> None:
        self._support = support
        self._conn: psycopg.Connection[Any] | None = None
        self._wire: pipe.Wire | None = None  # the connection's link in pipeline mode
        self._flights: collections.deque[_Flight] = collections.deque()
        self._shapes = pipe.Shapes()
        queries = support.queries
        self._statement = pipe.Statement.of(STATEMENT, queries["job_exchange"])
        self._plans = (queries["plans_by_index"].encode(), queries["plans_reset"].encode())

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
        """How many turns may be in flight at once: MAX_IN_FLIGHT."""
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

    def answered(self, timeout: float = 0.0) -> bool:
        """Whether the oldest turn in flight has (begun to) come back, waiting ``timeout``
        seconds at most: ``receive`` would not wait for the database. False with none in
        flight."""
        if not self._flights or self._wire is None:
            return False
        try:
            return self._wire.answered(timeout)
        except (OSError, ValueError, psycopg.Error):
            return True  # broken: receive says how

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
        support = self._support
        params = turn_params([], "", queues=queues, tasks=tasks, limit=1, take_suspect=False)
        held: list[psycopg.Connection[Any]] = []
        try:
            for _ in range(support.pool_size):
                conn = support.hold()
                if conn is None:
                    return 0
                held.append(conn)
                if conn.prepare_threshold is None:
                    return 0
            for conn in held:
                self._ready_one(conn, params)
            return len(held)
        finally:
            for conn in held:
                support.give_back(conn)

    def _ready_one(self, conn: psycopg.Connection[Any], params: dict[str, Any]) -> None:
        """One turn on ``conn``, read at once; the connection is closed (the pool replaces
        it) if it fails or cannot leave pipeline mode."""
        support = self._support
        with support.deadlines.watch(conn, support.call_timeout) as call:
            try:
                wire = pipe.Wire(conn)
                self._queue(wire, params)
                wire.read(wire.sync())
            except psycopg.Error as exc:
                conn.close()
                raise self._error(exc, call) from exc
            except BaseException:
                conn.close()  # not back to the pool in pipeline mode
                raise
        if not wire.leave():
            conn.close()

    def send(
        self,
        completions: Sequence[Completion],
        *,
        session_id: str,
        queues: Sequence[str],
        tasks: Sequence[str],
        limit: int,
        take_suspect: bool,
        wait: float = 0.0,
    ) -> bool:
        """Send a turn: these completions (plain, without effects) and a claim of up to
        ``limit`` jobs (``wait`` is for links that long-poll: not this one). False: nothing
        was sent, and no turn can be sent ahead on this database (a transaction pooler:
        plunder's settings are made per transaction there).
        Raises the store's errors; after one, whether it reached the database is unknown,
        and nothing is in flight (the turns that were are never read: see ``close``)."""
        if len(self._flights) >= MAX_IN_FLIGHT:
            raise RuntimeError(f"{len(self._flights)} turns are in flight already: receive first")
        if any(c.effects is not None for c in completions):
            raise ValueError("completions with effects go through job_complete_many")
        support = self._support
        support.check_claim(queues, limit)
        if support.fair(queues):  # a fair queue's claim is several statements: one at a time
            return False
        plain = support.encode(completions)
        params = turn_params(
            plain, session_id, queues=queues, tasks=tasks, limit=limit, take_suspect=take_suspect
        )
        wire = self._open()
        if wire is None:
            return False
        watch = ExitStack()
        call = watch.enter_context(support.deadlines.watch(wire.conn, support.call_timeout))
        try:
            self._queue(wire, params)
            commands = wire.sync()
        except psycopg.Error as exc:
            watch.close()
            self.close(discard=True)
            raise self._error(exc, call) from exc
        except BaseException:
            watch.close()
            self.close(discard=True)
            raise
        flight = _Flight(plain, session_id, watch, call, commands, time.monotonic(),
                         limit, take_suspect)  # fmt: skip
        self._flights.append(flight)
        return True

    def _queue(self, wire: pipe.Wire, params: dict[str, Any]) -> None:
        """Queue a turn's statement on ``wire``. Prepared at its first run on a connection
        that prepares, and planned then by its indexes (tx.plan_once): between
        plans_by_index and plans_reset, in the turn's own implicit transaction (if it
        fails, so does the setting). Where the connection prepares nothing, unnamed."""
        conn, statement = wire.conn, self._statement
        values = statement.values({**params, "now": None}, wire.encoding)
        planned: frozenset[str] | None = getattr(conn, "index_planned", None)
        if planned is None or conn.prepare_threshold is None:
            wire.query(statement.sql, values)
            return
        name = statement.name.encode()
        if STATEMENT not in planned:
            wire.query(self._plans[0])
            wire.prepare(name, statement.sql)
            wire.execute(name, values)
            wire.query(self._plans[1])
            conn.index_planned = planned | {STATEMENT}  # type: ignore[attr-defined]
        else:
            wire.execute(name, values)

    def receive(self) -> Answer:
        """The answer to the oldest turn in flight, once it committed. Raises the store's
        errors; after one, whether it committed is unknown, and nothing is in flight."""
        if not self._flights:
            raise RuntimeError("no turn is in flight")
        flight = self._flights.popleft()
        wire = self._wire
        assert wire is not None
        try:
            with flight.watch:
                result = wire.read(flight.commands)
                if result is None or not result.nfields:
                    raise errors.StoreError(f"{self._support.url}: a turn came back without rows")
                shape = self._shapes.of(result, wire.conn)
        except psycopg.Error as exc:
            self.close(discard=True)
            raise self._error(exc, flight.call) from exc
        except BaseException:
            self.close(discard=True)
            raise
        # how many it claimed, and whether it completed parents, without reading its rows
        # yet (they are loaded once the next turn is sent): one row of NULLs is none
        claimed = result.ntuples if result.ntuples != 1 or result.get_value(0, 2) else 0
        children = result.get_value(0, 1) == b"\x01"  # a boolean, binary

        def read() -> Claimed:  # the rows are here already; only loading them is left
            return shape.names, shape.rows(result)

        return Answer(
            self._support,
            flight.plain,
            flight.session_id,
            read,
            claimed,
            limit=flight.limit,
            take_suspect=flight.take_suspect,
            children=children,
        )

    def rest(self) -> None:
        """Nothing to let go: the connection stays in pipeline mode, so that the next claim
        (an idle worker's, sent by the thread that heard of work: plunder.idle) goes out
        without taking one from the pool and entering the mode again."""

    def close(self, *, discard: bool = False) -> list[Completion]:
        """Give the connection back to the pool: closed first if a turn is in flight (its
        answer is never read), ``discard``, or it cannot leave pipeline mode. The
        completions of the turns never read: the caller sends them again (each may have
        committed, or not)."""
        conn, wire = self._conn, self._wire
        self._conn = self._wire = None
        flights, self._flights = list(self._flights), collections.deque()
        for flight in flights:
            flight.watch.close()
        unread = [c for f in flights for c, _ in f.plain]
        if conn is None:
            return unread
        clean = not (flights or discard or conn.broken or conn.closed or wire is None)
        if not (clean and wire is not None and wire.leave()):
            conn.close()
        self._support.give_back(conn)
        return unread

    def _open(self) -> pipe.Wire | None:
        if self._conn is not None and self._wire is not None and not self._conn.closed:
            return self._wire
        self.close(discard=True)
        conn = self._support.hold()
        if conn is None:
            return None
        self._conn = conn
        try:
            self._wire = pipe.Wire(conn)
        except psycopg.Error as exc:
            self.close(discard=True)
            raise self._error(exc, None) from exc
        return self._wire

    def _error(self, exc: psycopg.Error, call: Call | None) -> Exception:
        if call is not None and call.reason is not None:
            return errors.StoreBusy(f"{self._support.url}: {call.reason}; the connection was cut")
        translated = self._support.translate(exc)
        return translated if translated is not None else errors.StoreError(str(exc))
