"""The partitions a worker owns, as its session's heartbeats hear them, and the queues
its claims name for them (plunder.store.partitions divides them).

```
 heartbeat answer ─▶ heard(): per partitioned queue, the newest generation heard wins
 a claim ─▶ preferred(): its own partitions' queues (and its other queues as they are)
            └─ came back empty ─▶ everything(): every partition of each queue (stealing)
```

A worker that has heard nothing of a queue yet (before its first heartbeat answers, or
where the far end does not say: a gateway older than the field) claims from the queue's
every partition it knows of, and from ``q`` itself, without preference.
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

    def generations(self) -> dict[str, int]:
        with self._lock:
            return {q: p.generation for q, p in self._known.items()}

    def owned(self, queue: str) -> tuple[int, ...]:
        with self._lock:
            found = self._known.get(queue)
        return () if found is None else found.owned

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
