"""The SQLite store: the shared SQL store (plunder.store.sqlbase) over a SQLite file's
driver (plunder.store.sqlite.driver)."""

from __future__ import annotations

from typing import Any

from plunder.store.sqlbase import SQLStore
from plunder.store.sqlite.driver import SqliteDriver


class SqliteStore(SQLStore):
    """The Store protocol on one SQLite file (see SqliteDriver for how it is used)."""

    def __init__(
        self, url: str, *, busy_timeout: float = 5.0, create: bool = True, **options: Any
    ) -> None:
        super().__init__(SqliteDriver(url, busy_timeout=busy_timeout, create=create), **options)
