"""The engine under every SQL store: the driver hooks, the transaction runner, schema
migrations, notifications and the mapping of rows to records.

A driver (``sqlite.py``, ``postgres.py``) supplies connections, a transaction, the value
conversions its database needs and the classification of its errors; everything else —
validation, the order of statements inside each transaction, fencing, matching batch rows
to their inputs — lives here, so both backends behave the same by construction.

Inside one operation::

    _run(op) ── begin ──▶ op(tx): tx.one / tx.all / tx.batch("query_name", ...) ── commit
       ▲                                    │
       └── busy? sleep a fixed, jittered interval, run op again (bounded total) ◀┘
"""

from __future__ import annotations

import operator
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from datetime import datetime
from typing import Any, NoReturn, Protocol, TypeVar

from plunder import errors, payload, policy
from plunder.model import (
    Completion,
    ErrorInfo,
    Exchange,
    JobRecord,
    Lease,
    Run,
    Session,
)
from plunder.states import TERMINAL, Outcome, Status
from plunder.store import columns, queries

T = TypeVar("T")
Row = Mapping[str, Any]
Now = datetime | None

MAX_BATCH = 10_000  # claims and acknowledgements per call
MAX_ENQUEUE = 100_000  # jobs per enqueue call

CHANNEL_ENQUEUED = "plunder_enqueued"  # payload: queue names with new or newly due work
CHANNEL_DONE = "plunder_done"  # payload: ids of jobs that reached a terminal state
CHANNEL_STREAM = "plunder_stream"  # payload: ids of jobs with new stream events
NOTIFY_BYTES = 7000

SESSION_LOST = ErrorInfo(
    "plunder.SessionLost",
    "the worker's session expired while this attempt was running (the worker died, "
    "hung or lost the database)",
)
JOB_TIMEOUT = ErrorInfo("plunder.JobTimeout", "the job ran past its timeout")
JOB_EXPIRED = ErrorInfo(
    "plunder.JobExpired",
    "the job's start-by deadline (expires_in) passed before its next attempt could start",
)


class Tx(Protocol):
    """One open transaction, as the shared code sees it."""

    conn: Any
    # True where each statement is a transaction of its own (see Engine._transaction's
    # ``single``): its answer may be lost after it committed
    statement_commits: bool

    def clock(self, now: Now) -> Any:
        """The value to pass as the ``now`` parameter for this transaction."""
        ...

    def all(self, name: str, /, **params: Any) -> list[Row]: ...

    def one(self, name: str, /, **params: Any) -> Row | None: ...

    def table(self, name: str, /, **params: Any) -> tuple[list[str], list[Sequence[Any]]]:
        """The column names and the rows as plain tuples: cheaper than mappings for the
        hundreds of wide rows of a claim."""
        ...

    def batch(self, name: str, rows: Sequence[Mapping[str, Any]], /, **common: Any) -> list[Row]:
        """Run a batch query over ``rows`` (one statement, or one per row) and return every
        row it returned."""
        ...

    def batch_table(
        self, name: str, rows: Sequence[Mapping[str, Any]], /, **common: Any
    ) -> tuple[list[str], list[Sequence[Any]]]:
        """``batch``, with what it returned as ``table`` gives it: names and plain tuples."""
        ...

    def batch_count(self, name: str, rows: Sequence[Mapping[str, Any]], /, **common: Any) -> int:
        """Run a batch query whose result is a count (see the query's documentation): the
        rows it changed, or the rows it returned."""
        ...

    def columns_count(
        self, name: str, columns: Mapping[str, Sequence[Any]], /, **common: Any
    ) -> int:
        """``batch_count`` over rows given column by column (equal lengths, at least one
        row): the hot path builds its few columns directly instead of a mapping per row."""
        ...

    def script(self, sql: str) -> None:
        """Execute one DDL statement."""
        ...


def insert_mismatch(tx: Tx, what: str) -> NoReturn:
    """The rows an insert returned do not match its inputs (a trigger of the user's on
    plunder_jobs, say). In a transaction nothing is stored; a statement that committed on
    its own has stored them, and running it again would store them twice."""
    if tx.statement_commits:
        raise errors.OutcomeUnknown(f"{what}; the insert committed, so do not repeat it")
    raise errors.StoreError(what)


class _EffectsFailed(Exception):
    """Carries an exception raised by a task's own writes out of the transaction."""

    def __init__(self, original: BaseException) -> None:
        super().__init__(str(original))
        self.original = original


class Engine(ABC):
    """What every SQL store operation stands on."""

    dialect: str
    url: str
    notifies = False  # whether the database delivers NOTIFY to listeners
    # runs of jobs with the same options an enqueue inserts one statement each, before it
    # inserts a batch in one statement with each row's options (see enqueue.Inserts)
    insert_runs = 4
    # whether an enqueue numbers its jobs itself (job_id_next, then each row's id is its
    # seq) and reads nothing back, which a database whose writers take turns allows; else
    # the database numbers them and the insert returns the rows it stored
    numbers_jobs = False
    retired = False  # closed for good (see retire)

    def __init__(
        self, *, busy_total: float = policy.BUSY_TOTAL, busy_interval: float = policy.BUSY_INTERVAL
    ) -> None:
        self.busy_total = busy_total
        self.busy_interval = busy_interval
        self.queries = queries.load(self.dialect)

    # -- what a driver provides -----------------------------------------------------------
    @abstractmethod
    def _transaction(self, *, write: bool, single: bool = False) -> AbstractContextManager[Tx]:
        """Begin a transaction (SQLite: BEGIN IMMEDIATE for writes), commit on exit.
        ``single``: the caller writes with one statement (reads may follow it), which a
        driver may then run as a transaction of its own."""

    @abstractmethod
    def _joined(self, conn: Any) -> Tx:
        """A Tx over the caller's own open connection and transaction."""

    @abstractmethod
    def _translate(self, exc: Exception) -> Exception | None:
        """Map a driver error to a plunder error: a StoreBusy means "retry the whole
        transaction"; None means "not a driver error, let it through"."""

    @abstractmethod
    def _time(self, value: Any) -> datetime: ...

    @abstractmethod
    def _list_in(self, values: Sequence[Any]) -> Any: ...

    @abstractmethod
    def _list_out(self, value: Any) -> list[str]: ...

    @abstractmethod
    def _next_due(self, tx: Tx, queues: list[str], tasks: list[str], clock: Any) -> float | None:
        """job_next_due's reading in ``tx``: as a claim reads, each queue on its own, one
        priority level at a time (the first CLAIM_LEVELS one by one, the rest in one go),
        and in each level the earliest job of a served task."""

    def _turn_at_once(
        self,
        plain: list[tuple[Completion, str]],
        session_id: str,
        *,
        queues: Sequence[str],
        tasks: Sequence[str],
        limit: int,
        take_suspect: bool,
        now: Now,
    ) -> Exchange | None:
        """A worker's turn of completions (their results encoded) and a claim, validated,
        as one statement where the dialect has one (PostgreSQL's job_exchange); None: it
        is the transaction of several statements that ``job_exchange_many`` runs."""
        return None

    def turn_pipe(self) -> Any:
        """Turns sent ahead (see Store.turn_pipe); None: this store has none."""
        return None

    @abstractmethod
    def close(self) -> None:
        """Close every connection this store opened."""

    def retire(self) -> None:
        """Close for good: a later call raises StoreUnavailable instead of connecting again,
        as it would after ``close()``. For a store its owner is done with while code it
        does not control may still hold it."""
        self.retired = True
        self.close()

    def _refuse_if_retired(self) -> None:
        if self.retired:
            raise errors.StoreUnavailable(f"{self.url}: this store was closed for good")

    # -- notifications --------------------------------------------------------------------
    def _notify(self, tx: Tx, channel: str, items: Sequence[str]) -> None:
        """Queue a notification that is delivered when ``tx`` commits: the payload is a
        comma-separated list (queue names and job ids contain no commas), chunked below the
        8000-byte limit. A no-op for databases without NOTIFY."""
        if not self.notifies or not items:
            return
        chunk: list[str] = []
        size = 0
        for item in sorted(set(items)):
            if chunk and size + len(item) + 1 > NOTIFY_BYTES:
                tx.one("notify", channel=channel, payload=",".join(chunk))
                chunk, size = [], 0
            chunk.append(item)
            size += len(item) + 1
        tx.one("notify", channel=channel, payload=",".join(chunk))

    def _announce(self, tx: Tx, rows: Sequence[Row]) -> None:
        """Tell listeners about jobs that changed state: pending again wakes the workers of
        its queue, a terminal state wakes whoever waits for its result."""
        pending = [str(r["queue"]) for r in rows if r["status"] == Status.PENDING]
        finished = [str(r["id"]) for r in rows if r["status"] in TERMINAL]
        self._notify(tx, CHANNEL_ENQUEUED, pending)
        self._notify(tx, CHANNEL_DONE, finished)

    def job_next_due(
        self, *, queues: Sequence[str], tasks: Sequence[str], now: Now = None
    ) -> float | None:
        """Seconds until the earliest pending job for these queues and tasks is due, by the
        database clock (zero or less: due now; None: no such job)."""
        if not queues or not tasks:
            return None
        for queue in queues:
            payload.check_queue(queue)
        return self._run(
            lambda tx: self._next_due(tx, list(dict.fromkeys(queues)), list(tasks), tx.clock(now)),
            write=False,
        )

    # -- the transaction runner -----------------------------------------------------------
    def _run(
        self,
        op: Callable[[Tx], T],
        *,
        write: bool = True,
        conn: Any = None,
        repeatable: bool = True,
        single: bool = False,
    ) -> T:
        """Run ``op`` in a transaction, retried whole while the database is busy.
        ``single``: see ``_transaction``.

        ``repeatable=False``: running ``op`` twice would write twice (an enqueue without
        keys). A connection lost while committing (or, for a statement that commits on
        its own, while it ran) leaves the outcome unknown, and then this raises
        OutcomeUnknown instead of running it again."""
        if conn is not None:
            return self._run_joined(op, conn)
        # made at the first busy answer (its budget starts there anyway): it seeds a random
        # generator from the OS, which costs more than the rest of a short transaction
        backoff: policy.BusyBackoff | None = None
        while True:
            committing = False
            try:
                with self._transaction(write=write, single=single) as tx:
                    committing = tx.statement_commits
                    result = op(tx)
                    committing = True
                return result
            except (errors.PlunderError, _EffectsFailed) as exc:
                if not isinstance(exc, errors.StoreBusy):
                    raise
                # raised by the driver itself (SQLite BUSY while opening a connection) or by
                # op: retried like a busy error from the database
                busy, cause = exc, exc.__cause__
            except Exception as exc:
                busy, cause = self._busy(exc), exc
            if committing and not repeatable and self._commit_lost(cause):
                raise errors.OutcomeUnknown(
                    f"{self.url}: the connection was lost while committing, so this write "
                    f"may or may not be stored ({str(busy).strip()}); enqueue with "
                    "key=... to make a retry safe"
                ) from cause
            if backoff is None:
                backoff = policy.BusyBackoff(interval=self.busy_interval, total=self.busy_total)
            wait = backoff.next_wait()
            if wait is None:
                raise busy from cause
            time.sleep(wait)

    def _busy(self, exc: Exception) -> errors.StoreBusy:
        """A driver error as StoreBusy (to retry), or raised as the error it means."""
        translated = self._translate(exc)
        if translated is None:
            raise exc
        if not isinstance(translated, errors.StoreBusy):
            raise translated from exc
        return translated

    def _commit_lost(self, exc: BaseException | None) -> bool:
        """Whether ``exc``, raised by COMMIT, leaves it unknown whether the transaction
        committed (a lost connection; not an answer such as a serialization failure, which
        says it did not)."""
        return False

    def _run_on(self, op: Callable[[Tx], T], conn: Any) -> T:
        """One transaction on a connection the caller owns (the hub's), not retried: the
        clock is read after the write lock is taken, so a heartbeat that waited for the lock
        cannot judge its session alive by a stale time."""
        try:
            with self._transaction_on(conn) as tx:
                return op(tx)
        except errors.PlunderError:
            raise
        except Exception as exc:
            translated = self._translate(exc)
            if translated is None:
                raise
            raise translated from exc

    @abstractmethod
    def _transaction_on(self, conn: Any) -> AbstractContextManager[Tx]:
        """A write transaction on the caller's own (autocommit) connection."""

    def _run_joined(self, op: Callable[[Tx], T], conn: Any) -> T:
        """``op`` in the transaction the caller holds open on ``conn``; not retried (the
        caller's own statements in it cannot be replayed)."""
        return self._once(op, self._joined(conn))

    def _once(self, op: Callable[[Tx], T], tx: Tx) -> T:
        try:
            return op(tx)
        except errors.PlunderError:
            raise
        except Exception as exc:
            translated = self._translate(exc)
            if translated is None:
                raise
            raise translated from exc

    # -- schema ---------------------------------------------------------------------------
    @property
    def latest_version(self) -> int:
        return len(queries.migrations(self.dialect))

    def migrate(self, *, fresh_schema: bool = True) -> int:
        """Bring the schema to the latest version. An empty database gets the fresh schema
        in one step (or, with ``fresh_schema=False``, every migration in turn). A schema
        that is current already is only read: no write lock (which a caller's own open
        write transaction may hold while it enqueues for the first time)."""
        if self._schema_version() == self.latest_version:
            return self.latest_version

        def create(tx: Tx) -> None:
            tx.all("schema_table_create")
            tx.all("schema_row_init")

        def apply(tx: Tx) -> int:
            row = tx.one("schema_version_lock")
            current = int(row["version"]) if row else 0
            latest = self.latest_version
            if current > latest:
                raise errors.SchemaError(self._too_new(current))
            if current == 0 and fresh_schema:
                scripts = [queries.schema(self.dialect)]
            else:
                scripts = [
                    sql for version, _, sql in queries.migrations(self.dialect) if version > current
                ]
            for script in scripts:
                for statement in queries.statements(script):
                    tx.script(statement)
            tx.all("schema_version_set", version=latest)
            return latest

        try:
            self._run(create)
        except errors.StoreError:
            # PostgreSQL's CREATE TABLE IF NOT EXISTS is not atomic: when migrators race, the
            # losers fail on the catalog (unique violation on pg_type, "type already
            # exists"). The winner's table exists by now, so once more is enough.
            self._run(create)
        return self._run(apply)

    def _schema_version(self) -> int | None:
        """The schema version the database records, read without the write lock."""

        def read(tx: Tx) -> int | None:
            exists = tx.one("schema_table_exists")
            if not exists or not exists["n"]:
                return None
            row = tx.one("schema_version_get")
            return int(row["version"]) if row else None

        return self._run(read, write=False)

    def schema_check(self) -> int:
        version = self._schema_version()
        latest = self.latest_version
        if not version:
            raise errors.SchemaError(
                f"{self.url} has no plunder schema; run `plunder init --db {self.url}`"
            )
        if version > latest:
            raise errors.SchemaError(self._too_new(version))
        if version < latest:
            raise errors.SchemaError(
                f"{self.url} has plunder schema version {version}, this plunder needs "
                f"{latest}; run `plunder init` to migrate"
            )
        return version

    def _too_new(self, version: int) -> str:
        return (
            f"{self.url} has plunder schema version {version}, newer than this plunder "
            f"understands ({self.latest_version}); upgrade plunder"
        )

    def now(self) -> datetime:
        row = self._run(lambda tx: tx.one("clock_now"), write=False)
        assert row is not None
        return self._time(row["now"])

    # -- rows to records ------------------------------------------------------------------
    def _opt_time(self, value: Any) -> datetime | None:
        return None if value is None else self._time(value)

    def _job(self, row: Row) -> JobRecord:
        names = list(row.keys())
        return self._jobs(names, [[row[name] for name in names]])[0]

    def _claimed(self, claimed: tuple[list[str], list[Sequence[Any]]]) -> list[JobRecord]:
        """Records of a claim's rows (its column names and rows), best first."""
        jobs = self._jobs(*claimed)
        jobs.sort(key=operator.attrgetter("run_at", "id"))  # by due time and id, then (a
        jobs.sort(key=operator.attrgetter("priority"), reverse=True)  # stable sort) level
        return jobs

    def _jobs(self, names: Sequence[str], rows: Sequence[Sequence[Any]]) -> list[JobRecord]:
        """Records of job rows given as tuples in the order of ``names``."""
        return columns.read_jobs(names, rows, self._time, self._list_out)

    def _run_record(self, row: Row) -> Run:
        return Run(
            job_id=int(row["job_id"]),
            attempt=int(row["attempt"]),
            session_id=row["session_id"],
            worker=row["worker"],
            host=row["host"],
            pid=int(row["pid"]),
            started_at=self._time(row["started_at"]),
            finished_at=self._opt_time(row["finished_at"]),
            outcome=Outcome(row["outcome"]) if row["outcome"] else None,
            error=payload.decode(row["error"]),
            logs=tuple(payload.decode(row["logs"]) or ()),
        )

    def _session(self, row: Row) -> Session:
        return Session(
            id=row["id"],
            name=row["name"],
            host=row["host"],
            pid=int(row["pid"]),
            queues=tuple(self._list_out(row["queues"])),
            expiry=float(row["expiry"]),
            started_at=self._time(row["started_at"]),
            heartbeat_at=self._time(row["heartbeat_at"]),
            expires_at=self._time(row["expires_at"]),
            tasks=tuple(self._list_out(row["tasks"])),
            free_slots=int(row["free_slots"]),
        )

    def _lease(self, row: Row) -> Lease:
        return Lease(
            name=row["name"],
            holder=row["holder"],
            term=int(row["term"]),
            acquired_at=self._time(row["acquired_at"]),
            expires_at=self._time(row["expires_at"]),
        )
