"""The PostgreSQL driver package: the driver (driver), the store built on it (store), its
transactions (tx), the connections it makes (connections, notifications), a worker's turns
in one statement and sent ahead (exchange, turns, pipe), and its SQL (``sql/``:
queries.sql, schema.sql, migrations/)."""

from plunder.store.postgres.store import PostgresStore

__all__ = ["PostgresStore"]
