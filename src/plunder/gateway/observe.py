"""The gateway's own metrics: ``GET /metrics`` (Prometheus's text format, for a key that
may read: it shows every queue's counts) and the time it takes to answer each request, by
route, method and status (plunder.tally)."""

from __future__ import annotations

import time

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from plunder import metrics, tally
from plunder.gateway.server import Endpoint, Gateway, key_of


class Timing:
    """ASGI middleware: each HTTP request's time to its answer's start, counted by the
    route's path template (``/v1/jobs/{job_id}``: not one series per job)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        began = time.monotonic()
        status = 500

        async def sent(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                route = scope.get("route")
                path = getattr(route, "path", "unmatched")
                tally.TALLY.count_request(path, scope["method"], status, time.monotonic() - began)
            await send(message)

        await self.app(scope, receive, sent)


def endpoint(gateway: Gateway) -> Endpoint:
    """``GET /metrics``: the gateway's registry (its tally and the database's counts)."""
    found = metrics.registry(gateway.store)

    async def serve_metrics(gateway: Gateway, request: Request) -> Response:
        await key_of(gateway, request, "read", "read metrics")
        text = await run_in_threadpool(metrics.render, found)
        return Response(text, media_type=metrics.CONTENT_TYPE)

    return serve_metrics
