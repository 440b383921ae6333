"""The worker protocol (plunder.protocol) over HTTP: a remote worker's session, heartbeats,
exchanges and stream events, each bound to the key that opened the session.

An exchange with nothing to claim waits (its claim request's ``wait`` seconds) for a
wake-up from the gateway's own LISTEN (or SQLite's data_version) on the claim's queues,
then claims again (plunder.gateway.longpoll): an idle remote worker hears of a new job in
milliseconds, and the database is not polled for it.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from plunder import errors, wire, wire_exchange
from plunder.access import ApiKey
from plunder.gateway import longpoll
from plunder.gateway.auth import Refused
from plunder.gateway.server import (
    MAX_WAIT,
    Gateway,
    body,
    handler,
    key_of,
    own_session,
    refusal,
)

ROUTES = [
    ("/v1/sessions", "POST", "open"),
    ("/v1/sessions/{session_id}/heartbeat", "POST", "heartbeat"),
    ("/v1/sessions/{session_id}/exchange", "POST", "exchange"),
    ("/v1/sessions/{session_id}/events", "POST", "append"),
    ("/v1/sessions/{session_id}/watch", "POST", "watch"),
    ("/v1/sessions/{session_id}/next-due", "POST", "next_due"),
    ("/v1/sessions/{session_id}/close", "POST", "close"),
    ("/v1/sessions/{session_id}/queues", "POST", "queues"),
    ("/v1/sessions/{session_id}/pause-limit", "POST", "pause_limit"),
    ("/v1/sessions/{session_id}/parent-results", "POST", "parent_results"),
]


async def _session(gateway: Gateway, request: Request) -> tuple[ApiKey, str, Any]:
    """The key (a worker's), the session it opened and the request's body."""
    key = await key_of(gateway, request, "work")
    session_id = request.path_params["session_id"]
    await own_session(gateway, key, session_id)
    return key, session_id, await body(gateway, request)


MAX_PAUSE = 366 * 86400.0  # the longest pause a remote worker may ask for


def _own_claims(session_id: str, claims: Any) -> None:
    for claim in claims:
        if claim.session_id != session_id:
            raise Refused(403, f"job {claim.job_id}'s claim names another session")


async def open_session(gateway: Gateway, request: Request) -> Response:
    key = await key_of(gateway, request, "work")
    hello = wire.hello_in(await body(gateway, request))
    await gateway.require_queues(key, hello.queues)
    session = await run_in_threadpool(
        lambda: gateway.store.session_open(
            name=hello.name,
            host=hello.host,
            pid=hello.pid,
            queues=hello.queues,
            expiry=hello.expiry,
            tasks=hello.tasks,
            free_slots=hello.free_slots,
            key_id=key.id,
            labels=hello.labels,
            slots=hello.slots,
        )
    )
    gateway.remember(session.id, key.id)
    return JSONResponse(wire.session_out(session), status_code=201)


async def heartbeat(gateway: Gateway, request: Request) -> Response:
    key, session_id, data = await _session(gateway, request)
    beat = wire.beat_in(data, session_id)
    _own_claims(session_id, beat.running)
    answer = await run_in_threadpool(gateway.link.heartbeat, beat)
    # the session's queues to a worker that asks (an older one would refuse the field),
    # only those its key may use: another may have been joined by someone with the database
    queues = None
    if request.query_params.get("queues") and answer.queues is not None:
        queues = await _served(gateway, key, answer.queues)
    # and its partitioned queues with the partitions it owns, likewise
    partitions = None
    if request.query_params.get("partitions") and answer.partitions is not None:
        served = await _served(gateway, key, [p.queue for p in answer.partitions])
        partitions = tuple(p for p in answer.partitions if p.queue in served)
    answer = dataclasses.replace(answer, queues=queues, partitions=partitions)
    return JSONResponse(wire.heartbeat_out(answer))


async def _served(gateway: Gateway, key: ApiKey, queues: Sequence[str]) -> tuple[str, ...]:
    groups = await gateway.known_groups()
    return tuple(q for q in queues if key.serves(q, groups))


async def change_queues(gateway: Gateway, request: Request) -> Response:
    """A remote worker joins and leaves queues: only queues its key may use."""
    key, session_id, data = await _session(gateway, request)
    fields = wire.Fields(data, "a change of queues")
    add, remove = fields.strings("add", ()), fields.strings("remove", ())
    fields.done()
    await gateway.require_queues(key, add)
    session = await run_in_threadpool(
        lambda: gateway.store.session_queues(session_id, add=add, remove=remove)
    )
    return JSONResponse({"queues": list(await _served(gateway, key, session.queues))})


async def exchange(gateway: Gateway, request: Request) -> Response:
    key, session_id, data = await _session(gateway, request)
    outcomes, claim = wire_exchange.exchange_in(data, session_id)  # claims of this session
    wait = claim.wait if claim is not None else 0.0
    if claim is not None:
        await gateway.require_queues(key, claim.queues)
    if claim is None or not claim.limit or not wait:
        reply = await run_in_threadpool(longpoll.exchange, gateway, session_id, outcomes, claim)
        return JSONResponse(wire_exchange.reply_out(reply))
    reply = await longpoll.long_poll(
        gateway, request, session_id=session_id, outcomes=outcomes, claim=claim, wait=wait
    )
    return JSONResponse(wire_exchange.reply_out(reply))


async def append(gateway: Gateway, request: Request) -> Response:
    _, session_id, data = await _session(gateway, request)
    fields = wire.Fields(data, "stream events")
    claim = wire.claim_in(fields.take("claim", dict))
    events = fields.items("events", _event_in)
    fields.done()
    _own_claims(session_id, [claim])
    await run_in_threadpool(gateway.link.append, claim, events)
    return Response(status_code=204)


async def pause_limit(gateway: Gateway, request: Request) -> Response:
    """ctx.pause_limit() of a remote worker: only the claimed job's own limit key (a
    worker key pauses no other tenant's limits)."""
    _, session_id, data = await _session(gateway, request)
    fields = wire.Fields(data, "a limit pause")
    claim = wire.claim_in(fields.take("claim", dict))
    key = fields.take("key", str)
    seconds = fields.take("seconds", float)
    fields.done()
    _own_claims(session_id, [claim])
    if not 0 <= seconds <= MAX_PAUSE:
        raise Refused(400, f"a pause lasts 0 to {MAX_PAUSE:g} seconds, not {seconds!r}")
    job = await run_in_threadpool(gateway.app.store.job_get, claim.job_id)
    if job.limit_key != key:
        raise Refused(403, f"job {claim.job_id}'s limit key is not {key!r}")
    until = await run_in_threadpool(gateway.link.pause_limit, claim, key, seconds)
    return JSONResponse({"until": wire.time_out(until)})


async def parent_results(gateway: Gateway, request: Request) -> Response:
    """ctx.parent_results of a remote worker: only for a job its session holds now (the
    claim's fence is the scope: decision 0020). A claim of another session, not current,
    or on a job unknown or of another group: one answer, 404."""
    _, session_id, data = await _session(gateway, request)
    fields = wire.Fields(data, "a parents' results request")
    claim = wire.claim_in(fields.take("claim", dict))
    fields.done()
    try:
        if claim.session_id != session_id:
            raise errors.StaleClaim("the claim names another session")
        found = await run_in_threadpool(gateway.link.parent_results, claim)
    except errors.StaleClaim:
        return refusal(404, f"no job {claim.job_id} claimed by this session", "StaleClaim")
    return JSONResponse(wire.parents_out(found))


def _event_in(data: Any) -> tuple[str, Any]:
    fields = wire.Fields(data, "a stream event")
    kind = fields.take("kind", str)
    value = fields.take("data", object, None)
    fields.done()
    if kind not in ("chunk", "progress"):
        raise wire.WireError(f"a stream event's kind must be chunk or progress, not {kind!r}")
    return kind, value


async def watch(gateway: Gateway, request: Request) -> Response:
    """Wait (``wait`` seconds at most) for a wake-up on these queues; claims nothing. For
    a worker with jobs running, whose exchanges must not wait (plunder.waker)."""
    key, _, data = await _session(gateway, request)
    fields = wire.Fields(data, "a watch")
    queues = list(fields.strings("queues"))
    wait = fields.take("wait", float)
    fields.done()
    if not queues or not 0 <= wait <= MAX_WAIT:
        raise Refused(400, f"a watch names its queues and waits 0 to {MAX_WAIT:g} seconds")
    await gateway.require_queues(key, queues)
    loop = asyncio.get_running_loop()
    woken = asyncio.Event()
    unregister = gateway.app.hub.on_work(queues, _waker(loop, woken))
    try:
        deadline = loop.time() + wait
        while not woken.is_set() and loop.time() < deadline:
            if await request.is_disconnected():
                break
            with contextlib.suppress(TimeoutError):  # a look at the client now and then
                await asyncio.wait_for(woken.wait(), min(1.0, deadline - loop.time()))
    finally:
        unregister()
    return JSONResponse({"work": woken.is_set()})


async def next_due(gateway: Gateway, request: Request) -> Response:
    key, _, data = await _session(gateway, request)
    claim = wire.request_in(data)
    if claim is None:
        raise Refused(400, "a claim request is expected")
    await gateway.require_queues(key, claim.queues)
    seconds = await run_in_threadpool(gateway.link.next_due, claim)
    return JSONResponse({"seconds": seconds})


async def close(gateway: Gateway, request: Request) -> Response:
    _, session_id, data = await _session(gateway, request)
    fields = wire.Fields(data, "a close")
    started = fields.items("started", wire.claim_in, [])
    lost = fields.take("lost", bool, False)
    fields.done()
    _own_claims(session_id, started)
    released = await run_in_threadpool(
        lambda: gateway.link.close(session_id, started=started, lost=lost)
    )
    return JSONResponse({"released": released})


_ENDPOINTS = {
    "open": open_session,
    "heartbeat": heartbeat,
    "exchange": exchange,
    "append": append,
    "watch": watch,
    "next_due": next_due,
    "close": close,
    "queues": change_queues,
    "pause_limit": pause_limit,
    "parent_results": parent_results,
}


def routes(gateway: Gateway) -> list[Route]:
    return [
        Route(path, handler(gateway, _ENDPOINTS[name]), methods=[method], name=name)
        for path, method, name in ROUTES
    ]


def _waker(loop: asyncio.AbstractEventLoop, event: asyncio.Event) -> Callable[[], None]:
    """A callback for the hub's thread that sets ``event`` on ``loop``."""

    def wake() -> None:
        loop.call_soon_threadsafe(event.set)

    return wake
