"""A SQLite store closed by one thread while another is in a transaction: the connection
under that transaction is closed once the transaction ends, not under it. Closing it
under a running statement could crash the interpreter (a halted worker's store closes
while its janitor still ends its lease)."""

from __future__ import annotations

import sqlite3
import threading
from pathlib import Path

import pytest

from plunder.store.sqlite.driver import SqliteDriver


def test_a_connection_in_use_is_closed_once_its_transaction_ends(tmp_path: Path) -> None:
    driver = SqliteDriver(f"sqlite:///{tmp_path / 'plunder.db'}")
    inside, go_on = threading.Event(), threading.Event()
    seen: list[object] = []
    held: list[sqlite3.Connection] = []

    def use() -> None:
        with driver.transaction(write=True) as tx:
            held.append(tx.conn)
            inside.set()
            go_on.wait(10)
            # the store was closed meanwhile: this transaction still has its connection
            seen.append(tx.conn.execute("SELECT 41 + 1").fetchone()[0])

    other = driver.connection()  # this thread's, idle: closed at once
    thread = threading.Thread(target=use)
    thread.start()
    assert inside.wait(10)
    driver.close()
    with pytest.raises(sqlite3.ProgrammingError):
        other.execute("SELECT 1")
    go_on.set()
    thread.join(10)
    assert seen == [42]
    with pytest.raises(sqlite3.ProgrammingError):  # closed by its thread, once done
        held[0].execute("SELECT 1")
    # the thread's next transaction opens a connection of its own again
    with driver.transaction(write=False) as tx:
        assert tx.conn.execute("SELECT 1").fetchone()[0] == 1
    driver.close()


def test_a_connection_closed_between_its_lookup_and_its_use_is_replaced(
    tmp_path: Path,
) -> None:
    driver = SqliteDriver(f"sqlite:///{tmp_path / 'plunder.db'}")
    stale = driver.connection()
    driver.close()  # this thread's connection closed: the next transaction opens one
    with driver.transaction(write=False) as tx:
        assert tx.conn is not stale
        assert tx.conn.execute("SELECT 1").fetchone()[0] == 1
    driver.close()
