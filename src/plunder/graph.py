"""A workflow's graph as it crosses the store seam: edges from parents to children, each
with the child's policy should its parent end other than succeeded, checked before
anything is written. See plunder.flows for how it is built and docs/guide/workflows.md.

```
  A ──▶ B ──▶ D      an edge (parent ──▶ child): the child waits, ``waiting``, until every
  └───▶ C ──┘        parent has ended; then it is pending, or ``skipped`` / ``failed``
                     when a parent did not succeed and its edge from it says so
```
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from plunder.model import Claim, JobRecord

POLICIES = ("skip", "fail", "run")  # what a parent's failure does to its child; the default first


@dataclass(frozen=True, slots=True)
class Edge:
    """``child`` (the index of a job enqueued with it) waits for ``parent``: the index of
    another such job, or (``new=False``) the id of a job enqueued before."""

    parent: int
    child: int
    on_failure: str = "skip"
    new: bool = True


@dataclass(frozen=True, slots=True)
class Link:
    """An edge as stored, between job ids."""

    parent_id: int
    child_id: int
    on_failure: str


@dataclass(frozen=True, slots=True)
class WorkflowState:
    """A workflow's jobs (in id order) and the edges between them; ``id`` is the job it
    was asked for by."""

    id: int
    jobs: tuple[JobRecord, ...]
    links: tuple[Link, ...]

    def parents(self, job_id: int) -> list[int]:
        return [link.parent_id for link in self.links if link.child_id == job_id]

    def children(self, job_id: int) -> list[int]:
        return [link.child_id for link in self.links if link.parent_id == job_id]


@dataclass(frozen=True, slots=True)
class ParentResult:
    """What a parent of a running child ended with: its status, and its result (None
    unless it succeeded)."""

    job_id: int
    status: str
    result: Any = None


class ParentReader(Protocol):
    def job_parent_results(
        self, job_id: int, *, claim: Claim | None = None
    ) -> dict[int, tuple[str, Any]]: ...


def results_of(sink: ParentReader, claim: Claim) -> dict[int, Any]:
    """``ctx.parent_results``: each parent's result by job id (None for one that did not
    succeed), read when asked, fenced by the child's claim (StaleClaim once it is not
    current): from the database, or through the gateway (plunder.context.LinkSink)."""
    found = sink.job_parent_results(claim.job_id, claim=claim)
    return {parent: result for parent, (_, result) in found.items()}


def check_policy(policy: Any) -> str:
    if policy not in POLICIES:
        raise ValueError(f"on_failure must be one of {', '.join(POLICIES)}, not {policy!r}")
    return str(policy)


def order(count: int, edges: Sequence[Edge]) -> list[int]:
    """The ``count`` new jobs in an order where every parent comes before its children;
    ValueError naming the problem for an edge out of range, to itself, or in a cycle."""
    children: dict[int, list[int]] = {i: [] for i in range(count)}
    waiting = dict.fromkeys(range(count), 0)
    for edge in edges:
        _check(edge, count)
        if edge.new:
            children[edge.parent].append(edge.child)
            waiting[edge.child] += 1
    ready = [i for i in range(count) if not waiting[i]]
    done: list[int] = []
    while ready:
        job = ready.pop()
        done.append(job)
        for child in children[job]:
            waiting[child] -= 1
            if not waiting[child]:
                ready.append(child)
    if len(done) < count:
        cycle = sorted(i for i in range(count) if waiting[i])
        raise ValueError(f"the workflow has a cycle through its jobs {cycle}")
    return done


def _check(edge: Edge, count: int) -> None:
    check_policy(edge.on_failure)
    if not 0 <= edge.child < count:
        raise ValueError(f"an edge names child {edge.child}, not one of the {count} jobs")
    if not edge.new:
        if isinstance(edge.parent, bool) or not isinstance(edge.parent, int) or edge.parent < 1:
            raise ValueError(f"a parent job id must be a positive integer, not {edge.parent!r}")
    elif not 0 <= edge.parent < count:
        raise ValueError(f"an edge names parent {edge.parent}, not one of the {count} jobs")
    elif edge.parent == edge.child:
        raise ValueError(f"job {edge.child} of the workflow waits for itself")
