"""Workflows in the store: a graph enqueued in one transaction, and its reads.

In one transaction (flow_enqueue)::

    the jobs inserted (as any enqueue) ─▶ the parents enqueued before marked as having
    children, their rows written and their status read ─▶ each fresh child, parents first:
    waiting for its parents not ended, or skipped / failed at once by one that failed
    (edge_wait, edge_doom) ─▶ the edges ─▶ the fresh parents marked

A child made waiting here is settled later by the trigger plunder_jobs_settle (migration
19) when a parent ends; marking a parent writes its row, so a parent ending meanwhile waits
for this transaction and then finds its new edges.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Sequence
from typing import Any

from plunder import errors, payload
from plunder.graph import Edge, Link, WorkflowState, order
from plunder.model import Claim, ErrorInfo, JobSpec
from plunder.states import TERMINAL, Status
from plunder.store import limits
from plunder.store.driver import Now, Tx
from plunder.store.engine import CHANNEL_DONE, Engine
from plunder.store.enqueue import Enqueue
from plunder.store.partitions import Partitions

CANCELLED = ErrorInfo("plunder.Cancelled", "cancelled with its workflow")
Visible = Callable[[str], bool]  # whether the caller may see the jobs of a queue


EDGES_A_STATEMENT = 10_000  # [parent, child, policy] rows: well under 1 MiB of JSON


def unknown_parents(job_ids: Sequence[int]) -> errors.JobNotFound:
    """The refusal of parents unknown, or that the caller may not see (told alike)."""
    return errors.JobNotFound(f"no job {', '.join(map(str, job_ids))} to wait for (unknown parent)")


class Edges:
    """flow_enqueue, flow_get, flow_cancel, edge_list and job_parent_results (fenced by a
    claim when given one)."""

    def __init__(self, engine: Engine, enqueue: Enqueue, partitions: Partitions) -> None:
        self.engine = engine
        self.enqueue = enqueue
        self.partitions = partitions
        self.limits = limits.Limits(engine)

    def flow_enqueue(
        self,
        specs: Sequence[JobSpec],
        edges: Sequence[Edge],
        *,
        now: Now = None,
        visible: Visible | None = None,
    ) -> list[int]:
        ordered = order(len(specs), edges)
        into: dict[int, list[Edge]] = defaultdict(list)
        for edge in edges:
            into[edge.child].append(edge)
        for child in into:
            spec = specs[child]
            if spec.key is not None or spec.limit is not None:
                what = "an idempotency key" if spec.key is not None else "a limit"
                raise ValueError(
                    f"job {child} of the workflow ({spec.task}) waits for others and so "
                    f"cannot have {what}"
                )
        routed = list(self.partitions.route(specs))

        def op(tx: Tx) -> list[int]:
            ids = self.enqueue.job_enqueue_ids(routed, conn=tx.conn, now=now)
            before = sorted({e.parent for e in edges if not e.new})
            found = {
                int(r["id"]): str(r["status"])
                for r in tx.all("edge_parents_mark", ids=self.engine.list_in(before))
                if visible is None or visible(str(r["queue"]))
            } if before else {}  # fmt: skip
            unknown = [job_id for job_id in before if job_id not in found]
            if unknown:
                raise unknown_parents(unknown)
            self._settle_fresh(tx, ids, ordered=ordered, into=into, found=found, now=now)
            if edges:
                rows = [[ids[e.parent] if e.new else e.parent, ids[e.child], e.on_failure]
                        for e in edges]  # fmt: skip
                for at in range(0, len(rows), EDGES_A_STATEMENT):  # each under the payload cap
                    chunk = rows[at : at + EDGES_A_STATEMENT]
                    tx.all("edge_insert", rows=payload.encode(chunk, what="edges"))
                fresh = sorted({ids[e.parent] for e in edges if e.new})
                if fresh:
                    tx.all("edge_parents_mark", ids=self.engine.list_in(fresh))
            return ids

        return self.engine.run(op, repeatable=False)

    def _settle_fresh(
        self,
        tx: Tx,
        ids: list[int],
        *,
        ordered: list[int],
        into: dict[int, list[Edge]],
        found: dict[int, str],
        now: Now,
    ) -> None:
        """Each fresh child's state from its parents' (parents first): waiting for those
        not ended, or ended at once by a failed parent whose edge skips or fails it."""
        state: dict[int, str] = {}  # fresh jobs: their status as this enqueue leaves it
        waits: dict[int, list[int]] = defaultdict(list)  # parents left -> job ids
        doomed: dict[tuple[str, str], list[int]] = defaultdict(list)  # (status, why) -> ids
        for i in ordered:
            left, doom = 0, None
            for edge in into.get(i, ()):
                status = state[edge.parent] if edge.new else found[edge.parent]
                parent_id = ids[edge.parent] if edge.new else edge.parent
                if Status(status) not in TERMINAL:
                    left += 1
                elif status != Status.SUCCEEDED and edge.on_failure != "run":
                    end = "failed" if edge.on_failure == "fail" else "skipped"
                    if doom is None or end == "failed":
                        doom = (end, f"parent job {parent_id} ended {status}")
            if doom is not None:
                state[i] = doom[0]
                doomed[doom].append(ids[i])
            elif left:
                state[i] = Status.WAITING
                waits[left].append(ids[i])
            else:
                state[i] = Status.PENDING
        clock = tx.clock(now)
        for left, job_ids in waits.items():
            tx.all("edge_wait", ids=self.engine.list_in(job_ids), parents_left=left)
        for (status, why), job_ids in doomed.items():
            error = ErrorInfo("plunder.ParentFailed", why).as_dict()
            tx.all(
                "edge_doom",
                ids=self.engine.list_in(job_ids),
                status=status,
                error=payload.encode(error, what="error"),
                now=clock,
            )
            self.engine.notify(tx, CHANNEL_DONE, [str(job_id) for job_id in job_ids])

    def flow_get(self, job_id: int) -> WorkflowState:
        def op(tx: Tx) -> WorkflowState:
            names, rows = tx.table("flow_jobs", job_id=int(job_id))
            if not rows:
                raise errors.JobNotFound(f"no job {job_id}")
            jobs = self.engine.jobs(names, rows)
            links = self._links(tx, [job.id for job in jobs])
            return WorkflowState(int(job_id), tuple(jobs), tuple(links))

        return self.engine.run(op, write=False)

    def flow_cancel(
        self, job_id: int, *, now: Now = None, visible: Visible | None = None
    ) -> list[int]:
        def op(tx: Tx) -> list[int]:
            clock = tx.clock(now)
            names, rows = tx.table("flow_jobs", job_id=int(job_id))
            if not rows:
                raise errors.JobNotFound(f"no job {job_id}")
            queue = names.index("queue")
            members = self.engine.list_in(
                [int(r[0]) for r in rows if visible is None or visible(str(r[queue]))]
            )
            cancelled: list[int] = []
            keys: set[str] = set()
            # again while a cancelled job's child was made pending by the trigger
            # (an edge that runs it anyway) before this statement reached it
            while True:
                done = tx.all(
                    "flow_cancel",
                    ids=members,
                    now=clock,
                    error=payload.encode(CANCELLED.as_dict(), what="error"),
                )
                if not done:
                    break
                self.engine.announce(tx, done)
                cancelled += [int(r["id"]) for r in done]
                keys |= {str(r["limit_key"]) for r in done if r["limit_key"] is not None}
            if keys:  # an admitted job's place is free
                self.limits.admit(tx, keys, clock)
            return sorted(cancelled)

        return self.engine.run(op)

    def edge_list(self, job_ids: Sequence[int]) -> list[Link]:
        ids = [int(job_id) for job_id in job_ids]
        return self.engine.run(lambda tx: self._links(tx, ids), write=False) if ids else []

    def _links(self, tx: Tx, ids: list[int]) -> list[Link]:
        rows = tx.all("edge_list", ids=self.engine.list_in(ids))
        return [Link(int(r["parent_id"]), int(r["child_id"]), str(r["on_failure"])) for r in rows]

    def job_parent_results(
        self, job_id: int, *, claim: Claim | None = None
    ) -> dict[int, tuple[str, Any]]:
        if claim is None:
            rows = self.engine.run(
                lambda tx: tx.all("edge_parent_results", job_id=int(job_id)), write=False
            )
        else:
            if claim.job_id != job_id:
                raise ValueError(f"the claim is on job {claim.job_id}, not on job {job_id}")
            rows = self.engine.run(
                lambda tx: tx.all("edge_parent_results_claimed", **_fence(claim)),
                write=False,
            )
            if not rows:
                raise errors.StaleClaim(
                    f"job {claim.job_id} attempt {claim.attempt} is not claimed by this "
                    "session: its parents' results are not given",
                    job_id=claim.job_id, attempt=claim.attempt, session_id=claim.session_id,
                )  # fmt: skip
            rows = [r for r in rows if r["id"] is not None]
        return {
            int(r["id"]): (
                str(r["status"]),
                payload.decode(r["result"]) if r["status"] == Status.SUCCEEDED else None,
            )
            for r in rows
        }


def _fence(claim: Claim) -> dict[str, Any]:
    return {"job_id": claim.job_id, "attempt": claim.attempt, "session_id": claim.session_id}
