"""Operations of ``Store`` beyond its core, kept out of plunder.store.base: those on
partitioned queues (plunder.store.partitioning) and the reads for metrics and traces."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Protocol

from plunder.model import QueueStats
from plunder.store.partitioning import Partitioned


class Extras(Partitioned, Protocol):
    def queue_active(self, *, now: datetime | None = None) -> list[QueueStats]:
        """queue_stats' pending and running counts and oldest ages alone, in one query
        that reads no finished job: for metrics, at scrape time."""
        ...

    def trace_get_many(self, job_ids: Sequence[int]) -> dict[int, str]:
        """The stored trace context (W3C, as JSON text) of each of ``job_ids`` that has one."""
        ...
