"""The engine under every SQL store: the transaction runner, schema migrations,
notifications and the mapping of rows to records, over the driver it holds.

A driver (plunder.store.driver.Driver, one per database package) supplies connections, a
transaction, the value conversions its database needs and the classification of its
errors; everything else — validation, the order of statements inside each transaction,
fencing, matching batch rows to their inputs — lives in the shared operation groups (acks,
claims, enqueue, maintenance, reads, sessions), each holding this engine, so both backends
behave the same by construction.

Inside one operation::

    run(op) ── begin ──▶ op(tx): tx.one / tx.all / tx.batch("query_name", ...) ── commit
       ▲                                    │
       └── busy? sleep a fixed, jittered interval, run op again (bounded total) ◀┘
"""

from __future__ import annotations

import operator
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from datetime import datetime
from typing import Any, NoReturn, TypeVar

from plunder import errors, payload, policy
from plunder.model import (
    ErrorInfo,
    JobRecord,
    Lease,
    Run,
    Session,
)
from plunder.protocol import MAX_CLAIM
from plunder.states import TERMINAL, Outcome, Status
from plunder.store import columns, queries
from plunder.store.driver import Claimed, Driver, Now, Row, Tx

T = TypeVar("T")

MAX_BATCH = MAX_CLAIM  # claims and acknowledgements per call (plunder.protocol)
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


def insert_mismatch(tx: Tx, what: str) -> NoReturn:
    """The rows an insert returned do not match its inputs (a trigger of the user's on
    plunder_jobs, say). In a transaction nothing is stored; a statement that committed on
    its own has stored them, and running it again would store them twice."""
    if tx.statement_commits:
        raise errors.OutcomeUnknown(f"{what}; the insert committed, so do not repeat it")
    raise errors.StoreError(what)


class EffectsFailed(Exception):
    """Carries an exception raised by a task's own writes out of the transaction."""

    def __init__(self, original: BaseException) -> None:
        super().__init__(str(original))
        self.original = original


class Engine:
    """What every SQL store operation stands on: the dialect's driver (held, not
    subclassed), the transaction runner, the schema, notifications and records."""

    def __init__(
        self,
        driver: Driver,
        *,
        busy_total: float = policy.BUSY_TOTAL,
        busy_interval: float = policy.BUSY_INTERVAL,
    ) -> None:
        self.driver = driver
        self.url = driver.url
        self.busy_total = busy_total
        self.busy_interval = busy_interval
        self.time = driver.time
        self.list_in = driver.list_in
        self.list_out = driver.list_out

    # -- notifications --------------------------------------------------------------------
    def notify(self, tx: Tx, channel: str, items: Sequence[str]) -> None:
        """Queue a notification that is delivered when ``tx`` commits: the payload is a
        comma-separated list (queue names and job ids contain no commas), chunked below the
        8000-byte limit. A no-op for databases without NOTIFY."""
        if not self.driver.notifies or not items:
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

    def announce(self, tx: Tx, rows: Sequence[Row]) -> None:
        """Tell listeners about jobs that changed state: pending again wakes the workers of
        its queue, a terminal state wakes whoever waits for its result."""
        pending = [str(r["queue"]) for r in rows if r["status"] == Status.PENDING]
        finished = [str(r["id"]) for r in rows if r["status"] in TERMINAL]
        self.notify(tx, CHANNEL_ENQUEUED, pending)
        self.notify(tx, CHANNEL_DONE, finished)

    def job_next_due(
        self, *, queues: Sequence[str], tasks: Sequence[str], now: Now = None
    ) -> float | None:
        """Seconds until the earliest pending job for these queues and tasks is due, by the
        database clock (zero or less: due now; None: no such job)."""
        if not queues or not tasks:
            return None
        for queue in queues:
            payload.check_stored_queue(queue)
        unique = list(dict.fromkeys(queues))
        return self.run(
            lambda tx: self.driver.next_due(tx, unique, list(tasks), tx.clock(now)), write=False
        )

    # -- the transaction runner -----------------------------------------------------------
    def run(
        self,
        op: Callable[[Tx], T],
        *,
        write: bool = True,
        conn: Any = None,
        repeatable: bool = True,
        single: bool = False,
    ) -> T:
        """Run ``op`` in a transaction, retried whole while the database is busy.
        ``single``: see ``Driver.transaction``.

        ``repeatable=False``: running ``op`` twice would write twice (an enqueue without
        keys). A connection lost while committing (or, for a statement that commits on
        its own, while it ran) leaves the outcome unknown, and then this raises
        OutcomeUnknown instead of running it again."""
        if conn is not None:
            return self.run_joined(op, conn)
        # made at the first busy answer (its budget starts there anyway): it seeds a random
        # generator from the OS, which costs more than the rest of a short transaction
        backoff: policy.BusyBackoff | None = None
        while True:
            committing = False
            try:
                with self.driver.transaction(write=write, single=single) as tx:
                    committing = tx.statement_commits
                    result = op(tx)
                    committing = True
                return result
            except (errors.PlunderError, EffectsFailed) as exc:
                if not isinstance(exc, errors.StoreBusy):
                    raise
                # raised by the driver itself (SQLite BUSY while opening a connection) or by
                # op: retried like a busy error from the database
                busy, cause = exc, exc.__cause__
            except Exception as exc:
                busy, cause = self._busy(exc), exc
            if committing and not repeatable and self.driver.commit_lost(cause):
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
        translated = self.driver.translate(exc)
        if translated is None:
            raise exc
        if not isinstance(translated, errors.StoreBusy):
            raise translated from exc
        return translated

    def run_on(self, op: Callable[[Tx], T], conn: Any) -> T:
        """One transaction on a connection the caller owns (the hub's), not retried: the
        clock is read after the write lock is taken, so a heartbeat that waited for the lock
        cannot judge its session alive by a stale time."""
        return self._once(op, self.driver.transaction_on(conn))

    def run_joined(self, op: Callable[[Tx], T], conn: Any) -> T:
        """``op`` in the transaction the caller holds open on ``conn``; not retried (the
        caller's own statements in it cannot be replayed)."""
        return self._once(op, self.driver.joined(conn))

    def _once(self, op: Callable[[Tx], T], transaction: AbstractContextManager[Tx]) -> T:
        """``op`` in ``transaction``, once, its driver errors made plunder's."""
        try:
            with transaction as tx:
                return op(tx)
        except errors.PlunderError:
            raise
        except Exception as exc:
            translated = self.driver.translate(exc)
            if translated is None:
                raise
            raise translated from exc

    @contextmanager
    def transaction(self) -> Iterator[Any]:
        """A write transaction on one of the store's connections, committed when the block
        ends without an exception. For a task's own writes (see ``Context.transaction``);
        not retried, because the block's code cannot be replayed.

        An exception from the block passes through unchanged. A failure to begin or to
        commit is a plunder error like any other store call's: a serialization failure
        raised at COMMIT (CockroachDB does this; so does a deferred constraint) or a lost
        connection is :class:`StoreBusy`, which the caller may answer by running the
        whole block again."""
        from_block = False
        try:
            with self.driver.task_transaction() as tx:
                try:
                    yield tx.conn
                except BaseException:
                    from_block = True
                    raise
        except Exception as exc:
            if from_block or isinstance(exc, errors.PlunderError):
                raise
            translated = self.driver.translate(exc)
            if translated is None:
                raise
            raise translated from exc

    def retire(self) -> None:
        self.driver.retire()

    # -- schema ---------------------------------------------------------------------------
    @property
    def latest_version(self) -> int:
        return len(queries.migrations(self.driver.dialect))

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
                scripts = [queries.schema(self.driver.dialect)]
            else:
                scripts = [
                    sql
                    for version, _, sql in queries.migrations(self.driver.dialect)
                    if version > current
                ]
            for script in scripts:
                for statement in queries.statements(script):
                    tx.script(statement)
            tx.all("schema_version_set", version=latest)
            return latest

        with self.driver.migrating():
            try:
                self.run(create)
            except errors.StoreError:
                # PostgreSQL's CREATE TABLE IF NOT EXISTS is not atomic: when migrators race,
                # the losers fail on the catalog (unique violation on pg_type, "type already
                # exists"). The winner's table exists by now, so once more is enough.
                self.run(create)
            return self.run(apply)

    def _schema_version(self) -> int | None:
        """The schema version the database records, read without the write lock."""

        def read(tx: Tx) -> int | None:
            exists = tx.one("schema_table_exists")
            if not exists or not exists["n"]:
                return None
            row = tx.one("schema_version_get")
            return int(row["version"]) if row else None

        return self.run(read, write=False)

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
        row = self.run(lambda tx: tx.one("clock_now"), write=False)
        assert row is not None
        return self.time(row["now"])

    # -- rows to records ------------------------------------------------------------------
    def opt_time(self, value: Any) -> datetime | None:
        return None if value is None else self.time(value)

    def job(self, row: Row) -> JobRecord:
        names = list(row.keys())
        return self.jobs(names, [[row[name] for name in names]])[0]

    def claimed(self, claimed: Claimed) -> list[JobRecord]:
        """Records of a claim's rows (its column names and rows), best first."""
        jobs = self.jobs(*claimed)
        jobs.sort(key=operator.attrgetter("run_at", "id"))  # by due time and id, then (a
        jobs.sort(key=operator.attrgetter("priority"), reverse=True)  # stable sort) level
        return jobs

    def jobs(self, names: Sequence[str], rows: Sequence[Sequence[Any]]) -> list[JobRecord]:
        """Records of job rows given as tuples in the order of ``names``."""
        return columns.read_jobs(names, rows, self.time, self.list_out)

    def run_record(self, row: Row) -> Run:
        return Run(
            job_id=int(row["job_id"]),
            attempt=int(row["attempt"]),
            session_id=row["session_id"],
            worker=row["worker"],
            host=row["host"],
            pid=int(row["pid"]),
            started_at=self.time(row["started_at"]),
            finished_at=self.opt_time(row["finished_at"]),
            outcome=Outcome(row["outcome"]) if row["outcome"] else None,
            error=payload.decode(row["error"]),
            logs=tuple(payload.decode(row["logs"]) or ()),
        )

    def session(self, row: Row) -> Session:
        return Session(
            id=row["id"],
            name=row["name"],
            host=row["host"],
            pid=int(row["pid"]),
            queues=tuple(self.list_out(row["queues"])),
            expiry=float(row["expiry"]),
            started_at=self.time(row["started_at"]),
            heartbeat_at=self.time(row["heartbeat_at"]),
            expires_at=self.time(row["expires_at"]),
            tasks=tuple(self.list_out(row["tasks"])),
            free_slots=int(row["free_slots"]),
            key_id=row["key_id"],
            labels=tuple(self.list_out(row["labels"])),
        )

    def lease(self, row: Row) -> Lease:
        return Lease(
            name=row["name"],
            holder=row["holder"],
            term=int(row["term"]),
            acquired_at=self.time(row["acquired_at"]),
            expires_at=self.time(row["expires_at"]),
        )
