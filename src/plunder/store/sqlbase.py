"""The SQL store as one object: the Store protocol (plunder.store.base) over a dialect's
driver, by delegation to the parts it composes.

```
 SQLStore ──▶ Sessions ──▶ Acks, Maintenance
   │      ──▶ Keys
   │      ──▶ Claims ────▶ Acks (and the dialect's turn at once, if any)
   │      ──▶ Enqueue, Reads, Acks, Maintenance
   └──────────────────────▶ Engine ──▶ Driver (plunder.store.sqlite or .postgres)
```

Each operation group holds the engine; the engine holds the driver; no part reaches
another's private members. A driver package builds its store (``SqliteStore``,
``PostgresStore``) as this facade over its own driver.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from datetime import datetime
from typing import Any, Protocol

from plunder import access, policy
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
from plunder.store.acks import Acks
from plunder.store.base import Notifications
from plunder.store.claims import Claims
from plunder.store.driver import Driver, Now
from plunder.store.edges import Edges
from plunder.store.engine import Engine
from plunder.store.enqueue import Enqueue
from plunder.store.fairness import Fairness
from plunder.store.keys import Keys
from plunder.store.limits import Limits
from plunder.store.maintenance import Maintenance
from plunder.store.observing import Observing
from plunder.store.ordering import Ordering
from plunder.store.partitions import Partitions
from plunder.store.pauses import PausedPipe, Pauses
from plunder.store.reads import Reads
from plunder.store.schedules import Schedules
from plunder.store.sessions import Sessions
from plunder.store.sqlfeatures import FeatureOps
from plunder.store.traces import Traces
from plunder.store.turnpipe import TurnPipe

__all__ = ["SQLStore", "Turns"]


class Turns(Protocol):
    """A dialect's own way with a worker's turns: in one statement, and sent ahead."""

    def at_once(
        self,
        plain: list[tuple[Completion, str]],
        session_id: str,
        *,
        queues: Sequence[str],
        tasks: Sequence[str],
        limit: int,
        take_suspect: bool,
        now: Now,
    ) -> Exchange | None:
        """See plunder.store.claims.TurnAtOnce."""
        ...

    def pipe(self) -> TurnPipe | None:
        """Turns sent ahead (see Store.turn_pipe)."""
        ...

    # whether a claim names a fair queue: its turns are not sent ahead (made by the store)
    fair: Callable[[Sequence[str]], bool]


class SQLStore(FeatureOps):
    """Every operation of :class:`plunder.store.base.Store`, delegated to its parts.
    ``turns``: made from the engine and the acknowledgements, where the dialect has its
    own (PostgreSQL)."""

    def __init__(
        self,
        driver: Driver,
        *,
        turns: Callable[[Engine, Acks], Turns] | None = None,
        busy_total: float = policy.BUSY_TOTAL,
        busy_interval: float = policy.BUSY_INTERVAL,
    ) -> None:
        self.driver = driver
        self.dialect = driver.dialect
        self.url = driver.url
        self.engine = Engine(driver, busy_total=busy_total, busy_interval=busy_interval)
        self.acks = Acks(self.engine)
        self.maintenance = Maintenance(self.engine)
        self.turns = None if turns is None else turns(self.engine, self.acks)
        at_once = None if self.turns is None else self.turns.at_once
        self.fairness = Fairness(self.engine)
        self.claims = Claims(self.engine, self.acks, at_once, self.fairness)
        if self.turns is not None:
            self.turns.fair = self.claims.fair
        self.traces = Traces(self.engine)
        self.enqueue = Enqueue(self.engine, self.traces, self.fairness)
        self.reads = Reads(self.engine)
        self.partitions = Partitions(self.engine, self.maintenance)
        self.sessions = Sessions(self.engine, self.acks, self.maintenance, self.partitions)
        self.keys = Keys(self.engine)
        self.limits = Limits(self.engine)
        self.ordering = Ordering(self.engine, self.limits.admit)
        self.schedules = Schedules(self.engine, self.maintenance, self.enqueue, self.partitions)
        self.pauses = Pauses(self.engine)  # paused queues, left out of every claim
        self.observing = Observing(self.engine)  # the dashboard's reads
        self.edges = Edges(self.engine, self.enqueue, self.partitions)  # flow_*, edge_*
        self.borrowed = False  # a limited view's driver is its owner's to close

    @property
    def notifies(self) -> bool:
        return self.driver.notifies

    @notifies.setter
    def notifies(self, value: bool) -> None:
        self.driver.notifies = value

    # -- schema and connections ------------------------------------------------------------
    @property
    def latest_version(self) -> int:
        return self.engine.latest_version

    def migrate(self, *, fresh_schema: bool = True) -> int:
        return self.engine.migrate(fresh_schema=fresh_schema)

    def schema_check(self) -> int:
        return self.engine.schema_check()

    def now(self) -> datetime:
        return self.engine.now()

    def close(self) -> None:
        if not self.borrowed:
            self.driver.close()

    def limited(
        self,
        *,
        call_timeout: float | None,
        idle_timeout: float | None,
        application_name: str | None = None,
    ) -> SQLStore:
        driver = self.driver.limited(
            call_timeout=call_timeout,
            idle_timeout=idle_timeout,
            application_name=application_name,
        )
        engine = self.engine
        view = SQLStore(driver, busy_total=engine.busy_total, busy_interval=engine.busy_interval)
        view.borrowed = True
        return view

    def retire(self) -> None:
        self.driver.retire()

    def calls_cut(self, reason: str, *, final: bool = False) -> int:
        return self.driver.calls_cut(reason, final=final)

    def notifications(
        self, *, listen: bool, application_name: str, statement_timeout: float | None = None
    ) -> Notifications:
        return self.driver.notifications(
            listen=listen, application_name=application_name, statement_timeout=statement_timeout
        )

    def transaction(self) -> AbstractContextManager[Any]:
        return self.engine.transaction()

    def turn_pipe(self) -> TurnPipe | None:
        pipe = None if self.turns is None else self.turns.pipe()
        return None if pipe is None else PausedPipe(pipe, self.pauses)

    # -- producers -----------------------------------------------------------------------
    def job_enqueue_many(
        self, specs: Sequence[JobSpec], *, conn: Any = None, now: Now = None
    ) -> list[JobRecord]:
        routed = self.partitions.route(self.fairness.route(specs, conn=conn), conn=conn)
        return self.enqueue.job_enqueue_many(routed, conn=conn, now=now)

    def job_enqueue_ids(
        self, specs: Sequence[JobSpec], *, conn: Any = None, now: Now = None
    ) -> list[int]:
        routed = self.partitions.route(self.fairness.route(specs, conn=conn), conn=conn)
        return self.enqueue.job_enqueue_ids(routed, conn=conn, now=now)

    def job_cancel(self, job_id: int, *, now: Now = None) -> JobRecord:
        return self.acks.job_cancel(job_id, now=now)

    def job_retry(self, job_id: int, *, now: Now = None) -> JobRecord:
        return self.acks.job_retry(job_id, now=now)

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
        return self.sessions.session_open(
            name=name, host=host, pid=pid, queues=queues, expiry=expiry, tasks=tasks,
            free_slots=free_slots, key_id=key_id, labels=labels, now=now, slots=slots,
        )  # fmt: skip

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
        return self.sessions.session_heartbeat(
            session_id, running, free_slots=free_slots, labels=labels, now=now, conn=conn
        )

    def session_queues(
        self,
        session_id: str,
        *,
        add: Sequence[str] = (),
        remove: Sequence[str] = (),
        now: Now = None,
    ) -> Session:
        return self.sessions.session_queues(session_id, add=add, remove=remove, now=now)

    def session_close(
        self,
        session_id: str,
        *,
        lost: bool = False,
        started: Sequence[Claim] = (),
        now: Now = None,
    ) -> list[int]:
        return self.sessions.session_close(session_id, lost=lost, started=started, now=now)

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
        return self.claims.job_claim_many(
            session_id, queues=self.pauses.unpaused(queues), tasks=tasks, limit=limit,
            take_suspect=take_suspect, now=now,
        )  # fmt: skip

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
        return self.claims.job_exchange_many(
            completions, failures, session_id=session_id,
            queues=self.pauses.unpaused(queues) if limit else queues, tasks=tasks,
            limit=limit, take_suspect=take_suspect, now=now,
        )  # fmt: skip

    def job_complete_many(
        self, completions: Sequence[Completion], *, now: Now = None, conn: Any = None
    ) -> AckResult:
        return self.acks.job_complete_many(completions, now=now, conn=conn)

    def job_fail_many(self, failures: Sequence[Failure], *, now: Now = None) -> AckResult:
        return self.acks.job_fail_many(failures, now=now)

    def job_release_many(self, claims: Sequence[Claim], *, now: Now = None) -> AckResult:
        return self.acks.job_release_many(claims, now=now)

    def stream_append(
        self,
        claim: Claim,
        events: Sequence[tuple[str, Any]],
        *,
        now: Now = None,
        conn: Any = None,
    ) -> list[int]:
        return self.claims.stream_append(claim, events, now=now, conn=conn)

    def job_next_due(
        self, *, queues: Sequence[str], tasks: Sequence[str], now: Now = None
    ) -> float | None:
        queues = self.pauses.unpaused(queues)
        return self.engine.job_next_due(queues=queues, tasks=tasks, now=now) if queues else None

    def trace_get_many(self, job_ids: Sequence[int]) -> dict[int, str]:
        return self.traces.trace_get_many(job_ids)

    # -- janitor -------------------------------------------------------------------------
    def lease_acquire(self, name: str, holder: str, ttl: float, *, now: Now = None) -> Lease | None:
        return self.maintenance.lease_acquire(name, holder, ttl, now=now)

    def lease_renew(self, lease: Lease, ttl: float, *, now: Now = None) -> Lease:
        return self.maintenance.lease_renew(lease, ttl, now=now)

    def lease_release(self, lease: Lease, *, now: Now = None) -> bool:
        return self.maintenance.lease_release(lease, now=now)

    def lease_get(self, name: str) -> Lease | None:
        return self.maintenance.lease_get(name)

    def session_reap_many(self, lease: Lease, *, limit: int = 100, now: Now = None) -> SweepResult:
        return self.maintenance.session_reap_many(lease, limit=limit, now=now)

    def job_timeout_many(self, lease: Lease, *, limit: int = 500, now: Now = None) -> SweepResult:
        return self.maintenance.job_timeout_many(lease, limit=limit, now=now)

    def job_expire_many(self, lease: Lease, *, limit: int = 500, now: Now = None) -> SweepResult:
        return self.maintenance.job_expire_many(lease, limit=limit, now=now)

    def job_prune_many(
        self, lease: Lease, *, older_than: float, limit: int = 1000, now: Now = None
    ) -> int:
        return self.maintenance.job_prune_many(lease, older_than=older_than, limit=limit, now=now)

    def job_stats_refresh(self) -> bool:
        return self.maintenance.job_stats_refresh()

    def job_table_vacuum(self) -> bool:
        return self.maintenance.job_table_vacuum()

    # -- reads for people ----------------------------------------------------------------
    def job_get(self, job_id: int) -> JobRecord:
        return self.reads.job_get(job_id)

    def job_list(
        self,
        *,
        queue: str | None = None,
        status: str | None = None,
        task: str | None = None,
        after: int | None = None,
        limit: int = 50,
    ) -> JobPage:
        return self.reads.job_list(queue=queue, status=status, task=task, after=after, limit=limit)

    def job_runs(self, job_id: int) -> list[Run]:
        return self.reads.job_runs(job_id)

    def session_get(self, session_id: str) -> Session | None:
        return self.reads.session_get(session_id)

    # -- API keys ------------------------------------------------------------------------
    def key_create(
        self,
        *,
        role: str,
        group: str = access.DEFAULT_GROUP,
        queues: Sequence[str] = (),
        name: str = "",
        expires_in: float | None = None,
        now: Now = None,
    ) -> tuple[ApiKey, str]:
        return self.keys.key_create(
            role=role, group=group, queues=queues, name=name, expires_in=expires_in, now=now
        )

    def key_get(self, key_id: str) -> ApiKey | None:
        return self.keys.key_get(key_id)

    def key_list(self) -> list[ApiKey]:
        return self.keys.key_list()

    def key_revoke(self, key_id: str, *, now: Now = None) -> tuple[ApiKey, list[str]]:
        return self.keys.key_revoke(key_id, now=now)

    def queue_groups(self) -> dict[str, str]:
        return self.keys.queue_groups()

    def stream_read(self, job_id: int, *, after: int = 0, limit: int = 1000) -> list[StreamEvent]:
        return self.reads.stream_read(job_id, after=after, limit=limit)

    def session_list(self, *, now: Now = None) -> list[Session]:
        return self.reads.session_list(now=now)

    def task_get(self, name: str) -> TaskInfo | None:
        return self.reads.task_get(name)

    def task_list(self) -> list[TaskInfo]:
        return self.reads.task_list()

    def job_unrunnable(self, *, now: Now = None) -> list[Unrunnable]:
        return self.reads.job_unrunnable(now=now)

    def queue_stats(self, *, now: Now = None) -> list[QueueStats]:
        return self.reads.queue_stats(now=now)

    def queue_active(self, *, now: Now = None) -> list[QueueStats]:
        return self.reads.queue_active(now=now)
