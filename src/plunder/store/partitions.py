"""Partitioned queues: a queue declared with N partitions keeps the jobs of partition p in
the queue ``q~p`` (plunder.payload.partition_queue), and the janitor gives each partition
to one live session serving ``q``.

```
 enqueue ─▶ route: partition_key given: a stable hash of it mod N; none: round-robin
            ─▶ the job is stored in q~p (claims over a list of queues do the rest)
 janitor pass ─▶ partition_members (live sessions, their queues) ─▶ for each partitioned
                 queue: each partition to the member it ranks first (rendezvous: a hash of
                 queue, partition and session), none taking more than its share
                 ─▶ written only where it changed, the queue's generation + 1
 heartbeat ─▶ partition_owned: each partitioned queue, its generation, the partitions
              the session owns (plunder.ownership keeps the newest generation heard)
```

Ownership is a preference, not a lock: a worker claims from its own partitions first and
from every partition of the queue when those are empty, and each claim stays fenced by its
job's (job, attempt, session) token, so a stale assignment never makes a job run twice.
"""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import threading
import time
from collections.abc import Mapping, Sequence
from typing import Any

from plunder import errors, payload
from plunder.model import JobSpec, Lease, PartitionedQueue, Partitioning
from plunder.store import convert, ordering
from plunder.store.driver import Now, Tx
from plunder.store.engine import Engine
from plunder.store.maintenance import Maintenance

# seconds a store's reading of the declared partitions is used for routing: an enqueue
# reads them again at most this often (an enqueue that does is a read slower)
FRESH = 5.0


def stable_hash(text: str) -> int:
    """A hash that is the same in every process (Python's own ``hash`` is salted)."""
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "big")


def partition_of(key: str, partitions: int) -> int:
    return stable_hash(key) % partitions


def assign(queue: str, partitions: int, members: Sequence[str]) -> list[str]:
    """The owner of each partition of ``queue`` among ``members`` (session ids): the
    member that ranks it highest (rendezvous hashing) among those that have not taken
    their share yet, so that the division is balanced and moves few partitions when a
    member comes or goes. Empty: no member."""
    if not members:
        return []
    share = -(-partitions // len(members))  # ceiling
    taken = dict.fromkeys(members, 0)
    owners = []
    for partition in range(partitions):
        ranked = sorted(
            members, key=lambda m: (stable_hash(f"{queue}~{partition}:{m}"), m), reverse=True
        )
        owner = next(m for m in ranked if taken[m] < share)
        taken[owner] += 1
        owners.append(owner)
    return owners


class Partitions:
    """Declarations, routing at enqueue, the janitor's assignment and what a heartbeat
    hears of it."""

    def __init__(self, engine: Engine, maintenance: Maintenance) -> None:
        self.engine = engine
        self.maintenance = maintenance
        self._lock = threading.Lock()
        self._counts: dict[str, int] = {}
        self._ordered: dict[str, str] = {}  # queues declared ordered, and their modes
        self._read_at = float("-inf")
        self._next = itertools.count()  # round-robin: this store's enqueues take turns

    def partition_declare(
        self, queue: str, partitions: int, *, ordered: bool | str | None = None
    ) -> None:
        """Declare ``queue`` partitioned in ``partitions`` (1-1024); a new count makes
        the janitor assign them anew. ``ordered`` (None: as it was) declares its jobs
        ordered by partition key (plunder.store.ordering)."""
        payload.check_queue(queue)
        count = convert.integer("partitions", partitions, 1, payload.MAX_PARTITIONS - 1)
        mode = None if ordered is None else ordering.mode_of(ordered, f"queue {queue!r}")

        def op(tx: Tx) -> None:
            tx.all("partition_declare", queue=queue, partitions=count)
            if ordered is not None:
                ordering.queue_set(tx, queue, ordered)

        self.engine.run(op)
        with self._lock:
            self._counts[queue] = count
            if ordered is not None:
                self._ordered.pop(queue, None)
                if mode is not None:
                    self._ordered[queue] = mode

    def partition_counts(self, *, fresh: float = FRESH, conn: Any = None) -> dict[str, int]:
        """The partitioned queues and their partitions, as read at most ``fresh`` seconds
        ago; read anew in the transaction the caller holds open on ``conn``, if given
        (SQLite cannot begin another on it)."""
        with self._lock:
            if time.monotonic() - self._read_at < fresh:
                return dict(self._counts)
        rows, modes = self.engine.run(
            lambda tx: (tx.all("partition_list"), ordering.queues(tx)), write=False, conn=conn
        )
        counts = {str(r["queue"]): int(r["partitions"]) for r in rows}
        with self._lock:
            self._counts, self._ordered, self._read_at = counts, modes, time.monotonic()
        return dict(counts)

    def partition_list(self) -> list[PartitionedQueue]:
        def op(tx: Tx) -> tuple[list[Any], list[Any]]:
            return tx.all("partition_list"), tx.all("partition_owner_list")

        queues, owners = self.engine.run(op, write=False)
        held = {(str(r["queue"]), int(r["partition"])): str(r["session_id"]) for r in owners}
        return [
            PartitionedQueue(
                str(r["queue"]),
                int(r["partitions"]),
                int(r["generation"]),
                tuple(held.get((str(r["queue"]), p)) for p in range(int(r["partitions"]))),
            )
            for r in queues
        ]

    def route(
        self,
        specs: Sequence[JobSpec],
        counts: Mapping[str, int] | None = None,
        *,
        conn: Any = None,
    ) -> Sequence[JobSpec]:
        """Specs of partitioned queues each in its partition's queue; the others as they
        are. A user's queue may not name a partition itself. Ordered specs get their
        key's limit first (plunder.store.ordering). ``counts``: the partitions as read
        before; else read now, in the caller's transaction on ``conn`` if given."""
        if specs:
            if counts is None:
                counts = self.partition_counts(conn=conn)
            with self._lock:
                modes = dict(self._ordered)
            specs = ordering.order(specs, modes)
        routed: list[JobSpec] | None = None
        for i, spec in enumerate(specs):
            if spec.partition_key is None:
                payload.check_queue(spec.queue)  # "q~3" is not a name users give
            elif not isinstance(spec.partition_key, str):
                raise errors.PayloadError(
                    f"partition_key of {spec.task!r} must be a string, not "
                    f"{type(spec.partition_key).__name__}"
                )
            assert counts is not None
            n = counts.get(spec.queue) if isinstance(spec.queue, str) else None
            if n is None:
                continue
            key = spec.partition_key
            p = next(self._next) % n if key is None else partition_of(key, n)
            if routed is None:
                routed = list(specs)
            routed[i] = dataclasses.replace(spec, queue=payload.partition_queue(spec.queue, p))
        return specs if routed is None else routed

    def owned(self, tx: Tx, session_id: str, queues: Sequence[str]) -> tuple[Partitioning, ...]:
        """Each partitioned queue of ``queues``: what its assignment gives the session."""
        found: dict[str, Partitioning] = {}
        for row in tx.all("partition_owned", session_id=session_id):
            queue = str(row["queue"])
            if queue not in queues:
                continue
            seen = found.get(queue) or Partitioning(
                queue, int(row["partitions"]), int(row["generation"])
            )
            if row["partition"] is not None:
                seen = dataclasses.replace(seen, owned=(*seen.owned, int(row["partition"])))
            found[queue] = seen
        return tuple(found.values())

    def partition_assign_many(self, lease: Lease, *, now: Now = None) -> list[str]:
        """Assign each partition of each partitioned queue to one live session serving
        it (see ``assign``), fenced by ``lease``; the queues whose assignment changed."""

        if not self.engine.run(lambda tx: tx.all("partition_list"), write=False):
            return []  # no partitioned queue: no write transaction

        def op(tx: Tx) -> list[str]:
            clock = tx.clock(now)
            self.maintenance.fence(tx, lease, clock)
            members: dict[str, list[str]] = {}
            for row in tx.all("partition_members", now=clock):
                for queue in self.engine.list_out(row["queues"]):
                    members.setdefault(queue, []).append(str(row["id"]))
            current: dict[str, dict[int, str]] = {}
            for row in tx.all("partition_owner_list"):
                current.setdefault(str(row["queue"]), {})[int(row["partition"])] = str(
                    row["session_id"]
                )
            changed = []
            for row in tx.all("partition_list"):
                queue, count = str(row["queue"]), int(row["partitions"])
                owners = assign(queue, count, members.get(queue, []))
                if dict(enumerate(owners)) == current.get(queue, {}):
                    continue
                tx.all("partition_owners_clear", queue=queue)
                if owners:
                    tx.all("partition_owners_set", queue=queue, owners=self.engine.list_in(owners))
                tx.one("partition_generation_next", queue=queue)
                changed.append(queue)
            return changed

        return self.engine.run(op)
