"""What each page shows, read from the store and narrowed to what its visitor may see.

The overview's and the workers' readings are shared by every visitor and taken at most
once per FRESH seconds (the sparklines' once per SLOW), and no sooner than SPARE times
what the last one took, however many browsers watch and however fast the queues drain: a
page's live updates re-render from the last reading.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, TypeVar

from plunder import janitor, payload
from plunder.dashboard.visitors import Visitor
from plunder.model import JobRecord, Lease, LimitState, QueueStats, Run, Session, Unrunnable
from plunder.states import Status
from plunder.store import observing, pauses
from plunder.store.base import Store
from plunder.store.observing import Activity, JobFilter, LostSession

T = TypeVar("T")
FRESH = 1.0  # seconds a reading of counts and sessions is shown
SLOW = 5.0  # seconds a reading of the last hour's activity is shown
SPARE = 10  # a reading is taken again no sooner than this many times its own duration
STATUSES = [s.value for s in Status]
SHOWN = [s.value for s in Status if s is not Status.EXPIRED]  # the overview's columns


class Cache:
    """Readings by name, each taken again once older than its period, or than SPARE times
    what it took to read: a reading that walks a large job table costs the database a
    bounded share of its time, however many browsers watch."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._taken: dict[str, tuple[Any, float, float]] = {}  # value, when, how long

    def get(self, name: str, period: float, read: Callable[[], T]) -> T:
        with self._lock:
            found = self._taken.get(name)
        if found is not None and time.monotonic() - found[1] < max(period, SPARE * found[2]):
            value: T = found[0]
            return value
        started = time.monotonic()
        value = read()
        with self._lock:
            self._taken[name] = (value, time.monotonic(), time.monotonic() - started)
        return value


@dataclass(frozen=True)
class QueueRow:
    queue: str
    counts: dict[str, int]
    oldest: float | None
    paused: bool
    activity: Activity | None


@dataclass(frozen=True)
class Overview:
    queues: list[QueueRow]
    unrunnable: list[Unrunnable]
    at_ceiling: list[LimitState]
    now: datetime
    paused: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class WorkerRow:
    session: Session
    running: int
    age: float  # seconds since its last heartbeat, by the database clock


@dataclass(frozen=True)
class Workers:
    live: list[WorkerRow]
    lost: list[LostSession]
    janitor: Lease | None
    now: datetime


@dataclass(frozen=True)
class JobView:
    job: JobRecord
    runs: list[Run]


class Views:
    """The pages' readings of ``store``."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.observing = observing.of(store)
        self.pauses = pauses.of(store)
        self.cache = Cache()

    # -- overview ------------------------------------------------------------------------
    def overview(self, visitor: Visitor) -> Overview:
        stats: list[QueueStats] = self.cache.get("stats", FRESH, self.store.queue_stats)
        unrunnable = self.cache.get("unrunnable", FRESH, self.store.job_unrunnable)
        limits = self.cache.get("limits", FRESH, self.store.limit_list)
        paused = self.cache.get("paused", FRESH, self.paused_queues)
        activity = self.cache.get("activity", SLOW, self.observing.activity)
        now = self.cache.get("now", FRESH, self.store.now)
        by_queue = {a.queue: a for a in activity}
        names = sorted({s.queue for s in stats} | set(by_queue) | set(paused))
        counted = {s.queue: s for s in stats}
        rows = []
        for name in names:
            if not visitor.sees(name):
                continue
            found = counted.get(name)
            counts = found.counts if found else {s: 0 for s in STATUSES}
            rows.append(
                QueueRow(
                    name,
                    counts,
                    found.oldest_pending_age if found else None,
                    name in paused,
                    by_queue.get(name),
                )
            )
        at_ceiling = [
            s
            for s in limits
            if visitor.admin and s.ceiling is not None and s.running + s.admitted >= s.ceiling
        ]
        return Overview(
            rows,
            [u for u in unrunnable if visitor.sees(u.queue)],
            at_ceiling,
            now,
            [q for q in paused if visitor.sees(q)],
        )

    def paused_queues(self) -> list[str]:
        return [p.queue for p in self.pauses.queue_pause_list()]

    # -- workers -------------------------------------------------------------------------
    def workers(self, visitor: Visitor) -> Workers:
        def read() -> Workers:
            now = self.store.now()
            sessions = self.store.session_list(now=now)
            running = self.observing.running()
            live = [
                WorkerRow(s, running.get(s.id, 0), (now - s.heartbeat_at).total_seconds())
                for s in sessions
            ]
            lost = self.observing.lost(now=now)
            return Workers(live, lost, self.store.lease_get(janitor.LEASE_NAME), now)

        found = self.cache.get("workers", FRESH, read)
        if visitor.admin:
            return found
        live = [w for w in found.live if any(visitor.sees(q) for q in w.session.queues)]
        return Workers(live, [], found.janitor, found.now)  # whose lost jobs: admins only

    # -- jobs ----------------------------------------------------------------------------
    def jobs(
        self, visitor: Visitor, where: JobFilter, *, before: int | None, limit: int = 50
    ) -> tuple[list[JobRecord], int | None]:
        only, hide = visitor.scope()
        if only is not None and where.only is None:
            where = _replace(where, only=only)
        if hide is not None:
            where = _replace(where, hide=hide)
        if where.only == ():
            return [], None  # a group with no queue yet: nothing to see
        page = self.observing.jobs(where, before=before, limit=limit)
        return list(page.jobs), page.next_after

    def job(self, visitor: Visitor, job_id: int) -> JobView | None:
        job = self.store.job_get(job_id)
        if not visitor.sees(job.queue):
            return None
        return JobView(job, self.store.job_runs(job_id))


def _replace(where: JobFilter, **changes: Any) -> JobFilter:
    values = {name: getattr(where, name) for name in JobFilter.__dataclass_fields__}
    return JobFilter(**{**values, **changes})


def age(seconds: float | None) -> str:
    """``12s``, ``4m 05s``, ``3h 02m``: an age for people."""
    if seconds is None:
        return "-"
    seconds = max(0.0, seconds)
    if seconds < 60:
        return f"{seconds:.0f}s" if seconds >= 10 else f"{seconds:.1f}s"
    if seconds < 3600:
        return f"{int(seconds // 60)}m {int(seconds % 60):02d}s"
    return f"{int(seconds // 3600)}h {int(seconds % 3600 // 60):02d}m"


def short(value: Any, limit: int = 80) -> str:
    """A JSON value on one line, cut at ``limit`` characters."""
    text = payload.encode(value, what="a value shown")
    return text if len(text) <= limit else text[: limit - 1] + "…"
