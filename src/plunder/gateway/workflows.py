"""Workflows through the gateway (plunder.flows, docs/guide/workflows.md): a whole graph
enqueued in one transaction, a workflow read, its jobs' edges read, its cancel.

```
 POST /v1/jobs  {"jobs": [...], "edges": [...]}   {"ids": [...]}: one transaction
 GET  /v1/jobs/{job_id}/workflow                  {"id", "jobs": [...], "edges": [...]}
 GET  /v1/jobs/{job_id}/edges                     {"edges": [...]}: into or out of the job
 POST /v1/jobs/{job_id}/workflow/cancel           {"cancelled": [ids]}
```

A key sees a workflow's jobs as it sees any job: those of its group's queues (of its own,
if it names any). A job it may not see is left out of what it reads, with the edges to it,
and left alone by its cancel; a parent it may not see is refused as an unknown one is, and
a workflow asked for by such a job is answered as for a job that does not exist (404).
"""

from __future__ import annotations

from collections.abc import Sequence

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from plunder import errors, wire, wire_specs
from plunder.access import ApiKey
from plunder.gateway.server import Gateway, job_id, key_of
from plunder.graph import Edge, WorkflowState
from plunder.model import JobSpec
from plunder.store.edges import Visible


async def visible_to(gateway: Gateway, key: ApiKey) -> Visible:
    """Whether ``key`` may see the jobs of a queue (the queues' groups read at most once
    per KEY_TTL, as for any request)."""
    groups = await gateway.known_groups()
    return lambda queue: key.serves(queue, groups)


async def enqueue(
    gateway: Gateway, key: ApiKey, specs: Sequence[JobSpec], edges: Sequence[Edge], records: bool
) -> Response:
    """The jobs and edges of a workflow in one transaction (the caller checked that the
    key may write into the jobs' queues); a parent the key may not see is as unknown."""
    if records:
        raise wire.WireError("an enqueue with 'edges' answers ids only: leave 'records' out")
    visible = await visible_to(gateway, key)
    ids = await run_in_threadpool(lambda: gateway.store.flow_enqueue(specs, edges, visible=visible))
    return JSONResponse({"ids": ids}, status_code=201)


async def _seen(gateway: Gateway, request: Request) -> tuple[int, WorkflowState]:
    """The workflow of the request's job as its key sees it: JobNotFound for a job that
    the key may not see, as for one that does not exist."""
    key = await key_of(gateway, request, "read")
    asked = job_id(request)
    visible = await visible_to(gateway, key)
    state = await run_in_threadpool(gateway.store.flow_get, asked)
    jobs = tuple(job for job in state.jobs if visible(job.queue))
    seen = {job.id for job in jobs}
    if asked not in seen:
        raise errors.JobNotFound(f"no job {asked}")
    links = tuple(link for link in state.links if {link.parent_id, link.child_id} <= seen)
    return asked, WorkflowState(state.id, jobs, links)


async def workflow(gateway: Gateway, request: Request) -> Response:
    _, state = await _seen(gateway, request)
    return JSONResponse(wire_specs.workflow_out(state))


async def workflow_edges(gateway: Gateway, request: Request) -> Response:
    asked, state = await _seen(gateway, request)
    links = [link for link in state.links if asked in (link.parent_id, link.child_id)]
    return JSONResponse({"edges": [wire_specs.link_out(link) for link in links]})


async def workflow_cancel(gateway: Gateway, request: Request) -> Response:
    """Cancel the jobs of the workflow not started yet that the key may see."""
    key = await key_of(gateway, request, "write")
    asked = job_id(request)
    visible = await visible_to(gateway, key)
    record = await run_in_threadpool(gateway.store.job_get, asked)
    if not visible(record.queue):
        raise errors.JobNotFound(f"no job {asked}")
    cancelled = await run_in_threadpool(lambda: gateway.store.flow_cancel(asked, visible=visible))
    return JSONResponse({"cancelled": cancelled})


ROUTES = [
    ("/v1/jobs/{job_id}/workflow", "GET", workflow),
    ("/v1/jobs/{job_id}/edges", "GET", workflow_edges),
    ("/v1/jobs/{job_id}/workflow/cancel", "POST", workflow_cancel),
]
