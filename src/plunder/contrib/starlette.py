"""Starlette (and FastAPI, which is Starlette) helpers: a lifespan that opens and closes a
plunder App's store, an enqueuer bound to the request's own database transaction, and a
server-sent events response relaying ``job.stream_async()``.

Enqueueing in the request's transaction takes a SQLAlchemy ``Session`` or ``Connection``,
a psycopg or sqlite3 connection (``enqueue``), or an async SQLAlchemy ``AsyncSession`` or
``AsyncConnection`` (``await enqueue_async``): see plunder.adapters.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Callable
from typing import Any

from starlette.responses import StreamingResponse

from plunder.app import App
from plunder.handle import Job
from plunder.model import StreamEvent


def lifespan(app: App) -> Callable[[Any], contextlib.AbstractAsyncContextManager[None]]:
    """``Starlette(lifespan=plunder.contrib.starlette.lifespan(app))``: the store is opened
    (and migrated) before the first request, and the app closed at shutdown."""

    @contextlib.asynccontextmanager
    async def span(_: Any) -> AsyncIterator[None]:
        async with opened(app):
            yield

    return span


@contextlib.asynccontextmanager
async def opened(app: App) -> AsyncIterator[App]:
    """The app with its store open, closed on leaving (to nest in a lifespan of your own)."""
    await asyncio.to_thread(lambda: app.store)
    try:
        yield app
    finally:
        await asyncio.to_thread(app.close)


class Enqueuer:
    """Enqueues on ``conn``, in the transaction it has open: the jobs exist if and only if
    the caller commits it."""

    def __init__(self, conn: Any) -> None:
        self.conn = conn

    def enqueue(self, task: Any, *args: Any, **kwargs: Any) -> Job:
        job: Job = task.enqueue_in(self.conn, *args, **kwargs)
        return job

    async def enqueue_async(self, task: Any, *args: Any, **kwargs: Any) -> Job:
        """On an async SQLAlchemy ``AsyncSession`` or ``AsyncConnection``."""
        job: Job = await task.enqueue_in_async(self.conn, *args, **kwargs)
        return job


def sse_event(event: StreamEvent) -> str:
    """One stream event as a server-sent event: its kind is the event name, its data JSON."""
    return f"event: {event.kind}\nid: {event.seq}\ndata: {json.dumps(event.data)}\n\n"


def stream_response(job: Job, *, timeout: float | None = None) -> StreamingResponse:
    """The job's stream as server-sent events (``text/event-stream``), then one ``end``
    event whose data is the job's final status. A client that goes away ends the relay."""

    async def events() -> AsyncIterator[str]:
        async for event in job.stream_async(timeout=timeout):
            yield sse_event(event)
        record = await asyncio.to_thread(job.refresh)
        yield f"event: end\ndata: {json.dumps(record.status.value)}\n\n"

    return StreamingResponse(
        events(), media_type="text/event-stream", headers={"Cache-Control": "no-cache"}
    )
