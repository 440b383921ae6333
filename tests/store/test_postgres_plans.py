"""The plans PostgreSQL keeps for the statements a worker repeats. Each is prepared at its
first run on a pooled connection and keeps that plan (a generic plan) until new
statistics of the jobs table: a plan made while the table was empty must still find its
jobs through the indexes once the table is full, not read it whole at every batch."""

from __future__ import annotations

from collections.abc import Iterator

import psycopg
import pytest

import plunder
from plunder import errors
from plunder.model import Completion, JobSpec
from plunder.store import Store
from plunder.store.postgres.tx import INDEX_PLANNED
from tests.store.helpers import claim, open_session


@pytest.fixture
def single(store_url: str) -> Iterator[Store]:
    """A store of one pooled connection: every statement runs, and is prepared, there."""
    if not store_url.startswith("postgres"):
        pytest.skip("plans are PostgreSQL's")
    opened = plunder.open_store(store_url, pool_size=1)
    try:
        yield opened
    finally:
        opened.close()


def kept_plan(conn: psycopg.Connection[object], marker: str) -> str:
    """The plan the connection keeps for its prepared statement whose text has ``marker``."""
    found = conn.execute(
        "SELECT name, cardinality(parameter_types) FROM pg_prepared_statements"
        " WHERE position(%s in statement) > 0",
        (marker,),
    ).fetchall()
    assert len(found) == 1, f"{marker!r} prepared {len(found)} times"
    ((name, types),) = found
    nulls = ", ".join(["NULL"] * int(types))
    return "\n".join(str(r[0]) for r in conn.execute(f"EXPLAIN EXECUTE {name}({nulls})"))


def test_a_claim_and_an_acknowledgement_planned_on_an_empty_table_use_the_indexes(
    single: Store,
) -> None:
    session = open_session(single)
    assert claim(single, session) == []  # planned while the queue is empty
    single.job_enqueue_many([JobSpec("t", [0])])
    (first,) = claim(single, session)
    assert single.job_complete_many([Completion(first.claim, 0)]).accepted == (first.claim,)
    single.job_enqueue_many([JobSpec("t", [i]) for i in range(2_000)])
    jobs = claim(single, session, limit=50)
    assert len(jobs) == 50
    ack = single.job_complete_many([Completion(j.claim, j.args[0]) for j in jobs])
    assert len(ack.accepted) == 50
    with single.driver.pool().connection() as conn:  # type: ignore[attr-defined]
        assert conn.execute("SHOW enable_seqscan").fetchone() == ("on",)
        assert {"job_claim_many", "job_complete_notify"} <= conn.index_planned
        assert conn.index_planned <= INDEX_PLANNED
        for marker in ("picked AS", "plunder_done"):
            plan = kept_plan(conn, marker)
            assert "Seq Scan on plunder_jobs" not in plan, plan
            assert "plunder_jobs_pkey" in plan, plan  # the jobs it names, by id


def test_a_first_run_that_fails_leaves_the_planner_setting_as_it_was(single: Store) -> None:
    session = open_session(single)
    with single.driver.pool().connection() as conn:  # type: ignore[attr-defined]
        conn.execute("ALTER TABLE plunder_jobs RENAME TO plunder_jobs_away")
    try:
        with pytest.raises(errors.PlunderError):
            claim(single, session)
    finally:
        with single.driver.pool().connection() as conn:  # type: ignore[attr-defined]
            conn.execute("ALTER TABLE plunder_jobs_away RENAME TO plunder_jobs")
    with single.driver.pool().connection() as conn:  # type: ignore[attr-defined]
        assert conn.execute("SHOW enable_seqscan").fetchone() == ("on",)
        assert "job_claim_many" not in conn.index_planned
    assert claim(single, session) == []
    with single.driver.pool().connection() as conn:  # type: ignore[attr-defined]
        assert "job_claim_many" in conn.index_planned
