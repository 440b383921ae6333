"""The SQLite driver: one database file shared by every process on one machine.

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

import logging
import math
import os
import sqlite3
import threading
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from datetime import UTC, datetime
from typing import Any

from plunder import errors, payload
from plunder.model import SUSPECT_LOSSES
from plunder.store import queries
from plunder.store.driver import CLAIM_LEVELS, Claimed, Row, Tx
from plunder.store.sqlite import adapted
from plunder.store.sqlite.files import check_local, parse_url
from plunder.store.sqlite.notifications import SqliteNotifications
from plunder.store.sqlite.tx import CallerTx, SqliteTx

log = logging.getLogger("plunder.store")
BUSY_CODES = frozenset({sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED})
FULL_CODES = frozenset({sqlite3.SQLITE_FULL, sqlite3.SQLITE_IOERR_WRITE})


def _autocommits(conn: sqlite3.Connection) -> bool:
    """Whether ``conn`` commits each statement by itself (begins no transaction of its
    own): ``isolation_level=None`` under sqlite3's default transaction control, or
    ``autocommit=True`` (Python 3.12+)."""
    mode = getattr(conn, "autocommit", -1)  # sqlite3.LEGACY_TRANSACTION_CONTROL is -1
    if mode is True or mode is False:
        return mode
    return conn.isolation_level is None


_orphans: list[sqlite3.Connection] = []  # inherited across fork: kept, never used or closed


class SqliteDriver:
    """A SQLite file as plunder.store.driver.Driver: its connections (one per thread),
    transactions, conversions, errors, and its claim walk."""

    dialect = "sqlite"
    notifies = False  # no NOTIFY: waiters watch the file (see SqliteNotifications)
    insert_runs = 4  # see Driver.insert_runs
    numbers_jobs = True  # writers take turns: an enqueue knows the ids it inserts
    caches_plans = False  # a statement is planned as it is prepared
    vacuums = False  # an update or delete takes its index entries out at once

    def __init__(self, url: str, *, busy_timeout: float = 5.0, create: bool = True) -> None:
        self.url = url
        self.queries = queries.load(self.dialect)
        self.retired = False
        self.create = create  # False: a missing file is refused, not created empty
        self.path, settings = parse_url(url)
        self.synchronous = settings["synchronous"]
        self.busy_timeout = busy_timeout
        check_local(self.path)
        self._local = threading.local()
        self._lock = threading.Lock()
        self._all: list[sqlite3.Connection] = []
        # connections in use by their thread (how many times over), and those close()
        # left to be closed by that thread once done with them
        self._using: dict[sqlite3.Connection, int] = {}
        self._closing: set[sqlite3.Connection] = set()
        self._pid = os.getpid()

    def connection(self) -> sqlite3.Connection:
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
            # a workflow's skipped child settles its own children (plunder_jobs_settle)
            conn.execute("PRAGMA recursive_triggers=ON")
        except sqlite3.Error as exc:
            conn.close()
            translated = self.translate(exc) or errors.StoreError(str(exc))
            raise translated from exc
        if str(mode).lower() != "wal":
            conn.close()
            raise errors.StoreUnavailable(f"{self.path}: could not switch to WAL (got {mode})")
        return conn

    @contextmanager
    def migrating(self) -> Iterator[None]:
        """Migrations run with foreign-key enforcement off on this thread's connection: a
        migration that rebuilds a table (SQLite cannot alter a CHECK, see 0008) drops the
        old one, and with enforcement on that drop first deletes every row that refers to
        it (runs and events, ON DELETE CASCADE). A rebuild keeps every id, so every
        reference still holds. The pragma cannot change inside a transaction, hence here,
        around the migration's, on the connection the engine's read of the schema version
        opened."""
        conn = self.connection()
        conn.execute("PRAGMA foreign_keys=OFF")
        try:
            yield
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
    def transaction(self, *, write: bool, single: bool = False) -> Iterator[SqliteTx]:
        begin = "BEGIN IMMEDIATE" if write else "BEGIN"
        with self._used() as conn, _committed(conn, begin, SqliteTx(conn, self.queries)) as tx:
            yield tx

    @contextmanager
    def _used(self) -> Iterator[sqlite3.Connection]:
        """This thread's connection, for a while: a close() meanwhile (from another thread:
        a halted worker's store closes while its janitor still ends its lease) closes it
        once this thread is done with it, not under it, which could crash the process."""
        while True:
            conn = self.connection()
            with self._lock:
                if conn in self._all:  # else closed since: this thread opens another
                    self._using[conn] = self._using.get(conn, 0) + 1
                    break
        try:
            yield conn
        finally:
            with self._lock:
                left = self._using.pop(conn) - 1
                if left:
                    self._using[conn] = left
                doomed = not left and conn in self._closing
                if doomed:
                    self._closing.discard(conn)
            if doomed:
                conn.close()

    @contextmanager
    def transaction_on(self, conn: Any) -> Iterator[SqliteTx]:
        with _committed(conn, "BEGIN IMMEDIATE", self._caller_tx(conn)) as tx:
            yield tx

    @contextmanager
    def joined(self, conn: Any) -> Iterator[SqliteTx]:
        """In the transaction open on the caller's connection, holding the write lock
        before the caller's operation reads anything (an enqueue reads the next id, then
        inserts: between a read and the lock, another writer could commit). On a connection
        in autocommit, in a transaction of its own there. On one in sqlite3's default mode
        with none open yet, in the transaction it would have begun at our first write:
        begun here, and left open for the caller to commit or roll back."""
        if adapted.is_adapted(conn):  # an async SQLAlchemy connection's, in its run_sync
            conn = adapted.SqliteView(conn)
        tx = self._caller_tx(conn)
        if not conn.in_transaction and _autocommits(conn):
            with self.transaction_on(conn) as own:
                yield own
            return
        if conn.in_transaction:
            tx.one("write_lock")  # a no-op where it holds the lock already
        else:
            conn.execute("BEGIN IMMEDIATE")
        yield tx

    def _caller_tx(self, conn: Any) -> SqliteTx:
        if not isinstance(conn, sqlite3.Connection | adapted.SqliteView):
            raise TypeError(f"conn must be a sqlite3.Connection, not {type(conn).__name__}")
        return CallerTx(conn, self.queries)  # type: ignore[arg-type]  # a view acts as one

    def statement_alone(self, name: str) -> None:
        try:
            # this thread's connection commits each statement (isolation_level=None)
            self.connection().execute(self.queries[name])
        except sqlite3.Error as exc:
            raise (self.translate(exc) or errors.StoreError(f"{self.url}: {exc}")) from exc

    def task_transaction(self) -> AbstractContextManager[SqliteTx]:
        return self.transaction(write=True)

    def translate(self, exc: Exception) -> Exception | None:
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

    def claim_rows(
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
        of jobs due later, nor with other queues'. The best of what was found, with at most
        one suspect (the first in claim order), while their costs fit ``limit`` slots
        (``_picked``), are claimed by ``job_claim_many``."""
        walk = {
            "session_id": session_id,
            "tasks": self.list_in(tasks),
            "take_suspect": take_suspect,
            "suspect_losses": SUSPECT_LOSSES,
            "now": clock,
        }
        found: list[Row] = []
        for queue in queues:
            found += _walk(tx, queue, limit, walk)
        if len(queues) > 1:
            found.sort(key=lambda row: (-row["priority"], row["run_at"], row["id"]))
        ids = _picked(found[:limit], limit)
        claimed: Claimed = ([], [])
        if ids:
            claimed = tx.table(
                "job_claim_many", ids=self.list_in(ids), session_id=session_id, now=clock
            )
        names, rows = claimed
        free = limit - sum(row[names.index("cost")] for row in rows) if rows else limit
        tx.all("session_free", session_id=session_id, free_slots=free, now=clock)
        return claimed

    def next_due(self, tx: Tx, queues: list[str], tasks: list[str], clock: Any) -> float | None:
        """A loop, as the claim's (``claim_rows``): for each queue, its priority levels
        best first (``job_claim_level``) and the earliest job of a served task in each
        (``job_next_due_level``, one probe); below the CLAIM_LEVELS-th level, the rest of
        the queue in one walk (``job_next_due_rest``)."""
        names = self.list_in(tasks)
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

    def time(self, value: Any) -> datetime:
        return datetime.fromtimestamp(float(value), UTC)

    def list_in(self, values: Sequence[Any]) -> str:
        return payload.encode(list(values), what="list")

    def list_out(self, value: Any) -> list[str]:
        return list(payload.decode(value) or [])

    def calls_cut(self, reason: str, *, final: bool = False) -> int:
        return 0  # nothing to cut: no network between this process and the file

    def commit_lost(self, exc: BaseException | None) -> bool:
        return False  # a local file: COMMIT answers, or the process is gone

    def _refuse_if_retired(self) -> None:
        if self.retired:
            raise errors.StoreUnavailable(f"{self.url}: this store was closed for good")

    def limited(
        self,
        *,
        call_timeout: float | None,
        idle_timeout: float | None,
        application_name: str | None = None,
    ) -> SqliteDriver:
        """Itself: a local file's calls have no deadlines to keep, nor names."""
        return self

    def retire(self) -> None:
        self.retired = True
        self.close()

    def close(self) -> None:
        with self._lock:
            connections, self._all = self._all, []
            self._local = threading.local()
            used = {conn for conn in connections if conn in self._using}
            self._closing |= used  # closed by their threads, once done (see _used)
        for conn in connections:
            if conn not in used:
                conn.close()


@contextmanager
def _committed(conn: Any, begin: str, tx: SqliteTx) -> Iterator[SqliteTx]:
    """``tx``, in a transaction on ``conn`` that ``begin`` starts: committed at the end, or
    rolled back. COMMIT can fail and leave the transaction open (a deferred foreign key of
    the caller's own writes, BUSY, a full disk): rolled back then too, or the connection
    keeps the write lock and every later transaction on it fails."""
    conn.execute(begin)
    try:
        yield tx
        conn.execute("COMMIT")
    except BaseException:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise


def _walk(tx: Tx, queue: str, limit: int, walk: dict[str, Any]) -> list[Row]:
    """Up to ``limit`` jobs of ``queue`` due now, in claim order (see
    ``SqliteDriver.claim_rows``)."""
    found: list[Row] = []
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
    return found


def _picked(rows: list[Row], slots: int) -> list[int]:
    """The ids of ``rows`` to claim: all but the suspects after the first, in claim order
    while their costs fit ``slots``; the first that does not fit ends the claim (decision
    0019)."""
    ids: list[int] = []
    suspect = False
    taken = 0
    for row in rows:
        if row["losses"] >= SUSPECT_LOSSES:
            if suspect:
                continue
            suspect = True
        if taken + row["cost"] > slots:
            break
        taken += row["cost"]
        ids.append(row["id"])
    return ids
