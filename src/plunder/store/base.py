"""The store seam: every state change plunder makes is one of these transactional
operations. Workers, the janitor, the app and the gateway see only this interface.

Conventions every implementation keeps (the contract suite in ``tests/store`` checks them):

* each operation is one transaction, retried as a whole when the database is busy
  (SQLite BUSY/LOCKED, PostgreSQL 40001/40P01, a lost connection) with the fixed-interval
  busy backoff of :mod:`plunder.policy`, up to a bounded total, then :class:`StoreBusy`;
* ``now=None`` means the database's clock; tests pass an aware ``datetime`` instead;
* a worker's write names its claim ``(job_id, attempt, session_id)`` and takes effect only
  while that claim is current and its session alive; a batch reports refused claims in
  :attr:`AckResult.stale`, and single-claim helpers raise :class:`StaleClaim`;
* a janitor's write names its lease and term and raises :class:`StaleLease` under a stale
  one, changing nothing;
* names are noun first; batches end in ``_many``.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from contextlib import AbstractContextManager
from datetime import datetime
from typing import Any, Protocol

from plunder.access import ApiKey
from plunder.model import (
    AckResult,
    Claim,
    Completion,
    Exchange,
    Failure,
    Heartbeat,
    JobPage,
    JobRecord,
    JobSpec,
    Lease,
    QueueStats,
    Run,
    Session,
    StreamEvent,
    SweepResult,
    TaskInfo,
    Unrunnable,
)
from plunder.store.features import Features
from plunder.store.limiting import Now
from plunder.store.turnpipe import TurnPipe


class Notifications(Protocol):
    """Wake-ups from the database on one dedicated connection."""

    listen: bool
    """False when notifications are off (or unavailable): waits are plain sleeps."""

    @property
    def connection(self) -> Any:
        """The dedicated connection (autocommit), reconnected if it was lost."""
        ...

    def connection_for(self, timeout: float | None) -> AbstractContextManager[Any]:
        """The dedicated connection for one call that must end within ``timeout`` seconds
        (None: no deadline): past that the connection is cut (where the driver can), the
        call raises :class:`StoreBusy` and the next use reconnects. The store's
        ``calls_cut()`` ends the call too."""
        ...

    def wait(
        self, timeout: float, channels: Collection[str] | None = None
    ) -> list[tuple[str, str]]:
        """Up to ``timeout`` seconds, listening on ``channels`` (None: all of plunder's);
        ``(channel, payload)`` pairs, where ``("*", "")`` means "something may have
        changed (or notifications were lost): re-check", and ``(channel, "*")`` the same
        for everyone watching that channel (listened on anew)."""
        ...

    def interrupt(self) -> None:
        """End the wait in progress (or the next one) early; callable from any thread."""
        ...

    def close(self) -> None: ...


class Store(Features, Protocol):
    dialect: str
    """``"sqlite"`` or ``"postgres"``."""
    url: str
    """The URL the store was opened with, password removed."""
    notifies: bool
    """Whether state changes are announced with NOTIFY (PostgreSQL) on the channels
    ``plunder_enqueued`` (queue names), ``plunder_done`` and ``plunder_stream`` (job ids)."""

    # -- schema --------------------------------------------------------------------------
    def migrate(self) -> int:
        """Apply pending migrations in order; return the schema version. Safe to race."""
        ...

    def schema_check(self) -> int:
        """Return the schema version; raise SchemaError if it is missing, older than this
        code expects (run ``plunder init``) or newer (upgrade plunder)."""
        ...

    def close(self) -> None: ...

    def limited(
        self,
        *,
        call_timeout: float | None,
        idle_timeout: float | None,
        application_name: str | None = None,
    ) -> Store:
        """This store on the same connections, with other deadlines for its calls: each
        cut after ``call_timeout`` seconds, each transaction ended by the server once idle
        for ``idle_timeout`` and going by ``application_name`` (PostgreSQL; SQLite has
        none of these). A worker's janitor works so, within the worker's connections.
        Closing it closes nothing."""
        ...

    def retire(self) -> None:
        """Close for good: later calls raise StoreUnavailable instead of reconnecting."""
        ...

    def calls_cut(self, reason: str, *, final: bool = False) -> int:
        """Cut every database call this store has in flight, wherever it waits (each
        raises :class:`StoreBusy`, or with ``final`` :class:`StoreUnavailable` and is not
        tried again); return how many. A no-op where calls cannot hang on a peer (SQLite)."""
        ...

    def now(self) -> datetime:
        """The database clock."""
        ...

    # -- producers -----------------------------------------------------------------------
    def job_enqueue_many(
        self, specs: Sequence[JobSpec], *, conn: Any = None, now: Now = None
    ) -> list[JobRecord]:
        """Insert jobs in one transaction and return them in input order.

        A spec whose ``key`` names a pending or running job inserts nothing and returns that
        job. With ``conn`` (the caller's open sqlite3 or psycopg connection) the rows join
        the caller's transaction: nothing is committed here, and nothing is retried.
        """
        ...

    def job_enqueue_ids(
        self, specs: Sequence[JobSpec], *, conn: Any = None, now: Now = None
    ) -> list[int]:
        """:meth:`job_enqueue_many`, answering only each job's id, in input order: what a
        producer's handles need, without building a record per job."""
        ...

    def job_get(self, job_id: int) -> JobRecord:
        """Raise JobNotFound when there is no such job."""
        ...

    def job_cancel(self, job_id: int, *, now: Now = None) -> JobRecord:
        """pending or running -> cancelled (a running attempt's later writes are refused);
        InvalidTransition from any other state."""
        ...

    def job_retry(self, job_id: int, *, now: Now = None) -> JobRecord:
        """failed, timed_out, cancelled or expired -> pending, with one more attempt allowed
        and no start-by deadline."""
        ...

    # -- workers -------------------------------------------------------------------------
    def session_open(
        self,
        *,
        name: str,
        host: str,
        pid: int,
        queues: Sequence[str],
        expiry: float,
        tasks: Sequence[TaskInfo] = (),
        free_slots: int = 0,
        key_id: str | None = None,
        labels: Sequence[str] = (),
        now: Now = None,
        slots: int | None = None,
    ) -> Session:
        """A live session serving ``queues`` and ``tasks`` with ``free_slots`` and
        ``labels``; the tasks published (:meth:`task_get`) in the same transaction, each
        replacing what was published under its name. ``key_id``: its gateway's API key.
        ``slots``: its worker's in all; its claims skip jobs costing more (None: none)."""
        ...

    def session_heartbeat(
        self,
        session_id: str,
        running: Sequence[Claim] = (),
        *,
        free_slots: int | None = None,
        labels: Sequence[str] | None = None,
        now: Now = None,
        conn: Any = None,
    ) -> Heartbeat:
        """Extend the session, record its ``free_slots`` and ``labels`` (None: unchanged):
        a job this session failed is left to another live one with a free slot."""
        ...

    def session_queues(  # joins and leaves, one guarded update (plunder.store.sessions)
        self, session_id: str, *, add: Sequence[str] = (), remove: Sequence[str] = ()
    ) -> Session: ...

    def notifications(
        self, *, listen: bool, application_name: str, statement_timeout: float | None = None
    ) -> Notifications:
        """A dedicated connection for wake-ups; it also carries heartbeats (``conn=``)."""
        ...

    def session_close(
        self,
        session_id: str,
        *,
        lost: bool = False,
        started: Sequence[Claim] = (),
        now: Now = None,
    ) -> list[int]:
        """Delete the session and give its running jobs back at once; return their ids.
        ``started``: claims whose task the worker started and stopped unfinished; their jobs
        with retry_on_lost off end timed_out (plunder.WorkerLost) instead. ``lost=True``
        counts every attempt (the worker lost the session)."""
        ...

    def job_claim_many(
        self,
        session_id: str,
        *,
        queues: Sequence[str],
        tasks: Sequence[str],
        limit: int,
        take_suspect: bool = True,
        now: Now = None,
    ) -> list[JobRecord]:
        """Claim up to ``limit`` pending jobs (priority desc, run_at, id) whose task is in
        ``tasks``; SessionGone if the session is dead. Suspects (``JobRecord.suspect``: lost
        with their worker again and again) are skipped unless ``take_suspect``, and then at
        most one is claimed, so a worker that passes it only while it runs none runs one at
        a time."""
        ...

    def job_complete_many(
        self, completions: Sequence[Completion], *, now: Now = None, conn: Any = None
    ) -> AckResult:
        """Acknowledge finished attempts. A completion with ``effects`` gets a transaction of
        its own in which its writes run after the fence passed. With ``conn`` the plain
        completions join the caller's open transaction."""
        ...

    def transaction(self) -> AbstractContextManager[Any]:
        """A write transaction on a driver connection, for a task's own writes."""
        ...

    def job_exchange_many(
        self,
        completions: Sequence[Completion],
        failures: Sequence[Failure],
        *,
        session_id: str,
        queues: Sequence[str],
        tasks: Sequence[str],
        limit: int,
        take_suspect: bool = True,
        now: Now = None,
    ) -> Exchange:
        """Acknowledge and claim in one transaction (a worker's turn, one commit); claims
        as :meth:`job_claim_many` does."""
        ...

    def turn_pipe(self) -> TurnPipe | None:
        """Turns sent ahead, on a connection the pipe holds until closed; None where this
        store has none (SQLite, a pool of one connection)."""
        ...

    def job_fail_many(self, failures: Sequence[Failure], *, now: Now = None) -> AckResult: ...

    def job_release_many(self, claims: Sequence[Claim], *, now: Now = None) -> AckResult: ...

    def stream_append(
        self,
        claim: Claim,
        events: Sequence[tuple[str, Any]],
        *,
        now: Now = None,
        conn: Any = None,
    ) -> list[int]:
        """Append ``(kind, data)`` events for a running attempt; StaleClaim if not current.
        With ``conn`` (a task's open transaction), in that transaction."""
        ...

    def job_next_due(
        self, *, queues: Sequence[str], tasks: Sequence[str], now: Now = None
    ) -> float | None:
        """Seconds until the earliest pending job for these queues and tasks is due (zero or
        less: due now; None: there is none). What it reads does not grow with other queues'
        jobs, nor with the jobs due later than the earliest of each priority level (the
        first CLAIM_LEVELS levels; below them, the rest of the queue is read in one go)."""
        ...

    # -- janitor -------------------------------------------------------------------------
    def lease_acquire(
        self, name: str, holder: str, ttl: float, *, now: Now = None
    ) -> Lease | None: ...

    def lease_renew(self, lease: Lease, ttl: float, *, now: Now = None) -> Lease: ...

    def lease_release(self, lease: Lease, *, now: Now = None) -> bool: ...

    def lease_get(self, name: str) -> Lease | None: ...

    def session_reap_many(
        self, lease: Lease, *, limit: int = 100, now: Now = None
    ) -> SweepResult: ...

    def job_timeout_many(
        self, lease: Lease, *, limit: int = 500, now: Now = None
    ) -> SweepResult: ...

    def job_expire_many(self, lease: Lease, *, limit: int = 500, now: Now = None) -> SweepResult:
        """Pending jobs past their start-by deadline -> expired (terminal, never run)."""
        ...

    def job_prune_many(
        self, lease: Lease, *, older_than: float, limit: int = 1000, now: Now = None
    ) -> int: ...

    def job_stats_refresh(self) -> bool: ...

    def job_table_vacuum(self) -> bool:
        """The jobs table's dead index entries removed once enough piled up (PostgreSQL:
        a VACUUM); whether it ran one."""
        ...

    # -- reads for people ----------------------------------------------------------------
    def job_list(
        self,
        *,
        queue: str | None = None,
        status: str | None = None,
        task: str | None = None,
        after: int | None = None,
        limit: int = 50,
    ) -> JobPage: ...

    def job_runs(self, job_id: int) -> list[Run]: ...

    def stream_read(
        self, job_id: int, *, after: int = 0, limit: int = 1000
    ) -> list[StreamEvent]: ...

    def session_list(self, *, now: Now = None) -> list[Session]: ...

    def session_get(self, session_id: str) -> Session | None:
        """A session by id, live or expired; None once reaped (or never opened)."""
        ...

    # -- API keys (the gateway's; see plunder.access) ---------------------------------------
    def key_create(
        self,
        *,
        role: str,
        group: str = ...,
        queues: Sequence[str] = (),
        name: str = "",
        expires_in: float | None = None,
        now: Now = None,
    ) -> tuple[ApiKey, str]:
        """A new key and its secret, shown this once (only its hash is stored)."""
        ...

    def key_get(self, key_id: str) -> ApiKey | None: ...

    def key_list(self) -> list[ApiKey]: ...

    def key_revoke(self, key_id: str, *, now: Now = None) -> tuple[ApiKey, list[str]]:
        """Revoke the key and end the live sessions it opened (their ids)."""
        ...

    def queue_groups(self) -> dict[str, str]:
        """The queues that belong to a group other than the default one, with it."""
        ...

    def task_get(self, name: str) -> TaskInfo | None:
        """The task as the last worker serving it published it; None if none ever did."""
        ...

    def task_list(self) -> list[TaskInfo]:
        """Every task a worker ever published, by name."""
        ...

    def job_unrunnable(self, *, now: Now = None) -> list[Unrunnable]:
        """Pending jobs that no live session can run (none lists both their queue and
        their task), counted by task and queue."""
        ...

    def queue_stats(self, *, now: Now = None) -> list[QueueStats]: ...
