"""What a dialect's driver gives the shared SQL engine (plunder.store.engine): one open
transaction (Tx), and the driver itself (Driver), which each driver package implements
(plunder.store.sqlite, plunder.store.postgres)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from contextlib import AbstractContextManager
from datetime import datetime
from typing import Any, Protocol

from plunder.store.base import Notifications

Row = Mapping[str, Any]
Now = datetime | None
Claimed = tuple[list[str], list[Sequence[Any]]]  # a claim's column names and rows
# Priority levels of a queue that a claim reads one by one (see job_claim_many): a queue
# with more, a priority used as a score, would cost an index probe per level.
CLAIM_LEVELS = 16


class Tx(Protocol):
    """One open transaction, as the shared code sees it."""

    conn: Any
    # True where each statement is a transaction of its own (see Driver.transaction's
    # ``single``): its answer may be lost after it committed
    statement_commits: bool

    def clock(self, now: Now) -> Any:
        """The value to pass as the ``now`` parameter for this transaction."""
        ...

    def all(self, name: str, /, **params: Any) -> list[Row]: ...

    def one(self, name: str, /, **params: Any) -> Row | None: ...

    def table(self, name: str, /, **params: Any) -> tuple[list[str], list[Sequence[Any]]]:
        """The column names and the rows as plain tuples: cheaper than mappings for the
        hundreds of wide rows of a claim."""
        ...

    def batch(self, name: str, rows: Sequence[Mapping[str, Any]], /, **common: Any) -> list[Row]:
        """Run a batch query over ``rows`` (one statement, or one per row) and return every
        row it returned."""
        ...

    def batch_table(
        self, name: str, rows: Sequence[Mapping[str, Any]], /, **common: Any
    ) -> tuple[list[str], list[Sequence[Any]]]:
        """``batch``, with what it returned as ``table`` gives it: names and plain tuples."""
        ...

    def batch_count(self, name: str, rows: Sequence[Mapping[str, Any]], /, **common: Any) -> int:
        """Run a batch query whose result is a count (see the query's documentation): the
        rows it changed, or the rows it returned."""
        ...

    def columns_count(
        self, name: str, columns: Mapping[str, Sequence[Any]], /, **common: Any
    ) -> int:
        """``batch_count`` over rows given column by column (equal lengths, at least one
        row): the hot path builds its few columns directly instead of a mapping per row."""
        ...

    def script(self, sql: str) -> None:
        """Execute one DDL statement."""
        ...


class Driver(Protocol):
    """A database as the engine sees it: its connections and transactions, the value
    conversions it needs, the classification of its errors, and the few operations each
    dialect does its own way (the claim's walk, the next-due read)."""

    notifies: bool  # whether the database delivers NOTIFY to listeners
    # whether dead row versions keep their index entries until a VACUUM (PostgreSQL; see
    # Maintenance.job_table_vacuum)
    vacuums: bool

    @property
    def dialect(self) -> str: ...

    @property
    def url(self) -> str:
        """The URL the store was opened with, password removed."""
        ...

    @property
    def queries(self) -> Mapping[str, str]:
        """The dialect's named queries, by name."""
        ...

    @property
    def insert_runs(self) -> int:
        """Runs of jobs with the same options an enqueue inserts one statement each,
        before it inserts a batch in one statement with each row's options (see
        enqueue.Inserts)."""
        ...

    @property
    def numbers_jobs(self) -> bool:
        """Whether an enqueue numbers its jobs itself (job_id_next, then each row's id is
        its seq) and reads nothing back, which a database whose writers take turns allows;
        else the database numbers them and the insert returns the rows it stored."""
        ...

    @property
    def caches_plans(self) -> bool:
        """Whether connections keep plans made for the jobs table as it was (see
        Maintenance.job_stats_refresh)."""
        ...

    def statement_alone(self, name: str) -> None:
        """Run the named statement outside any transaction (PostgreSQL's VACUUM cannot run
        in one), without a call deadline; its errors as a transaction's (``translate``)."""
        ...

    def transaction(self, *, write: bool, single: bool = False) -> AbstractContextManager[Tx]:
        """Begin a transaction (SQLite: BEGIN IMMEDIATE for writes), commit on exit.
        ``single``: the caller writes with one statement (reads may follow it), which a
        driver may then run as a transaction of its own."""
        ...

    def transaction_on(self, conn: Any) -> AbstractContextManager[Tx]:
        """A write transaction on the caller's own (autocommit) connection."""
        ...

    def joined(self, conn: Any) -> AbstractContextManager[Tx]:
        """A Tx in the transaction the caller holds open on ``conn`` (taking the write lock
        first where the database needs it), or of its own on a connection that commits
        each statement."""
        ...

    def task_transaction(self) -> AbstractContextManager[Tx]:
        """A task's own write transaction (see Engine.transaction)."""
        ...

    def migrating(self) -> AbstractContextManager[None]:
        """Around the transactions of a migration (SQLite: foreign keys off)."""
        ...

    def translate(self, exc: Exception) -> Exception | None:
        """Map a driver error to a plunder error: a StoreBusy means "retry the whole
        transaction"; None means "not a driver error, let it through"."""
        ...

    def commit_lost(self, exc: BaseException | None) -> bool:
        """Whether ``exc``, raised by COMMIT, leaves it unknown whether the transaction
        committed (a lost connection; not an answer such as a serialization failure)."""
        ...

    def time(self, value: Any) -> datetime: ...

    def list_in(self, values: Sequence[Any]) -> Any: ...

    def list_out(self, value: Any) -> list[str]: ...

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
        """The claim itself, in ``tx``: the column names and the claimed rows."""
        ...

    def next_due(self, tx: Tx, queues: list[str], tasks: list[str], clock: Any) -> float | None:
        """job_next_due's reading in ``tx``: as a claim reads, each queue on its own, one
        priority level at a time (the first CLAIM_LEVELS one by one, the rest in one go),
        and in each level the earliest job of a served task."""
        ...

    def notifications(
        self, *, listen: bool, application_name: str, statement_timeout: float | None = None
    ) -> Notifications:
        """A dedicated connection for wake-ups (and its owner's heartbeats)."""
        ...

    def calls_cut(self, reason: str, *, final: bool = False) -> int:
        """Cut every call in flight (see Store.calls_cut); how many."""
        ...

    def limited(
        self,
        *,
        call_timeout: float | None,
        idle_timeout: float | None,
        application_name: str | None = None,
    ) -> Driver:
        """A driver on this one's connections whose calls keep other deadlines (see
        Store.limited)."""
        ...

    def close(self) -> None:
        """Close every connection this driver opened."""
        ...

    def retire(self) -> None:
        """Close for good: a later call raises StoreUnavailable instead of connecting."""
        ...
