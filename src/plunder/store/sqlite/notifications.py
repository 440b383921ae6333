"""Wake-ups on SQLite, which has no NOTIFY: a dedicated connection watches the file's
``PRAGMA data_version``."""

from __future__ import annotations

import logging
import sqlite3
import time
from collections.abc import Collection, Iterator
from contextlib import contextmanager
from typing import Any

log = logging.getLogger("plunder.store")
POLL_STEP = 0.005  # seconds between PRAGMA data_version reads while waiting


class SqliteNotifications:
    """SQLite has no NOTIFY. A dedicated connection reads ``PRAGMA data_version`` every few
    milliseconds: it changes whenever another connection commits, so any change reports
    ``("*", "")`` ("something changed; re-check"). The read touches no table and takes
    microseconds. The connection also carries the owner's heartbeats."""

    def __init__(self, open_connection: Any, *, listen: bool) -> None:
        self._open = open_connection
        self.listen = listen
        self._conn: sqlite3.Connection | None = None
        self._version: int | None = None

    @property
    def connection(self) -> sqlite3.Connection:
        if self._conn is None:
            self._conn = self._open()
        return self._conn

    @contextmanager
    def connection_for(self, timeout: float | None) -> Iterator[sqlite3.Connection]:
        """A local file has no peer that can hang; SQLite's busy timeout bounds the wait
        for its lock."""
        yield self.connection

    def _data_version(self) -> int:
        return int(self.connection.execute("PRAGMA data_version").fetchone()[0])

    def wait(
        self, timeout: float, channels: Collection[str] | None = None
    ) -> list[tuple[str, str]]:
        """Up to ``timeout`` seconds. Any commit says "re-check" to every channel, so
        ``channels`` changes nothing here."""
        if not self.listen:
            time.sleep(timeout)
            return []
        deadline = time.monotonic() + timeout
        try:
            if self._version is None:
                self._version = self._data_version()
                return [("*", "")]
            while True:
                version = self._data_version()
                if version != self._version:
                    self._version = version
                    return [("*", "")]
                left = deadline - time.monotonic()
                if left <= 0:
                    return []
                time.sleep(min(POLL_STEP, left))
        except sqlite3.Error as exc:
            log.warning("data_version poll failed (%s); reopening", exc)
            self.close()
            time.sleep(min(timeout, 0.5))
            return []

    def interrupt(self) -> None:
        """Nothing to do: a wait looks again every POLL_STEP, and reports the commit that
        gave a waiter its reason to interrupt."""

    def close(self) -> None:
        conn, self._conn = self._conn, None
        self._version = None
        if conn is not None:
            conn.close()
