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

import os
import threading
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

RETRYABLE = (pg_errors.SerializationFailure, pg_errors.DeadlockDetected, pg_errors.LockNotAvailable)


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

    def script(self, sql: str) -> None:
        self.conn.execute(sql.encode("utf-8"))


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
                    kwargs={
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
                    },
                )
            return self._pool

    def _timeout_option(self) -> dict[str, str]:
        if self._statement_timeout is None:
            return {}
        return {"options": f"-c statement_timeout={int(self._statement_timeout * 1000)}"}

    @contextmanager
    def _transaction(self, *, write: bool) -> Iterator[_Tx]:
        with self._get_pool().connection() as conn, conn.transaction():
            yield _Tx(conn, self.queries)

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
