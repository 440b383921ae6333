"""The PostgreSQL driver: the store (store), its transactions (tx), the connections it makes
(connections, notifications), a worker's turns sent ahead (turns, pipe), and its SQL
(``sql/``: queries.sql, schema.sql, migrations/)."""

from plunder.store.postgres.store import PostgresStore

__all__ = ["PostgresStore"]
