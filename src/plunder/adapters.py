"""The connections ``enqueue_in`` and ``conn=`` accept, as the store's drivers want them.

A driver takes the caller's own sqlite3 or psycopg connection. A SQLAlchemy ``Connection``
or ``Session`` (sync) stands for the DB-API connection under it, in the transaction it
has open (a Session's transaction begins on it if none has yet). An async SQLAlchemy
``AsyncConnection`` or ``AsyncSession`` is joined by ``enqueue_in_async`` through its
public ``run_sync``: there, its DB-API connection is SQLAlchemy's adapter over the async
driver (psycopg's AsyncConnection, or aiosqlite), whose calls the event loop awaits, and
the store writes through that adapter. ``enqueue_in`` refuses one (it would block the loop).
Nothing here imports SQLAlchemy: an object is recognised by its class's module.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from plunder import errors

T = TypeVar("T")

ASYNC_TYPES = ("AsyncConnection", "AsyncSession", "AsyncEngine")


def dbapi_connection(conn: Any) -> Any:
    """``conn`` itself, or the DB-API connection under a SQLAlchemy Connection or Session."""
    module = type(conn).__module__ or ""
    if not module.startswith("sqlalchemy."):
        return conn
    kind = type(conn).__name__
    if kind in ASYNC_TYPES:
        raise errors.ConfigError(
            f"enqueue_in cannot join a SQLAlchemy {kind}: its driver connection is "
            "asynchronous; await task.enqueue_in_async(conn, ...) joins it"
        )
    if kind == "Engine":
        raise errors.ConfigError(
            "enqueue_in needs a connection with a transaction open, not an Engine: pass "
            "engine.begin()'s Connection or a Session"
        )
    if hasattr(conn, "get_bind") and hasattr(conn, "connection"):  # a Session
        conn = conn.connection()
    fairy = getattr(conn, "connection", None)  # Connection.connection: the pooled DB-API one
    raw = getattr(fairy, "dbapi_connection", None)
    if raw is None:
        raise errors.ConfigError(
            f"cannot reach the database connection under SQLAlchemy {kind} (is it closed?)"
        )
    return raw


async def run_sync_on(conn: Any, write: Callable[[Any], T]) -> T:
    """``write(sync)`` in the transaction open on an async SQLAlchemy ``AsyncConnection``
    or ``AsyncSession``, through its ``run_sync``: ``sync`` is its sync facade, whose
    DB-API connection (:func:`dbapi_connection`) is the adapter over the async driver."""
    kind = type(conn).__name__
    module = type(conn).__module__ or ""
    if not module.startswith("sqlalchemy.") or kind not in ("AsyncConnection", "AsyncSession"):
        raise errors.ConfigError(
            f"enqueue_in_async joins a SQLAlchemy AsyncConnection or AsyncSession, not "
            f"{kind}; for a sync connection use enqueue_in"
        )
    return await conn.run_sync(write)  # type: ignore[no-any-return]
