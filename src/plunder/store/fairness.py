"""Fair queues: a claim on a fair queue takes its groups (tenants) in turn, weighted, so
that one group's burst does not starve another's few jobs (see
docs/decisions/0012-fair-queues.md and docs/guide/fairness.md).

Each group of a fair queue with pending jobs has a row with a *virtual time*. A claim:

```
 fair_turn   the next few groups, lowest virtual time first (plunder_fair_groups_turn)
   ─▶ shares   group g's i-th slot is due at vtime_g + i / weight_g: the `limit` first of
               those say how many slots each group gets
   ─▶ fair_walk  each group's due jobs in claim order (priority first) while their costs
               fit its share, on plunder_jobs_fair (an index range of that group alone:
               never the others' jobs), with the plain claim's filters (labels, cost)
   ─▶ claim    the jobs found (job_claim_many on SQLite, fair_claim on PostgreSQL)
   ─▶ fair_advance  a group served: vtime + slots taken / weight; none due: behind all
   ─▶ session_free  a labelled session's free slots, less all the claim took
```

An enqueue makes the rows of new groups at the queue's lowest virtual time (served within
the round). The janitor prunes the rows of groups without pending jobs and makes those of
groups whose jobs came back without one (fair_repair). What the groups miss — a job
whose group has no row yet, or no group — the claim takes after them, in plain claim
order, whenever the groups' turn did not fill it: a fair queue never stalls on its rows.

The claim's ``limit`` is slots: jobs are taken while their costs fit what is left of it,
and the first that does not fit ends the claim, as in a plain claim (decision 0019).
Shares count slots too, so a group of costly jobs gets the slots of its weight, not as
many jobs as a group of cheap ones: a group takes its jobs while their costs fit its share,
but its first job of a walk even past it (its virtual time then moves on by all it took,
so it gets that much less after), else a job costing more than a share would never run.
"""

from __future__ import annotations

import heapq
import itertools
import json
import math
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any

from plunder import access, payload
from plunder.model import SUSPECT_LOSSES, JobSpec
from plunder.store.driver import Claimed, Now, Tx
from plunder.store.engine import Engine
from plunder.store.fairqueues import FairGroup

FRESH = 5.0  # seconds a store's reading of the fair queues is used
DEFAULT_GROUP = access.DEFAULT_GROUP  # a fair queue's job enqueued without a group
MAX_GROUPS = 32  # groups a claim reads at most
SKIP = 1e-6  # how far past the last group a group with no job due goes
ROUNDS = 3  # shares of one claim: what groups that ran out left goes to the others

# the plain claim of (queues, limit), for what the groups' turn leaves
Plain = Callable[[list[str], int], Claimed]


def check_weights(weights: Mapping[str, float] | None) -> dict[str, float]:
    """Weights by group name: positive finite numbers."""
    checked: dict[str, float] = {}
    for group, weight in (weights or {}).items():
        access.check_group(group)
        if isinstance(weight, bool) or not isinstance(weight, int | float):
            raise ValueError(f"weight of group {group!r} must be a number, not {weight!r}")
        if not (math.isfinite(weight) and 0 < weight <= 1e6):
            raise ValueError(f"weight of group {group!r} must be above 0 and at most 1e6")
        checked[group] = float(weight)
    return checked


def shares(groups: Sequence[FairGroup], limit: int) -> list[int]:
    """How many slots each group gets of a claim of ``limit`` slots, were each backlogged:
    the ``limit`` smallest of vtime + i / weight (ties to the group read first)."""
    heap = [(g.vtime + 1 / g.weight, n, 1) for n, g in enumerate(groups)]
    heapq.heapify(heap)
    taken = [0] * len(groups)
    for _ in range(limit if groups else 0):
        _, n, i = heapq.heappop(heap)
        taken[n] += 1
        heapq.heappush(heap, (groups[n].vtime + (i + 1) / groups[n].weight, n, i + 1))
    return taken


class _Taken:
    """What a claim took so far: the ids, the slots they take, whether a suspect is among
    them, and whether a job that did not fit the slots left ended it."""

    def __init__(self, slots: int) -> None:
        self.ids: list[int] = []
        self.slots = slots  # left
        self.suspect = False
        self.full = False

    def take(self, rows: Sequence[Any], share: int) -> tuple[int, int]:
        """Add the ids of ``rows`` (one group's walk) in order while their costs fit the
        slots left and the group's ``share`` of slots, the first even past its share; a
        suspect only as the first of the claim (the others stepped over). How many rows
        it went through (taken or stepped over), and the slots it took."""
        used = 0
        for n, row in enumerate(rows):
            if int(row["losses"]) >= SUSPECT_LOSSES:
                if self.suspect:
                    continue
                self.suspect = True
            cost = int(row["cost"])
            if used and used + cost > share:
                return n, used  # its share is spent: the rest wait for its next turn
            if cost > self.slots:
                self.full = True
                return n, used
            self.slots -= cost
            self.ids.append(int(row["id"]))
            used += cost
        return len(rows), used


class Fairness:
    """Declarations, groups at enqueue, the fair claim and the janitor's pass."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        # the statement that claims chosen ids (SQLite's job_claim_many takes ids already)
        self.claim_ids = "job_claim_many" if engine.driver.dialect == "sqlite" else "fair_claim"
        self._lock = threading.Lock()
        self._weights: dict[str, dict[str, float]] = {}
        self._read_at = float("-inf")
        self._turn = itertools.count()

    # -- declarations ----------------------------------------------------------------------
    def fair_declare(self, queue: str, weights: Mapping[str, float] | None = None) -> None:
        """Declare ``queue`` fair, with these weights (1 for a group not named); its pending
        jobs without a group join the group "default"."""
        payload.check_queue(queue)
        checked = check_weights(weights)
        text = json.dumps(checked, sort_keys=True)

        def op(tx: Tx) -> None:
            tx.all("fair_declare", queue=queue, weights=text)
            tx.all("fair_backfill", queue=queue)

        self.engine.run(op)
        with self._lock:
            self._weights[queue] = checked

    def fair_queues(self, *, fresh: float = FRESH, conn: Any = None) -> dict[str, dict[str, float]]:
        """The fair queues and their weights, read at most ``fresh`` seconds ago; read
        anew in the transaction the caller holds open on ``conn``, if given."""
        with self._lock:
            if time.monotonic() - self._read_at < fresh:
                return dict(self._weights)
        rows = self.engine.run(lambda tx: tx.all("fair_queue_list"), write=False, conn=conn)
        found = {str(r["queue"]): dict(json.loads(r["weights"])) for r in rows}
        with self._lock:
            self._weights, self._read_at = found, time.monotonic()
        return dict(found)

    def among(self, queues: Sequence[str], *, read: bool = True) -> list[str]:
        """Those of ``queues`` that are fair; ``read=False`` inside a transaction: as last
        read (a read of its own would be a transaction within it)."""
        if read:
            fair = self.fair_queues()
        else:
            with self._lock:
                fair = self._weights
        return [q for q in dict.fromkeys(queues) if q in fair] if fair else []

    def fair_group_list(self) -> list[FairGroup]:
        rows = self.engine.run(lambda tx: tx.all("fair_group_list"), write=False)
        return [
            FairGroup(str(r["queue"]), str(r["group_name"]), float(r["vtime"]), float(r["weight"]))
            for r in rows
        ]

    # -- enqueue ---------------------------------------------------------------------------
    def route(self, specs: Sequence[JobSpec], *, conn: Any = None) -> Sequence[JobSpec]:
        """A fair queue's job without a group is of the group "default" (the fair queues
        read in the caller's transaction on ``conn``, if given)."""
        fair = self.fair_queues(conn=conn)
        if not fair or not any(s.group is None and s.queue in fair for s in specs):
            return specs
        return [
            replace(s, group=DEFAULT_GROUP) if s.group is None and s.queue in fair else s
            for s in specs
        ]

    def enqueued(self, tx: Tx, specs: Sequence[JobSpec], clock: Any) -> None:
        """In the enqueue's transaction: the rows of its fair queues' new groups (the fair
        queues as ``route`` read them just before)."""
        with self._lock:
            fair = self._weights
        if not fair:
            return
        pairs = {(s.queue, s.group) for s in specs if s.group is not None and s.queue in fair}
        rows = [{"queue": q, "group": g} for q, g in sorted(pairs)]
        if rows:
            tx.batch("fair_group_touch", rows)

    # -- claims ----------------------------------------------------------------------------
    def claim(
        self,
        tx: Tx,
        session_id: str,
        *,
        queues: list[str],
        tasks: list[str],
        limit: int,
        take_suspect: bool,
        clock: Any,
        plain: Plain,
    ) -> Claimed:
        """Claim up to ``limit`` slots: the fair queues' groups in turn; the other queues by
        ``plain`` (first every other claim, so neither kind starves the other); then, for
        what is left, ``plain`` over the fair queues too (jobs no group's row shows). The
        session's free slots are reported once, for all of it (session_free)."""
        fair = self.among(queues, read=False)
        others = [q for q in queues if q not in fair]
        names: list[str] = []
        rows: list[Sequence[Any]] = []
        left = limit  # slots

        def add(found: Claimed) -> None:
            nonlocal names, left
            if found[1]:
                names = names or found[0]
                rows.extend(found[1])
                left -= sum(row[names.index("cost")] for row in found[1])

        if others and next(self._turn) % 2:
            add(plain(others, limit))
        full = False  # a group's job did not fit: the claim ends there
        if left > 0:
            found, full = self._turn_of(tx, session_id, queues=fair, tasks=tasks, limit=left,
                                        take_suspect=take_suspect, clock=clock)  # fmt: skip
            add(found)
        if others and left > 0 and not full:
            add(plain(others, left))
        if left > 0 and not full:
            add(plain(fair, left))
        # a labelled session's free slots less all this claim took: a plain claim reports
        # its own part only, the groups' turn nothing
        tx.all("session_free", session_id=session_id, free_slots=max(left, 0), now=clock)
        return names, rows

    def _turn_of(
        self,
        tx: Tx,
        session_id: str,
        *,
        queues: list[str],
        tasks: list[str],
        limit: int,
        take_suspect: bool,
        clock: Any,
    ) -> tuple[Claimed, bool]:
        """The groups' turn: each group's share of ``limit``; what the groups that ran out
        left is shared again among those that did not, up to ROUNDS times. And whether a
        job that did not fit the slots left ended it."""
        driver = self.engine.driver
        found = tx.all(
            "fair_turn", queues=driver.list_in(queues), groups=min(limit + 2, MAX_GROUPS)
        )
        groups = [
            FairGroup(str(r["queue"]), str(r["group_name"]), float(r["vtime"]), float(r["weight"]))
            for r in found
        ]
        tops = {str(r["queue"]): float(r["top"]) for r in found}
        walk = {
            "session_id": session_id,
            "tasks": driver.list_in(tasks),
            "take_suspect": take_suspect,
            "suspect_losses": SUSPECT_LOSSES,
            "now": clock,
        }
        got, taken, done = self._rounds(tx, groups, limit, walk)
        advance = [
            {"queue": g.queue, "group": g.group, "delta": taken[n] / g.weight,
             "floor": None if taken[n] else tops[g.queue] + SKIP}
            for n, g in enumerate(groups)
            if taken[n] or done[n]
        ]  # fmt: skip
        if advance:
            tx.batch("fair_advance", advance)
        if not got.ids:
            return ([], []), got.full
        ids = driver.list_in(got.ids)
        return tx.table(self.claim_ids, ids=ids, session_id=session_id, now=clock), got.full

    def _rounds(
        self, tx: Tx, groups: list[FairGroup], limit: int, walk: dict[str, Any]
    ) -> tuple[_Taken, list[int], list[bool]]:
        """Each group's share of ``limit``, the claim's slots, taken of its due jobs; what
        the groups that ran out left, shared again among the others (ROUNDS at most), until
        a job does not fit the slots left. What it took, the slots each group gave, and
        which ran out."""
        got = _Taken(limit)
        taken = [0] * len(groups)  # slots
        after: list[tuple[Any, ...]] = [(None,) * 3] * len(groups)  # the last row gone through
        done = [False] * len(groups)  # no more due jobs
        for _ in range(ROUNDS):
            live = [n for n in range(len(groups)) if not done[n]]
            moved = [replace(groups[n], vtime=groups[n].vtime + taken[n] / groups[n].weight)
                     for n in live]  # fmt: skip
            for n, share in zip(live, shares(moved, got.slots), strict=True):
                if not share or got.full:
                    continue
                group = groups[n]
                # at most `share` jobs fit its share: each costs a slot or more
                rows = tx.all(
                    "fair_walk", queue=group.queue, group=group.group, limit=share,
                    after_priority=after[n][0], after_run_at=after[n][1],
                    after_id=after[n][2], **walk,
                )  # fmt: skip
                went, used = got.take(rows, share)
                if went:
                    last = rows[went - 1]
                    after[n] = (last["priority"], last["run_at"], last["id"])
                taken[n] += used
                # ran out, unless a job of its did not fit: it keeps its place in turn
                done[n] = went == len(rows) < share and not got.full
            if got.slots <= 0 or got.full or all(done):
                break
        return got, taken, done

    # -- the janitor's pass ----------------------------------------------------------------
    def fair_prune_many(self, *, now: Now = None) -> tuple[int, int]:
        """Prune the rows of groups without pending jobs, and make those of groups with
        pending jobs that have none; (pruned, made)."""

        def op(tx: Tx) -> tuple[int, int]:
            pruned = len(tx.all("fair_prune"))
            made = 0
            for row in tx.all("fair_queue_list"):
                made += len(tx.all("fair_repair", queue=str(row["queue"])))
            return pruned, made

        return self.engine.run(op)
