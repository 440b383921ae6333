"""One statement of plunder's sent ahead on a psycopg connection through libpq's pipeline
mode, on psycopg's public libpq wrapper (``psycopg.pq``) alone.

psycopg's own ``Pipeline.sync()`` waits for every statement sent, so a turn's answer could
not be read while the turn after it still runs. Here each turn goes out as its commands and
a Sync, flushed at once; its answer is read up to its own Sync, never further:

```
 send(N):   [SET ...; Parse] Bind/Execute [; RESET ...] Sync ── flushed
 read(N):   results of N's commands, then N's PIPELINE_SYNC ── N+1's are left unread
```

Parameters go as text, results come back binary and are read by psycopg's loader for
each column's type (its public adapters API).
"""

from __future__ import annotations

import functools
import re
import select
import weakref
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from itertools import repeat
from typing import Any

import psycopg
from psycopg import pq
from psycopg.errors import lookup
from psycopg.pq.abc import PGresult

from plunder.store.postgres.tx import array_literal

_PLACEHOLDER = re.compile(r"%\(([a-z_][a-z0-9_]*)\)s|%%|%")
_BINARY = pq.Format.BINARY
_ST = pq.ExecStatus


@functools.cache
def numbered(sql: str) -> tuple[str, tuple[str, ...]]:
    """``sql`` with its ``%(name)s`` placeholders as ``$1..$n`` (one number per name, in
    the order names first appear) and ``%%`` as ``%``; and the names in number order."""
    names: dict[str, int] = {}

    def number(match: re.Match[str]) -> str:
        name = match.group(1)
        if name is None:
            if match.group(0) == "%":
                raise ValueError(f"a lone % in a query at {match.start()}: write %% for one")
            return "%"
        return f"${names.setdefault(name, len(names) + 1)}"

    return _PLACEHOLDER.sub(number, sql), tuple(names)


def text_value(value: Any) -> str | None:
    """A parameter's text as PostgreSQL reads it (the statement casts or infers its type)."""
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, bool):
        return "t" if value else "f"
    if isinstance(value, int | float):
        return str(value)
    if isinstance(value, list | tuple):
        return array_literal(list(value)) if value else "{}"
    raise TypeError(f"a turn parameter cannot be a {type(value).__name__}: {value!r}")


@dataclass(frozen=True)
class Statement:
    """A query of plunder's, numbered for libpq, prepared under ``name`` where it is."""

    name: str
    sql: bytes
    params: tuple[str, ...]  # the parameters' names, in number order

    @classmethod
    def of(cls, name: str, sql: str) -> Statement:
        text, params = numbered(sql)
        return cls(name, text.encode("utf-8"), params)

    def values(self, params: Mapping[str, Any], encoding: str) -> list[bytes | None]:
        texts = (text_value(params[name]) for name in self.params)
        return [None if text is None else text.encode(encoding) for text in texts]


def error_of(result: PGresult, encoding: str) -> psycopg.Error:
    """The exception psycopg raises for a failed result: the class of its SQLSTATE (an
    OperationalError without one: the connection was lost)."""
    message = result.error_message.decode(encoding, "replace").strip()
    state = (result.error_field(pq.DiagnosticField.SQLSTATE) or b"").decode("ascii", "replace")
    if not state:
        return psycopg.OperationalError(message or "the connection was lost")
    try:
        cls = lookup(state)
    except KeyError:  # a state psycopg has no class for
        error = psycopg.DatabaseError(message)
        error.sqlstate = state
        return error
    return cls(message)


class Wire:
    """A connection's libpq link in pipeline mode, for as long as the caller holds it: no
    psycopg cursor or pipeline touches the connection meanwhile. ``leave`` ends the mode
    before the connection goes back to its pool."""

    def __init__(self, conn: psycopg.Connection[Any]) -> None:
        self.conn = conn
        self.pgconn = conn.pgconn
        self.encoding = conn.info.encoding
        self._queued = 0  # commands queued since the last Sync
        self.pgconn.enter_pipeline_mode()

    def query(self, sql: bytes, values: Sequence[bytes | None] = ()) -> None:
        """Queue a statement, unnamed (its rows binary)."""
        self.pgconn.send_query_params(sql, list(values), result_format=_BINARY)
        self._queued += 1

    def prepare(self, name: bytes, sql: bytes) -> None:
        """Queue the preparing of a statement under ``name`` (parameter types inferred)."""
        self.pgconn.send_prepare(name, sql)
        self._queued += 1

    def execute(self, name: bytes, values: Sequence[bytes | None]) -> None:
        """Queue a run of the statement prepared as ``name`` (its rows binary)."""
        self.pgconn.send_query_prepared(name, list(values), result_format=_BINARY)
        self._queued += 1

    def sync(self) -> int:
        """End the commands queued with a Sync and send them all: the server runs them, one
        implicit transaction, as soon as it has read them. How many commands it ended."""
        self.pgconn.pipeline_sync()
        queued, self._queued = self._queued, 0
        self._flush()
        return queued

    def read(self, commands: int) -> PGresult | None:
        """The results of the oldest ``commands`` commands not read yet, through their
        Sync (see ``sync``): the one that returned rows (None if none did). Raises the
        first error."""
        rows = None
        ended = 0
        while True:
            result = self._next()
            if result is None:  # the end of one command's results
                ended += 1
                if ended > commands:
                    raise psycopg.OperationalError("a turn's answer ended without its Sync")
                continue
            status = result.status
            if status == _ST.PIPELINE_SYNC:
                return rows
            if status == _ST.TUPLES_OK:
                rows = result
            elif status != _ST.COMMAND_OK:
                raise error_of(result, self.encoding)

    def answered(self, timeout: float = 0.0) -> bool:
        """Whether a result has (begun to) come back, waiting ``timeout`` seconds at most:
        reading one would not wait."""
        pgconn = self.pgconn
        if not pgconn.is_busy():
            return True
        return ready(pgconn.socket, timeout=timeout)[0]

    def leave(self) -> bool:
        """End pipeline mode (nothing may be in flight); False if libpq refused."""
        try:
            self.pgconn.exit_pipeline_mode()
        except psycopg.Error:
            return False  # the caller closes the connection instead
        return True

    def _next(self) -> PGresult | None:
        pgconn = self.pgconn
        while pgconn.is_busy():
            ready(pgconn.socket)
            pgconn.consume_input()
        return pgconn.get_result()

    def _flush(self) -> None:
        """Send what libpq holds, reading meanwhile: the server may be answering earlier
        turns, and stops reading ours while its own output is not read."""
        pgconn = self.pgconn
        while pgconn.flush():
            if ready(pgconn.socket, write=True)[0]:
                pgconn.consume_input()


READ = select.POLLIN | select.POLLPRI | select.POLLERR | select.POLLHUP | select.POLLNVAL


def ready(sock: int, *, write: bool = False, timeout: float | None = None) -> tuple[bool, bool]:
    """Wait until ``sock`` can be read (or is broken: reading says how), or, with
    ``write``, written; ``timeout`` seconds at most (None: as long as it takes; the
    call's deadline cuts the connection). (readable, writable). poll(), not select(),
    which cannot watch a descriptor past 1023."""
    poller = select.poll()
    poller.register(sock, select.POLLIN | (select.POLLOUT if write else 0))
    events = poller.poll(None if timeout is None else timeout * 1000)
    readable = any(event & READ for _, event in events)
    return readable, any(event & select.POLLOUT for _, event in events)


Load = Callable[[Any], Any]  # a loader's load: bytes in, a Python value out


@dataclass(frozen=True)
class Shape:
    """A result's columns: their names, and for each the load of psycopg's loader for its
    type (public adapters API), made while its connection was open."""

    names: list[str]
    loads: tuple[Load, ...]

    def rows(self, result: PGresult) -> list[Sequence[Any]]:
        """The result's rows as Python values, read column by column. A value every row
        shares (a claim's queue, task, start) is loaded once."""
        count, get = result.ntuples, result.get_value
        if count == 1:  # an idle worker's claim, most often: the row as it is
            return [tuple(None if (v := get(0, c)) is None else load(v)
                          for c, load in enumerate(self.loads))]  # fmt: skip
        columns: list[Sequence[Any]] = []
        for column, load in enumerate(self.loads):
            raw = list(map(get, range(count), repeat(column, count)))
            first = raw[0] if raw else None
            if raw.count(first) == count:  # one value in every row, or none
                value = None if first is None else load(first)
                if not isinstance(value, list | dict):  # shared by the rows: immutable only
                    columns.append([value] * count)
                    continue
            if None in raw:
                columns.append([None if v is None else load(v) for v in raw])
            else:
                columns.append(list(map(load, raw)))
        return list(zip(*columns, strict=True))


class Shapes:
    """The shape of a binary result, made once per connection and column types (a pipe
    takes its connections from a pool, in turn)."""

    def __init__(self) -> None:
        self._made: weakref.WeakKeyDictionary[
            psycopg.Connection[Any], tuple[tuple[int, ...], Shape]
        ] = weakref.WeakKeyDictionary()

    def of(self, result: PGresult, conn: psycopg.Connection[Any]) -> Shape:
        types = tuple(map(result.ftype, range(result.nfields)))
        made = self._made.get(conn)
        if made is not None and made[0] == types:
            return made[1]
        adapters, encoding = conn.adapters, conn.info.encoding
        loads: list[Load] = []
        for oid in types:
            loader = adapters.get_loader(oid, _BINARY)
            if loader is None:
                raise psycopg.InterfaceError(f"no binary loader for the type of oid {oid}")
            loads.append(loader(oid, conn).load)
        names = [(result.fname(i) or b"").decode(encoding) for i in range(len(types))]
        shape = Shape(names, tuple(loads))
        self._made[conn] = (types, shape)
        return shape
