"""The janitor: maintenance that one process does for everyone while it holds a lease.

```
 every janitor_interval:
   renew our lease (or acquire it when free or expired; the term grows at every new holder)
   └─ held? ── reap dead sessions ─▶ time out late jobs ─▶ expire jobs not started by
               their start-by deadline ─▶ assign the partitions of partitioned queues to
               the live sessions ─▶ prune old finished jobs (hourly, or at every pass
               while a backlog is left) ─▶ new statistics of the jobs table once it
               has grown tenfold (PostgreSQL) ─▶ enqueue the due ticks of schedules
               (plunder.schedules)
               each write in a transaction that first checks (lease, holder, term) in the
               database (pruning finds its jobs with a read before that transaction)
```

Every process may run a janitor; only the lease holder acts. When the holder dies, its
lease expires by the database clock and another process takes over within
``lease_ttl + janitor_interval``. A holder that was paused and wakes up late finds its
term stale: its writes are refused inside the same transaction, so a brief overlap during
takeover changes nothing twice. Each service is idempotent and is a config plus
``run_once(store, lease, now=None)``.
"""

from __future__ import annotations

import logging
import secrets
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime

from plunder import errors, tally
from plunder.config import Settings, WorkerDeadlines
from plunder.cron import Tick
from plunder.model import Lease, SweepResult
from plunder.schedules import Ticker
from plunder.store.base import Store

log = logging.getLogger("plunder.janitor")
LEASE_NAME = "plunder.janitor"


def own_store(store: Store, settings: Settings, application_name: str) -> Callable[[], Store]:
    """How a janitor inside a worker keeps its own deadlines while it holds the lease: on
    the worker's own connections (``store.limited``), so that a worker holds three at
    most, lease or not; its transactions go by ``application_name``."""

    def limited() -> Store:
        timeout = WorkerDeadlines.of(settings).janitor_timeout
        return store.limited(
            call_timeout=timeout, idle_timeout=timeout, application_name=application_name
        )

    return limited


@dataclass(frozen=True)
class Reaper:
    """Deletes sessions past their expiry and releases or finishes their running jobs."""

    limit: int = 100

    def run_once(self, store: Store, lease: Lease, now: datetime | None = None) -> SweepResult:
        return store.session_reap_many(lease, limit=self.limit, now=now)


@dataclass(frozen=True)
class Timeouts:
    """Ends running jobs past their deadline (retried, or timed_out)."""

    limit: int = 500

    def run_once(self, store: Store, lease: Lease, now: datetime | None = None) -> SweepResult:
        return store.job_timeout_many(lease, limit=self.limit, now=now)


@dataclass(frozen=True)
class Expirer:
    """Ends pending jobs past their start-by deadline as expired (never run). Claims never
    take such a job even before this runs; this makes it terminal for its waiters."""

    limit: int = 500

    def run_once(self, store: Store, lease: Lease, now: datetime | None = None) -> SweepResult:
        return store.job_expire_many(lease, limit=self.limit, now=now)


@dataclass
class Pruner:
    """Deletes finished jobs (and their runs and stream events) older than the retention,
    at most ``limit`` a pass (found by a read, then deleted under the fence in a transaction
    of their own; see Store.job_prune_many). While passes come back full, a
    backlog is left, and the next pass prunes again; otherwise at most once per ``every``
    seconds (finding nothing to prune reads the whole table)."""

    retention: float
    every: float = 3600.0
    limit: int = 5000
    _last: float | None = field(default=None, repr=False)
    _more: bool = field(default=False, repr=False)

    def run_once(self, store: Store, lease: Lease, now: datetime | None = None) -> int:
        clock = time.monotonic()
        waiting = self._last is not None and clock - self._last < self.every
        if now is None and waiting and not self._more:
            return 0
        self._last = clock
        pruned = store.job_prune_many(lease, older_than=self.retention, limit=self.limit, now=now)
        self._more = pruned >= self.limit
        return pruned


@dataclass(frozen=True)
class Partitioner:
    """Assigns each partition of each partitioned queue to one live session serving it
    (plunder.store.partitions), anew where sessions came or went."""

    def run_once(self, store: Store, lease: Lease, now: datetime | None = None) -> list[str]:
        return store.partition_assign_many(lease, now=now)


@dataclass(frozen=True)
class Pass:
    """What one janitor pass did."""

    held: bool
    term: int | None = None
    reaped: SweepResult = field(default_factory=SweepResult)
    timed_out: SweepResult = field(default_factory=SweepResult)
    expired: SweepResult = field(default_factory=SweepResult)
    pruned: int = 0
    analyzed: bool = False  # the jobs table's statistics taken anew (Store.job_stats_refresh)
    vacuumed: bool = False  # its dead index entries removed (Store.job_table_vacuum)
    admitted: int = 0  # limited jobs admitted: due, or with room in their limits again
    assigned: tuple[str, ...] = ()  # the partitioned queues whose assignment changed
    fair: tuple[int, int] = (0, 0)  # fair queues' groups pruned, and made
    ticks: tuple[Tick, ...] = ()  # the schedules' ticks enqueued


class Janitor:
    def __init__(
        self,
        store: Store,
        settings: Settings,
        *,
        holder: str | None = None,
        own_store: Callable[[], Store] | None = None,
    ) -> None:
        """``store`` is used to try for the lease; with ``own_store``, a holder opens a store
        of its own for its passes and closes it when it loses or releases the lease."""
        self.shared = store
        self.store = store
        self._own_factory = own_store
        self.settings = settings
        self.holder = holder or f"{socket.gethostname()}:{secrets.token_hex(8)}"
        self.lease: Lease | None = None
        self.reaper = Reaper()
        self.timeouts = Timeouts()
        self.expirer = Expirer()
        self.pruner = Pruner(retention=settings.retention)
        self.partitioner = Partitioner()
        self.ticker = Ticker()

    def _hold(self, now: datetime | None) -> Lease | None:
        ttl = self.settings.lease_ttl
        if self.lease is not None:
            try:
                self.lease = self.store.lease_renew(self.lease, ttl, now=now)
                return self.lease
            except errors.StaleLease:
                log.warning(
                    "janitor lease term %d was lost; another process holds it now", self.lease.term
                )
                self._drop()
        acquired = self.shared.lease_acquire(LEASE_NAME, self.holder, ttl, now=now)
        if acquired is not None:
            log.info("janitor lease acquired by %s (term %d)", self.holder, acquired.term)
            if self._own_factory is not None:
                self.store = self._own_factory()
        self.lease = acquired
        return acquired

    def _drop(self) -> None:
        """Forget the lease and close the connection only a holder keeps."""
        self.lease = None
        if self.store is not self.shared:
            store, self.store = self.store, self.shared
            store.close()

    def run_once(self, now: datetime | None = None) -> Pass:
        lease = self._hold(now)
        if lease is None:
            return Pass(held=False)
        try:
            reaped = self.reaper.run_once(self.store, lease, now)
            timed_out = self.timeouts.run_once(self.store, lease, now)
            expired = self.expirer.run_once(self.store, lease, now)
            # after the reaper: a dead session's partitions go to the live ones
            assigned = self.partitioner.run_once(self.store, lease, now)
            pruned = self.pruner.run_once(self.store, lease, now)
            analyzed = self.store.job_stats_refresh()
            vacuumed = self.store.job_table_vacuum()
            admitted = self.store.limit_admit_due(now=now)  # see plunder.store.limits
            fair = self.store.fair_prune_many(now=now)  # see plunder.store.fairness
            ticks = self.ticker.run_once(self.store, lease, now)
        except errors.StaleLease:
            log.warning("janitor lease term %d went stale mid-pass; writes refused", lease.term)
            self._drop()
            return Pass(held=False)
        if reaped.count or timed_out.count or expired.count or pruned:
            log.info(
                "janitor: %d dead sessions (%d jobs retried, %d finished), %d jobs timed "
                "out, %d expired, %d pruned",
                len(reaped.sessions),
                len(reaped.retried),
                len(reaped.finished),
                timed_out.count,
                expired.count,
                pruned,
            )
        if assigned:
            log.info("janitor: partitions of %s assigned anew", ",".join(assigned))
        if analyzed:
            log.info("janitor: the jobs table grew tenfold since its statistics; analyzed it")
        return Pass(
            held=True,
            term=lease.term,
            reaped=reaped,
            timed_out=timed_out,
            expired=expired,
            pruned=pruned,
            analyzed=analyzed,
            vacuumed=vacuumed,
            admitted=admitted,
            assigned=tuple(assigned),
            fair=fair,
            ticks=tuple(ticks),
        )

    def run(self, stop: threading.Event) -> None:
        """Pass after pass until ``stop`` is set; database trouble is retried every
        interval and logged when it starts and when it ends (a database that is full or
        down for minutes must not fill the log with one line per pass)."""
        failures = 0
        while not stop.is_set():
            try:
                tally.janitor_pass(self.run_once)
            except errors.StoreError as exc:
                if not failures:
                    log.warning("janitor pass failed: %s (retrying every pass)", exc)
                failures += 1
            except Exception:  # keep the janitor alive; say what happened
                log.exception("janitor pass failed unexpectedly")
            else:
                if failures:
                    log.info("janitor passes work again after %d failures", failures)
                failures = 0
            stop.wait(self.settings.janitor_interval)
        self.release()

    def release(self) -> None:
        lease = self.lease
        if lease is not None:
            try:
                self.store.lease_release(lease)
            except errors.StoreError as exc:
                log.warning("could not release the janitor lease (it will expire): %s", exc)
        self._drop()
