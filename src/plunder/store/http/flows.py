"""Workflows through a gateway (plunder.flows): the graph enqueued in one request (and one
transaction at the gateway), a workflow and a job's edges read, a workflow cancelled. The
gateway shows a key only the jobs it may see (plunder.gateway.workflows)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from plunder import errors, wire, wire_specs
from plunder.graph import Edge, Link, WorkflowState
from plunder.model import JobSpec
from plunder.store.http.client import Client

MAX_BATCH = 10_000  # jobs per plain enqueue request
MAX_FLOW = wire.MAX_LIST  # jobs of one workflow (it cannot be split: one transaction)


class HttpFlows:
    """The workflow operations of the store seam, for HttpStore."""

    client: Client

    def flow_enqueue(
        self,
        specs: Sequence[JobSpec],
        edges: Sequence[Edge],
        *,
        now: Any = None,
        visible: Any = None,
    ) -> list[int]:
        if now is not None:
            raise errors.ConfigError("through a gateway the database's clock decides 'now'")
        if visible is not None:
            raise errors.ConfigError("through a gateway its key decides which jobs are seen")
        if len(specs) > MAX_FLOW or len(edges) > MAX_FLOW:
            raise errors.PayloadError(
                f"at most {MAX_FLOW} jobs and {MAX_FLOW} edges per workflow through a gateway, "
                f"got {len(specs)} and {len(edges)}"
            )
        body = {
            "jobs": [wire_specs.spec_out(s) for s in specs],
            "edges": [wire_specs.edge_out(e) for e in edges],
        }
        # never sent twice: a lost answer may hide a graph enqueued (its jobs have no keys)
        data = self.client.call("POST", "/v1/jobs", json=body, idempotent=False)
        return [int(i) for i in data["ids"]]

    def flow_get(self, job_id: int) -> WorkflowState:
        data = self.client.call("GET", f"/v1/jobs/{path_id(job_id)}/workflow")
        return wire_specs.workflow_in(data)

    def flow_cancel(self, job_id: int, *, now: Any = None, visible: Any = None) -> list[int]:
        if now is not None or visible is not None:
            raise errors.ConfigError("through a gateway the database's clock and the key decide")
        path = f"/v1/jobs/{path_id(job_id)}/workflow/cancel"
        # sent again if need be: a second cancel finds nothing left to cancel
        return [int(i) for i in self.client.call("POST", path)["cancelled"]]

    def edge_list(self, job_ids: Sequence[int]) -> list[Link]:
        """The edges into or out of these jobs (one request per job)."""
        found: dict[Link, None] = {}
        for job_id in job_ids:
            data = self.client.call("GET", f"/v1/jobs/{path_id(job_id)}/edges")
            found.update(dict.fromkeys(wire_specs.link_in(e) for e in data["edges"]))
        return list(found)


def path_id(job_id: int) -> int:
    """A job id to put in a request's path; JobNotFound for what cannot be one."""
    if isinstance(job_id, bool) or not isinstance(job_id, int) or job_id < 1:
        raise errors.JobNotFound(f"no job {job_id!r}")
    return job_id
