"""plunder's statements on the caller's async psycopg connection, as an async SQLAlchemy
connection hands it over: inside ``AsyncConnection.run_sync`` its DB-API connection is
SQLAlchemy's adapter, whose calls look synchronous and are awaited on the caller's event
loop. Plain DB-API calls only (no prepared or binary statements: the same rows)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import psycopg

from plunder.store.driver import Row
from plunder.store.postgres.tx import PgTx, array_columns, array_literal


def is_adapted(conn: Any) -> bool:
    """Whether ``conn`` is a DB-API adapter over a psycopg AsyncConnection."""
    return isinstance(getattr(conn, "driver_connection", None), psycopg.AsyncConnection)


class AdaptedPgTx(PgTx):
    """:class:`PgTx` through a DB-API adapter of an async psycopg connection."""

    def _run(self, name: str, params: Mapping[str, Any]) -> Any:
        cur = self.conn.cursor()
        cur.execute(self._sql[name], params)
        return cur

    def all(self, name: str, /, **params: Any) -> list[Row]:
        columns, rows = self.table(name, **params)
        return [dict(zip(columns, row, strict=True)) for row in rows]

    def table(self, name: str, /, **params: Any) -> tuple[list[str], list[Sequence[Any]]]:
        cur = self._run(name, params)
        try:
            if cur.description is None:
                return [], []
            return [column[0] for column in cur.description], list(cur.fetchall())
        finally:
            cur.close()

    def batch_count(self, name: str, rows: Sequence[Mapping[str, Any]], /, **common: Any) -> int:
        if not rows:
            return 0
        return self._count(name, {**array_columns(rows), **common})

    def columns_count(
        self, name: str, columns: Mapping[str, Sequence[Any]], /, **common: Any
    ) -> int:
        arrays = {key: array_literal(list(values)) for key, values in columns.items()}
        return self._count(name, {**arrays, **common})

    def _count(self, name: str, params: Mapping[str, Any]) -> int:
        cur = self._run(name, params)
        try:
            return int(cur.rowcount)
        finally:
            cur.close()

    def script(self, sql: str) -> None:
        cur = self.conn.cursor()
        try:
            cur.execute(sql)
        finally:
            cur.close()
