"""The store's schedule operations (plunder.store.schedules implements them; ``Store`` has
them too)."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Protocol

from plunder import cron
from plunder.cron import Schedule, ScheduleSpec, Tick
from plunder.model import JobSpec, Lease

Now = datetime | None


class Scheduled(Protocol):
    def schedule_upsert(self, spec: ScheduleSpec, *, now: Now = None) -> Schedule:
        """Create the schedule or give it this definition (its pause is kept; a new cron
        or time zone ticks first after now). InvalidSchedule names what is wrong."""
        ...

    def schedule_get(self, name: str) -> Schedule:
        """The schedule, or ScheduleNotFound."""
        ...

    def schedule_list(self) -> list[Schedule]:
        """Every schedule, by name."""
        ...

    def schedule_pause(self, name: str, paused: bool, *, now: Now = None) -> Schedule:
        """Pause or resume (from the first tick after now); ScheduleNotFound."""
        ...

    def schedule_remove(self, name: str) -> bool:
        """Delete the schedule; False when there was none."""
        ...

    def schedule_tick_many(
        self,
        lease: Lease,
        make: Callable[[Schedule, datetime], JobSpec],
        *,
        grace: float = cron.GRACE,
        limit: int = cron.TICKS_PER_PASS,
        now: Now = None,
    ) -> list[Tick]:
        """The janitor's pass: enqueue each due tick once, fenced by ``lease``, in one
        transaction (plunder.store.schedules)."""
        ...
