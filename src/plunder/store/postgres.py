"""The PostgreSQL store: for workers on many machines.

* psycopg 3 with a small connection pool; connections are in autocommit mode and every
  operation runs inside an explicit ``conn.transaction()`` block at READ COMMITTED, with
  row guards (``WHERE status = 'running' AND attempt = … AND session_id = …``) doing the
  fencing rather than an isolation level.
* Claims use ``FOR UPDATE SKIP LOCKED``; batches travel as arrays through ``unnest`` so a
  batch of any size is one statement.
* No session-level state is relied on — no advisory locks, no temporary tables, no
  server-side prepared statements (psycopg's automatic ones are turned off), no startup
  ``options`` (a statement timeout is set inside each transaction) — so the store keeps
  working behind pgbouncer in transaction mode, and the SQL stays close to what
  CockroachDB accepts. LISTEN is only an optimisation there: polling carries on alone.
* Serialization failures (40001), deadlocks (40P01) and lost connections retry the whole
  transaction after a fixed, jittered busy interval, up to a bounded total.
"""

from __future__ import annotations

import logging
import os
import secrets
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any
from urllib.parse import urlsplit, urlunsplit

try:
    import psycopg
    from psycopg import errors as pg_errors
    from psycopg.rows import dict_row
    from psycopg_pool import ConnectionPool, PoolTimeout
except ImportError as exc:  # pragma: no cover - depends on the installation
    raise ImportError(
        "PostgreSQL support needs psycopg 3 and psycopg_pool: pip install 'plunder[postgres]'"
    ) from exc

from plunder import errors
from plunder.store.sqlbase import Row, SQLStore

log = logging.getLogger("plunder.store")
RETRYABLE = (pg_errors.SerializationFailure, pg_errors.DeadlockDetected, pg_errors.LockNotAvailable)
# psycopg_pool tries again to open a connection it lost after delays that double (1, 2,
# 4, 8 s, …) for reconnect_timeout (5 minutes by default): after a long outage (a
# restart, every connection slot taken) its next try could come as long after the
# database was back as the outage had lasted. Giving up a series after this long keeps
# the gap between tries to a couple of seconds: the next request for a connection starts
# a new series at once.
RECONNECT_SERIES = 5.0


def redact(url: str) -> str:
    """The URL without its password, for messages and ``store.url``."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.replace(f":{parts.password}@", ":***@", 1)
    return urlunsplit(parts._replace(netloc=netloc))


class _Tx:
    def __init__(self, conn: psycopg.Connection[Any], sql: Mapping[str, str]) -> None:
        self.conn = conn
        self._sql = sql

    def clock(self, now: datetime | None) -> datetime | None:
        if now is not None and now.tzinfo is None:
            raise ValueError("now must be a timezone-aware datetime")
        return now

    def all(self, name: str, /, **params: Any) -> list[Row]:
        with self.conn.cursor(row_factory=dict_row) as cur:
            cur.execute(self._sql[name], params)
            if cur.description is None:
                return []
            return list(cur.fetchall())

    def one(self, name: str, /, **params: Any) -> Row | None:
        rows = self.all(name, **params)
        return rows[0] if rows else None

    def batch(self, name: str, rows: Sequence[Mapping[str, Any]], /, **common: Any) -> list[Row]:
        if not rows:
            return []
        columns: dict[str, Any] = {key: [row[key] for row in rows] for key in rows[0]}
        return self.all(name, **columns, **common)

    def batch_count(self, name: str, rows: Sequence[Mapping[str, Any]], /, **common: Any) -> int:
        if not rows:
            return 0
        columns: dict[str, Any] = {key: [row[key] for row in rows] for key in rows[0]}
        with self.conn.cursor() as cur:
            cur.execute(self._sql[name], {**columns, **common})
            return int(cur.rowcount)

    def script(self, sql: str) -> None:
        self.conn.execute(sql.encode("utf-8"))


CHANNELS = ("plunder_enqueued", "plunder_done", "plunder_stream")  # fixed names, never input
PROBE_CHANNEL = "plunder_probe"


class _Connection(psycopg.Connection[Any]):
    """A connection that knows the statement timeout its transactions run under.

    The timeout is set inside each transaction (``set_config(name, value, true)``, the form
    of SET LOCAL), not with the ``options`` startup parameter: a transaction pooler refuses
    that parameter ("unsupported startup parameter: options", pgbouncer) and would hand a
    session-level SET to whichever client gets that server connection next."""

    statement_timeout: float | None = None


class PgNotifications:
    """One dedicated connection: LISTENs on plunder's channels, and lends itself to the
    owner's light periodic calls (heartbeats) between waits.

    Notifications are lost while the connection is down, so after every reconnect it
    LISTENs first and then reports ``("*", "")``: "re-check everything once".

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
        statement_timeout: float | None = None,
    ) -> None:
        self._conninfo = conninfo
        self._kwargs = kwargs
        self.listen = listen
        self._statement_timeout = statement_timeout
        self._conn: _Connection | None = None
        self._fresh = False
        self._probe: tuple[str, float] | None = None  # token, deadline (monotonic)

    @property
    def connection(self) -> psycopg.Connection[Any]:
        """The connection, reconnected (and re-LISTENed) if it was lost."""
        if self._conn is None or self._conn.closed or self._conn.broken:
            self._connect()
        assert self._conn is not None
        return self._conn

    def _connect(self) -> None:
        self.close()
        try:
            conn = _Connection.connect(self._conninfo, **self._kwargs)
        except psycopg.Error as exc:
            raise errors.StoreBusy(f"cannot open the listening connection: {exc}") from exc
        conn.statement_timeout = self._statement_timeout
        self._conn = conn
        if not self.listen:
            self._fresh = True
            return
        try:
            conn.execute(f"LISTEN {PROBE_CHANNEL}")
        except psycopg.Error as exc:
            if conn.broken:
                self.close()
                raise errors.StoreBusy(f"lost the listening connection: {exc}") from exc
            self._stop_listening()  # the database refuses LISTEN itself
            return
        token = secrets.token_hex(8)
        try:
            with psycopg.connect(self._conninfo, **self._kwargs) as other:
                other.execute("SELECT pg_notify(%s, %s)", (PROBE_CHANNEL, token))
        except psycopg.Error as exc:  # tried again on the next reconnect
            self.close()
            raise errors.StoreBusy(f"cannot probe LISTEN/NOTIFY: {exc}") from exc
        self._probe = (token, time.monotonic() + self.PROBE_TIMEOUT)

    def _await_probe(self, conn: psycopg.Connection[Any], timeout: float) -> None:
        """Wait up to ``timeout`` for the probe: once it came back, LISTEN on plunder's
        channels; once its time is up, poll only."""
        assert self._probe is not None
        token, deadline = self._probe
        wait = max(0.0, min(timeout, deadline - time.monotonic()))
        if any(
            n.channel == PROBE_CHANNEL and n.payload == token
            for n in conn.notifies(timeout=wait, stop_after=1)
        ):
            self._probe = None
            conn.execute(f"UNLISTEN {PROBE_CHANNEL}")
            for channel in CHANNELS:
                conn.execute(f"LISTEN {channel}")
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

    def wait(self, timeout: float) -> list[tuple[str, str]]:
        """Wait up to ``timeout`` seconds; return the notifications that arrived."""
        try:
            conn = self.connection
            if self._probe is not None:
                self._await_probe(conn, timeout)
            if self._fresh:
                self._fresh = False
                return [("*", "")]
            if self._probe is not None:
                return []
            if not self.listen:
                time.sleep(timeout)
                return []
            got = [
                (n.channel, n.payload)
                for n in conn.notifies(timeout=max(0.0, timeout), stop_after=1)
            ]
            if got:
                got += [(n.channel, n.payload) for n in conn.notifies(timeout=0.0)]
            return got
        except psycopg.Error as exc:
            log.warning("listening connection lost (%s); reconnecting", str(exc).strip())
            self.close()
            time.sleep(min(timeout, 0.5))
            return []
        except errors.StoreBusy as exc:
            log.warning("%s", exc)
            time.sleep(min(timeout, 0.5))
            return []

    def close(self) -> None:
        conn, self._conn = self._conn, None
        self._probe = None
        if conn is not None:
            conn.close()


class PostgresStore(SQLStore):
    dialect = "postgres"
    notifies = True

    def __init__(
        self,
        url: str,
        *,
        pool_size: int = 4,
        connect_timeout: float = 10.0,
        application_name: str = "plunder",
        statement_timeout: float | None = None,
        tcp_user_timeout: float = 10.0,
        **options: Any,
    ) -> None:
        super().__init__(**options)
        self._statement_timeout = statement_timeout
        self._tcp_user_timeout = tcp_user_timeout
        self.url = redact(url)
        self._conninfo = url.replace("postgres://", "postgresql://", 1)
        self._pool_size = pool_size
        self._connect_timeout = connect_timeout
        self._application_name = application_name
        self._lock = threading.Lock()
        self._pool: ConnectionPool | None = None
        self._pid = os.getpid()

    def _get_pool(self) -> ConnectionPool:
        with self._lock:
            if self._pool is None or self._pid != os.getpid():
                # a pool inherited across fork shares sockets with the parent: start afresh
                self._pid = os.getpid()
                self._pool = ConnectionPool(
                    self._conninfo,
                    min_size=1,
                    max_size=self._pool_size,
                    open=True,
                    timeout=self._connect_timeout,
                    reconnect_timeout=RECONNECT_SERIES,
                    name="plunder",
                    kwargs=self._connection_kwargs(),
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
            # psycopg prepares a statement on the server after its fifth run, under a name
            # of its own; behind a transaction pooler (pgbouncer before 1.21) the next
            # transaction may land on a server connection where that name is unknown or
            # taken ("prepared statement _pg3_0 already exists"). plunder's statements are
            # short and planned cheaply: never prepare them.
            "prepare_threshold": None,
        }

    def notifications(
        self, *, listen: bool, application_name: str, statement_timeout: float | None = None
    ) -> PgNotifications:
        """A dedicated connection for wake-ups (and the owner's heartbeats)."""
        kwargs = {**self._connection_kwargs(), "application_name": application_name}
        return PgNotifications(
            self._conninfo, kwargs, listen=listen, statement_timeout=statement_timeout
        )

    def _limit(self, tx: _Tx, seconds: float | None) -> None:
        """Bound every statement of this transaction (see ``_Connection``)."""
        if seconds is not None:
            tx.one("statement_timeout_set", timeout=str(int(seconds * 1000)))

    @contextmanager
    def _transaction(self, *, write: bool) -> Iterator[_Tx]:
        with self._get_pool().connection() as conn, conn.transaction():
            tx = _Tx(conn, self.queries)
            self._limit(tx, self._statement_timeout)
            yield tx

    @contextmanager
    def _transaction_on(self, conn: Any) -> Iterator[_Tx]:
        tx = self._joined(conn)
        with conn.transaction():
            self._limit(tx, conn.statement_timeout if isinstance(conn, _Connection) else None)
            yield tx

    def _joined(self, conn: Any) -> _Tx:
        if not isinstance(conn, psycopg.Connection):
            raise TypeError(f"conn must be a psycopg.Connection, not {type(conn).__name__}")
        return _Tx(conn, self.queries)

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
        if isinstance(exc, psycopg.OperationalError):
            # a lost or refused connection: retried on a fresh connection from the pool
            return errors.StoreBusy(message)
        return errors.StoreError(message)

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
