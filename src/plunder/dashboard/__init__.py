"""The dashboard: live pages over the database, for people. ``plunder serve`` serves it
at ``/`` to the holders of the gateway's API keys; ``plunder dashboard`` serves it alone,
on the local machine, to its user (admin, no key).

```
 browser ── GET /, /workers, /jobs, /jobs/{id} ──▶ pages (jinja2 templates, inline SVG)
         ◀─ SSE /live/… (a fragment a second at most; a job's stream as it is written)
         ── GET /confirm ─▶ POST /act (admin, CSRF) ─▶ cancel, retry, bulk, pause a queue
 every reading ─▶ views (shared, once a second) ─▶ the store (plunder.store.observing)
```

Server-rendered: no build step, nothing fetched from the network; the one script
(static/live.js) only swaps in the fragments the server sends.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

from starlette.applications import Starlette
from starlette.routing import BaseRoute, Mount, Route
from starlette.staticfiles import StaticFiles

from plunder.dashboard.live import Live
from plunder.dashboard.pages import Pages
from plunder.dashboard.views import Views
from plunder.dashboard.visitors import Visitors
from plunder.store.base import Store


def routes(store: Store, *, local: bool = False, secure: bool = False) -> list[BaseRoute]:
    """The dashboard's routes on ``store`` (a store on the database itself). ``local``:
    no login, every visitor an admin (``plunder dashboard``); ``secure``: cookies only
    over HTTPS."""
    pages = Pages(Views(store), Visitors(store, local=local), secure=secure)
    live = Live(pages)
    return [
        Route("/", pages.overview, methods=["GET"]),
        Route("/workers", pages.workers, methods=["GET"]),
        Route("/jobs", pages.jobs, methods=["GET"]),
        Route("/jobs/{job_id}", pages.job, methods=["GET"]),
        Route("/login", pages.login_form, methods=["GET"]),
        Route("/login", pages.login, methods=["POST"]),
        Route("/logout", pages.logout, methods=["POST"]),
        Route("/confirm", pages.confirm, methods=["GET"]),
        Route("/act", pages.act, methods=["POST"]),
        Route("/live/overview", live.overview, methods=["GET"]),
        Route("/live/workers", live.workers, methods=["GET"]),
        Route("/live/jobs", live.jobs, methods=["GET"]),
        Route("/live/jobs/{job_id}", live.job, methods=["GET"]),
        Mount("/static", StaticFiles(packages=[("plunder.dashboard", "static")]), name="static"),
    ]


def create_app(url: str) -> Starlette:
    """The dashboard alone on the database at ``url``, for its local user."""
    from plunder.store import open_store

    store = open_store(url, pool_size=4, application_name="plunder:dashboard")
    store.schema_check()

    @contextlib.asynccontextmanager
    async def lifespan(_: Starlette) -> AsyncIterator[None]:
        try:
            yield
        finally:
            store.close()

    return Starlette(routes=routes(store, local=True), lifespan=lifespan)


def serve(url: str, *, host: str = "127.0.0.1", port: int = 8710) -> None:
    """Serve the local dashboard until interrupted."""
    import uvicorn

    uvicorn.run(
        create_app(url), host=host, port=port, log_level="warning", access_log=False,
        timeout_graceful_shutdown=2,
    )  # fmt: skip
