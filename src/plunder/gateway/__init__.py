"""``plunder serve``: the gateway. Workers and producers that hold an API key instead of
the database's credentials speak to it over HTTP (plunder.store.http); it speaks to the
database with a small pool and one listening connection, however many they are.

```
 remote workers ─┐   /v1/sessions/…  (the worker protocol; the exchange long-polls)
 producers ──────┼─▶ /v1/jobs/…      (enqueue, list, read, result long-poll, SSE stream)
 admins ─────────┤   /v1/keys/…      (make, list, revoke keys)                      ─▶ database
                 │   /v1/schedules/… (list, pause, resume schedules)
 browsers ───────┤   /, /jobs, …     (the dashboard: plunder.dashboard)
 load balancer ──┘   /v1/health, /openapi.json
```

Stateless: any number of gateways serve one database behind a load balancer; what a
request needs (its key, the session's owner) is in the database. Each takes part in the
janitor's duty (remote workers do not), so that a dead remote worker's jobs are rescued.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import threading
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager
from typing import Any

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from plunder import dashboard
from plunder.app import App
from plunder.gateway import admin, observe, openapi, producers, schedules, workers, workflows
from plunder.gateway.server import MAX_BODY, Gateway, handler, refusal, routes
from plunder.janitor import Janitor, own_store

log = logging.getLogger("plunder.gateway")
POOL_SIZE = 8  # the gateway's pooled connections (and one for its hub): ≤ 10 in all


def create_app(url: str, *, pool_size: int = POOL_SIZE, max_body: int = MAX_BODY) -> Starlette:
    """The gateway's ASGI app on the database at ``url`` (migrated if need be)."""
    app = App(url, pool_size=pool_size, application_name="plunder:gateway")
    gateway = Gateway(app, max_body=max_body)
    table = [(p, m, n) for p, m, n in workers.ROUTES] + [
        (p, m, endpoint.__name__)
        for p, m, endpoint in [
            *producers.ROUTES,
            *workflows.ROUTES,
            *admin.ROUTES,
            *schedules.ROUTES,
        ]
    ]
    document = openapi.schema(table)

    async def openapi_json(_: Request) -> JSONResponse:
        return JSONResponse(document)

    endpoints: list[Any] = [
        *workers.routes(gateway),
        *routes(gateway, producers.ROUTES),
        *routes(gateway, workflows.ROUTES),
        *routes(gateway, admin.ROUTES),
        *routes(gateway, schedules.ROUTES),
        Route("/openapi.json", openapi_json, methods=["GET"]),
        Route("/metrics", handler(gateway, observe.endpoint(gateway)), methods=["GET"]),
        *dashboard.routes(app.store),  # the pages for people, at /
    ]
    starlette = Starlette(
        routes=endpoints,
        exception_handlers={404: _not_found, 405: _not_found, 500: _crashed},
        lifespan=_lifespan(app),
        middleware=[Middleware(observe.Timing)],
    )
    starlette.state.gateway = gateway
    return starlette


def _lifespan(app: App) -> Callable[[Starlette], AbstractAsyncContextManager[None]]:
    """The gateway's janitor while it serves: remote workers run none, so the gateways
    take part in its duty (one of the fleet holds the lease) and a dead remote worker's
    jobs are rescued; the database closed at the end."""

    @contextlib.asynccontextmanager
    async def lifespan(_: Starlette) -> AsyncIterator[None]:
        stop = threading.Event()
        janitor = Janitor(
            app.store,
            app.settings,
            holder=f"gateway:{socket.gethostname()}:{os.getpid()}",
            own_store=own_store(app.store, app.settings, "plunder:gateway:janitor"),
        )
        thread = threading.Thread(target=janitor.run, args=(stop,), name="plunder-janitor")
        thread.start()
        try:
            yield
        finally:
            stop.set()
            thread.join(timeout=10)
            app.close()

    return lifespan


async def _not_found(_: Request, exc: Exception) -> JSONResponse:
    status = getattr(exc, "status_code", 404)
    return refusal(status, "no such endpoint" if status == 404 else "method not allowed")


async def _crashed(request: Request, exc: Exception) -> JSONResponse:
    log.error("%s %s failed", request.method, request.url.path, exc_info=exc)
    return refusal(500, "the gateway failed; see its log", "GatewayError")


def serve(
    url: str,
    *,
    host: str = "127.0.0.1",
    port: int = 8700,
    tls_cert: str | None = None,
    tls_key: str | None = None,
    pool_size: int = POOL_SIZE,
) -> None:
    """Serve the gateway until interrupted (uvicorn, one process)."""
    import uvicorn

    asgi = create_app(url, pool_size=pool_size)
    uvicorn.run(
        asgi,
        host=host,
        port=port,
        ssl_certfile=tls_cert,
        ssl_keyfile=tls_key,
        log_level="warning",
        access_log=False,
        timeout_graceful_shutdown=5,
    )
