"""Workflows: jobs that wait for others and receive their results, enqueued as one graph
in one transaction.

```python
flow = plunder.Flow(app)
a = flow.add(fetch, "https://…")
b = flow.add(parse, after=a)                   # waits for a; ctx.parent_results[a's id]
c = flow.add(index, after=a, on_failure="run")
d = flow.add(report, after=[b, c])             # fan-in
workflow = flow.enqueue()                      # one transaction for the whole graph
workflow.job(d).result(timeout=60)
```

A child waits (``waiting``) until every parent has ended; it is then claimable in the
transaction that ended its last parent. Should a parent end other than succeeded
(failed, timed out, cancelled, expired, skipped), its edge's ``on_failure`` decides:
``"skip"`` (the default: the child ends ``skipped``), ``"fail"`` (it ends ``failed``) or
``"run"`` (it runs anyway once every parent has ended). ``chain``, ``group`` and ``chord``
add the common shapes. See docs/guide/workflows.md.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from plunder import graph
from plunder.app import App
from plunder.graph import Edge, WorkflowState
from plunder.handle import Job
from plunder.model import JobSpec
from plunder.task import Task


@dataclass(frozen=True, slots=True)
class Call:
    """A task (or a task's name) with its arguments: one job of a workflow to be."""

    task: Task | str
    args: tuple[Any, ...] = ()
    kwargs: dict[str, Any] = field(default_factory=dict)


def call(task: Task | str, /, *args: Any, **kwargs: Any) -> Call:
    """``call(add, 1, 2)``: a Call for ``chain``, ``group`` and ``chord``."""
    return Call(task, args, kwargs)


@dataclass(frozen=True, slots=True)
class Node:
    """A job of a Flow not enqueued yet: its place in the flow."""

    index: int
    flow: int  # id() of its Flow, so that a node of another flow is refused


Parent = Node | Job | int
After = Parent | Sequence[Parent] | None


class Flow:
    """A graph of jobs built up, then enqueued in one transaction (:meth:`enqueue`)."""

    def __init__(self, app: App) -> None:
        self.app = app
        self.specs: list[JobSpec] = []
        self.edges: list[Edge] = []

    def add(
        self,
        task: Task | str,
        /,
        *args: Any,
        after: After = None,
        on_failure: str = "skip",
        **kwargs: Any,
    ) -> Node:
        """A job of ``task`` waiting for ``after``: nodes of this flow, or jobs (handles
        or ids) enqueued before. ``on_failure``: what a parent's failure does to it."""
        graph.check_policy(on_failure)
        node = Node(len(self.specs), id(self))
        parents = self._parents(after)
        self.specs.append(self._spec(task, args, kwargs))
        for parent in parents:
            if isinstance(parent, Node):
                self.edges.append(Edge(parent.index, node.index, on_failure))
            else:
                job_id = parent.id if isinstance(parent, Job) else parent
                self.edges.append(Edge(job_id, node.index, on_failure, new=False))
        return node

    def chain(self, *calls: Call, after: After = None, on_failure: str = "skip") -> list[Node]:
        """Each call after the one before (the first after ``after``): a sequence."""
        nodes: list[Node] = []
        for step in calls:
            before: After = nodes[-1] if nodes else after
            nodes.append(self._add(step, before, on_failure))
        return nodes

    def group(self, *calls: Call, after: After = None, on_failure: str = "skip") -> list[Node]:
        """Every call after ``after``, side by side: a fan-out."""
        return [self._add(step, after, on_failure) for step in calls]

    def chord(
        self,
        calls: Iterable[Call],
        then: Call,
        *,
        after: After = None,
        on_failure: str = "skip",
    ) -> Node:
        """The calls side by side, then ``then`` after all of them: a fan-out and fan-in
        (``then`` sees each one's result in ``ctx.parent_results``)."""
        header = self.group(*calls, after=after, on_failure=on_failure)
        return self._add(then, header, on_failure)

    def enqueue(self) -> Workflow:
        """Insert every job and edge in one transaction. JobNotFound for an unknown parent,
        ValueError for a cycle (nothing is stored then)."""
        if not self.specs:
            raise ValueError("an empty flow: add a job first")
        self.app.declare_partitions()
        # on the database, or through a gateway (one request, one transaction there)
        ids = self.app.store.flow_enqueue(self.specs, self.edges)
        return Workflow(self.app, ids)

    def _add(self, step: Call, after: After, on_failure: str) -> Node:
        if not isinstance(step, Call):
            raise TypeError(f"expected a plunder.flows.call(...), not {type(step).__name__}")
        return self.add(step.task, *step.args, after=after, on_failure=on_failure, **step.kwargs)

    def _parents(self, after: After) -> list[Parent]:
        if after is None:
            return []
        parents: list[Any] = list(after) if isinstance(after, list | tuple) else [after]
        for parent in parents:
            if isinstance(parent, Node) and parent.flow != id(self):
                raise ValueError(f"node {parent.index} belongs to another flow")
            if not isinstance(parent, Node | Job | int) or isinstance(parent, bool):
                raise TypeError(f"after= takes nodes of this flow, jobs or job ids, not {parent!r}")
        return parents

    def _spec(self, task: Task | str, args: Sequence[Any], kwargs: dict[str, Any]) -> JobSpec:
        if isinstance(task, Task):
            return task.spec(args, kwargs)
        return self.app.task_options(task).spec(task, args, kwargs)


class Workflow:
    """An enqueued flow: a handle for each of its jobs, in the order they were added."""

    def __init__(self, app: App, ids: Sequence[int]) -> None:
        self.app = app
        self.ids = list(ids)
        self.id = self.ids[0]  # a workflow is named by its first job

    def __repr__(self) -> str:
        return f"<Workflow {self.id}: {len(self.ids)} jobs>"

    def job(self, node: Node) -> Job:
        return Job(self.app, self.ids[node.index])

    @property
    def jobs(self) -> list[Job]:
        return [Job(self.app, job_id) for job_id in self.ids]

    def state(self) -> WorkflowState:
        return self.app.workflow(self.id)

    def cancel(self) -> list[int]:
        """Cancel its jobs not started yet; those running run on. The ids cancelled."""
        return self.app.cancel_workflow(self.id)
