"""Periodic jobs: the schedules an App declares in code, and the janitor's service that
enqueues their ticks (docs/guide/periodic.md).

```
 @app.periodic / app.schedule ─▶ Declared (in the process) ─▶ upserted at worker start
 plunder schedules add|pause|resume|remove ─────────────────▶ plunder_schedules (database)
 janitor pass, while it holds the lease ─▶ Ticker.run_once ─▶ Store.schedule_tick_many
```

The ticks are the database's: the lease holder enqueues what is due by the database clock,
so a worker whose clock is off changes nothing, and exactly one job is enqueued per tick
(plunder.store.schedules says how).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any

from plunder import cron, errors
from plunder.cron import Schedule, ScheduleSpec, Tick
from plunder.model import JobSpec, Lease
from plunder.store.base import Store
from plunder.task import Options, Task, published_options

log = logging.getLogger("plunder.schedules")
OPTIONS_FRESH = 60.0  # seconds a task's published options are used before read again


class Declared:
    """The schedules declared in code, upserted into the database at worker start (and by
    :meth:`declare`), so that a deploy changes them; a schedule made from the command line
    lives in the database only."""

    def __init__(self) -> None:
        self._specs: dict[str, ScheduleSpec] = {}
        self._lock = threading.Lock()

    def add(self, spec: ScheduleSpec) -> ScheduleSpec:
        spec = spec.checked()
        with self._lock:
            known = self._specs.get(spec.name)
            if known is not None and known != spec:
                raise errors.InvalidSchedule(
                    f"two different schedules are declared as {spec.name!r}; give one a name="
                )
            self._specs[spec.name] = spec
        return spec

    def specs(self) -> list[ScheduleSpec]:
        with self._lock:
            return list(self._specs.values())

    def declare(self, store: Store) -> list[Schedule]:
        """Upsert every declared schedule (a pause made in the database is kept)."""
        return [store.schedule_upsert(spec) for spec in self.specs()]


def spec_of(
    task: Task | str,
    *,
    cron_: str,
    name: str | None = None,
    timezone: str = "UTC",
    queue: str | None = None,
    args: Sequence[Any] = (),
    kwargs: dict[str, Any] | None = None,
    catch_up: str = cron.DEFAULT_CATCH_UP,
) -> ScheduleSpec:
    """The ScheduleSpec of ``app.schedule(task, cron=...)``; named after the task unless
    ``name`` is given; in the queue of a registered task unless ``queue`` is given (a task
    named only takes its queue as its workers published it, at each tick)."""
    task_name = task if isinstance(task, str) else task.name
    if queue is None and not isinstance(task, str):
        queue = task.options_.queue
    return ScheduleSpec(
        name=name or task_name,
        task=task_name,
        cron=cron_,
        timezone=timezone,
        queue=queue,
        args=list(args),
        kwargs=dict(kwargs or {}),
        catch_up=catch_up,
    ).checked()


@dataclass
class Ticker:
    """The janitor's service: enqueue the due ticks of every schedule, once each, fenced
    by the lease. A job takes its task's options as the last worker serving it published
    them (its queue from the schedule, if set), else the defaults."""

    grace: float = cron.GRACE
    limit: int = cron.TICKS_PER_PASS
    _options: dict[str, tuple[float, Options]] = field(default_factory=dict, repr=False)

    def run_once(self, store: Store, lease: Lease, now: datetime | None = None) -> list[Tick]:
        waiting = [s for s in store.schedule_list() if not s.paused and s.next_at is not None]
        if not waiting:
            return []
        clock = now or store.now()
        due = [s for s in waiting if s.next_at is not None and s.next_at <= clock]
        if not due:
            return []
        # read before the tick's transaction: it cannot read beside itself on SQLite
        makers = {s.task: self._maker(store, s.task) for s in due}

        def make(schedule: Schedule, tick: datetime) -> JobSpec:
            spec = makers[schedule.task](schedule.args, schedule.kwargs)
            return spec if schedule.queue is None else replace(spec, queue=schedule.queue)

        ticks = store.schedule_tick_many(lease, make, grace=self.grace, limit=self.limit, now=now)
        for tick in ticks:
            log.debug("schedule %s: tick %s is job %d", tick.schedule, tick.at, tick.job_id)
        return ticks

    def _maker(self, store: Store, task: str) -> Callable[[Sequence[Any], dict[str, Any]], JobSpec]:
        cached = self._options.get(task)
        if cached is None or time.monotonic() - cached[0] > OPTIONS_FRESH:
            info = store.task_get(task)
            if info is None:  # no worker published it yet: the defaults, read again next time
                return Options().maker(task)
            cached = self._options[task] = (time.monotonic(), published_options(info))
        return cached[1].maker(task)
