"""Prometheus metrics (``prometheus_client``, the ``metrics`` extra): the process's
tally (plunder.tally) and the database's job counts, exposed by ``plunder serve`` at
``/metrics`` and by ``plunder worker --metrics-port N``.

```
 scrape ─▶ registry ─┬─ TallyCollector: counters and histograms of this process (no I/O)
                     └─ QueueCollector: pending and running jobs by queue, the oldest
                        pending age — one query (of those statuses' partial indexes), at
                        most once per MIN_INTERVAL however often it is scraped (between
                        reads, the last answer)
```

The metric names are listed in docs/guide/metrics.md.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

from plunder import errors, tally
from plunder.model import QueueStats
from plunder.store.base import Store

MIN_INTERVAL = 1.0  # seconds between two reads of the database's counts
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


def _client() -> Any:
    try:
        import prometheus_client
        import prometheus_client.core
    except ImportError as exc:
        raise errors.ConfigError(
            "metrics need prometheus_client: pip install 'plunder[metrics]'"
        ) from exc
    return prometheus_client


class TallyCollector:
    """The process's counts, as read at scrape time."""

    def __init__(self, counts: tally.Tally) -> None:
        self.tally = counts

    def collect(self) -> Iterator[Any]:
        core = _client().core
        t = self.tally
        with t.lock:  # a consistent copy; the hooks wait for it a moment at most
            enqueued, started = dict(t.enqueued), dict(t.started)
            finished, events, passes = dict(t.finished), dict(t.events), dict(t.janitor)
            histograms = [
                (name, h.snapshot(), labels, doc)
                for name, h, labels, doc in (
                    ("plunder_job_run_seconds", t.run_seconds, ("queue", "task", "outcome"),
                     "Seconds from a job's start in this worker to its acknowledgement."),
                    ("plunder_job_wait_seconds", t.wait_seconds, ("queue", "task"),
                     "Seconds from when a job was due to its claim (database clock)."),
                    ("plunder_janitor_pass_seconds", t.janitor_seconds, ("lease",),
                     "Seconds a janitor pass took."),
                    ("plunder_gateway_request_seconds", t.request_seconds,
                     ("route", "method", "status"), "Seconds the gateway took to answer."),
                )
            ]  # fmt: skip
        yield _counter(core, "plunder_jobs_enqueued", "Jobs enqueued by this process.",
                       ("queue", "task"), enqueued)  # fmt: skip
        yield _counter(core, "plunder_jobs_started", "Jobs claimed and started here.",
                       ("queue", "task"), started)  # fmt: skip
        yield _counter(core, "plunder_jobs_finished", "Attempts acknowledged, by outcome.",
                       ("queue", "task", "outcome"), finished)  # fmt: skip
        for name, doc in EVENTS.items():
            family = core.CounterMetricFamily(f"plunder_{name}", doc)
            family.add_metric([], events.get(name, 0))
            yield family
        family = core.CounterMetricFamily(
            "plunder_janitor_passes", "Janitor passes, by whether this process held the lease.",
            labels=["lease"],
        )  # fmt: skip
        for state in ("held", "idle"):
            family.add_metric([state], passes.get(state, 0))
        yield family
        for name, snapshot, labels, doc in histograms:
            family = core.HistogramMetricFamily(name, doc, labels=list(labels))
            for values, buckets, total in snapshot:
                family.add_metric(list(values), buckets, total)
            yield family


EVENTS = {
    "sessions_opened": "Worker sessions opened by this process.",
    "stale_acknowledgements": "Results refused: their claim was no longer current.",
    "busy_retries": "Busy answers (a database, a gateway) waited out and retried.",
    "rescued_jobs": "Jobs of dead sessions retried or ended by this process's janitor.",
}


def _counter(
    core: Any, name: str, doc: str, labels: tuple[str, ...], counts: dict[Any, int]
) -> Any:
    family = core.CounterMetricFamily(name, doc, labels=list(labels))
    for values, n in sorted(counts.items()):
        family.add_metric(list(values), n)
    return family


class QueueCollector:
    """Pending and running jobs by queue, and the oldest due pending job's age, from the
    database at most once per ``min_interval`` seconds (see the module docstring)."""

    def __init__(self, store: Store, *, min_interval: float = MIN_INTERVAL) -> None:
        self.store = store
        self.min_interval = min_interval
        self.reads = 0  # of the database, for tests and the docs' claim
        self._lock = threading.Lock()
        self._last: tuple[float, list[QueueStats]] | None = None

    def stats(self) -> list[QueueStats]:
        with self._lock:  # scrapes at once wait for one read
            last = self._last
            if last is not None and time.monotonic() - last[0] < self.min_interval:
                return last[1]
            stats = self.store.queue_active()
            self.reads += 1
            self._last = (time.monotonic(), stats)
            return stats

    def collect(self) -> Iterator[Any]:
        core = _client().core
        stats = self.stats()
        jobs = core.GaugeMetricFamily(
            "plunder_jobs", "Pending and running jobs in the database, by queue.",
            labels=["queue", "status"],
        )  # fmt: skip
        oldest = core.GaugeMetricFamily(
            "plunder_oldest_pending_seconds",
            "Age of the oldest pending job that is due, by queue (database clock).",
            labels=["queue"],
        )
        for queue in stats:
            for status, n in sorted(queue.counts.items()):
                jobs.add_metric([queue.queue, status], n)
            if queue.oldest_pending_age is not None:
                oldest.add_metric([queue.queue], queue.oldest_pending_age)
        yield jobs
        yield oldest


def registry(store: Store | None) -> Any:
    """A registry of this process's metrics (and the database's counts with ``store``);
    counting is enabled from now on."""
    client = _client()
    counts = tally.enable()
    found = client.CollectorRegistry(auto_describe=False)
    found.register(TallyCollector(counts))
    if store is not None:
        found.register(QueueCollector(store))
    return found


def render(found: Any) -> bytes:
    """The registry's metrics in Prometheus's text format."""
    return bytes(_client().generate_latest(found))


def serve(port: int, store: Store | None, *, host: str = "0.0.0.0") -> Any:
    """Serve ``/metrics`` on ``port`` from a daemon thread of prometheus_client's own;
    the server (its ``shutdown()`` stops it)."""
    try:
        server, _thread = _client().start_http_server(port, addr=host, registry=registry(store))
    except OSError as exc:
        raise errors.ConfigError(f"cannot serve metrics on {host}:{port}: {exc}") from exc
    return server
