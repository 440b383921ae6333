"""The partitions a worker owns, as its session's heartbeats hear them, and the queues
its claims name for them (plunder.store.partitions divides them).

```
 heartbeat answer ─▶ heard(): per partitioned queue, the newest generation heard wins
 a claim ─▶ preferred(): its own partitions' queues (and its other queues as they are)
            └─ came back empty ─▶ everything(): every partition of each queue (stealing)
```

Before its first heartbeat answers, a worker knows the partitioned queues as declared
(``declared``, read where the worker has the database) and claims from all their
partitions. One that hears nothing of partitions (a gateway older than the field) claims
from ``q`` alone: it never sees the jobs of a partition.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence

from plunder import payload
from plunder.model import Partitioning


class Ownership:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._known: dict[str, Partitioning] = {}

    def heard(self, partitions: Sequence[Partitioning]) -> None:
        """A heartbeat's answer: each partitioned queue of the session; one it no longer
        names is forgotten. An assignment older than one heard before is ignored."""
        with self._lock:
            known = {}
            for found in partitions:
                before = self._known.get(found.queue)
                newer = before is None or found.generation >= before.generation
                known[found.queue] = found if newer or before is None else before
            self._known = known

    @property
    def partitioned(self) -> bool:
        """Whether any queue is known to be partitioned (a read without the lock: a
        claim made as the answer comes in names the queues as before, then as now)."""
        return bool(self._known)

    def declared(self, counts: dict[str, int]) -> None:
        """The partitioned queues as declared (before a heartbeat has said more): claimed
        from by every partition, none owned yet."""
        with self._lock:
            for queue, partitions in counts.items():
                self._known.setdefault(queue, Partitioning(queue, partitions, -1))

    def generations(self) -> dict[str, int]:
        with self._lock:
            return {q: p.generation for q, p in self._known.items()}

    def preferred(self, queues: Sequence[str]) -> list[str] | None:
        """The queues a claim names first: each partitioned queue by the partitions owned,
        the others as they are; None: none of ``queues`` is partitioned."""
        with self._lock:
            known = dict(self._known)
        if not any(q in known for q in queues):
            return None
        mine: list[str] = []
        for queue in queues:
            found = known.get(queue)
            if found is None:
                mine.append(queue)
            else:
                mine += [payload.partition_queue(queue, p) for p in found.owned]
        return mine

    def everything(self, queues: Sequence[str]) -> list[str]:
        """Every queue a job of ``queues`` may be in: each partitioned queue by all its
        partitions, and itself (jobs enqueued before it was partitioned)."""
        with self._lock:
            known = dict(self._known)
        every: list[str] = []
        for queue in queues:
            every.append(queue)
            found = known.get(queue)
            if found is not None:
                every += [payload.partition_queue(queue, p) for p in range(found.partitions)]
        return every
