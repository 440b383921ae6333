"""Schedules in the database, and the janitor's enqueue of their due ticks.

```
 schedule_tick_many (one transaction, by the database clock):
   lease_check (the janitor's lease and term, else StaleLease: nothing written)
   ─▶ schedule_due (locked where the database locks rows) ─▶ per schedule:
        plunder.cron.plan (which ticks, and the next one) ─▶ enqueue them, each with the
        idempotency key of (schedule, tick) ─▶ schedule_advance: next_at moves past them,
        compare-and-set from the value read
```

A tick is enqueued in the transaction that moves next_at past it, so a tick is enqueued
once or not at all: a takeover starts where the last committed pass stopped (no gap, no
repeat), and a stale holder's pass is refused by the fence before it writes.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import replace
from datetime import datetime
from typing import Any

from plunder import cron, errors, payload
from plunder.cron import Cron, Schedule, ScheduleSpec, Tick
from plunder.model import JobSpec, Lease
from plunder.store.driver import Now, Row, Tx
from plunder.store.engine import Engine
from plunder.store.enqueue import Enqueue
from plunder.store.maintenance import Maintenance
from plunder.store.partitions import Partitions

log = logging.getLogger("plunder.schedules")
MakeJob = Callable[[Schedule, datetime], JobSpec]
SCHEDULES_PER_PASS = 100


class Schedules:
    """The store's schedule operations."""

    def __init__(
        self, engine: Engine, maintenance: Maintenance, enqueue: Enqueue, partitions: Partitions
    ) -> None:
        self.engine = engine
        self.maintenance = maintenance
        self.enqueue = enqueue
        self.partitions = partitions
        self.skipped: set[str] = set()  # schedules whose definition no longer reads

    def _clock(self, tx: Tx, now: Now) -> tuple[Any, datetime]:
        """This transaction's ``now`` parameter, and that time as a datetime (UTC)."""
        clock = tx.clock(now)
        if clock is None:  # PostgreSQL leaves it to the statement; read it once here
            row = tx.one("clock_now")
            assert row is not None
            clock = row["now"]
        return clock, self.engine.time(clock)

    @staticmethod
    def _at(tx: Tx, instant: datetime | None) -> Any:
        return None if instant is None else tx.clock(instant)

    def record(self, row: Row) -> Schedule:
        last_job = row["last_job_id"]
        return Schedule(
            name=row["name"],
            task=row["task"],
            cron=row["cron"],
            timezone=row["timezone"],
            queue=row["queue"],
            args=list(payload.decode(row["args"]) or []),
            kwargs=dict(payload.decode(row["kwargs"]) or {}),
            catch_up=row["catch_up"],
            paused=bool(row["paused"]),
            next_at=self.engine.opt_time(row["next_at"]),
            last_at=self.engine.opt_time(row["last_at"]),
            last_job_id=None if last_job is None else int(last_job),
            created_at=self.engine.time(row["created_at"]),
            updated_at=self.engine.time(row["updated_at"]),
        )

    # -- definitions ------------------------------------------------------------------------
    def schedule_upsert(self, spec: ScheduleSpec, *, now: Now = None) -> Schedule:
        """Create the schedule, or give it this definition. A schedule made anew, or whose
        cron or time zone changed, ticks first after now; a pause is kept."""
        spec = spec.checked()
        ticks = Cron(spec.cron, spec.timezone)
        values = {
            "name": spec.name,
            "task": spec.task,
            "queue": spec.queue,
            "cron": spec.cron,
            "timezone": spec.timezone,
            "args": payload.encode(list(spec.args), what="arguments", of=spec.task),
            "kwargs": payload.encode(spec.kwargs, what="keyword arguments", of=spec.task),
            "catch_up": spec.catch_up,
        }

        def op(tx: Tx) -> Schedule:
            clock, current = self._clock(tx, now)
            row = tx.one("schedule_lock", name=spec.name)
            if row is None:
                first = self._at(tx, ticks.after(current))
                row = tx.one("schedule_insert", **values, paused=False, next_at=first, now=clock)
                if row is None:  # made by another process since our read: update it
                    raise errors.StoreBusy(f"schedule {spec.name!r} was created meanwhile")
                return self.record(row)
            if all(row[name] == value for name, value in values.items()):
                return self.record(row)
            same = row["cron"] == spec.cron and row["timezone"] == spec.timezone
            next_at = row["next_at"] if same else self._at(tx, ticks.after(current))
            row = tx.one("schedule_update", **values, next_at=next_at, now=clock)
            assert row is not None
            return self.record(row)

        return self.engine.run(op)

    def schedule_get(self, name: str) -> Schedule:
        cron.check_name(name)
        row = self.engine.run(lambda tx: tx.one("schedule_list", name=name), write=False)
        if row is None:
            raise errors.ScheduleNotFound(f"there is no schedule named {name!r}")
        return self.record(row)

    def schedule_list(self) -> list[Schedule]:
        rows = self.engine.run(lambda tx: tx.all("schedule_list", name=None), write=False)
        return [self.record(row) for row in rows]

    def schedule_pause(self, name: str, paused: bool, *, now: Now = None) -> Schedule:
        """Pause or resume. A resumed schedule's next tick is the first after now: the
        ticks of its pause are not enqueued."""
        cron.check_name(name)

        def op(tx: Tx) -> Schedule:
            clock, current = self._clock(tx, now)
            row = tx.one("schedule_lock", name=name)
            if row is None:
                raise errors.ScheduleNotFound(f"there is no schedule named {name!r}")
            next_at = None
            if bool(row["paused"]) and not paused:
                next_at = self._at(tx, Cron(row["cron"], row["timezone"]).after(current))
            found = tx.one("schedule_pause", name=name, paused=paused, next_at=next_at, now=clock)
            assert found is not None
            return self.record(found)

        return self.engine.run(op)

    def schedule_remove(self, name: str) -> bool:
        """Delete the schedule (its jobs stay); False when there was none."""
        cron.check_name(name)
        row = self.engine.run(lambda tx: tx.one("schedule_delete", name=name))
        return row is not None

    # -- the janitor's ticks ----------------------------------------------------------------
    def schedule_tick_many(
        self,
        lease: Lease,
        make: MakeJob,
        *,
        grace: float = cron.GRACE,
        limit: int = cron.TICKS_PER_PASS,
        now: Now = None,
    ) -> list[Tick]:
        """Enqueue the due ticks of every schedule (see the module docstring); ``make``
        gives the job of a schedule's tick (its key is set here). StaleLease when the
        lease was lost: then nothing was written."""

        counts = self.partitions.partition_counts()  # read before the transaction begins

        def op(tx: Tx) -> list[Tick]:
            clock, current = self._clock(tx, now)
            self.maintenance.fence(tx, lease, clock)
            done: list[Tick] = []
            for row in tx.all("schedule_due", now=clock, limit=SCHEDULES_PER_PASS):
                try:
                    planned = self._plan(row, make, current, grace, limit)
                except errors.InvalidSchedule as exc:  # a zone gone from the system's tzdata
                    if row["name"] not in self.skipped:  # said once, not at every pass
                        log.error("schedule %r is skipped until fixed: %s", row["name"], exc)
                    self.skipped.add(row["name"])
                    continue
                done.extend(self._enqueue(tx, row, planned, counts, clock=clock, now=now))
            return done

        return self.engine.run(op)

    def _plan(
        self, row: Row, make: MakeJob, current: datetime, grace: float, limit: int
    ) -> tuple[list[datetime], list[JobSpec], datetime | None]:
        """A due schedule's ticks, their jobs, and its next tick after them."""
        schedule = self.record(row)
        assert schedule.next_at is not None  # schedule_due reads only those with one
        ticks, after = cron.plan(
            Cron(schedule.cron, schedule.timezone),
            schedule.catch_up,
            schedule.next_at,
            current,
            grace=grace,
            limit=limit,
        )
        specs = [replace(make(schedule, tick), key=schedule.key(tick)) for tick in ticks]
        return ticks, specs, after

    def _enqueue(
        self,
        tx: Tx,
        row: Row,
        planned: tuple[list[datetime], list[JobSpec], datetime | None],
        counts: Mapping[str, int],
        *,
        clock: Any,
        now: Now,
    ) -> list[Tick]:
        ticks, specs, after = planned
        ids = []
        if specs:
            routed = self.partitions.route(specs, counts)
            ids = self.enqueue.job_enqueue_ids(routed, conn=tx.conn, now=now)
        advanced = tx.one(
            "schedule_advance",
            name=row["name"],
            was=row["next_at"],
            next_at=self._at(tx, after),
            last_at=self._at(tx, ticks[-1] if ticks else None),
            last_job_id=ids[-1] if ids else None,
            now=clock,
        )
        if advanced is None:  # changed under us (not where rows are locked): run again
            raise errors.StoreBusy(f"schedule {row['name']!r} changed during its tick")
        return [Tick(row["name"], tick, job_id) for tick, job_id in zip(ticks, ids, strict=True)]
