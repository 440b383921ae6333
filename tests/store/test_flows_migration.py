"""Version 19 (workflows) over a database of version 18 with data in it: SQLite rebuilds
plunder_jobs for its status CHECK; every row, id and reference comes through, and the old
jobs can be parents of a new workflow."""

from __future__ import annotations

import sqlite3

import pytest

import plunder
from plunder.graph import Edge
from plunder.model import JobSpec, Limit
from plunder.states import Status
from plunder.store import queries
from tests.store.helpers import claim, complete, open_session, raw_connect
from tests.store.test_schema import rows_of


@pytest.mark.parametrize("backend", ["sqlite"])
def test_version_19_keeps_the_rows_of_version_18(
    empty_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    every = queries.migrations("sqlite")
    assert every[18][1] == "0019_workflows.sql"
    monkeypatch.setattr(queries, "migrations", lambda dialect: every[:18])
    old = plunder.open_store(empty_url)
    try:
        assert old.migrate(fresh_schema=False) == 18
        session = open_session(old)
        done, running = old.job_enqueue_many([JobSpec("t", [1]), JobSpec("t", [2])])
        got = {j.id: j for j in claim(old, session, limit=2)}
        limited, _ = old.job_enqueue_many(
            [JobSpec("t", [3], limit=Limit("k", 1)), JobSpec("t", [4], key="held")]
        )
        assert complete(old, got[done.id].claim, "old")
        old.stream_append(got[running.id].claim, [("chunk", "x")])
    finally:
        old.close()
    before = rows_of(empty_url)
    monkeypatch.undo()

    store = plunder.open_store(empty_url)
    try:
        assert store.migrate() == len(every)
        assert rows_of(empty_url) == before
        assert store.job_get(limited.id).limit_key == "k"
        (child,) = store.flow_enqueue([JobSpec("t", [5])], [
            Edge(done.id, 0, new=False), Edge(running.id, 0, new=False),
        ])  # fmt: skip
        assert store.job_get(child).status == Status.WAITING
        assert complete(store, got[running.id].claim, "new")
        assert store.job_get(child).status == Status.PENDING
        assert store.job_parent_results(child) == {
            done.id: ("succeeded", "old"), running.id: ("succeeded", "new"),
        }  # fmt: skip
        (again,) = store.job_enqueue_many([JobSpec("t", key="held")])
        assert again.id == before["plunder_jobs"][3][0]  # the key still names its job
    finally:
        store.close()
    conn = raw_connect(empty_url)
    try:
        assert conn.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
        assert conn.execute("PRAGMA foreign_key_check").fetchall() == []
        conn.execute("PRAGMA foreign_keys=ON")
        with pytest.raises(sqlite3.IntegrityError, match="CHECK"):
            conn.execute("UPDATE plunder_jobs SET status = 'lost' WHERE id = ?", (done.id,))
        conn.execute("DELETE FROM plunder_jobs WHERE id = ?", (done.id,))
        assert conn.execute("SELECT count(*) FROM plunder_edges").fetchone()[0] == 1
    finally:
        conn.close()
