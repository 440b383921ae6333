"""Ordered keys: at most one job of a key running, its jobs started in enqueue order, built
on the limits at admission (plunder.store.limits; docs/decisions/0013-ordered-keys.md).

A job is ordered when its task says ``ordered=True`` (or ``"stop"``) or its queue is
declared ordered, and it names a ``partition_key``. At enqueue (``order``) it gets the
limit ``(QUEUE~KEY, 1)``: it is enqueued held, like every limited job, and an admission
(plunder.store.limits) takes the ordered keys among its keys first, in two statements for
them all:

```
 order_lock_many: which keys are ordered; their limit rows locked, in key order (the
                  admissions of a key take turns), paused or not
   ─▶ order_admit_many (a statement of its own, so it sees every admission before): for
      each key not paused with no job running or admitted (a dead worker's counts as
      running until the janitor rescues it) and, if it stops on failure, no failed job
      since its release — its pending job first enqueued (lowest id), only once due
```

So a later job never passes the head: not by priority, not while the head waits for its
retry's backoff, not while a dead worker's run of it waits to be rescued (it counts as
running until then, and goes back held: the head again). A new owner of the key's
partition claims only what admission brings back, so rebalancing cannot start a key's
next job while its current one still runs.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Mapping, Sequence
from typing import Any

from plunder import errors
from plunder.model import MAX_LIMIT_KEY, JobSpec, Limit
from plunder.store.driver import Now, Tx
from plunder.store.engine import Engine
from plunder.store.partitioning import OrderedKey

MODES = ("continue", "stop")  # what a failed job of the key does: go on, or stop it


def mode_of(value: object, what: str) -> str | None:
    """``ordered`` as given (False/None, True, "continue", "stop") as a mode, or None."""
    if value is None or value is False:
        return None
    if value is True:
        return "continue"
    if isinstance(value, str) and value in MODES:
        return value
    raise errors.PayloadError(
        f"ordered of {what} must be True, False, 'continue' or 'stop', not {value!r}"
    )


def key_of(queue: str, partition_key: str) -> str:
    """The limit key of an ordered key of ``queue``."""
    return f"{queue}~{partition_key}"


def order(specs: Sequence[JobSpec], queues: Mapping[str, str]) -> Sequence[JobSpec]:
    """Each ordered spec (its own ``ordered``, else its queue's in ``queues``) with its
    key's limit of one, and ``ordered`` as its mode; the others as they are."""
    out: list[JobSpec] | None = None
    for i, spec in enumerate(specs):
        mode = mode_of(spec.ordered, repr(spec.task))
        if mode is None and isinstance(spec.queue, str):
            mode = queues.get(spec.queue)
        if mode is None:
            continue
        if spec.partition_key is None:
            raise errors.PayloadError(
                f"{spec.task!r} is ordered: give it a partition_key (jobs of one key run "
                "one at a time, in order)"
            )
        if spec.limit is not None:
            raise errors.PayloadError(
                f"{spec.task!r} is ordered and names the limit {spec.limit.key!r}: a job "
                "may have one or the other"
            )
        key = key_of(spec.queue, spec.partition_key)
        if len(key) > MAX_LIMIT_KEY:
            raise errors.PayloadError(
                f"the ordered key {key[:40]!r}... of {spec.task!r} is longer than "
                f"{MAX_LIMIT_KEY} characters (queue, '~' and partition_key)"
            )
        if out is None:
            out = list(specs)
        out[i] = dataclasses.replace(spec, limit=Limit(key, 1), ordered=mode)
    return specs if out is None else out


def declare(tx: Tx, specs: Sequence[JobSpec]) -> None:
    """The ordered keys of these (ordered) specs, with their mode."""
    modes = {
        s.limit.key: str(s.ordered) for s in specs if s.limit is not None and s.ordered in MODES
    }
    if modes:
        tx.batch("order_declare", [{"key": k, "on_failure": modes[k]} for k in sorted(modes)])


def admit_many(
    tx: Tx, keys: Collection[str], clock: Any, engine: Engine
) -> tuple[set[str], list[Any]]:
    """Within an admission: of ``keys``, those that are ordered (their limit rows locked,
    in key order), and the rows of their heads admitted (each key free and not stopped,
    its head due). The others are the limits' to admit."""
    found = tx.all("order_lock_many", keys=engine.list_in(sorted(set(keys))), now=clock)
    if not found:
        return set(), []
    ordered = {str(r["key"]) for r in found}
    free = sorted(str(r["key"]) for r in found if not r["paused"])
    if not free:
        return ordered, []
    return ordered, tx.all("order_admit_many", keys=engine.list_in(free), now=clock)


def queue_set(tx: Tx, queue: str, ordered: object) -> None:
    """Declare the jobs of ``queue`` ordered by their partition key (a mode), or not."""
    mode = mode_of(ordered, f"queue {queue!r}")
    if mode is None:
        tx.all("order_queue_clear", queue=queue)
    else:
        tx.all("order_queue_set", queue=queue, on_failure=mode)


def queues(tx: Tx) -> dict[str, str]:
    """The queues declared ordered, and their modes."""
    return {str(r["queue"]): str(r["on_failure"]) for r in tx.all("order_queue_list")}


class Ordering:
    """The store's operations on ordered keys and queues; ``admit_keys`` runs the limits'
    admission (given by plunder.store.limits) after a release."""

    def __init__(self, engine: Engine, admit_keys: Any) -> None:
        self.engine = engine
        self.admit_keys = admit_keys

    def order_release(self, key: str, *, now: Now = None) -> bool:
        """Let a stopped key go on past its failed jobs, and admit its next; False when
        no such ordered key exists."""

        def op(tx: Tx) -> bool:
            if tx.one("order_release", key=key) is None:
                return False
            self.admit_keys(tx, [key], tx.clock(now))
            return True

        return self.engine.run(op)

    def order_list(self) -> list[OrderedKey]:
        rows = self.engine.run(lambda tx: tx.all("order_list"), write=False)
        return [
            OrderedKey(
                str(r["key"]),
                str(r["on_failure"]),
                None if r["failed_job"] is None else int(r["failed_job"]),
                int(r["pending"]),
            )
            for r in rows
        ]
