"""The SQLite driver: the store (store), its transactions (tx), its wake-ups
(notifications), where its file may live (files), and its SQL (``sql/``: queries.sql,
schema.sql, migrations/)."""

from plunder.store.sqlite.store import SqliteStore

__all__ = ["SqliteStore"]
