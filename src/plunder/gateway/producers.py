"""The producer's API over HTTP: enqueue, list, read, wait for a result (long-poll), follow a
stream (server-sent events, resumable with ``Last-Event-ID``), cancel, retry.

A key sees only the jobs of its group's queues (of its own, if it names any); a job it
may not see is answered exactly as a job that does not exist (404), so that no answer
tells the two apart.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from plunder import errors, wire, wire_specs
from plunder.access import ApiKey, Role
from plunder.gateway import workflows
from plunder.gateway.auth import KEY_TTL, Refused
from plunder.gateway.server import (
    MAX_WAIT,
    Gateway,
    body,
    integer,
    job_id,
    key_of,
    number,
)
from plunder.graph import Edge
from plunder.handle import Job
from plunder.model import JobRecord, JobSpec
from plunder.states import is_terminal
from plunder.streaming import StreamReader

KEEPALIVE = 15.0  # seconds between SSE comments on a quiet stream (proxies close idle ones)
MAX_LIST = 1000


async def _job(gateway: Gateway, key: ApiKey, job_id: int) -> JobRecord:
    """The job, if ``key`` may see it; JobNotFound otherwise (either way the same)."""
    record = await run_in_threadpool(gateway.store.job_get, job_id)
    if not key.serves(record.queue, await gateway.known_groups()):
        raise errors.JobNotFound(f"no job {job_id}")
    return record


def _specs(data: Any) -> tuple[list[JobSpec], bool, list[Edge] | None]:
    fields = wire.Fields(data, "an enqueue")
    specs = fields.items("jobs", wire_specs.spec_in)
    records = fields.take("records", bool, False)
    edges = fields.items("edges", wire_specs.edge_in, None)  # a workflow (plunder.flows)
    fields.done()
    if not specs:
        raise wire.WireError("an enqueue: 'jobs' is empty")
    return specs, records, edges


async def enqueue(gateway: Gateway, request: Request) -> Response:
    key = await key_of(gateway, request, "write")
    specs, records, edges = _specs(await body(gateway, request))
    await gateway.require_queues(key, sorted({s.queue for s in specs}))
    if edges is not None:
        return await workflows.enqueue(gateway, key, specs, edges, records)
    if records:
        jobs = await run_in_threadpool(gateway.store.job_enqueue_many, specs)
        return JSONResponse({"jobs": [wire.job_out(j) for j in jobs]}, status_code=201)
    ids = await run_in_threadpool(gateway.store.job_enqueue_ids, specs)
    return JSONResponse({"ids": ids}, status_code=201)


async def list_jobs(gateway: Gateway, request: Request) -> Response:
    """A page of jobs, newest first (``?queue= &status= &task= &after= &limit=``). An
    admin key lists every queue; any other reading key names one queue it may use."""
    key = await key_of(gateway, request, "read")
    query = request.query_params
    queue = query.get("queue")
    if queue is None and key.role is not Role.ADMIN:
        raise Refused(400, "name a queue (?queue=, plunder jobs --queue): only an admin key "
                           "lists every queue")  # fmt: skip
    if queue is not None:
        await gateway.require_queues(key, [queue])
    after = integer(request, "after", None, high=2**62)
    limit = integer(request, "limit", None, high=MAX_LIST)
    page = await run_in_threadpool(
        lambda: gateway.store.job_list(
            queue=queue,
            status=query.get("status"),
            task=query.get("task"),
            after=after,
            limit=50 if limit is None else limit,
        )
    )
    return JSONResponse(
        {"jobs": [wire.job_out(j) for j in page.jobs], "next_after": page.next_after}
    )


async def get_job(gateway: Gateway, request: Request) -> Response:
    key = await key_of(gateway, request, "read")
    return JSONResponse(wire.job_out(await _job(gateway, key, job_id(request))))


async def result(gateway: Gateway, request: Request) -> Response:
    """The job once terminal, or as it is when ``?wait=`` seconds pass first."""
    key = await key_of(gateway, request, "read")
    wait = number(request, "wait", 0.0, high=MAX_WAIT)
    record = await _job(gateway, key, job_id(request))
    if is_terminal(record.status) or not wait:
        return JSONResponse(wire.job_out(record))
    loop = asyncio.get_running_loop()
    woken = asyncio.Event()
    deadline = loop.time() + wait
    unwatch = gateway.app.hub.watch("done", record.id, _waker(loop, woken))
    try:
        while not is_terminal(record.status):
            left = deadline - loop.time()
            if left <= 0 or await request.is_disconnected():
                break
            with contextlib.suppress(TimeoutError):  # the poll: a wake-up may have been lost
                await asyncio.wait_for(woken.wait(), min(left, gateway.app.settings.poll_interval))
            woken.clear()
            record = await run_in_threadpool(gateway.store.job_get, record.id)
    finally:
        unwatch()
    return JSONResponse(wire.job_out(record))


async def stream(gateway: Gateway, request: Request) -> Response:
    """Server-sent events: each stream event (``id:`` its seq), the marks of new attempts
    (no id), then ``event: end`` with the job as it ended."""
    key = await key_of(gateway, request, "read")
    record = await _job(gateway, key, job_id(request))
    last = request.headers.get("last-event-id") or request.query_params.get("after") or "0"
    if not last.isdigit():
        raise Refused(400, "Last-Event-ID must be the seq of the last event received")
    header = request.headers.get("authorization")
    address = request.client.host if request.client else "?"
    events = _events(gateway, request, Job(gateway.app, record.id), int(last), (header, address))
    return StreamingResponse(
        events,
        media_type="text/event-stream",
        headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"},
    )


async def _events(
    gateway: Gateway, request: Request, job: Job, after: int, caller: tuple[str | None, str]
) -> AsyncIterator[str]:
    loop = asyncio.get_running_loop()
    woken = asyncio.Event()
    reader = StreamReader(job, after=after)
    unwatch = await run_in_threadpool(job.watch, _waker(loop, woken))
    checked = quiet_since = time.monotonic()
    try:
        while True:
            if time.monotonic() - checked >= KEY_TTL:  # a revoked key's streams close
                try:
                    await run_in_threadpool(gateway.keys.check, *caller)
                except Refused:
                    return
                checked = time.monotonic()
            events = await run_in_threadpool(reader.read)
            if events is None:
                final = await run_in_threadpool(job.refresh)
                yield _sse("end", wire.job_out(final))
                return
            for event in events:
                seq = None if event.kind == "attempt" else event.seq
                yield _sse(event.kind, wire.event_out(event), seq)
                quiet_since = time.monotonic()
            if not events:
                if time.monotonic() - quiet_since >= KEEPALIVE:
                    yield ": keep-alive\n\n"
                    quiet_since = time.monotonic()
                if await request.is_disconnected():
                    return
                with contextlib.suppress(TimeoutError):  # a poll, and the key checked again
                    await asyncio.wait_for(woken.wait(), min(KEY_TTL, reader.poll))
                woken.clear()
    finally:
        unwatch()


def _sse(kind: str, data: Any, seq: int | None = None) -> str:
    head = f"id: {seq}\n" if seq is not None else ""
    return f"{head}event: {kind}\ndata: {json.dumps(data, separators=(',', ':'))}\n\n"


async def cancel(gateway: Gateway, request: Request) -> Response:
    key = await key_of(gateway, request, "write")
    record = await _job(gateway, key, job_id(request))
    return JSONResponse(wire.job_out(await run_in_threadpool(gateway.store.job_cancel, record.id)))


async def retry(gateway: Gateway, request: Request) -> Response:
    key = await key_of(gateway, request, "write")
    record = await _job(gateway, key, job_id(request))
    return JSONResponse(wire.job_out(await run_in_threadpool(gateway.store.job_retry, record.id)))


async def runs(gateway: Gateway, request: Request) -> Response:
    key = await key_of(gateway, request, "read")
    record = await _job(gateway, key, job_id(request))
    found = await run_in_threadpool(gateway.store.job_runs, record.id)
    return JSONResponse({"runs": [wire.run_out(r) for r in found]})


async def events(gateway: Gateway, request: Request) -> Response:
    """The stored stream events after ``?after=`` (no waiting: see ``stream``)."""
    key = await key_of(gateway, request, "read")
    record = await _job(gateway, key, job_id(request))
    after = integer(request, "after", 0, high=2**62) or 0
    limit = integer(request, "limit", MAX_LIST, high=MAX_LIST) or MAX_LIST
    found = await run_in_threadpool(
        lambda: gateway.store.stream_read(record.id, after=after, limit=limit)
    )
    return JSONResponse({"events": [wire.event_out(e) for e in found]})


async def task(gateway: Gateway, request: Request) -> Response:
    await key_of(gateway, request, "read")
    info = await run_in_threadpool(gateway.store.task_get, request.path_params["name"])
    if info is None:
        raise Refused(404, f"no task {request.path_params['name'][:200]!r} was published")
    return JSONResponse(wire.task_info_out(info))


async def health(gateway: Gateway, request: Request) -> Response:
    """For load balancers: 200 while the database answers, 503 otherwise."""
    now = await run_in_threadpool(gateway.store.now)
    return JSONResponse({"status": "ok", "database_time": now.isoformat()})


ROUTES = [
    ("/v1/health", "GET", health),
    ("/v1/jobs", "POST", enqueue),
    ("/v1/jobs", "GET", list_jobs),
    ("/v1/jobs/{job_id}", "GET", get_job),
    ("/v1/jobs/{job_id}/result", "GET", result),
    ("/v1/jobs/{job_id}/stream", "GET", stream),
    ("/v1/jobs/{job_id}/events", "GET", events),
    ("/v1/jobs/{job_id}/runs", "GET", runs),
    ("/v1/jobs/{job_id}/cancel", "POST", cancel),
    ("/v1/jobs/{job_id}/retry", "POST", retry),
    ("/v1/tasks/{name}", "GET", task),
]


def _waker(loop: asyncio.AbstractEventLoop, event: asyncio.Event) -> Callable[[], None]:
    """A callback for the hub's thread that sets ``event`` on ``loop``."""

    def wake() -> None:
        loop.call_soon_threadsafe(event.set)

    return wake
