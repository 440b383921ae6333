"""The store's operations on partitioned queues (plunder.store.partitions implements
them; ``Store`` has them too)."""

from __future__ import annotations

from datetime import datetime
from typing import Protocol

from plunder.model import Lease, PartitionedQueue


class Partitioned(Protocol):
    def partition_declare(self, queue: str, partitions: int) -> None:
        """Declare ``queue`` partitioned in ``partitions`` (1-1023): its jobs are stored in
        the queue of their partition (``q~3``); a new count is assigned anew."""
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
