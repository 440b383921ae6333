"""The pages, live: Server-Sent Events that carry re-rendered fragments.

```
 overview / workers / jobs:  every PERIOD ─▶ render from the shared reading (views.Cache)
                              ─▶ sent only if it changed        event: swap
 a job:                       every STREAM_PERIOD ─▶ its new stream events
                              ─▶ event: chunk (text) / mark (a new attempt) / progress
                              every PERIOD ─▶ its facts, if changed      event: status
```

However fast the queues drain, a browser gets at most one overview a second, and the
database is read once a second for every browser together (the job stream: one small
indexed read per watcher and STREAM_PERIOD). The visitor is checked again at each
update: a revoked key's streams end within a second.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from typing import Any

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from plunder import errors
from plunder.dashboard.pages import Pages, _job_id
from plunder.dashboard.visitors import COOKIE, Visitor

PERIOD = 1.0  # seconds between two updates of a page
STREAM_PERIOD = 0.2  # seconds between two reads of a job's new stream events
PING = 15.0  # seconds of silence after which a comment keeps proxies from closing the stream
HEADERS = {"Cache-Control": "no-store", "X-Accel-Buffering": "no"}


def event(name: str, data: str) -> str:
    lines = data.split("\n")
    return f"event: {name}\n" + "".join(f"data: {line}\n" for line in lines) + "\n"


class Live:
    """The event streams of ``pages``."""

    def __init__(self, pages: Pages, *, period: float = PERIOD) -> None:
        self.pages = pages
        self.period = period

    async def _visitor(self, request: Request) -> Visitor | None:
        return await run_in_threadpool(self.pages.visitors.visitor, request.cookies.get(COOKIE))

    def _stream(self, body: AsyncIterator[str]) -> Response:
        return StreamingResponse(body, media_type="text/event-stream", headers=HEADERS)

    async def _fragments(
        self, request: Request, render: Callable[[Visitor], str]
    ) -> AsyncIterator[str]:
        last, quiet = "", 0.0
        while True:
            visitor = await self._visitor(request)
            if visitor is None:
                yield event("end", "logged out")
                return
            html = await run_in_threadpool(render, visitor)
            if html != last:
                last, quiet = html, 0.0
                yield event("swap", html)
            elif quiet >= PING:
                quiet = 0.0
                yield ": ping\n\n"
            await asyncio.sleep(self.period)
            quiet += self.period

    async def overview(self, request: Request) -> Response:
        views, pages = self.pages.views, self.pages

        def render(visitor: Visitor) -> str:
            data = views.overview(visitor)
            return pages.fragment("_overview.html", request, visitor=visitor, data=data)

        return self._stream(self._fragments(request, render))

    async def workers(self, request: Request) -> Response:
        views, pages = self.pages.views, self.pages

        def render(visitor: Visitor) -> str:
            data = views.workers(visitor)
            return pages.fragment("_workers.html", request, visitor=visitor, data=data)

        return self._stream(self._fragments(request, render))

    async def jobs(self, request: Request) -> Response:
        def render(visitor: Visitor) -> str:
            try:
                return self.pages.jobs_fragment(visitor, request)
            except ValueError as exc:
                return f"<p class='error'>{exc}</p>"

        return self._stream(self._fragments(request, render))

    async def job(self, request: Request) -> Response:
        job_id = _job_id(request.path_params["job_id"])
        after = _job_id(request.query_params.get("after", "")) or 0
        return self._stream(self._job_events(request, job_id or 0, after))

    async def _job_events(self, request: Request, job_id: int, after: int) -> AsyncIterator[str]:
        last, attempt, since_status = "", None, self.period
        visitor: Visitor | None = None
        while True:
            if since_status >= self.period:  # who asks, and the job's facts: once a PERIOD
                since_status = 0.0
                visitor = await self._visitor(request)
                view = None
                if visitor is not None:
                    view = await run_in_threadpool(self._job, visitor, job_id)
                if visitor is None or view is None:
                    yield event("end", "gone")
                    return
                html = self.pages.fragment("_job.html", request, visitor=visitor, view=view)
                if html != last:
                    last = html
                    yield event("status", html)
            read = self.pages.views.store.stream_read
            for e in await run_in_threadpool(read, job_id, after=after):
                after = max(after, e.seq)
                if attempt is not None and e.attempt != attempt:
                    yield event("mark", json.dumps(f"\n--- attempt {e.attempt} ---\n"))
                attempt = e.attempt
                if e.kind == "chunk":
                    text = e.data if isinstance(e.data, str) else json.dumps(e.data) + "\n"
                    yield event("chunk", json.dumps(text))
                elif e.kind == "progress":
                    yield event("progress", json.dumps(_progress(e.data)))
            await asyncio.sleep(STREAM_PERIOD)
            since_status += STREAM_PERIOD

    def _job(self, visitor: Visitor, job_id: int) -> Any:
        try:
            return self.pages.views.job(visitor, job_id)
        except errors.JobNotFound:
            return None


def _progress(data: Any) -> str:
    if isinstance(data, dict) and "current" in data:
        total = data.get("total")
        return f"progress: {data['current']}" + (f" of {total}" if total is not None else "")
    return f"progress: {json.dumps(data)}"
