"""plunder's statements on a psycopg connection: the transaction handle the PostgreSQL store
gives its operations, and the array literals its batch statements take, one per column."""

from __future__ import annotations

import operator
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from psycopg import Connection, Cursor
from psycopg.pq import TransactionStatus
from psycopg.rows import dict_row, tuple_row

from plunder.store.driver import Row

# Statements whose rows come back in PostgreSQL's binary format: a claim's hundred rows of
# two dozen columns, of which five are timestamps, cost the client less read as binary
# than parsed from text (the same Python values either way).
BINARY_RESULTS = frozenset({"job_claim_many", "job_exchange"})
# Statements a worker repeats at every batch: prepared at their first run on a pooled
# connection, and planned then by their indexes, whatever the statistics of the jobs table
# say at that moment (see the plans_by_index query).
INDEX_PLANNED = frozenset(
    {
        "job_claim_many",
        "job_exchange",
        "job_complete",
        "job_complete_notify",
        "job_fail",
        "job_release",
        "run_close",
        "run_mark_stale",
        "job_claim_state",
        "job_check_claim",
        "session_running",
    }
)


def plan_once(conn: Connection[Any], name: str) -> tuple[bool | None, frozenset[str] | None]:
    """How statement ``name`` runs on ``conn``: psycopg's ``prepare`` argument (True for
    those of INDEX_PLANNED on a connection that prepares, None otherwise: psycopg's own
    threshold), and, when this run prepares it there for the first time, the statements
    planned by their indexes on the connection so far (None otherwise). The caller of a
    first run sends plans_by_index before it and plans_reset after it, and then records
    ``name`` in ``conn.index_planned``."""
    planned: frozenset[str] | None = getattr(conn, "index_planned", None)
    if name not in INDEX_PLANNED or planned is None or conn.prepare_threshold is None:
        return None, None
    return True, None if name in planned else planned


def array_literal(values: list[Any]) -> str:
    """A PostgreSQL array literal of ``values`` (str, int, float, bool or None). The batch
    queries cast each column parameter (``%(job_id)s::bigint[]``), so the text goes in as
    is; psycopg's own list dumper looks up a dumper and quotes element by element in Python,
    which cost more than the statements themselves on a batch of a hundred jobs."""
    kinds = set(map(type, values))
    first = values[0]
    if (
        len(values) > 1
        and len(kinds) == 1
        and type(first) is not float  # 0.0 == -0.0, but they are written differently
        and values.count(first) == len(values)
    ):  # one value for the whole column (a batch's queue, task, options): written once
        return "{" + ",".join([array_literal([first])[1:-1]] * len(values)) + "}"
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


def array_columns(rows: Sequence[Mapping[str, Any]]) -> dict[str, str]:
    """Batch rows as one array parameter per column, for unnest() in the query."""
    return {key: array_literal(list(map(operator.itemgetter(key), rows))) for key in rows[0]}


class PgTx:
    """plunder's statements on a psycopg connection (see ``engine.Tx``)."""

    def __init__(self, conn: Connection[Any], sql: Mapping[str, str]) -> None:
        self.conn = conn
        self._sql = sql
        self.statement_commits = False

    def clock(self, now: datetime | None) -> datetime | None:
        if now is not None and now.tzinfo is None:
            raise ValueError("now must be a timezone-aware datetime")
        return now

    def _execute(
        self, cur: Cursor[Any], name: str, params: Mapping[str, Any], *, binary: bool = False
    ) -> None:
        conn = self.conn
        prepare, planned = plan_once(conn, name)
        if planned is None:
            cur.execute(self._sql[name], params, binary=binary, prepare=prepare)
            return
        conn.execute(self._sql["plans_by_index"])
        try:
            cur.execute(self._sql[name], params, binary=binary, prepare=True)
        finally:  # a transaction that failed undoes the setting as it rolls back
            if not conn.broken and conn.info.transaction_status != TransactionStatus.INERROR:
                conn.execute(self._sql["plans_reset"])
        conn.index_planned = planned | {name}  # type: ignore[attr-defined]

    def all(self, name: str, /, **params: Any) -> list[Row]:
        with self.conn.cursor(row_factory=dict_row) as cur:
            self._execute(cur, name, params)
            if cur.description is None:
                return []
            return list(cur.fetchall())

    def one(self, name: str, /, **params: Any) -> Row | None:
        rows = self.all(name, **params)
        return rows[0] if rows else None

    def table(self, name: str, /, **params: Any) -> tuple[list[str], list[Sequence[Any]]]:
        with self.conn.cursor(row_factory=tuple_row) as cur:
            self._execute(cur, name, params, binary=name in BINARY_RESULTS)
            description = cur.description  # built anew at each call: 20 µs for a job's columns
            if description is None:
                return [], []
            return [column.name for column in description], list(cur.fetchall())

    def batch(self, name: str, rows: Sequence[Mapping[str, Any]], /, **common: Any) -> list[Row]:
        if not rows:
            return []
        return self.all(name, **array_columns(rows), **common)

    def batch_table(
        self, name: str, rows: Sequence[Mapping[str, Any]], /, **common: Any
    ) -> tuple[list[str], list[Sequence[Any]]]:
        if not rows:
            return [], []
        return self.table(name, **array_columns(rows), **common)

    def batch_count(self, name: str, rows: Sequence[Mapping[str, Any]], /, **common: Any) -> int:
        if not rows:
            return 0
        columns = array_columns(rows)
        with self.conn.cursor() as cur:
            self._execute(cur, name, {**columns, **common})
            return int(cur.rowcount)

    def columns_count(
        self, name: str, columns: Mapping[str, Sequence[Any]], /, **common: Any
    ) -> int:
        arrays = {key: array_literal(list(values)) for key, values in columns.items()}
        with self.conn.cursor() as cur:
            self._execute(cur, name, {**arrays, **common})
            return int(cur.rowcount)

    def script(self, sql: str) -> None:
        self.conn.execute(sql.encode("utf-8"))
