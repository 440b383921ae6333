"""Reads for the dashboard (plunder.dashboard): a queue's activity over the last hour, the
sessions that died in it, and jobs found by any of their filters. Reads for people: each
walks what it needs of the job table once, so callers keep answers a second or more.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime

from plunder import errors, payload
from plunder.model import JobPage
from plunder.store import convert
from plunder.store.driver import Now, Row, Tx
from plunder.store.engine import Engine

MINUTES = 60  # the sparklines' span, one bucket a minute


@dataclass(frozen=True, slots=True)
class Activity:
    """One queue's last hour, a minute a bucket, oldest first: jobs finished, jobs
    started, and their mean wait from due to started (seconds; 0 where none started)."""

    queue: str
    finished: tuple[int, ...]
    started: tuple[int, ...]
    wait: tuple[float, ...]


@dataclass(frozen=True, slots=True)
class LostSession:
    """A session whose runs were lost in the last hour (its worker died or stopped
    heartbeating): who it was, and the jobs rescued from it."""

    session_id: str
    worker: str
    host: str
    pid: int
    lost: int
    lost_at: datetime
    job_ids: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class JobFilter:
    """What a job list is narrowed to; None: any. ``only``: the queues seen are these
    alone; ``hide``: never these (a key's scope: see plunder.dashboard.scope)."""

    queue: str | None = None
    task: str | None = None
    status: str | None = None
    key: str | None = None
    since: float | None = None  # created from (seconds since the epoch)
    until: float | None = None  # created before
    only: tuple[str, ...] | None = None
    hide: tuple[str, ...] | None = field(default=None)


@dataclass
class _Series:
    finished: list[int] = field(default_factory=lambda: [0] * MINUTES)
    started: list[int] = field(default_factory=lambda: [0] * MINUTES)
    waited: list[float] = field(default_factory=lambda: [0.0] * MINUTES)


class Observing:
    """The dashboard's reads: activity, running, lost, jobs."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    def activity(self, *, now: Now = None) -> list[Activity]:
        """Every queue with jobs started or finished in the last hour (a partition's
        count as its queue's), by name."""

        def op(tx: Tx) -> tuple[list[Row], list[Row]]:
            clock = tx.clock(now)
            return tx.all("observe_finished", now=clock), tx.all("observe_started", now=clock)

        finished, started = self.engine.run(op, write=False)
        series: dict[str, _Series] = {}
        for row in finished:
            slot = MINUTES - 1 - int(row["ago"])
            if 0 <= slot < MINUTES:
                found = series.setdefault(payload.base_queue(str(row["queue"])), _Series())
                found.finished[slot] += int(row["n"])
        for row in started:
            slot = MINUTES - 1 - int(row["ago"])
            if 0 <= slot < MINUTES:
                found = series.setdefault(payload.base_queue(str(row["queue"])), _Series())
                found.started[slot] += int(row["n"])
                found.waited[slot] += float(row["wait"] or 0.0) * int(row["n"])
        return [
            Activity(
                queue,
                tuple(s.finished),
                tuple(s.started),
                tuple(w / n if n else 0.0 for w, n in zip(s.waited, s.started, strict=True)),
            )
            for queue, s in sorted(series.items())
        ]

    def running(self) -> dict[str, int]:
        """Each session's running jobs, counted."""
        rows = self.engine.run(lambda tx: tx.all("observe_running"), write=False)
        return {str(r["session_id"]): int(r["n"]) for r in rows}

    def lost(self, *, now: Now = None) -> list[LostSession]:
        """The sessions whose runs were lost in the last hour, the latest first."""
        rows = self.engine.run(lambda tx: tx.all("observe_lost", now=tx.clock(now)), write=False)
        return [
            LostSession(
                session_id=str(r["session_id"]),
                worker=str(r["worker"]),
                host=str(r["host"]),
                pid=int(r["pid"]),
                lost=int(r["n"]),
                lost_at=self.engine.time(r["lost_at"]),
                job_ids=tuple(int(i) for i in self._ids(r["job_ids"])),
            )
            for r in rows
        ]

    def _ids(self, value: object) -> Sequence[int]:
        if isinstance(value, str):  # SQLite: a JSON list
            return sorted(int(i) for i in payload.decode(value))
        return [int(i) for i in value or ()]  # type: ignore[attr-defined]

    def jobs(self, where: JobFilter, *, before: int | None = None, limit: int = 50) -> JobPage:
        """The jobs ``where`` names, newest first, ``limit`` a page; ``before``: the
        ``next_after`` of the page before."""
        status = None if where.status is None else convert.status_name(where.status)
        limit = convert.integer("limit", limit, 1, 10_000)
        before = None if before is None else convert.job_id(before)
        params = {
            "queue": where.queue,
            "task": where.task,
            "status": status,
            "key": where.key,
            "since": where.since,
            "until": where.until,
            "only": None if where.only is None else self.engine.list_in(list(where.only)),
            "hide": None if where.hide is None else self.engine.list_in(list(where.hide)),
            "before": before,
            "limit": limit,
        }
        for name in ("queue", "task", "key"):
            value = params[name]
            if isinstance(value, str) and ("\x00" in value or not value.isprintable()):
                return JobPage((), None)  # no job has such a name; PostgreSQL refuses NUL
        rows = self.engine.run(lambda tx: tx.all("observe_jobs", **params), write=False)
        jobs = tuple(self.engine.job(row) for row in rows)
        return JobPage(jobs, jobs[-1].id if len(jobs) == limit else None)


def of(store: object) -> Observing:
    """The dashboard's reads of a store on the database itself; ConfigError for another
    (a gateway's: the dashboard is served by the gateway itself)."""
    observing = getattr(store, "observing", None)
    if not isinstance(observing, Observing):
        raise errors.ConfigError("the dashboard needs the database's URL, not a gateway's")
    return observing
