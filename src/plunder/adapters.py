"""The connections ``enqueue_in`` and ``conn=`` accept, as the store's drivers want them.

A driver takes the caller's own sqlite3 or psycopg connection. A SQLAlchemy ``Connection``
or ``Session`` (sync) stands for the DB-API connection under it, in the transaction it
has open (a Session's transaction begins on it if none has yet). An async SQLAlchemy
connection is refused: the DB-API connection under it is an adapter that runs the async
driver's calls on the event loop, and plunder's store drives a synchronous connection.
Nothing here imports SQLAlchemy: an object is recognised by its class's module.
"""

from __future__ import annotations

from typing import Any

from plunder import errors

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
            "asynchronous and plunder's store writes through a synchronous one; use a sync "
            "Session or Connection, or enqueue after your commit (await task.enqueue_async)"
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
