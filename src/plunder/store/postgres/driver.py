"""The PostgreSQL driver: for workers on many machines.

* psycopg 3 with a small connection pool; connections are in autocommit mode and every
  operation runs inside an explicit ``conn.transaction()`` block at READ COMMITTED, with
  row guards (``WHERE status = 'running' AND attempt = … AND session_id = …``) doing the
  fencing rather than an isolation level.
* Claims use ``FOR UPDATE SKIP LOCKED``; batches travel as arrays through ``unnest`` so a
  batch of any size is one statement.
* No session-level state is relied on — no advisory locks, no temporary tables, and server
  settings go in the ``options`` startup parameter or, where a pooler refuses it, inside
  each transaction — so the store keeps working behind pgbouncer in transaction mode, and
  the SQL stays close to what CockroachDB accepts. LISTEN is only an optimisation there:
  polling carries on alone.
* Statements are prepared on the server after a few runs (psycopg's automatic prepared
  statements: parsing and planning the claim cost more than running it). They are turned
  off behind a transaction pooler that refuses startup options, and for good as soon as a
  server says a prepared name is unknown or taken (a pooler that lends server connections
  without tracking them); the transaction that met it is retried.
* Serialization failures (40001), deadlocks (40P01) and lost connections retry the whole
  transaction after a fixed, jittered busy interval, up to a bounded total.
* With ``call_timeout``, a transaction that has no answer after that many seconds (by this
  process's clock) has its connection cut, and fails like a lost connection: a hung peer
  never answers and never resets, so nothing else would end the wait (see
  :mod:`plunder.store.deadlines`). A task's own ``transaction()`` has no deadline, but
  ``calls_cut()`` ends it like every other call in flight.
"""

from __future__ import annotations

import copy
import logging
import math
import os
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any

try:
    import psycopg
    from psycopg import errors as pg_errors
    from psycopg_pool import ConnectionPool, PoolTimeout
except ImportError as exc:  # pragma: no cover - depends on the installation
    raise ImportError(
        "PostgreSQL support needs psycopg 3 and psycopg_pool: pip install 'plunder[postgres]'"
    ) from exc

from plunder import errors
from plunder.model import SUSPECT_LOSSES
from plunder.store import queries
from plunder.store.deadlines import Deadlines
from plunder.store.driver import CLAIM_LEVELS, Claimed, Tx
from plunder.store.postgres import adapted
from plunder.store.postgres.connections import (
    UTC_NAMES,
    PgConnection,
    answer_lost,
    call_deadline,
    cancel_statement,
    connection_kwargs,
    first_line,
    pool_options,
    redact,
    refused_for_good,
    server_reason,
    server_settings,
    socket_of,
    spoken_to,
    startup_options,
)
from plunder.store.postgres.notifications import PgNotifications
from plunder.store.postgres.tx import PgTx

log = logging.getLogger("plunder.store")
RETRYABLE = (pg_errors.SerializationFailure, pg_errors.DeadlockDetected, pg_errors.LockNotAvailable)
# what a server says when a pooler mixed up psycopg's prepared statements between clients
PREPARED_MIXUP = (pg_errors.InvalidSqlStatementName, pg_errors.DuplicatePreparedStatement)
PREPARE_THRESHOLD = 5  # runs of a statement on one connection before psycopg prepares it
RECONNECT_WINDOW = 5.0  # seconds the pool retries a lost connection before starting over
REACH_INTERVAL = 1.0  # seconds between the tries to reach a server before the pool opens


class PgDriver:
    """A PostgreSQL server as plunder.store.driver.Driver: its pool of connections, the
    settings it takes, transactions, conversions, errors, and its one-statement claim."""

    dialect = "postgres"
    notifies = True
    insert_runs = 1  # each statement is a round trip: a batch is one whatever it mixes
    numbers_jobs = False  # the database numbers them
    caches_plans = True  # prepared statements keep their plans (see job_stats_refresh)
    vacuums = True  # dead row versions stay in the indexes until a VACUUM

    def __init__(
        self,
        url: str,
        *,
        pool_size: int = 4,
        connect_timeout: float = 10.0,
        application_name: str = "plunder",
        statement_timeout: float | None = None,
        tcp_user_timeout: float = 10.0,
        call_timeout: float | None = None,
        idle_timeout: float | None = None,
    ) -> None:
        self.retired = False
        self.queries = {
            name: queries.compact(sql) for name, sql in queries.load("postgres").items()
        }
        self.call_timeout = call_timeout
        self.idle_timeout = idle_timeout
        self.deadlines = Deadlines(socket_of, cancel_statement)
        self._statement_timeout = statement_timeout
        self._tcp_user_timeout = tcp_user_timeout
        self.url = redact(url)
        self._conninfo = url.replace("postgres://", "postgresql://", 1)
        self.pool_size = pool_size
        self._connect_timeout = connect_timeout
        self._application_name = application_name
        self._accepts_options: bool | None = None  # see _options_accepted
        self._utc = False  # the server's time zone is UTC under another name: see _pool_kwargs
        self._prepare = True  # see _prepare_threshold
        self._lock = threading.Lock()
        self._pool: ConnectionPool | None = None
        self._pid = os.getpid()
        self.owner: PgDriver | None = None  # a limited driver's: whose pool it uses
        self.limits: dict[str, int] = {}  # settings each transaction makes (see limited)
        self.label: str | None = None  # the application name its transactions go by

    def limited(
        self,
        *,
        call_timeout: float | None,
        idle_timeout: float | None,
        application_name: str | None = None,
    ) -> PgDriver:
        """A driver on this one's pool whose calls keep other deadlines: ``call_timeout``
        (cut by a deadlines watch of its own, which a lost session's cut leaves alone) and
        an idle limit made in each of its transactions, which go by ``application_name``.
        Closing it closes nothing."""
        view = copy.copy(self)
        view.owner = self
        view.call_timeout = call_timeout
        view.idle_timeout = idle_timeout
        view.deadlines = Deadlines(socket_of, cancel_statement)
        view.limits = server_settings(self._statement_timeout, idle_timeout)
        view.label = application_name
        return view

    def pool(self) -> ConnectionPool:
        if self.owner is not None:
            self._refuse_if_retired()
            return self.owner.pool()
        with self._lock:
            if self._pool is None or self._pid != os.getpid():
                self._refuse_if_retired()
                if self._accepts_options is None:
                    self._reach()
                # a pool inherited across fork shares sockets with the parent: start afresh
                self._pid = os.getpid()
                self._pool = ConnectionPool(
                    self._conninfo,
                    min_size=1,
                    max_size=self.pool_size,
                    open=True,
                    timeout=self._connect_timeout,
                    # psycopg_pool retries a lost connection with a delay that doubles for
                    # as long as this (default 5 min), so after an outage of a minute the
                    # next try could be half a minute away. Give up after a few seconds
                    # instead: the next call that needs a connection starts a fresh try at
                    # once, so tries stay a couple of seconds apart however long it lasts.
                    reconnect_timeout=RECONNECT_WINDOW,
                    connection_class=PgConnection,
                    configure=self._configure,
                    name="plunder",
                    kwargs=self._pool_kwargs(),
                )
            return self._pool

    def _connection_kwargs(self) -> dict[str, Any]:
        return connection_kwargs(
            self._application_name, self._connect_timeout, self._tcp_user_timeout
        )

    def notifications(
        self, *, listen: bool, application_name: str, statement_timeout: float | None = None
    ) -> PgNotifications:
        """A dedicated connection for wake-ups (and the owner's heartbeats)."""
        kwargs = {**self._connection_kwargs(), "application_name": application_name}
        settings = self._settings(statement_timeout)
        if settings and self._options_accepted():
            kwargs["options"] = startup_options(settings)
        return PgNotifications(
            self._conninfo,
            kwargs,
            listen=listen,
            deadlines=self.deadlines,
            url=self.url,
            queries=self.queries,
            per_transaction=None if "options" in kwargs else settings or None,
        )

    def _settings(self, statement_timeout: float | None) -> dict[str, int]:
        return server_settings(statement_timeout, self.idle_timeout)

    def _options_accepted(self) -> bool:
        """Whether the server takes settings in the ``options`` startup parameter (sent once
        per connection, so they cost nothing per transaction). A transaction pooler refuses
        it ("unsupported startup parameter: options", pgbouncer); then the settings are made
        inside each transaction instead (see ``PgConnection``). Asked once, by connecting."""
        if self._accepts_options is None:
            try:
                self._probe(self._connect_timeout)
            except psycopg.OperationalError as exc:
                if refused_for_good(exc):
                    raise errors.StoreRefused(f"{self.url}: {server_reason(exc)}") from exc
                return True  # not an answer (the database is down?): ask again later
        return self._accepts_options is not False

    def _probe(self, timeout: float) -> None:
        """Connect once, directly, to learn whether the server takes startup options and
        whether its time zone is UTC; a failure to connect is the driver's error."""
        kwargs = {
            **self._connection_kwargs(),
            "options": "-c statement_timeout=0",
            "connect_timeout": max(1, math.ceil(timeout)),
        }
        try:
            with psycopg.connect(self._conninfo, **kwargs) as probe:
                self._utc = probe.info.parameter_status("TimeZone") in UTC_NAMES
                self._accepts_options = True
        except psycopg.OperationalError as exc:
            if "unsupported startup parameter" not in str(exc):
                raise
            log.info("%s refuses startup options; settings go in each transaction", self.url)
            self._accepts_options = False

    def _reach(self) -> None:
        """Connect directly before the pool opens: a refusal that trying again cannot change
        (authentication, no such database or role) raises StoreRefused at once, with the
        server's reason; any other failure is tried again every REACH_INTERVAL, one log
        line per attempt, for ``connect_timeout`` seconds in all, then StoreUnavailable.
        (A pool opened on such a server would try in the background, warn at every try,
        and end in a timeout that hides the reason.)"""
        deadline = time.monotonic() + self._connect_timeout
        while True:
            left = deadline - time.monotonic()
            try:
                self._probe(left)
                return
            except psycopg.OperationalError as exc:
                if refused_for_good(exc):
                    raise errors.StoreRefused(f"{self.url}: {server_reason(exc)}") from exc
                reason = first_line(exc)
                if deadline - time.monotonic() <= REACH_INTERVAL:
                    raise errors.StoreUnavailable(
                        f"cannot connect to {self.url}: {reason}"
                    ) from exc
                log.warning("cannot connect to %s (%s); trying again", self.url, reason)
            time.sleep(REACH_INTERVAL)

    def _configure(self, conn: psycopg.Connection[Any]) -> None:
        """Each new pooled connection: the settings its transactions must make, if the
        server did not take them at startup."""
        if isinstance(conn, PgConnection):
            settings = self._settings(self._statement_timeout)
            conn.per_transaction = None if self._options_accepted() else settings or None

    def _prepare_threshold(self) -> int | None:
        """psycopg prepares a statement on the server after a few runs, under a name of its
        own, for the life of the connection. Behind a transaction pooler the next
        transaction may land on another server connection, where that name is unknown or
        taken ("prepared statement _pg3_0 does not exist"), unless the pooler tracks them
        (pgbouncer 1.21 and later, with ``max_prepared_statements``). So: prepare on a
        server that takes startup options (a pooler in transaction mode refuses them), and
        never again once a server named such a mix-up (see ``translate``)."""
        if self._prepare and self._options_accepted():
            return PREPARE_THRESHOLD
        return None

    def _pool_kwargs(self) -> dict[str, Any]:
        kwargs = self._connection_kwargs()
        if not self._options_accepted():
            return kwargs  # each transaction makes its settings (see settings_set)
        kwargs["options"] = pool_options(
            self._settings(self._statement_timeout),
            generic_plans=self._prepare_threshold() is not None,
            utc=self._utc,
        )
        return kwargs

    def _limit(self, tx: PgTx, conn: Any) -> None:
        """Make this transaction's settings, where the server refused them at startup or
        this driver limits its calls otherwise (see limited)."""
        refused = conn.per_transaction if isinstance(conn, PgConnection) else None
        settings = {**(refused or {}), **self.limits}
        if settings or self.label:
            tx.one(
                "settings_set",
                statement_timeout=str(settings.get("statement_timeout", 0)),
                idle_timeout=str(settings.get("idle_in_transaction_session_timeout", 0)),
                application_name=self.label,
            )

    @contextmanager
    def transaction(self, *, write: bool, single: bool = False) -> Iterator[PgTx]:
        # the deadline covers COMMIT, and ends before the connection goes back to the pool
        with (
            self.pool().connection() as conn,
            call_deadline(self.deadlines, conn, self.call_timeout, self.url),
        ):
            conn.prepare_threshold = self._prepare_threshold()
            tx = PgTx(conn, self.queries)
            refused = isinstance(conn, PgConnection) and conn.per_transaction
            if not (single and conn.autocommit) or refused or self.owner or spoken_to(conn):
                with conn.transaction():
                    self._limit(tx, conn)
                    yield tx
                return
            # One write statement is a transaction of its own (the pool's connections are in
            # autocommit mode), without the round trips of BEGIN and COMMIT: an idle
            # worker's claim and a single enqueue, whose time is the latency users see.
            # (Not behind a pooler that refused our settings: those are made per
            # transaction.)
            tx.statement_commits = True
            yield tx

    def statement_alone(self, name: str) -> None:
        try:
            with (
                self.pool().connection() as conn,
                call_deadline(self.deadlines, conn, None, self.url),
            ):
                conn.execute(self.queries[name], prepare=False)  # VACUUM cannot be prepared
        except Exception as exc:
            translated = self.translate(exc)
            if translated is None:
                raise
            raise translated from exc

    @contextmanager
    def task_transaction(self) -> Iterator[PgTx]:
        """A task's own write transaction: no deadline (its statements may take as long as
        they need), but ``calls_cut()`` ends it."""
        with (
            self.pool().connection() as conn,
            call_deadline(self.deadlines, conn, None, self.url),
            conn.transaction(),
        ):
            # the user's statements are planned for their values, as on any connection
            conn.prepare_threshold = None
            tx = PgTx(conn, self.queries)
            self._limit(tx, conn)
            yield tx

    def calls_cut(self, reason: str, *, final: bool = False) -> int:
        """Cut every call in flight on this store's connections (each fails with StoreBusy;
        with ``final``, StoreUnavailable, never tried again); how many. For a worker that
        stopped trusting its session, or halts: the database would refuse what it waits for,
        and a call stuck on a hung peer would hold its thread and connection for good. Not
        ``final``, the idle connections in the pool are closed too (new ones are opened):
        they lead to the same peer, and the next call on one that hangs would wait."""
        cut = self.deadlines.cut_all(reason, final=final)
        with self._lock:
            pool = self._pool if self._pid == os.getpid() and not final else None
        drain = getattr(pool, "drain", None)  # psycopg_pool 3.3 and later
        if drain is not None:
            drain()
        return cut

    @contextmanager
    def transaction_on(self, conn: Any) -> Iterator[PgTx]:
        tx = self._caller_tx(conn)
        try:
            with conn.transaction():
                self._limit(tx, conn)
                yield tx
        except psycopg.Error as exc:  # cut by the owner's deadline (connection_for)?
            reason = self.deadlines.reason_of(conn)
            if reason is None:
                raise
            raise errors.StoreBusy(f"{self.url}: {reason}; the connection was cut") from exc

    @contextmanager
    def joined(self, conn: Any) -> Iterator[PgTx]:
        yield self._caller_tx(conn)

    def _caller_tx(self, conn: Any) -> PgTx:
        if adapted.is_adapted(conn):  # an async SQLAlchemy connection's, in its run_sync
            return adapted.AdaptedPgTx(conn, self.queries)
        if not isinstance(conn, psycopg.Connection):
            raise TypeError(f"conn must be a psycopg.Connection, not {type(conn).__name__}")
        return PgTx(conn, self.queries)

    def translate(self, exc: Exception) -> Exception | None:
        if isinstance(exc, PoolTimeout):
            return errors.StoreUnavailable(f"cannot connect to {self.url}: {exc}")
        if not isinstance(exc, psycopg.Error):
            return None
        message = f"{self.url}: {str(exc).strip()}"
        if isinstance(exc, pg_errors.DiskFull):
            return errors.StoreFull(message)
        if isinstance(exc, pg_errors.UndefinedTable) and "plunder_" in str(exc):
            return errors.SchemaError(f"{self.url} has no plunder schema; run `plunder init`")
        if isinstance(exc, RETRYABLE):
            return errors.StoreBusy(message)
        if isinstance(exc, PREPARED_MIXUP) and self._prepare:
            log.warning(
                "%s mixed up prepared statements (a transaction pooler?): no longer preparing them",
                self.url,
            )
            self._prepare = False
            return errors.StoreBusy(message)  # the transaction is retried, unprepared
        if isinstance(exc, psycopg.OperationalError):
            # a lost or refused connection: retried on a fresh connection from the pool
            return errors.StoreBusy(message)
        return errors.StoreError(message)

    def commit_lost(self, exc: BaseException | None) -> bool:
        return answer_lost(exc)

    def pipe_connection(self) -> psycopg.Connection[Any] | None:
        """A pooled connection for a TurnPipe to hold; None (given back) behind a
        transaction pooler, where each transaction must first make plunder's settings."""
        try:
            conn = self.pool().getconn()
        except PoolTimeout as exc:
            raise errors.StoreUnavailable(f"cannot connect to {self.url}: {exc}") from exc
        if (isinstance(conn, PgConnection) and conn.per_transaction) or not conn.autocommit:
            self.pool().putconn(conn)
            return None
        conn.prepare_threshold = self._prepare_threshold()
        return conn

    def give_back(self, conn: psycopg.Connection[Any]) -> None:
        """Return a connection ``pipe_connection`` lent to the pool."""
        self.pool().putconn(conn)

    def claim_rows(
        self,
        tx: Tx,
        session_id: str,
        *,
        queues: list[str],
        tasks: list[str],
        limit: int,
        take_suspect: bool,
        clock: Any,
    ) -> Claimed:
        """One statement: PostgreSQL walks each queue and priority level inside it."""
        return tx.table(
            "job_claim_many",
            session_id=session_id,
            queues=self.list_in(queues),
            tasks=self.list_in(tasks),
            limit=limit,
            take_suspect=take_suspect,
            suspect_losses=SUSPECT_LOSSES,
            levels=CLAIM_LEVELS,
            now=clock,
        )

    def next_due(self, tx: Tx, queues: list[str], tasks: list[str], clock: Any) -> float | None:
        """One statement, which walks each queue and priority level inside it."""
        row = tx.one("job_next_due", queues=queues, tasks=tasks, levels=CLAIM_LEVELS, now=clock)
        return None if row is None or row["due_in"] is None else float(row["due_in"])

    def time(self, value: Any) -> datetime:
        if not isinstance(value, datetime):
            raise errors.StoreError(f"expected a timestamp from the database, got {value!r}")
        return value.astimezone(UTC)

    def list_in(self, values: Sequence[Any]) -> list[Any]:
        return list(values)

    def list_out(self, value: Any) -> list[str]:
        return list(value or [])

    @contextmanager
    def migrating(self) -> Iterator[None]:
        yield  # nothing to set around a migration

    def _refuse_if_retired(self) -> None:
        if self.retired:
            raise errors.StoreUnavailable(f"{self.url}: this store was closed for good")

    def retire(self) -> None:
        self.retired = True
        self.close()

    def close(self) -> None:
        if self.owner is not None:  # the pool is its owner's
            return
        with self._lock:
            pool, self._pool = self._pool, None
        if pool is not None and self._pid == os.getpid():
            pool.close()
