"""Schedules as values: a cron expression in a time zone (evaluated by ``cronsim``, with
``zoneinfo`` for the zone and its daylight-saving changes), what a schedule enqueues, and
which of its ticks are due at a given time of the database clock.

```
 next_at ─── t1 ── t2 ── ... ── tk ─────── t(k+1) ... ── now
 (stored)   └──── missed: late by more than ``grace`` ──┘└ late by at most grace: due ┘
 catch_up="all":    every tick          (at most ``limit`` a pass; the rest the next pass)
 catch_up="latest": the newest missed tick, then the due ones
 catch_up="none":   the due ones only
```

A tick late by at most ``grace`` is not missed: a janitor takeover or a slow pass delays it,
and it still runs once. Ticks are instants (UTC); a daily "30 2 * * *" in Europe/Paris runs
at 03:00 on the day 02:30 does not exist and once on the day it exists twice, as Debian's
cron does (cronsim's rule for 5-field expressions with a fixed hour and minute).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from cronsim import CronSim, CronSimError

from plunder import errors, payload

CATCH_UP = ("all", "latest", "none")
DEFAULT_CATCH_UP = "latest"
GRACE = 60.0  # seconds a tick may be late and still be due, not missed
TICKS_PER_PASS = 1000  # ticks of one schedule enqueued by one pass at most
_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.:-]{0,199}")


def check_name(name: object) -> str:
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise errors.InvalidSchedule(
            f"invalid schedule name {name!r}: use 1-200 characters from A-Z a-z 0-9 _ . : -, "
            "starting with a letter, digit or underscore"
        )
    return name


def zone(name: object) -> ZoneInfo:
    """The IANA time zone ``name`` ("Europe/Paris", "UTC")."""
    if not isinstance(name, str) or not name:
        raise errors.InvalidSchedule(f"invalid time zone {name!r}: name an IANA zone")
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError) as exc:
        raise errors.InvalidSchedule(
            f"unknown time zone {name!r}: name an IANA zone such as 'UTC' or 'Europe/Paris'"
        ) from exc


@dataclass(frozen=True)
class Cron:
    """A cron expression (5 fields, or 6 with seconds first) in a time zone."""

    expression: str
    timezone: str = "UTC"
    _zone: ZoneInfo = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not isinstance(self.expression, str):
            raise errors.InvalidSchedule(f"a cron expression must be text, not {self.expression!r}")
        object.__setattr__(self, "_zone", zone(self.timezone))
        fields = len(self.expression.split())
        if fields not in (5, 6):
            raise errors.InvalidSchedule(
                f"invalid cron expression {self.expression!r}: it has {fields} fields; use 5 "
                "(minute hour day-of-month month day-of-week) or 6 (seconds first)"
            )
        try:
            CronSim(self.expression, datetime.now(self._zone))
        except CronSimError as exc:
            raise errors.InvalidSchedule(
                f"invalid cron expression {self.expression!r}: {exc}"
            ) from exc
        if self.after(datetime(2000, 1, 1, tzinfo=UTC)) is None:
            raise errors.InvalidSchedule(
                f"cron expression {self.expression!r} never matches a date"
            )

    def after(self, instant: datetime) -> datetime | None:
        """The first tick strictly after ``instant`` (UTC), or None when there is none."""
        ticks = CronSim(self.expression, instant.astimezone(self._zone))
        tick = next(ticks, None)
        if tick is not None and tick.astimezone(UTC) <= instant:
            tick = next(ticks, None)  # an instant with a fraction of a second
        return None if tick is None else tick.astimezone(UTC)

    def at_or_before(self, instant: datetime) -> datetime | None:
        """The last tick at or before ``instant`` (UTC), or None when there is none."""
        # cronsim's reverse walk starts at the instant itself only when it has a fraction
        probe = instant if instant.microsecond else instant.replace(microsecond=1)
        tick = next(CronSim(self.expression, probe.astimezone(self._zone), reverse=True), None)
        return None if tick is None else tick.astimezone(UTC)


@dataclass(frozen=True)
class ScheduleSpec:
    """What a schedule enqueues, and when. ``args``/``kwargs`` go to every job."""

    name: str
    task: str
    cron: str
    timezone: str = "UTC"
    queue: str | None = None  # None: the task's own queue
    args: list[Any] = field(default_factory=list)
    kwargs: dict[str, Any] = field(default_factory=dict)
    catch_up: str = DEFAULT_CATCH_UP

    def checked(self) -> ScheduleSpec:
        """This spec, or InvalidSchedule (or InvalidName, PayloadError) naming what is wrong."""
        check_name(self.name)
        payload.check_task(self.task)
        if self.queue is not None:
            payload.check_queue(self.queue)
        Cron(self.cron, self.timezone)
        if self.catch_up not in CATCH_UP:
            raise errors.InvalidSchedule(
                f"catch_up must be one of {', '.join(CATCH_UP)}, not {self.catch_up!r}"
            )
        if not isinstance(self.args, list | tuple):
            raise errors.InvalidSchedule(f"args must be a list, not {type(self.args).__name__}")
        if not isinstance(self.kwargs, dict):
            raise errors.InvalidSchedule(f"kwargs must be a dict, not {type(self.kwargs).__name__}")
        payload.encode(list(self.args), what="arguments", of=self.task)
        payload.encode(self.kwargs, what="keyword arguments", of=self.task)
        return self


@dataclass(frozen=True)
class Schedule:
    """A stored schedule. ``next_at``: its next tick not enqueued yet (UTC)."""

    name: str
    task: str
    cron: str
    timezone: str
    queue: str | None
    args: list[Any]
    kwargs: dict[str, Any]
    catch_up: str
    paused: bool
    next_at: datetime | None
    last_at: datetime | None  # the last tick enqueued
    last_job_id: int | None
    created_at: datetime
    updated_at: datetime

    def key(self, tick: datetime) -> str:
        """The idempotency key of this schedule's job for ``tick``."""
        return f"plunder.schedule:{self.name}@{tick.astimezone(UTC):%Y-%m-%dT%H:%M:%SZ}"


@dataclass(frozen=True)
class Tick:
    """A tick of a schedule, enqueued as the job ``job_id``."""

    schedule: str
    at: datetime
    job_id: int


def plan(
    cron: Cron,
    catch_up: str,
    next_at: datetime,
    now: datetime,
    *,
    grace: float = GRACE,
    limit: int = TICKS_PER_PASS,
) -> tuple[list[datetime], datetime | None]:
    """The ticks to enqueue at ``now`` for a schedule whose next tick is ``next_at``, and its
    next tick after them (see the module docstring)."""
    if next_at > now:
        return [], next_at
    horizon = now - timedelta(seconds=grace)
    ticks: list[datetime] = []
    start: datetime | None = next_at
    if next_at < horizon and catch_up != "all":
        newest = cron.at_or_before(horizon)
        if catch_up == "latest" and newest is not None and newest >= next_at:
            ticks.append(newest)
        start = cron.after(horizon)
    while start is not None and start <= now and len(ticks) < limit:
        ticks.append(start)
        start = cron.after(start)
    return ticks, start
