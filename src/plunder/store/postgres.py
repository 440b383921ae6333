"""The PostgreSQL store: for workers on many machines.

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

import logging
import os
import secrets
import select
import socket
import threading
import time
from collections.abc import Collection, Iterator, Sequence
from contextlib import contextmanager, suppress
from datetime import UTC, datetime
from typing import Any
from urllib.parse import urlsplit, urlunsplit

try:
    import psycopg
    from psycopg import errors as pg_errors
    from psycopg_pool import ConnectionPool, PoolTimeout
except ImportError as exc:  # pragma: no cover - depends on the installation
    raise ImportError(
        "PostgreSQL support needs psycopg 3 and psycopg_pool: pip install 'plunder[postgres]'"
    ) from exc

from plunder import errors
from plunder.model import SUSPECT_LOSSES, AckResult, Completion, Exchange
from plunder.store import pgturn, queries
from plunder.store.deadlines import Deadlines
from plunder.store.engine import Tx
from plunder.store.pgtx import PgTx
from plunder.store.sqlbase import CLAIM_LEVELS, Claimed, SQLStore

log = logging.getLogger("plunder.store")
RETRYABLE = (pg_errors.SerializationFailure, pg_errors.DeadlockDetected, pg_errors.LockNotAvailable)
# what a server says when a pooler mixed up psycopg's prepared statements between clients
PREPARED_MIXUP = (pg_errors.InvalidSqlStatementName, pg_errors.DuplicatePreparedStatement)
PREPARE_THRESHOLD = 5  # runs of a statement on one connection before psycopg prepares it


def _socket(conn: psycopg.Connection[Any]) -> int:
    return int(conn.pgconn.socket)  # OperationalError once the connection is closed


@contextmanager
def _deadline(
    deadlines: Deadlines, conn: psycopg.Connection[Any], timeout: float | None, url: str
) -> Iterator[None]:
    """Run the block as one call on ``conn`` that is cut after ``timeout`` seconds (never,
    for None: only ``cut_all``); a cut call raises StoreBusy, which is retried on a fresh
    connection like any lost connection."""
    with deadlines.watch(conn, timeout) as call:
        try:
            yield
        except (psycopg.Error, errors.StoreBusy) as exc:
            if call.reason is None:
                raise
            raise errors.StoreBusy(f"{url}: {call.reason}; the connection was cut") from exc


def _first_line(exc: BaseException) -> str:
    """libpq's messages go on with hints on further lines; a log line needs the first."""
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def redact(url: str) -> str:
    """The URL without its password, for messages and ``store.url``."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.replace(f":{parts.password}@", ":***@", 1)
    return urlunsplit(parts._replace(netloc=netloc))


def _spoken_to(conn: psycopg.Connection[Any]) -> bool:
    """Whether the server sent something to this idle pooled connection. Most often it
    closed it (a restart, ``idle_session_timeout``): a statement that commits on its own
    would then fail, and for an enqueue nobody could tell whether before or after it
    committed. In a transaction BEGIN fails first instead, surely before anything was
    written, and the store retries on a fresh connection. (Anything else the server says
    unasked, a changed setting say, only costs this call the two round trips.) poll, not
    select: a process with many files open has descriptors past select's limit."""
    try:
        descriptor = conn.fileno()
    except psycopg.Error:  # lost already
        return True
    poller = select.poll()
    poller.register(descriptor, select.POLLIN)
    return bool(poller.poll(0))


# PostgreSQL's names for UTC (its tz database's aliases; GMT is left out: a format's TZ
# field would print it differently)
UTC_NAMES = frozenset(
    ("UTC", "Etc/UTC", "UCT", "Etc/UCT", "Universal", "Etc/Universal", "Zulu", "Etc/Zulu")
)
RECONNECT_WINDOW = 5.0  # seconds the pool retries a lost connection before starting over
CHANNELS = ("plunder_enqueued", "plunder_done", "plunder_stream")  # fixed names, never input
PROBE_CHANNEL = "plunder_probe"


class _Connection(psycopg.Connection[Any]):
    """A connection that knows the settings its transactions must make themselves.

    plunder's server settings (statement and idle-in-transaction timeouts) normally travel
    in the ``options`` startup parameter, once per connection. A transaction pooler refuses
    that parameter ("unsupported startup parameter: options", pgbouncer), and a
    session-level SET would stay on a server connection the pooler then lends to another
    client; there, each transaction makes them with ``set_config(name, value, true)`` (the
    form of SET LOCAL), which ends with the transaction. Milliseconds by name, or None."""

    per_transaction: dict[str, int] | None = None


def _options(settings: dict[str, int]) -> str:
    return " ".join(f"-c {name}={value}" for name, value in settings.items())


class PgNotifications:
    """One dedicated connection: LISTENs on the channels its owner asks for, and lends
    itself to the owner's light periodic calls (heartbeats) between waits.

    Notifications are lost while the connection is down, so after every reconnect it
    LISTENs first and then reports ``("*", "")``: "re-check everything once". A channel
    listened on anew reports ``(channel, "*")``: whatever it said before is lost, so
    everyone watching it re-checks once.

    The channels are the owner's to choose because every notification costs each listener:
    each worker's turn names the jobs it completed on ``plunder_done``, and a process that
    listened there whether or not it waited for a result would receive (and its server
    backend would send) the turns of every worker of the cluster.

    Before LISTENing it checks that notifications reach this connection at all: a probe
    NOTIFY is sent from a second, short-lived connection, and the waits that follow look
    for it (a wait never lasts longer than asked, so the owner's heartbeats are not held
    up). Behind a transaction pooler (pgbouncer) it never comes back: between
    transactions this client holds no server connection, and a LISTEN would stay behind
    on a server connection that the pooler lends to other clients, who would then receive
    our notifications (psycopg keeps them, unread, for as long as the connection lives).
    A probe sent from this same connection would come back whenever the pooler happened
    to reuse that server connection. When the probe does not come back within
    ``PROBE_TIMEOUT`` (or the database refuses LISTEN, as CockroachDB does), it stops
    listening and says so; polling carries on alone.
    """

    PROBE_TIMEOUT = 1.0

    def __init__(
        self,
        conninfo: str,
        kwargs: dict[str, Any],
        *,
        listen: bool,
        deadlines: Deadlines,
        url: str,
        per_transaction: dict[str, int] | None = None,
    ) -> None:
        self._conninfo = conninfo
        self._kwargs = kwargs
        self.listen = listen
        self._per_transaction = per_transaction
        self._conn: _Connection | None = None
        self._fresh = False
        self._deadlines = deadlines
        self._url = url
        self._down_since: float | None = None  # when reconnecting began to fail
        self._probe: tuple[str, float] | None = None  # token, deadline (monotonic)
        self._listening: frozenset[str] = frozenset()  # LISTENed on this connection
        # interrupt() ends a wait from another thread: one byte on a socket it watches
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self._closed = False

    @contextmanager
    def connection_for(self, timeout: float | None) -> Iterator[psycopg.Connection[Any]]:
        """The connection, for one call that must end within ``timeout`` seconds: past
        that it is cut (the call raises StoreBusy) and the next use reconnects."""
        conn = self.connection
        with _deadline(self._deadlines, conn, timeout, self._url):
            yield conn

    @property
    def connection(self) -> psycopg.Connection[Any]:
        """The connection, reconnected (and re-LISTENed) if it was lost."""
        if self._closed:
            raise errors.StoreBusy("the listening connection was closed")
        if self._conn is None or self._conn.closed or self._conn.broken:
            self._connect()
        assert self._conn is not None
        return self._conn

    def _connect(self) -> None:
        self._disconnect()
        try:
            conn = _Connection.connect(self._conninfo, **self._kwargs)
        except psycopg.Error as exc:
            reason = _first_line(exc)
            # tried again at every wait and every heartbeat, so said once per outage: a
            # database that is down for a minute must not fill the log
            if self._down_since is None:
                self._down_since = time.monotonic()
                log.warning(
                    "cannot open the listening connection (%s); trying again until it works",
                    reason,
                )
            raise errors.StoreBusy(f"cannot open the listening connection: {reason}") from exc
        if self._down_since is not None:
            log.info(
                "listening connection open again after %.1fs",
                time.monotonic() - self._down_since,
            )
            self._down_since = None
        conn.per_transaction = self._per_transaction
        self._conn = conn
        if not self.listen:
            self._fresh = True
            return
        try:  # a peer that hangs right after connecting must not hang us here
            with _deadline(self._deadlines, conn, self._kwargs["connect_timeout"], self._url):
                conn.execute(f"LISTEN {PROBE_CHANNEL}")
        except psycopg.Error as exc:
            if conn.broken:
                self._disconnect()
                raise errors.StoreBusy(f"lost the listening connection: {exc}") from exc
            self._stop_listening()  # the database refuses LISTEN itself
            return
        except errors.StoreBusy:
            self._disconnect()
            raise
        token = secrets.token_hex(8)
        try:
            # a name of its own: it lives for a moment, beside the connection it probes
            name = f"{self._kwargs.get('application_name', 'plunder')}:probe"[:63]
            with psycopg.connect(
                self._conninfo, **{**self._kwargs, "application_name": name}
            ) as other:
                other.execute("SELECT pg_notify(%s, %s)", (PROBE_CHANNEL, token))
        except psycopg.Error as exc:  # tried again on the next reconnect
            self._disconnect()
            raise errors.StoreBusy(f"cannot probe LISTEN/NOTIFY: {exc}") from exc
        self._probe = (token, time.monotonic() + self.PROBE_TIMEOUT)

    def _await_probe(
        self, conn: psycopg.Connection[Any], timeout: float, channels: frozenset[str]
    ) -> None:
        """Wait up to ``timeout`` for the probe (an interrupt ends the wait, and the next
        one waits on): once it came back, LISTEN on ``channels``; once its time is up, poll
        only."""
        assert self._probe is not None
        token, deadline = self._probe
        self._sleep(min(timeout, deadline - time.monotonic()), conn)
        if any(n.channel == PROBE_CHANNEL and n.payload == token for n in self._notified(conn)):
            self._probe = None
            conn.execute(f"UNLISTEN {PROBE_CHANNEL}")
            self._relisten(conn, channels)
            self._fresh = True
        elif time.monotonic() >= deadline:
            self._probe = None
            conn.execute(f"UNLISTEN {PROBE_CHANNEL}")
            self._stop_listening()

    def _stop_listening(self) -> None:
        log.warning(
            "LISTEN/NOTIFY does not come back on this connection (a transaction-mode "
            "pooler?); falling back to polling only"
        )
        self.listen = False
        self._fresh = True

    def wait(
        self, timeout: float, channels: Collection[str] | None = None
    ) -> list[tuple[str, str]]:
        """Wait up to ``timeout`` seconds (less if interrupted), LISTENing on ``channels``
        (None: all of plunder's); return the notifications that arrived."""
        wanted = frozenset(CHANNELS if channels is None else channels)
        if not wanted <= set(CHANNELS):
            raise ValueError(f"not plunder's channels: {sorted(wanted - set(CHANNELS))}")
        if self._closed:  # an owner's thread that outlived close(): no new connection
            return []
        try:
            return self._wait(timeout, wanted)
        except psycopg.Error as exc:
            log.warning("listening connection lost (%s); reconnecting", str(exc).strip())
            self._disconnect()
            self._sleep(min(timeout, 0.5))
            return []
        except errors.StoreBusy as exc:  # _connect said so, once per outage
            log.debug("%s", exc)
            self._sleep(min(timeout, 0.5))
            return []

    def _wait(self, timeout: float, wanted: frozenset[str]) -> list[tuple[str, str]]:
        conn = self.connection
        if self._probe is not None:
            self._await_probe(conn, timeout, wanted)
        if self._fresh:
            self._fresh = False
            return [("*", "")]
        if self._probe is not None:
            return []
        if not self.listen:
            self._sleep(timeout)
            return []
        added = self._relisten(conn, wanted)
        if added:
            return [(channel, "*") for channel in added]
        got = self._arrived(conn)  # including any that came during a periodic call
        if not got and timeout > 0 and self._sleep(timeout, conn):
            got = self._arrived(conn)
        return got

    def interrupt(self) -> None:
        """End the wait in progress, or the next one, now (from any thread)."""
        if self._closed:
            return
        # BlockingIOError: a full socket holds wake-ups enough, the next wait ends at once;
        # OSError: closed meanwhile, and nothing waits any more
        with suppress(OSError):
            self._wake_w.send(b"\0")

    def _relisten(self, conn: psycopg.Connection[Any], wanted: frozenset[str]) -> list[str]:
        """LISTEN on what is wanted and UNLISTEN the rest; return the channels added."""
        gone, added = sorted(self._listening - wanted), sorted(wanted - self._listening)
        if gone or added:
            with _deadline(self._deadlines, conn, self._kwargs["connect_timeout"], self._url):
                for channel in gone:
                    conn.execute(f"UNLISTEN {channel}")
                for channel in added:
                    conn.execute(f"LISTEN {channel}")
            self._listening = wanted
        return added

    def _arrived(self, conn: psycopg.Connection[Any]) -> list[tuple[str, str]]:
        return [(n.channel, n.payload) for n in self._notified(conn)]

    @staticmethod
    def _notified(conn: psycopg.Connection[Any]) -> list[psycopg.Notify]:
        """The notifications that have arrived, without waiting for more."""
        return list(conn.notifies(timeout=0.0))

    def _sleep(self, timeout: float, conn: psycopg.Connection[Any] | None = None) -> bool:
        """Until ``timeout`` passes, an interrupt() or (with ``conn``) something to read on
        the connection; True in that last case."""
        poller = select.poll()  # not select: descriptors past its limit (see _spoken_to)
        wake = self._wake_r.fileno()
        poller.register(wake, select.POLLIN)
        fd = None if conn is None else _socket(conn)
        if fd is not None:
            poller.register(fd, select.POLLIN)
        ready = {ready_fd for ready_fd, _ in poller.poll(max(0.0, timeout) * 1000)}
        if wake in ready:
            with suppress(BlockingIOError):  # until none is left
                while self._wake_r.recv(4096):
                    pass
        return fd in ready

    def _disconnect(self) -> None:
        conn, self._conn = self._conn, None
        self._probe = None
        self._listening = frozenset()
        if conn is not None:
            conn.close()

    def close(self) -> None:
        self._closed = True
        self._disconnect()
        self._wake_r.close()
        self._wake_w.close()


class PostgresStore(SQLStore):
    dialect = "postgres"
    notifies = True
    parallel_writes = True
    insert_runs = 1  # each statement is a round trip: a batch is one whatever it mixes

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
        **options: Any,
    ) -> None:
        super().__init__(**options)
        self.queries = {name: queries.compact(sql) for name, sql in self.queries.items()}
        self._call_timeout = call_timeout
        self._idle_timeout = idle_timeout
        self._deadlines = Deadlines(_socket)
        self._statement_timeout = statement_timeout
        self._tcp_user_timeout = tcp_user_timeout
        self.url = redact(url)
        self._conninfo = url.replace("postgres://", "postgresql://", 1)
        self._pool_size = pool_size
        self._connect_timeout = connect_timeout
        self._application_name = application_name
        self._accepts_options: bool | None = None  # see _options_accepted
        self._utc = False  # the server's time zone is UTC under another name: see _pool_kwargs
        self._prepare = True  # see _prepare_threshold
        self._lock = threading.Lock()
        self._pool: ConnectionPool | None = None
        self._pid = os.getpid()

    def _get_pool(self) -> ConnectionPool:
        with self._lock:
            if self._pool is None or self._pid != os.getpid():
                self._refuse_if_retired()
                # a pool inherited across fork shares sockets with the parent: start afresh
                self._pid = os.getpid()
                self._pool = ConnectionPool(
                    self._conninfo,
                    min_size=1,
                    max_size=self._pool_size,
                    open=True,
                    timeout=self._connect_timeout,
                    # psycopg_pool retries a lost connection with a delay that doubles for
                    # as long as this (default 5 min), so after an outage of a minute the
                    # next try could be half a minute away. Give up after a few seconds
                    # instead: the next call that needs a connection starts a fresh try at
                    # once, so tries stay a couple of seconds apart however long it lasts.
                    reconnect_timeout=RECONNECT_WINDOW,
                    connection_class=_Connection,
                    configure=self._configure,
                    name="plunder",
                    kwargs=self._pool_kwargs(),
                )
            return self._pool

    def _connection_kwargs(self) -> dict[str, Any]:
        return {
            "autocommit": True,
            "application_name": self._application_name,
            "connect_timeout": max(1, int(self._connect_timeout)),
            "keepalives": 1,
            "keepalives_idle": 10,
            "keepalives_interval": 5,
            "keepalives_count": 3,
            # a peer that stops acknowledging is dropped after this, instead
            # of hanging a call for the kernel's ~15 minutes
            "tcp_user_timeout": int(self._tcp_user_timeout * 1000),
            # pooled connections prepare (see _prepare_threshold); the others run few
            # statements, or are short-lived
            "prepare_threshold": None,
        }

    def notifications(
        self, *, listen: bool, application_name: str, statement_timeout: float | None = None
    ) -> PgNotifications:
        """A dedicated connection for wake-ups (and the owner's heartbeats)."""
        kwargs = {**self._connection_kwargs(), "application_name": application_name}
        settings = self._settings(statement_timeout)
        if settings and self._options_accepted():
            kwargs["options"] = _options(settings)
        return PgNotifications(
            self._conninfo,
            kwargs,
            listen=listen,
            deadlines=self._deadlines,
            url=self.url,
            per_transaction=None if "options" in kwargs else settings or None,
        )

    def _settings(self, statement_timeout: float | None) -> dict[str, int]:
        """Settings for our backends, in milliseconds. ``idle_in_transaction_session_timeout``:
        when this client hangs or is cut off in the middle of a transaction, the server
        would hold that transaction, and its row locks (a job, a session, the janitor's
        lease), for as long as the connection looks alive, which behind a hung peer is
        forever: nobody could rescue those rows. The server ends such a transaction after
        this long."""
        values = {
            "statement_timeout": statement_timeout,
            "idle_in_transaction_session_timeout": self._idle_timeout,
        }
        return {name: int(value * 1000) for name, value in values.items() if value}

    def _options_accepted(self) -> bool:
        """Whether the server takes settings in the ``options`` startup parameter (sent once
        per connection, so they cost nothing per transaction). A transaction pooler refuses
        it ("unsupported startup parameter: options", pgbouncer); then the settings are made
        inside each transaction instead (see ``_Connection``). Asked once, by connecting."""
        if self._accepts_options is None:
            try:
                kwargs = {**self._connection_kwargs(), "options": "-c statement_timeout=0"}
                with psycopg.connect(self._conninfo, **kwargs) as probe:
                    self._utc = probe.info.parameter_status("TimeZone") in UTC_NAMES
                    self._accepts_options = True
            except psycopg.OperationalError as exc:
                if "unsupported startup parameter" not in str(exc):
                    return True  # not an answer (the database is down?): ask again later
                log.info("%s refuses startup options; settings go in each transaction", self.url)
                self._accepts_options = False
        return self._accepts_options

    def _configure(self, conn: psycopg.Connection[Any]) -> None:
        """Each new pooled connection: the settings its transactions must make, if the
        server did not take them at startup."""
        if isinstance(conn, _Connection):
            settings = self._settings(self._statement_timeout)
            conn.per_transaction = None if self._options_accepted() else settings or None

    def _prepare_threshold(self) -> int | None:
        """psycopg prepares a statement on the server after a few runs, under a name of its
        own, for the life of the connection. Behind a transaction pooler the next
        transaction may land on another server connection, where that name is unknown or
        taken ("prepared statement _pg3_0 does not exist"), unless the pooler tracks them
        (pgbouncer 1.21 and later, with ``max_prepared_statements``). So: prepare on a
        server that takes startup options (a pooler in transaction mode refuses them), and
        never again once a server named such a mix-up (see ``_translate``)."""
        if self._prepare and self._options_accepted():
            return PREPARE_THRESHOLD
        return None

    def _pool_kwargs(self) -> dict[str, Any]:
        kwargs = self._connection_kwargs()
        if not self._options_accepted():
            return kwargs  # each transaction makes its settings (see settings_set)
        # JIT-compiling plunder's short statements costs far more than running them (the
        # claim's estimate passes jit_above_cost on a deep queue: 50 ms of compiling for
        # 0.5 ms of work)
        options = ["-c jit=off"]
        settings = self._settings(self._statement_timeout)
        if settings:
            options.append(_options(settings))
        if self._prepare_threshold() is not None:
            # A prepared statement is planned afresh at every run while the server expects
            # a custom plan to beat its generic one, which for the claim it always does:
            # planning it (0.5-0.6 ms) then costs more than running it. plunder's
            # statements are written for their indexes whatever the values, so they are
            # planned once per connection. A task's own transaction prepares nothing (see
            # _task_transaction), so this never touches a user's queries.
            options.append("-c plan_cache_mode=force_generic_plan")
        if self._utc:
            # The same zone, named so that psycopg knows it for UTC: a claim's timestamps
            # are then read without a conversion each (through zoneinfo for "Etc/UTC", a
            # common default), which cost a tenth of the worker's CPU per job. A server in
            # any other zone is left in it: a task's own transaction sees the zone it set.
            options.append("-c TimeZone=UTC")
        kwargs["options"] = " ".join(options)
        return kwargs

    @staticmethod
    def _limit(tx: PgTx, conn: Any) -> None:
        """Make this transaction's settings, where the server refused them at startup."""
        settings = conn.per_transaction if isinstance(conn, _Connection) else None
        if settings:
            tx.one(
                "settings_set",
                statement_timeout=str(settings.get("statement_timeout", 0)),
                idle_timeout=str(settings.get("idle_in_transaction_session_timeout", 0)),
            )

    @contextmanager
    def _transaction(self, *, write: bool, single: bool = False) -> Iterator[PgTx]:
        # the deadline covers COMMIT, and ends before the connection goes back to the pool
        with (
            self._get_pool().connection() as conn,
            _deadline(self._deadlines, conn, self._call_timeout, self.url),
        ):
            conn.prepare_threshold = self._prepare_threshold()
            tx = PgTx(conn, self.queries)
            per_transaction = isinstance(conn, _Connection) and conn.per_transaction
            if not (single and conn.autocommit) or per_transaction or _spoken_to(conn):
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

    @contextmanager
    def _task_transaction(self) -> Iterator[PgTx]:
        """A task's own write transaction: no deadline (its statements may take as long as
        they need), but ``calls_cut()`` ends it."""
        with (
            self._get_pool().connection() as conn,
            _deadline(self._deadlines, conn, None, self.url),
            conn.transaction(),
        ):
            # the user's statements are planned for their values, as on any connection
            conn.prepare_threshold = None
            tx = PgTx(conn, self.queries)
            self._limit(tx, conn)
            yield tx

    def calls_cut(self, reason: str) -> int:
        """Cut every call in flight on this store's connections (each fails with
        StoreBusy); how many. For a worker that stopped trusting its session: whatever it
        still waits for would be refused by the database anyway, and a call stuck on a hung
        peer would otherwise hold its thread, and its pooled connection, for good.

        The idle connections in the pool are closed too (new ones are opened): they lead to
        the same peer, and the next call on one that hangs would wait for its deadline."""
        cut = self._deadlines.cut_all(reason)
        with self._lock:
            pool = self._pool if self._pid == os.getpid() else None
        drain = getattr(pool, "drain", None)  # psycopg_pool 3.3 and later
        if drain is not None:
            drain()
        return cut

    @contextmanager
    def _transaction_on(self, conn: Any) -> Iterator[PgTx]:
        tx = self._joined(conn)
        try:
            with conn.transaction():
                self._limit(tx, conn)
                yield tx
        except psycopg.Error as exc:  # cut by the owner's deadline (connection_for)?
            reason = self._deadlines.reason_of(conn)
            if reason is None:
                raise
            raise errors.StoreBusy(f"{self.url}: {reason}; the connection was cut") from exc

    def _joined(self, conn: Any) -> PgTx:
        if not isinstance(conn, psycopg.Connection):
            raise TypeError(f"conn must be a psycopg.Connection, not {type(conn).__name__}")
        return PgTx(conn, self.queries)

    def _translate(self, exc: Exception) -> Exception | None:
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

    def _commit_lost(self, exc: BaseException | None) -> bool:
        # A lost connection (no SQLSTATE, or class 08), or a server that ended the backend
        # (57P01-57P03: it may have committed just before): the answer never came. Not
        # 57P05, idle_session_timeout: the server ends only a session that was idle, so the
        # statement in flight never ran.
        if not isinstance(exc, psycopg.OperationalError):
            return False
        state = exc.sqlstate
        return state is None or (state.startswith(("08", "57P")) and state != "57P05")

    def _turn_at_once(
        self,
        plain: list[tuple[Completion, str]],
        session_id: str,
        *,
        queues: Sequence[str],
        tasks: Sequence[str],
        limit: int,
        take_suspect: bool,
        now: datetime | None,
    ) -> Exchange | None:
        """One statement (job_exchange), committed in one round trip, where the database
        delivers NOTIFY (the statement notifies the result waiters)."""
        if not self.notifies:
            return None
        params = pgturn.turn_params(
            plain, session_id, queues=queues, tasks=tasks, limit=limit, take_suspect=take_suspect
        )
        names, rows = self._run(
            lambda tx: tx.table("job_exchange", **params, now=tx.clock(now)), single=True
        )
        answer = pgturn.Answer.of(self, plain, session_id, (names, rows))
        return Exchange(answer.settle(now), AckResult((), ()), tuple(answer.jobs()))

    def turn_pipe(self) -> pgturn.TurnPipe | None:
        """Turns sent ahead (see plunder.store.pgturn), on a connection of the pool held
        for them: not with a pool of one, which the pipe would keep from every other call."""
        if self._pool_size < 2 or not self.notifies:
            return None
        return pgturn.TurnPipe(self)

    def _pipe_connection(self) -> psycopg.Connection[Any] | None:
        """A pooled connection for a TurnPipe to hold; None (given back) behind a
        transaction pooler, where each transaction must first make plunder's settings."""
        try:
            conn = self._get_pool().getconn()
        except PoolTimeout as exc:
            raise errors.StoreUnavailable(f"cannot connect to {self.url}: {exc}") from exc
        if (isinstance(conn, _Connection) and conn.per_transaction) or not conn.autocommit:
            self._get_pool().putconn(conn)
            return None
        conn.prepare_threshold = self._prepare_threshold()
        return conn

    def _claim_rows(
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
            queues=self._list_in(queues),
            tasks=self._list_in(tasks),
            limit=limit,
            take_suspect=take_suspect,
            suspect_losses=SUSPECT_LOSSES,
            levels=CLAIM_LEVELS,
            now=clock,
        )

    def _next_due(self, tx: Tx, queues: list[str], tasks: list[str], clock: Any) -> float | None:
        """One statement, which walks each queue and priority level inside it."""
        row = tx.one("job_next_due", queues=queues, tasks=tasks, levels=CLAIM_LEVELS, now=clock)
        return None if row is None or row["due_in"] is None else float(row["due_in"])

    def _time(self, value: Any) -> datetime:
        if not isinstance(value, datetime):
            raise errors.StoreError(f"expected a timestamp from the database, got {value!r}")
        return value.astimezone(UTC)

    def _list_in(self, values: Sequence[Any]) -> list[Any]:
        return list(values)

    def _list_out(self, value: Any) -> list[str]:
        return list(value or [])

    def close(self) -> None:
        with self._lock:
            pool, self._pool = self._pool, None
        if pool is not None and self._pid == os.getpid():
            pool.close()
