"""Open a store from a URL: ``sqlite:///path.db``, ``postgresql://…``, or a gateway's
``https://…`` (plunder.store.http, with an API key)."""

from __future__ import annotations

from typing import Any

from plunder import errors
from plunder.store.base import Store


def open_store(url: str, **options: Any) -> Store:
    """Open the store a URL names. Nothing touches the database until first use.
    ``create=False``: a SQLite file that does not exist is refused (StoreUnavailable) at
    first use instead of created empty (a PostgreSQL database is never created)."""
    create = bool(options.pop("create", True))
    if not isinstance(url, str) or "://" not in url:
        raise errors.ConfigError(
            f"invalid database URL {url!r}: use sqlite:///path/to/file.db or "
            "postgresql://user:password@host:port/dbname"
        )
    scheme = url.split("://", 1)[0].lower()
    if scheme == "sqlite":
        from plunder.store.sqlite import SqliteStore

        pg_only = {
            "pool_size",
            "connect_timeout",
            "application_name",
            "statement_timeout",
            "tcp_user_timeout",
            "call_timeout",
            "idle_timeout",
        }
        options = {k: v for k, v in options.items() if k not in pg_only}
        return SqliteStore(url, create=create, **options)
    if scheme in ("postgresql", "postgres"):
        try:
            from plunder.store.postgres import PostgresStore
        except ImportError as exc:
            raise errors.ConfigError(str(exc)) from exc
        sqlite_only = {"busy_timeout"}
        return PostgresStore(url, **{k: v for k, v in options.items() if k not in sqlite_only})
    if scheme in ("http", "https"):  # a gateway (plunder serve), with an API key
        from plunder.store.http import HttpStore

        return HttpStore(url, **options)  # the producers' part of a Store
    raise errors.ConfigError(
        f"unsupported database URL scheme {scheme!r} in {url.split('://', 1)[0]}://…: "
        "use sqlite://, postgresql:// or a gateway's https://"
    )
