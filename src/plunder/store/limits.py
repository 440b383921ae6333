"""Concurrency and rate limits by key, enforced at admission (see
docs/decisions/0010-limits-at-admission.md).

A job whose spec names a Limit is enqueued *held*: pending, its run_at HOLD seconds past
its due time, where no claim's walk reaches it (the claim statement knows nothing of
limits). An admission of a key, in one transaction:

```
 limit_lock (the key's row, locked; its rate's bucket refilled) ─▶ paused? stop
   ─▶ limit_busy (its jobs running or admitted, counted afresh)
   ─▶ limit_admit (up to ceiling - busy, and the tokens, of its held jobs that are due:
                   back to their due time, first due first) ─▶ limit_spend (tokens)
```

Admissions of one key take turns on its row, and each counts what the database says runs,
so no counter can drift and the ceiling holds across every worker. They run where capacity
may appear: the enqueue of limited jobs, a worker's acknowledgement of them (its admitter
thread), a retry or cancel by hand, a limit set or resumed, and each janitor pass (which
also admits the jobs whose delay, retry backoff or pause has passed). A limited job that
goes back to pending (a retry, a release, a rescue from a lost worker) goes back held, so a
paused key's jobs never run during its pause.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Sequence
from datetime import datetime
from typing import Any

from plunder import errors
from plunder.model import Claim, JobSpec, Limit, LimitState, rate_parts
from plunder.store import convert, ordering
from plunder.store.driver import Now, Tx
from plunder.store.engine import CHANNEL_ENQUEUED, Engine

# How far past its due time a held job's run_at lies (seconds, about 6,300 years); the SQL
# spells it out, and reads a run_at from the year 4000 on as held.
HOLD = 200_000_000_000
MAX_PAUSE = 366 * 86400.0  # a pause of more than a year is a mistake
_UNITS = {1.0: "s", 60.0: "min", 3600.0: "h", 86400.0: "day"}


def rate_text(count: int | None, period: float | None) -> str | None:
    if count is None or period is None:
        return None
    return f"{count}/{_UNITS.get(period, f'{period:g}s')}"


def _pause_seconds(seconds: float) -> float:
    seconds = convert.non_negative("pause seconds", seconds)
    if seconds > MAX_PAUSE:
        raise ValueError(f"a pause may last at most {MAX_PAUSE:g} seconds, not {seconds}")
    return seconds


def _rate_columns(rate: str | None) -> tuple[int | None, float | None]:
    return (None, None) if rate is None else rate_parts(rate)


class Limits:
    """The store's limit operations, and the admission the other parts run in their own
    transactions (``admit``)."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    # -- inside other operations' transactions -------------------------------------------
    def declare(self, tx: Tx, specs: Sequence[JobSpec], clock: Any) -> list[str]:
        """Make the limits these specs name that do not exist yet; their keys, sorted."""
        declared: dict[str, Limit] = {}
        for spec in specs:
            limit = spec.limit
            if limit is not None and limit.key not in declared:
                declared[limit.key] = limit
        if declared:
            rows = []
            for key in sorted(declared):
                count, period = _rate_columns(declared[key].rate)
                ceiling = declared[key].ceiling
                rows.append(
                    {"key": key, "ceiling": ceiling, "rate_count": count, "rate_period": period}
                )
            tx.batch("limit_declare", rows, now=clock)
        return sorted(declared)

    def enqueued(self, tx: Tx, specs: Sequence[JobSpec], clock: Any) -> None:
        """After an enqueue's inserts: the limits its jobs name made where new, and their
        jobs (inserted held) admitted as far as the limits allow."""
        keys = self.declare(tx, specs, clock)
        ordering.declare(tx, specs)
        if keys:
            self.admit(tx, keys, clock)

    def admit(self, tx: Tx, keys: Collection[str], clock: Any) -> int:
        """Admit what each key's limit allows of its held jobs (keys in order, so that two
        admissions lock rows in the same order); how many were admitted."""
        # ordered keys first (plunder.store.ordering): their heads, if free, in one go
        ordered, taken = ordering.admit_many(tx, keys, clock, self.engine)
        admitted = len(taken)
        queues: list[str] = [str(r["queue"]) for r in taken]
        for key in sorted(set(keys) - ordered):
            row = tx.one("limit_lock", key=key, now=clock)
            if row is None or row["paused"]:
                continue
            room = math.inf
            if row["ceiling"] is not None:
                room = int(row["ceiling"]) - int(tx.one("limit_busy", key=key)["n"])  # type: ignore[index]
            if row["rate_count"] is not None:
                room = min(room, math.floor(float(row["tokens"])))
            if room <= 0:
                continue
            n = int(min(room, 10_000))
            taken = tx.all("limit_admit", key=key, n=n, now=clock)
            if taken and row["rate_count"] is not None:
                tx.one("limit_spend", key=key, n=len(taken))
            admitted += len(taken)
            queues += [str(r["queue"]) for r in taken]
        self.engine.notify(tx, CHANNEL_ENQUEUED, queues)
        return admitted

    # -- operations of their own ---------------------------------------------------------
    def limit_admit_many(self, keys: Collection[str], *, now: Now = None) -> int:
        """Admit the held jobs these keys' limits allow now; how many."""
        if not keys:
            return 0
        return self.engine.run(lambda tx: self.admit(tx, keys, tx.clock(now)))

    def limit_admit_due(self, *, now: Now = None) -> int:
        """Every key not paused with held jobs that are due: admitted as far as its limit
        allows (the janitor's pass)."""

        def op(tx: Tx) -> int:
            clock = tx.clock(now)
            keys = [str(r["key"]) for r in tx.all("limit_due", now=clock)]
            return self.admit(tx, keys, clock)

        return self.engine.run(op)

    def limit_set(
        self, key: str, ceiling: int | None, rate: str | None = None, *, now: Now = None
    ) -> LimitState:
        """Set a key's ceiling and rate (None: none), then admit what the new limit allows."""
        limit = Limit(key, ceiling, rate)
        count, period = _rate_columns(limit.rate)

        def op(tx: Tx) -> None:
            clock = tx.clock(now)
            tx.one(
                "limit_set", key=key, ceiling=limit.ceiling, rate_count=count,
                rate_period=period, now=clock,
            )  # fmt: skip
            self.admit(tx, [key], clock)

        self.engine.run(op)
        return self._state(key)

    def limit_pause(self, key: str, seconds: float, *, now: Now = None) -> datetime:
        """Admit none of the key's jobs for ``seconds`` (a pause that ends later stays), and
        hold again those admitted that no claim took yet; returns the end of the pause."""
        Limit(key)
        seconds = _pause_seconds(seconds)
        return self.engine.time(
            self.engine.run(lambda tx: self._pause(tx, key, seconds, tx.clock(now)))
        )

    def _pause(self, tx: Tx, key: str, seconds: float, clock: Any) -> Any:
        row = tx.one("limit_pause", key=key, seconds=seconds, now=clock)
        tx.all("limit_hold", key=key)
        assert row is not None
        return row["paused_until"]

    def pause_claim(
        self,
        claim: Claim,
        key: str,
        seconds: float,
        release: Callable[[Tx, list[Claim], Any], list[Claim]],
        *,
        now: Now = None,
    ) -> datetime:
        """limit_pause, and the job of ``claim`` given back (``release``, fenced: held,
        without spending an attempt), in one transaction; StaleClaim if it is not current."""
        Limit(key)
        seconds = _pause_seconds(seconds)

        def op(tx: Tx) -> Any:
            clock = tx.clock(now)
            if not release(tx, [claim], clock):
                raise errors.StaleClaim(
                    f"job {claim.job_id} attempt {claim.attempt} is no longer claimed by this "
                    "session: its limit was not paused",
                    job_id=claim.job_id, attempt=claim.attempt, session_id=claim.session_id,
                )  # fmt: skip
            return self._pause(tx, key, seconds, clock)

        return self.engine.time(self.engine.run(op))

    def limit_resume(self, key: str, *, now: Now = None) -> bool:
        """End the key's pause and admit its jobs; False when no such limit exists."""

        def op(tx: Tx) -> bool:
            clock = tx.clock(now)
            if tx.one("limit_resume", key=key) is None:
                return False
            self.admit(tx, [key], clock)
            return True

        return self.engine.run(op)

    def limit_list(self, *, now: Now = None) -> list[LimitState]:
        rows = self.engine.run(lambda tx: tx.all("limit_list", now=tx.clock(now)), write=False)
        return [
            LimitState(
                key=str(r["key"]),
                ceiling=None if r["ceiling"] is None else int(r["ceiling"]),
                rate=rate_text(r["rate_count"], r["rate_period"]),
                running=int(r["running"]),
                admitted=int(r["admitted"]),
                held=int(r["held"]),
                paused_until=self.engine.opt_time(r["paused_until"]),
            )
            for r in rows
        ]

    def _state(self, key: str) -> LimitState:
        for state in self.limit_list():
            if state.key == key:
                return state
        raise errors.StoreError(f"limit {key!r} was set but cannot be read back")
