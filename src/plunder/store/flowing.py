"""The workflow operations of the store seam (plunder.store.edges implements them;
``Store`` has them too). See plunder.graph and docs/guide/workflows.md."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any, Protocol

from plunder.graph import Edge, Link, WorkflowState
from plunder.model import Claim, JobSpec

Now = datetime | None


class FlowOps(Protocol):
    def flow_enqueue(
        self,
        specs: Sequence[JobSpec],
        edges: Sequence[Edge],
        *,
        now: Now = None,
        visible: Callable[[str], bool] | None = None,
    ) -> list[int]:
        """Insert the jobs and the edges between them (and to jobs enqueued before) in one
        transaction; their ids in input order. A child with a parent not ended waits; one
        whose parents have all ended is pending, or skipped / failed at once by a parent's
        failure as its edge says. JobNotFound for an unknown parent (or one of a queue
        that ``visible`` refuses: told alike), ValueError for a cycle; a child can have
        neither a key nor a limit."""
        ...

    def flow_get(self, job_id: int) -> WorkflowState:
        """The workflow of ``job_id``: every job its edges join it to, either way."""
        ...

    def flow_cancel(
        self, job_id: int, *, now: Now = None, visible: Callable[[str], bool] | None = None
    ) -> list[int]:
        """Cancel the jobs of the workflow of ``job_id`` not started yet (pending or
        waiting); those running run on, and so do those of a queue that ``visible``
        refuses. Returns the ids cancelled."""
        ...

    def edge_list(self, job_ids: Sequence[int]) -> list[Link]:
        """The edges into or out of these jobs."""
        ...

    def job_parent_results(
        self, job_id: int, *, claim: Claim | None = None
    ) -> dict[int, tuple[str, Any]]:
        """Each parent of ``job_id``: its status and its result (None unless succeeded).
        With ``claim`` (a worker's, on this job), only while the claim is current:
        StaleClaim otherwise, as for a job unknown."""
        ...
