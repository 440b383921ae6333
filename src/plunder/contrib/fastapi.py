"""FastAPI helpers: those of plunder.contrib.starlette, and ``enqueuer``, a dependency
that enqueues in the request's own database transaction::

    @api.post("/orders")
    def place(session: Session = Depends(get_session),
              jobs: Enqueuer = Depends(enqueuer(get_session))):
        session.add(order)
        jobs.enqueue(send_receipt, order.id)   # committed with the order, or not at all
        session.commit()

FastAPI resolves ``get_session`` once per request, so both parameters are one session.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fastapi import Depends

from plunder.contrib.starlette import Enqueuer, lifespan, opened, sse_event, stream_response

__all__ = ["Enqueuer", "enqueuer", "lifespan", "opened", "sse_event", "stream_response"]


def enqueuer(connection: Callable[..., Any]) -> Callable[..., Enqueuer]:
    """A dependency giving an :class:`Enqueuer` on what the dependency ``connection``
    gives the request (a sync SQLAlchemy Session or Connection, or a psycopg or sqlite3
    connection)."""

    def dependency(conn: Any = Depends(connection)) -> Enqueuer:  # noqa: B008
        return Enqueuer(conn)

    return dependency
