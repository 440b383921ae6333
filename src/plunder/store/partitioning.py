"""The store's operations on partitioned queues (plunder.store.partitions implements
them; ``Store`` has them too)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Protocol

from plunder.model import Lease, PartitionedQueue


@dataclass(frozen=True, slots=True)
class OrderedKey:
    """An ordered key as ``plunder ordered`` shows it: what a failure does, the failed job
    that stops it (None: it runs), and its jobs pending."""

    key: str
    on_failure: str
    failed_job: int | None
    pending: int

    @property
    def stopped(self) -> bool:
        return self.on_failure == "stop" and self.failed_job is not None


class Partitioned(Protocol):
    def partition_declare(
        self, queue: str, partitions: int, *, ordered: bool | str | None = None
    ) -> None:
        """Declare ``queue`` partitioned in ``partitions`` (1-1023): its jobs are stored in
        the queue of their partition (``q~3``); a new count is assigned anew. ``ordered``
        (True, "continue", "stop"; False: not; None: as it was): one job of a partition
        key runs at a time, in enqueue order (plunder.store.ordering)."""
        ...

    def order_release(self, key: str, *, now: datetime | None = None) -> bool:
        """Let an ordered key stopped by a failed job go on with its next jobs; False when
        no such ordered key exists."""
        ...

    def order_list(self) -> list[OrderedKey]:
        """Every ordered key: what a failure does, the failed job stopping it, its jobs
        pending."""
        ...

    def partition_counts(self, *, fresh: float = 5.0) -> dict[str, int]:
        """The partitioned queues and their partitions, read at most ``fresh`` s ago."""
        ...

    def partition_assign_many(self, lease: Lease, *, now: datetime | None = None) -> list[str]:
        """The janitor's pass: each partition to one live session of its queue, fenced
        by ``lease``; the queues whose assignment changed (their generation grew)."""
        ...

    def partition_list(self) -> list[PartitionedQueue]:
        """Each partitioned queue and the owner of each of its partitions."""
        ...
