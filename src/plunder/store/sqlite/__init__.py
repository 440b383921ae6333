"""The SQLite driver package: the driver (driver), the store built on it (store), its
transactions (tx), its wake-ups (notifications), where its file may live (files), and its
SQL (``sql/``: queries.sql, schema.sql, migrations/)."""

from plunder.store.sqlite.store import SqliteStore

__all__ = ["SqliteStore"]
