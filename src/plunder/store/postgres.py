"""The PostgreSQL store: for workers on many machines.

* psycopg 3 with a small connection pool; connections are in autocommit mode and every
  operation runs inside an explicit ``conn.transaction()`` block at READ COMMITTED, with
  row guards (``WHERE status = 'running' AND attempt = … AND session_id = …``) doing the
  fencing rather than an isolation level.
* Claims use ``FOR UPDATE SKIP LOCKED``; batches travel as arrays through ``unnest`` so a
  batch of any size is one statement.
* No session-level state is relied on — no advisory locks, no temporary tables, no
  prepared statement names of our own — so the store keeps working behind pgbouncer in
  transaction mode, and the SQL stays close to what CockroachDB accepts.
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


def redact(url: str) -> str:
    """The URL without its password, for messages and ``store.url``."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.replace(f":{parts.password}@", ":***@", 1)
    return urlunsplit(parts._replace(netloc=netloc))


def _array(values: list[Any]) -> str:
    """A PostgreSQL array literal of ``values`` (str, int, float, bool or None). The batch
    queries cast each column parameter (``%(job_id)s::bigint[]``), so the text goes in as
    is; psycopg's own list dumper looks up a dumper and quotes element by element in Python,
    which cost more than the statements themselves on a batch of a hundred jobs."""
    kinds = {type(value) for value in values}
    if kinds == {str}:
        # Quote and escape the whole column in a few C-level passes. NUL separates the
        # elements while escaping: PostgreSQL text cannot hold it, so no element has one
        # (if one did, the count below differs and the element path lets the server refuse).
        joined = "\0".join(values)
        if joined.count("\0") == len(values) - 1:
            escaped = joined.replace("\\", "\\\\").replace('"', '\\"')
            return '{"' + escaped.replace("\0", '","') + '"}'
    elif kinds <= {int, float}:  # ids, attempts, seconds
        return "{" + ",".join(map(str, values)) + "}"
    out = []
    for value in values:
        if value is None:
            out.append("NULL")
        elif isinstance(value, str):
            out.append('"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"')
        else:  # numbers and booleans: their str() is what PostgreSQL reads back
            out.append(str(value))
    return "{" + ",".join(out) + "}"


def _columns(rows: Sequence[Mapping[str, Any]]) -> dict[str, str]:
    """Batch rows as one array parameter per column, for unnest() in the query."""
    return {key: _array([row[key] for row in rows]) for key in rows[0]}


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
        return self.all(name, **_columns(rows), **common)

    def batch_count(self, name: str, rows: Sequence[Mapping[str, Any]], /, **common: Any) -> int:
        if not rows:
            return 0
        columns = _columns(rows)
        with self.conn.cursor() as cur:
            cur.execute(self._sql[name], {**columns, **common})
            return int(cur.rowcount)

    def script(self, sql: str) -> None:
        self.conn.execute(sql.encode("utf-8"))


CHANNELS = ("plunder_enqueued", "plunder_done", "plunder_stream")  # fixed names, never input
PROBE_CHANNEL = "plunder_probe"


class PgNotifications:
    """One dedicated connection: LISTENs on plunder's channels, and lends itself to the
    owner's light periodic calls (heartbeats) between waits.

    Notifications are lost while the connection is down, so after every reconnect it
    LISTENs first and then reports ``("*", "")``: "re-check everything once". If a probe
    NOTIFY sent right after LISTEN does not come back (pgbouncer in transaction mode, a
    database without LISTEN), it stops listening and says so; polling carries on alone.
    """

    def __init__(self, conninfo: str, kwargs: dict[str, Any], *, listen: bool) -> None:
        self._conninfo = conninfo
        self._kwargs = kwargs
        self.listen = listen
        self._conn: psycopg.Connection[Any] | None = None
        self._fresh = False

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
            conn = psycopg.connect(self._conninfo, **self._kwargs)
        except psycopg.Error as exc:
            raise errors.StoreBusy(f"cannot open the listening connection: {exc}") from exc
        self._conn = conn
        self._fresh = True
        if self.listen:
            for channel in CHANNELS:
                conn.execute(f"LISTEN {channel}")
            if not self._probe(conn):
                log.warning(
                    "LISTEN/NOTIFY does not come back on this connection (a "
                    "transaction-mode pooler?); falling back to polling only"
                )
                self.listen = False

    def _probe(self, conn: psycopg.Connection[Any]) -> bool:
        token = secrets.token_hex(8)
        conn.execute(f"LISTEN {PROBE_CHANNEL}")
        conn.execute("SELECT pg_notify(%s, %s)", (PROBE_CHANNEL, token))
        received = [
            n for n in conn.notifies(timeout=1.0, stop_after=1) if n.channel == PROBE_CHANNEL
        ]
        conn.execute(f"UNLISTEN {PROBE_CHANNEL}")
        return any(n.payload == token for n in received)

    def wait(self, timeout: float) -> list[tuple[str, str]]:
        """Wait up to ``timeout`` seconds; return the notifications that arrived."""
        try:
            conn = self.connection
            if self._fresh:
                self._fresh = False
                return [("*", "")]
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
            **self._timeout_option(),
        }

    def notifications(
        self, *, listen: bool, application_name: str, statement_timeout: float | None = None
    ) -> PgNotifications:
        """A dedicated connection for wake-ups (and the owner's heartbeats)."""
        kwargs = {**self._connection_kwargs(), "application_name": application_name}
        if statement_timeout is not None:
            kwargs["options"] = f"-c statement_timeout={int(statement_timeout * 1000)}"
        return PgNotifications(self._conninfo, kwargs, listen=listen)

    def _timeout_option(self) -> dict[str, str]:
        if self._statement_timeout is None:
            return {}
        return {"options": f"-c statement_timeout={int(self._statement_timeout * 1000)}"}

    @contextmanager
    def _transaction(self, *, write: bool) -> Iterator[_Tx]:
        with self._get_pool().connection() as conn, conn.transaction():
            yield _Tx(conn, self.queries)

    @contextmanager
    def _transaction_on(self, conn: Any) -> Iterator[_Tx]:
        tx = self._joined(conn)
        with conn.transaction():
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
