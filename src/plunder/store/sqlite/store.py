"""The SQLite store: one database file shared by every process on one machine.

* WAL journal, so readers never block the writer and the writer never blocks readers.
* Every write transaction starts with ``BEGIN IMMEDIATE``: it takes the write lock up front.
  A deferred transaction that reads first and upgrades later gets SQLITE_BUSY at once,
  whatever the busy timeout, which is how naive SQLite queues leak "database is locked".
* ``synchronous=FULL`` by default: an enqueue that returned survives power loss.
  ``?synchronous=NORMAL`` is faster and still safe against a crashed process, but the last
  transactions before a power cut or kernel crash may be lost.
* One connection per thread (used only by that thread), opened lazily; a forked child
  never touches its parent's connections (SQLite forbids carrying one across ``fork``).
* A file on a network filesystem is refused: WAL needs shared memory on one host.
"""

from __future__ import annotations

import functools
import itertools
import logging
import math
import operator
import os
import re
import sqlite3
import threading
import time
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import parse_qs, urlsplit

from plunder import errors, payload
from plunder.model import SUSPECT_LOSSES
from plunder.store import queries
from plunder.store.engine import Tx
from plunder.store.sqlbase import CLAIM_LEVELS, Claimed, Row, SQLStore

log = logging.getLogger("plunder.store")
SYNCHRONOUS = ("FULL", "NORMAL", "EXTRA")
NETWORK_FILESYSTEMS = frozenset(
    {
        "nfs",
        "nfs4",
        "cifs",
        "smb3",
        "smbfs",
        "9p",
        "afs",
        "ceph",
        "glusterfs",
        "lustre",
        "fuse.sshfs",
        "fuse.s3fs",
        "fuse.rclone",
        "fuse.gcsfuse",
        "davfs",
    }
)
BUSY_CODES = frozenset({sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED})
FULL_CODES = frozenset({sqlite3.SQLITE_FULL, sqlite3.SQLITE_IOERR_WRITE})

T = TypeVar("T")


def _autocommits(conn: sqlite3.Connection) -> bool:
    """Whether ``conn`` commits each statement by itself (begins no transaction of its
    own): ``isolation_level=None`` under sqlite3's default transaction control, or
    ``autocommit=True`` (Python 3.12+)."""
    mode = getattr(conn, "autocommit", -1)  # sqlite3.LEGACY_TRANSACTION_CONTROL is -1
    if mode is True or mode is False:
        return mode
    return conn.isolation_level is None


_orphans: list[sqlite3.Connection] = []  # inherited across fork: kept, never used or closed


def parse_url(url: str) -> tuple[Path, dict[str, str]]:
    """``sqlite:///relative.db``, ``sqlite:////absolute/path.db``, optional
    ``?synchronous=NORMAL``."""
    parts = urlsplit(url)
    if parts.scheme != "sqlite" or parts.netloc:
        raise errors.ConfigError(f"not a SQLite URL: {url!r} (use sqlite:///path/to/file.db)")
    path = parts.path[1:] if parts.path.startswith("/") else parts.path
    if not path or path == ":memory:":
        raise errors.ConfigError(
            f"{url!r} names no file; plunder needs a database file that every worker process "
            "can open (e.g. sqlite:///plunder.db)"
        )
    options = {key: values[-1] for key, values in parse_qs(parts.query).items()}
    unknown = set(options) - {"synchronous"}
    if unknown:
        raise errors.ConfigError(f"unknown SQLite URL option(s): {', '.join(sorted(unknown))}")
    sync = options.get("synchronous", "FULL").upper()
    if sync not in SYNCHRONOUS:
        raise errors.ConfigError(f"synchronous must be one of {', '.join(SYNCHRONOUS)}")
    options["synchronous"] = sync
    return Path(path), options


def filesystem_type(path: Path, mounts: str | None = None) -> str | None:
    """The type of the filesystem holding ``path``, from /proc/mounts (None if unknown)."""
    if mounts is None:
        try:
            mounts = Path("/proc/mounts").read_text(encoding="utf-8")
        except OSError:
            return None
    target = str(path.resolve())
    best, best_type = "", None
    for line in mounts.splitlines():
        fields = line.split()
        if len(fields) < 3:
            continue
        point = fields[1].replace("\\040", " ")
        inside = target == point or target.startswith(point.rstrip("/") + "/")
        if inside and len(point) >= len(best):
            best, best_type = point, fields[2]
    return best_type


def check_local(path: Path, mounts: str | None = None) -> None:
    kind = filesystem_type(path.parent if not path.exists() else path, mounts)
    if kind in NETWORK_FILESYSTEMS:
        raise errors.ConfigError(
            f"{path} is on a network filesystem ({kind}); SQLite's WAL mode needs a local "
            "disk. Put the file on a local disk, or use PostgreSQL for workers on many machines"
        )


def _returning(sql: Mapping[str, str]) -> frozenset[str]:
    return frozenset(name for name, text in sql.items() if "RETURNING" in text.upper())


_RETURNING = _returning(queries.load("sqlite"))


class _Tx:
    statement_commits = False  # always in a transaction: BEGIN IMMEDIATE, then COMMIT

    def __init__(self, conn: sqlite3.Connection, sql: Mapping[str, str]) -> None:
        self.conn = conn
        self._sql = sql
        self._now: float | None = None

    def clock(self, now: datetime | None) -> float:
        if now is not None:
            return _epoch(now)
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


class _CallerTx(_Tx):
    """A transaction on the caller's own connection: rows are read through cursors of its
    own, so the caller's ``row_factory`` is neither changed nor relied on."""

    def _cursor(self) -> sqlite3.Cursor:
        cur = self.conn.cursor()
        cur.row_factory = sqlite3.Row
        return cur

    def clock(self, now: datetime | None) -> float:
        if now is not None:
            return _epoch(now)
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


def _epoch(value: datetime) -> float:
    if value.tzinfo is None:
        raise ValueError("now must be a timezone-aware datetime")
    return value.timestamp()


POLL_STEP = 0.005  # seconds between PRAGMA data_version reads while waiting


class SqliteNotifications:
    """SQLite has no NOTIFY. A dedicated connection reads ``PRAGMA data_version`` every few
    milliseconds: it changes whenever another connection commits, so any change reports
    ``("*", "")`` ("something changed; re-check"). The read touches no table and takes
    microseconds. The connection also carries the owner's heartbeats."""

    def __init__(self, open_connection: Any, *, listen: bool) -> None:
        self._open = open_connection
        self.listen = listen
        self._conn: sqlite3.Connection | None = None
        self._version: int | None = None

    @property
    def connection(self) -> sqlite3.Connection:
        if self._conn is None:
            self._conn = self._open()
        return self._conn

    @contextmanager
    def connection_for(self, timeout: float | None) -> Iterator[sqlite3.Connection]:
        """A local file has no peer that can hang; SQLite's busy timeout bounds the wait
        for its lock."""
        yield self.connection

    def _data_version(self) -> int:
        return int(self.connection.execute("PRAGMA data_version").fetchone()[0])

    def wait(
        self, timeout: float, channels: Collection[str] | None = None
    ) -> list[tuple[str, str]]:
        """Up to ``timeout`` seconds. Any commit says "re-check" to every channel, so
        ``channels`` changes nothing here."""
        if not self.listen:
            time.sleep(timeout)
            return []
        deadline = time.monotonic() + timeout
        try:
            if self._version is None:
                self._version = self._data_version()
                return [("*", "")]
            while True:
                version = self._data_version()
                if version != self._version:
                    self._version = version
                    return [("*", "")]
                left = deadline - time.monotonic()
                if left <= 0:
                    return []
                time.sleep(min(POLL_STEP, left))
        except sqlite3.Error as exc:
            log.warning("data_version poll failed (%s); reopening", exc)
            self.close()
            time.sleep(min(timeout, 0.5))
            return []

    def interrupt(self) -> None:
        """Nothing to do: a wait looks again every POLL_STEP, and reports the commit that
        gave a waiter its reason to interrupt."""

    def close(self) -> None:
        conn, self._conn = self._conn, None
        self._version = None
        if conn is not None:
            conn.close()


class SqliteStore(SQLStore):
    dialect = "sqlite"
    numbers_jobs = True  # writers take turns: an enqueue knows the ids it inserts

    def __init__(
        self, url: str, *, busy_timeout: float = 5.0, create: bool = True, **options: Any
    ) -> None:
        super().__init__(**options)
        self.url = url
        self.create = create  # False: a missing file is refused, not created empty
        self.path, settings = parse_url(url)
        self.synchronous = settings["synchronous"]
        self.busy_timeout = busy_timeout
        check_local(self.path)
        self._local = threading.local()
        self._lock = threading.Lock()
        self._all: list[sqlite3.Connection] = []
        self._pid = os.getpid()

    def _connection(self) -> sqlite3.Connection:
        if os.getpid() != self._pid:
            self._after_fork()
        conn: sqlite3.Connection | None = getattr(self._local, "conn", None)
        if conn is None:
            self._refuse_if_retired()
            conn = self._open()
            self._local.conn = conn
            with self._lock:
                self._all.append(conn)
        return conn

    def _after_fork(self) -> None:
        with self._lock:
            _orphans.extend(self._all)
            self._all = []
            self._local = threading.local()
            self._pid = os.getpid()

    def _open(self) -> sqlite3.Connection:
        # mode=rw opens an existing file only: no window between a check and the open
        target = self.path if self.create else f"{self.path.absolute().as_uri()}?mode=rw"
        try:
            conn = sqlite3.connect(
                target,
                uri=not self.create,
                timeout=self.busy_timeout,
                isolation_level=None,
                check_same_thread=False,
                cached_statements=256,
            )
        except sqlite3.Error as exc:
            if not self.create and not self.path.exists():
                raise errors.StoreUnavailable(
                    f"no database at {self.path.absolute()} (run 'plunder init' or pass --db)"
                ) from exc
            raise errors.StoreUnavailable(f"cannot open {self.path}: {exc}") from exc
        conn.row_factory = sqlite3.Row
        try:
            mode = conn.execute("PRAGMA journal_mode=WAL").fetchone()[0]
            conn.execute(f"PRAGMA synchronous={self.synchronous}")
            conn.execute("PRAGMA foreign_keys=ON")
        except sqlite3.Error as exc:
            conn.close()
            translated = self._translate(exc) or errors.StoreError(str(exc))
            raise translated from exc
        if str(mode).lower() != "wal":
            conn.close()
            raise errors.StoreUnavailable(f"{self.path}: could not switch to WAL (got {mode})")
        return conn

    def migrate(self, *, fresh_schema: bool = True) -> int:
        """Migrations run with foreign-key enforcement off on this thread's connection: a
        migration that rebuilds a table (SQLite cannot alter a CHECK, see 0008) drops the
        old one, and with enforcement on that drop first deletes every row that refers to
        it (runs and events, ON DELETE CASCADE). A rebuild keeps every id, so every
        reference still holds. The pragma cannot change inside a transaction, hence here,
        around the migration's, on the connection an empty read transaction opened (with
        the store's retries when the file is busy)."""
        self._run(lambda tx: None, write=False)
        conn = self._connection()
        conn.execute("PRAGMA foreign_keys=OFF")
        try:
            return super().migrate(fresh_schema=fresh_schema)
        finally:
            conn.execute("PRAGMA foreign_keys=ON")

    def notifications(
        self, *, listen: bool, application_name: str, statement_timeout: float | None = None
    ) -> SqliteNotifications:
        """A dedicated connection that notices other connections' commits (and carries the
        owner's heartbeats). ``application_name`` and ``statement_timeout`` are PostgreSQL
        settings with no SQLite equivalent."""
        return SqliteNotifications(self._open, listen=listen)

    @contextmanager
    def _transaction(self, *, write: bool, single: bool = False) -> Iterator[_Tx]:
        conn = self._connection()
        conn.execute("BEGIN IMMEDIATE" if write else "BEGIN")
        try:
            yield _Tx(conn, self.queries)
            # COMMIT can fail and leave the transaction open (a deferred foreign key of the
            # caller's own writes, BUSY, a full disk): roll back, or this thread's connection
            # keeps the write lock and every later transaction on it fails.
            conn.execute("COMMIT")
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise

    @contextmanager
    def _transaction_on(self, conn: Any) -> Iterator[_Tx]:
        tx = self._joined(conn)
        conn.execute("BEGIN IMMEDIATE")
        try:
            yield tx
            conn.execute("COMMIT")
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise

    def _run_joined(self, op: Callable[[Tx], T], conn: Any) -> T:
        """In the transaction open on the caller's connection, holding the write lock
        before ``op`` reads anything (an enqueue reads the next id, then inserts: between
        a read and the lock, another writer could commit). On a connection in autocommit,
        in a transaction of its own there. On one in sqlite3's default mode with none open
        yet, in the transaction it would have begun at our first write: begun here, and
        left open for the caller to commit or roll back."""
        if not isinstance(conn, sqlite3.Connection):
            return super()._run_joined(op, conn)
        if not conn.in_transaction and _autocommits(conn):
            return self._run_on(op, conn)

        def locked(tx: Tx) -> T:
            if conn.in_transaction:
                tx.one("write_lock")  # a no-op where it holds the lock already
            else:
                conn.execute("BEGIN IMMEDIATE")
            return op(tx)

        return super()._run_joined(locked, conn)

    def _joined(self, conn: Any) -> _Tx:
        if not isinstance(conn, sqlite3.Connection):
            raise TypeError(f"conn must be a sqlite3.Connection, not {type(conn).__name__}")
        return _CallerTx(conn, self.queries)

    def _translate(self, exc: Exception) -> Exception | None:
        if not isinstance(exc, sqlite3.Error):
            return None
        code = getattr(exc, "sqlite_errorcode", None)
        primary = None if code is None else code & 0xFF
        message = f"{self.path}: {exc}"
        if primary in BUSY_CODES:
            return errors.StoreBusy(message)
        if code in FULL_CODES or primary == sqlite3.SQLITE_FULL:
            return errors.StoreFull(message)
        if "no such table: plunder_" in str(exc):
            return errors.SchemaError(f"{self.path} has no plunder schema; run `plunder init`")
        if primary == sqlite3.SQLITE_CANTOPEN:
            return errors.StoreUnavailable(message)
        return errors.StoreError(message)

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
        """SQLite has no LATERAL join, so the walk that PostgreSQL's claim does in one
        statement is a loop here, of statements that cost no round trip (the file is local,
        and the transaction holds the write lock): for each queue, its priority levels best
        first (``job_claim_level``), and in each level the jobs due now, up to what is still
        missing (``job_claim_walk``); below the CLAIM_LEVELS-th level, the rest of the
        queue in one walk (``job_claim_rest``). What it reads does not grow with the number
        of jobs due later, nor with other queues'. The best ``limit`` of what was found,
        with at most one suspect (the first in claim order), are claimed by
        ``job_claim_many``."""
        walk = {
            "session_id": session_id,
            "tasks": self._list_in(tasks),
            "take_suspect": take_suspect,
            "suspect_losses": SUSPECT_LOSSES,
            "now": clock,
        }
        found: list[Row] = []
        for queue in queues:
            missing, below = limit, math.inf
            for _ in range(CLAIM_LEVELS):
                level = tx.one("job_claim_level", queue=queue, below=below)
                if level is None:
                    break
                below = level["priority"]
                rows = tx.all("job_claim_walk", queue=queue, priority=below, limit=missing, **walk)
                found += rows
                missing -= len(rows)
                if not missing:
                    break
            else:  # as many levels as a claim probes, and still short: the rest in one walk
                found += tx.all("job_claim_rest", queue=queue, below=below, limit=missing, **walk)
        if len(queues) > 1:
            found.sort(key=lambda row: (-row["priority"], row["run_at"], row["id"]))
        ids: list[int] = []
        suspect = False
        for row in found[:limit]:
            if row["losses"] >= SUSPECT_LOSSES:
                if suspect:
                    continue
                suspect = True
            ids.append(row["id"])
        if not ids:
            return [], []
        return tx.table("job_claim_many", ids=self._list_in(ids), session_id=session_id, now=clock)

    def _next_due(self, tx: Tx, queues: list[str], tasks: list[str], clock: Any) -> float | None:
        """A loop, as the claim's (``_claim_rows``): for each queue, its priority levels
        best first (``job_claim_level``) and the earliest job of a served task in each
        (``job_next_due_level``, one probe); below the CLAIM_LEVELS-th level, the rest of
        the queue in one walk (``job_next_due_rest``)."""
        names = self._list_in(tasks)
        earliest = math.inf
        for queue in queues:
            below = math.inf
            for _ in range(CLAIM_LEVELS):
                level = tx.one("job_claim_level", queue=queue, below=below)
                if level is None:
                    break
                below = level["priority"]
                row = tx.one(
                    "job_next_due_level", queue=queue, priority=below, tasks=names, now=clock
                )
                if row is not None:
                    earliest = min(earliest, float(row["run_at"]))
            else:
                row = tx.one("job_next_due_rest", queue=queue, below=below, tasks=names, now=clock)
                if row is not None and row["run_at"] is not None:
                    earliest = min(earliest, float(row["run_at"]))
        return None if earliest == math.inf else earliest - clock

    def _time(self, value: Any) -> datetime:
        return datetime.fromtimestamp(float(value), UTC)

    def _list_in(self, values: Sequence[Any]) -> str:
        return payload.encode(list(values), what="list")

    def _list_out(self, value: Any) -> list[str]:
        return list(payload.decode(value) or [])

    def calls_cut(self, reason: str) -> int:
        return 0  # nothing to cut: no network between this process and the file

    def job_stats_refresh(self) -> bool:
        # nothing to refresh: SQLite plans a statement as it prepares it, by the statistics
        # of the moment, and caches no plan made for a table that has grown since
        return False

    def close(self) -> None:
        with self._lock:
            connections, self._all = self._all, []
            self._local = threading.local()
        for conn in connections:
            conn.close()
