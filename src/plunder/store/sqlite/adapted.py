"""The caller's aiosqlite connection, as an async SQLAlchemy connection hands it over, seen
as a sqlite3 connection by the SQLite store's caller transactions (``CallerTx``).

Inside ``AsyncConnection.run_sync`` that connection's DB-API connection is SQLAlchemy's
adapter, whose calls look synchronous and are awaited on the caller's event loop (aiosqlite
runs the sqlite3 connection on a thread of its own). :class:`SqliteView` offers the part of
sqlite3's interface the store uses: each statement's rows are read whole, and its cursor
closed, before the store looks at them.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterable, Mapping, Sequence
from typing import Any


def is_adapted(conn: Any) -> bool:
    """Whether ``conn`` is a DB-API adapter over an aiosqlite connection."""
    driver = getattr(conn, "driver_connection", None)
    return (type(driver).__module__ or "").startswith("aiosqlite")


class KeyedRow(tuple[Any, ...]):
    """A row read by position or by column name, as sqlite3.Row is."""

    names: dict[str, int]

    def __new__(cls, values: Sequence[Any], names: dict[str, int]) -> KeyedRow:
        row = super().__new__(cls, values)
        row.names = names
        return row

    def __getitem__(self, key: Any) -> Any:
        if isinstance(key, str):
            return super().__getitem__(self.names[key])
        return super().__getitem__(key)

    def keys(self) -> list[str]:
        return list(self.names)


class CursorView:
    """A sqlite3-like cursor over the adapter's: rows as tuples, or keyed rows where
    ``row_factory`` is sqlite3.Row (the only factory the store sets)."""

    def __init__(self, adapter: Any) -> None:
        self._adapter = adapter
        self.row_factory: Any = None
        self.description: Any = None
        self.rowcount = -1
        self.lastrowid: int | None = None
        self._rows: list[Any] = []

    def execute(self, sql: str, params: Mapping[str, Any] | Sequence[Any] = ()) -> CursorView:
        return self._run(lambda cur: cur.execute(sql, params))

    def executemany(self, sql: str, params: Iterable[Any]) -> CursorView:
        return self._run(lambda cur: cur.executemany(sql, list(params)))

    def _run(self, call: Any) -> CursorView:
        cur = self._adapter.cursor()
        try:
            call(cur)
            self.description, self.rowcount = cur.description, cur.rowcount
            self.lastrowid = cur.lastrowid
            rows = cur.fetchall() if cur.description is not None else []
        finally:
            cur.close()
        if self.row_factory is sqlite3.Row and self.description is not None:
            names = {column[0]: i for i, column in enumerate(self.description)}
            self._rows = [KeyedRow(row, names) for row in rows]
        else:
            self._rows = [tuple(row) for row in rows]
        return self

    def fetchall(self) -> list[Any]:
        rows, self._rows = self._rows, []
        return rows

    def fetchone(self) -> Any:
        return self._rows.pop(0) if self._rows else None


class SqliteView:
    """The part of sqlite3.Connection's interface the SQLite store uses on a caller's
    connection, over SQLAlchemy's aiosqlite adapter."""

    def __init__(self, adapter: Any) -> None:
        self._adapter = adapter
        self._driver = adapter.driver_connection

    @property
    def in_transaction(self) -> bool:
        return bool(self._driver.in_transaction)

    @property
    def isolation_level(self) -> str | None:
        level: str | None = self._driver.isolation_level
        return level

    def cursor(self) -> CursorView:
        return CursorView(self._adapter)

    def execute(self, sql: str, params: Mapping[str, Any] | Sequence[Any] = ()) -> CursorView:
        return self.cursor().execute(sql, params)

    def executemany(self, sql: str, params: Iterable[Any]) -> CursorView:
        return self.cursor().executemany(sql, params)
