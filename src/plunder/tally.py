"""In-process counts for metrics: what this process enqueued, started, acknowledged,
retried and swept, kept in plain dictionaries under one lock taken once per batch.

```
 hooks (a line each: store, worker, janitor, gateway) ─▶ TALLY (counts, histograms)
                                                            │ read at scrape time
 plunder.metrics (prometheus_client collectors) ◀───────────┘
```

Nothing is counted until ``enable()`` (``plunder worker --metrics-port``, ``plunder
serve``): a hook then costs a check of one global. Counting never touches the database:
the gauges read from it (pending, running) are plunder.metrics' own, at scrape time.
This module needs no third-party package; only plunder.metrics imports prometheus_client.
"""

from __future__ import annotations

import bisect
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from plunder import payload
from plunder.model import AckResult, JobRecord, JobSpec

T = TypeVar("T")
# seconds: from sub-millisecond jobs to hour-long ones
DURATION_BUCKETS = (0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 10.0, 60.0, 300.0, 3600.0)
LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0)
MAX_TRACKED = 100_000  # started jobs awaiting their acknowledgement (then forgotten)


@dataclass
class Histogram:
    """Cumulative-bucket counts of observations (their ``sum`` and ``count``), keyed by
    labels; ``buckets`` are upper bounds, +Inf implied."""

    buckets: tuple[float, ...]
    counts: dict[tuple[str, ...], list[int]] = field(default_factory=dict)
    sums: dict[tuple[str, ...], float] = field(default_factory=dict)

    def observe(self, labels: tuple[str, ...], value: float) -> None:
        """Under the tally's lock."""
        counts = self.counts.get(labels)
        if counts is None:
            counts = self.counts[labels] = [0] * (len(self.buckets) + 1)
            self.sums[labels] = 0.0
        counts[bisect.bisect_left(self.buckets, value)] += 1
        self.sums[labels] += value

    def snapshot(self) -> list[tuple[tuple[str, ...], list[tuple[str, int]], float]]:
        """(labels, cumulative (bound, count) pairs ending with +Inf, sum) for each."""
        out = []
        for labels, counts in list(self.counts.items()):
            running, pairs = 0, []
            for bound, count in zip([*map(repr, self.buckets), "+Inf"], counts, strict=True):
                running += count
                pairs.append((bound, running))
            out.append((labels, pairs, self.sums[labels]))
        return out


class Tally:
    """The counts of one process (see the module docstring); every method is safe from
    any thread."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.enqueued: dict[tuple[str, str], int] = {}  # (queue, task)
        self.started: dict[tuple[str, str], int] = {}
        self.finished: dict[tuple[str, str, str], int] = {}  # (queue, task, outcome)
        self.events: dict[str, int] = {}  # see plunder.metrics.EVENTS
        self.janitor: dict[str, int] = {}  # passes by held / idle
        self.run_seconds = Histogram(DURATION_BUCKETS)
        self.wait_seconds = Histogram(DURATION_BUCKETS)
        self.janitor_seconds = Histogram(LATENCY_BUCKETS)
        self.request_seconds = Histogram(LATENCY_BUCKETS)  # (route, method, status)
        self._running: dict[tuple[int, int], tuple[str, str, float]] = {}

    def count_enqueued(self, specs: Iterable[JobSpec]) -> None:
        with self.lock:
            for spec in specs:
                key = (payload.base_queue(spec.queue), spec.task)
                self.enqueued[key] = self.enqueued.get(key, 0) + 1

    def count_started(self, jobs: Sequence[JobRecord]) -> None:
        """Jobs claimed and started here: their wait (by the database clock, from when
        they were due to when they were claimed) and when they started (to time them)."""
        now = time.monotonic()
        with self.lock:
            if len(self._running) > MAX_TRACKED:  # acknowledgements lost with a session
                self._running.clear()
            for job in jobs:
                key = (payload.base_queue(job.queue), job.task)
                self.started[key] = self.started.get(key, 0) + 1
                self._running[(job.id, job.attempt)] = (*key, now)
                if job.started_at is not None:
                    wait = (job.started_at - job.run_at).total_seconds()
                    self.wait_seconds.observe(key, max(0.0, wait))

    def count_acknowledged(self, ack: AckResult, outcome: str) -> None:
        """Results written: ``ack.accepted`` ended with ``outcome`` (their time from start
        to acknowledgement observed), ``ack.stale`` refused (their claim was not current)."""
        now = time.monotonic()
        with self.lock:
            for claim in ack.accepted:
                started = self._running.pop((claim.job_id, claim.attempt), None)
                if started is None:
                    continue  # started before metrics were enabled
                queue, task, at = started
                key = (queue, task, outcome)
                self.finished[key] = self.finished.get(key, 0) + 1
                self.run_seconds.observe(key, now - at)
            for claim in ack.stale:
                self._running.pop((claim.job_id, claim.attempt), None)
            if ack.stale:
                self.events["stale_acknowledgements"] = self.events.get(
                    "stale_acknowledgements", 0
                ) + len(ack.stale)

    def count(self, event: str, n: int = 1) -> None:
        with self.lock:
            self.events[event] = self.events.get(event, 0) + n

    def count_pass(self, held: bool, rescued: int, seconds: float) -> None:
        with self.lock:
            state = "held" if held else "idle"
            self.janitor[state] = self.janitor.get(state, 0) + 1
            self.janitor_seconds.observe((state,), seconds)
            if rescued:
                self.events["rescued_jobs"] = self.events.get("rescued_jobs", 0) + rescued

    def count_request(self, route: str, method: str, status: int, seconds: float) -> None:
        with self.lock:
            self.request_seconds.observe((route, method, str(status)), seconds)


TALLY = Tally()
_enabled = False


def enable() -> Tally:
    """Count from now on (for this process's lifetime); the tally."""
    global _enabled  # noqa: PLW0603 - one switch for the process's hooks
    _enabled = True
    return TALLY


def enabled() -> bool:
    return _enabled


# -- the hooks: each a check of the switch while metrics are off ----------------------------
def enqueued(specs: Sequence[JobSpec]) -> None:
    if _enabled:
        TALLY.count_enqueued(specs)


def started(jobs: Sequence[JobRecord]) -> None:
    if _enabled:
        TALLY.count_started(jobs)


def acknowledged(ack: AckResult, outcome: str) -> None:
    if _enabled:
        TALLY.count_acknowledged(ack, outcome)


def event(name: str, n: int = 1) -> None:
    """``sessions_opened`` or ``busy_retries`` (see plunder.metrics.EVENTS)."""
    if _enabled:
        TALLY.count(name, n)


def janitor_pass(run_once: Callable[[], Any]) -> Any:
    """``run_once()`` (a janitor pass), timed and counted with the jobs it rescued."""
    if not _enabled:
        return run_once()
    began = time.monotonic()
    done = run_once()
    rescued = len(done.reaped.retried) + len(done.reaped.finished) if done.held else 0
    TALLY.count_pass(done.held, rescued, time.monotonic() - began)
    return done
