"""Version 19 (workflows) over a database of version 18 with data in it: SQLite rebuilds
plunder_jobs for its status CHECK; every row, id and reference comes through, and the old
jobs can be parents of a new workflow."""

from __future__ import annotations

import sqlite3

import pytest

import plunder
from plunder import payload
from plunder.graph import Edge
from plunder.model import JobSpec
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
    finally:
        old.close()
    monkeypatch.undo()
    # rows as version 18 held them, written in SQL: today's store reads tables of later
    # versions (fair queues, ordered keys) that a database of version 18 has not yet
    conn = raw_connect(empty_url)
    try:
        insert = (
            "INSERT INTO plunder_jobs (queue, task, args, status, result, limit_key, key,"
            " run_at, created_at) VALUES ('default', 't', ?, ?, ?, ?, ?, 0, 0) RETURNING id"
        )
        done, parent, limited, keyed = (
            conn.execute(insert, row).fetchone()[0]
            for row in [
                ("[1]", "succeeded", payload.encode("old"), None, None),
                ("[2]", "pending", None, None, None),
                ("[3]", "pending", None, "k", None),
                ("[4]", "pending", None, None, "held"),
            ]
        )
        conn.execute(
            "INSERT INTO plunder_events (job_id, attempt, kind, data, created_at)"
            " VALUES (?, 1, 'chunk', 'x', 0)",
            (parent,),
        )
        conn.commit()
    finally:
        conn.close()
    before = rows_of(empty_url)

    store = plunder.open_store(empty_url)
    try:
        assert store.migrate() == len(every)
        assert rows_of(empty_url) == before
        assert store.job_get(limited).limit_key == "k"
        (child,) = store.flow_enqueue([JobSpec("t", [5])], [
            Edge(done, 0, new=False), Edge(parent, 0, new=False),
        ])  # fmt: skip
        assert store.job_get(child).status == Status.WAITING
        session = open_session(store)
        (got,) = claim(store, session, limit=1)
        assert got.id == parent
        assert complete(store, got.claim, "new")
        assert store.job_get(child).status == Status.PENDING
        assert store.job_parent_results(child) == {
            done: ("succeeded", "old"), parent: ("succeeded", "new"),
        }  # fmt: skip
        (again,) = store.job_enqueue_many([JobSpec("t", key="held")])
        assert again.id == keyed  # the key still names its job
    finally:
        store.close()
    conn = raw_connect(empty_url)
    try:
        assert conn.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
        assert conn.execute("PRAGMA foreign_key_check").fetchall() == []
        conn.execute("PRAGMA foreign_keys=ON")
        with pytest.raises(sqlite3.IntegrityError, match="CHECK"):
            conn.execute("UPDATE plunder_jobs SET status = 'lost' WHERE id = ?", (done,))
        conn.execute("DELETE FROM plunder_jobs WHERE id = ?", (done,))
        assert conn.execute("SELECT count(*) FROM plunder_edges").fetchone()[0] == 1
    finally:
        conn.close()
