"""plunder's statements on a sqlite3 connection: the transaction handles the SQLite store
gives its operations (on its own connections, or on a caller's), and batches run as
many-row statements."""

from __future__ import annotations

import functools
import itertools
import operator
import re
import sqlite3
from collections.abc import Iterator, Mapping, Sequence
from datetime import datetime
from typing import Any

from plunder.store import queries
from plunder.store.driver import Row


def _returning(sql: Mapping[str, str]) -> frozenset[str]:
    return frozenset(name for name, text in sql.items() if "RETURNING" in text.upper())


_RETURNING = _returning(queries.load("sqlite"))


class SqliteTx:
    statement_commits = False  # always in a transaction: BEGIN IMMEDIATE, then COMMIT

    def __init__(self, conn: sqlite3.Connection, sql: Mapping[str, str]) -> None:
        self.conn = conn
        self._sql = sql
        self._now: float | None = None

    def clock(self, now: datetime | None) -> float:
        if now is not None:
            return epoch(now)
        if self._now is None:
            self._now = float(self.conn.execute(self._sql["clock_now"]).fetchone()[0])
        return self._now

    def all(self, name: str, /, **params: Any) -> list[Row]:
        return self.conn.execute(self._sql[name], params).fetchall()

    def one(self, name: str, /, **params: Any) -> Row | None:
        row: Row | None = self.conn.execute(self._sql[name], params).fetchone()
        return row

    def table(self, name: str, /, **params: Any) -> tuple[list[str], list[Sequence[Any]]]:
        cur = self.conn.cursor()
        cur.row_factory = None  # plain tuples
        cur.execute(self._sql[name], params)
        rows: list[Sequence[Any]] = cur.fetchall()
        names = [column[0] for column in cur.description or ()]
        return names, rows

    def batch(self, name: str, rows: Sequence[Mapping[str, Any]], /, **common: Any) -> list[Row]:
        if name not in _RETURNING:
            if rows:  # no rows to read back: let sqlite3 loop in C
                self.conn.executemany(self._sql[name], [{**common, **row} for row in rows])
            return []
        names, found = self.batch_table(name, rows, **common)
        return [dict(zip(names, row, strict=True)) for row in found]

    def batch_table(
        self, name: str, rows: Sequence[Mapping[str, Any]], /, **common: Any
    ) -> tuple[list[str], list[Sequence[Any]]]:
        """An ``INSERT … VALUES (…) RETURNING`` runs as one statement per chunk of
        MULTIROW_CHUNK rows, with positional parameters: per row, SQLite then only inserts
        (one statement each would also re-bind every name and re-run each statement's
        one-off setup). Any other query runs once per row."""
        sql = self._sql[name]
        cur = self.conn.cursor()
        cur.row_factory = None  # plain tuples
        out: list[Sequence[Any]] = []
        multi = _multirow(sql)
        if multi is not None:
            for call in multi.calls(rows, common):
                out.extend(cur.execute(*call).fetchall())
        else:
            for row in rows:
                out.extend(cur.execute(sql, {**common, **row}).fetchall())
        return [column[0] for column in cur.description or ()], out

    def batch_count(self, name: str, rows: Sequence[Mapping[str, Any]], /, **common: Any) -> int:
        """Each statement of the query over every row in turn; the rows the first changed.
        A set-based statement (``FROM (VALUES (…))``) runs once per MULTIROW_CHUNK rows,
        with its VALUES list repeated for each row."""
        if not rows:
            return 0
        counts = []
        params: list[dict[str, Any]] | None = None  # per row, made once for all statements
        for sql in _statements(self._sql[name]):
            multi = _multirow(sql)
            if multi is not None:
                calls = multi.calls(rows, common)
                counts.append(sum(int(self.conn.execute(*call).rowcount) for call in calls))
                continue
            if params is None:
                params = [{**common, **row} for row in rows]
            counts.append(int(self.conn.executemany(sql, params).rowcount))
        return counts[0]

    def columns_count(
        self, name: str, columns: Mapping[str, Sequence[Any]], /, **common: Any
    ) -> int:
        keys = list(columns)
        together = zip(*columns.values(), strict=True)
        rows = [dict(zip(keys, values, strict=True)) for values in together]
        return self.batch_count(name, rows, **common)

    def script(self, sql: str) -> None:
        self.conn.execute(sql)


class CallerTx(SqliteTx):
    """A transaction on the caller's own connection: rows are read through cursors of its
    own, so the caller's ``row_factory`` is neither changed nor relied on."""

    def _cursor(self) -> sqlite3.Cursor:
        cur = self.conn.cursor()
        cur.row_factory = sqlite3.Row
        return cur

    def clock(self, now: datetime | None) -> float:
        if now is not None:
            return epoch(now)
        if self._now is None:
            self._now = float(self._cursor().execute(self._sql["clock_now"]).fetchone()[0])
        return self._now

    def all(self, name: str, /, **params: Any) -> list[Row]:
        return self._cursor().execute(self._sql[name], params).fetchall()

    def one(self, name: str, /, **params: Any) -> Row | None:
        row: Row | None = self._cursor().execute(self._sql[name], params).fetchone()
        return row


MULTIROW_CHUNK = 500  # rows per statement (4 columns x 500 is far below SQLite's limit)
_VALUES = re.compile(r"\bVALUES\s*(\((?:[^()]|\([^()]*\))*\))", re.IGNORECASE)
_NAME = re.compile(r"(?<![:\w]):([A-Za-z_][A-Za-z0-9_]*)")


class _MultiRow:
    """A statement with a one-row VALUES list, rewritten for many rows, with positional
    parameters: those before and after the list bind once, from the common values; those
    in it bind once per row."""

    def __init__(self, head: str, values: str, tail: str, names: list[list[str]]) -> None:
        self.head, self.values, self.tail = head, values, tail
        self._before, row_names, self._after = names
        self._pick = operator.itemgetter(*row_names)
        self._in_rows = frozenset(row_names)
        self._single = len(row_names) == 1
        self._texts: dict[int, str] = {}

    def calls(
        self, rows: Sequence[Mapping[str, Any]], common: Mapping[str, Any]
    ) -> Iterator[tuple[str, list[Any]]]:
        """The statement text and parameters for each chunk of MULTIROW_CHUNK rows."""
        for start in range(0, len(rows), MULTIROW_CHUNK):
            yield self._call(rows[start : start + MULTIROW_CHUNK], common)

    def _call(
        self, rows: Sequence[Mapping[str, Any]], common: Mapping[str, Any]
    ) -> tuple[str, list[Any]]:
        params = [common[name] for name in self._before]
        if not self._in_rows.issubset(rows[0]):  # a row value that is common (:now)
            rows = [{**common, **row} for row in rows]
        picked = map(self._pick, rows)
        params.extend(picked if self._single else itertools.chain.from_iterable(picked))
        params.extend(common[name] for name in self._after)
        return self.sql(len(rows)), params

    def sql(self, count: int) -> str:
        text = self._texts.get(count)
        if text is None:
            text = self.head + ", ".join([self.values] * count) + self.tail
            if len(self._texts) < 128:  # a worker's batches take few distinct sizes
                self._texts[count] = text
        return text


@functools.cache
def _multirow(sql: str) -> _MultiRow | None:
    """The many-row form of a one-statement ``INSERT … VALUES (…) … RETURNING`` or of a
    set-based ``… FROM (VALUES (…)) …`` statement, or None for any other statement."""
    statements = _statements(sql)
    if len(statements) != 1:
        return None
    body = statements[0]
    found = _VALUES.search(body)
    if found is None:
        return None
    inserts = body.upper().startswith("INSERT")
    if not (inserts and "RETURNING" in body.upper()) and "FROM (VALUES" not in body.upper():
        return None
    values = found.group(1)
    head, tail = body[: found.start(1)], body[found.end(1) :]
    names = [_NAME.findall(part) for part in (head, values, tail)]
    if not names[1]:
        return None
    return _MultiRow(_NAME.sub("?", head), _NAME.sub("?", values), _NAME.sub("?", tail), names)


@functools.cache
def _statements(sql: str) -> list[str]:
    """A batch query's statements (sqlite3 runs one statement per call)."""
    return queries.statements(sql)


def epoch(value: datetime) -> float:
    if value.tzinfo is None:
        raise ValueError("now must be a timezone-aware datetime")
    return value.timestamp()
