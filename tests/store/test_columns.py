"""The jobs table holds the declared columns (plunder.store.columns), NULL where the
declaration says, on every backend; and a job enqueued with every option set reads back
as the record the enqueue made of it."""

from __future__ import annotations

from plunder.model import JobSpec
from plunder.store import Store, columns
from tests.store.helpers import enqueue, raw_connect

RUN_KEPT = {"run_worker", "run_host", "run_pid", "run_logs"}  # the run kept on a job
EDGES_KEPT = {"has_children", "parents_left"}  # a workflow's, read by its trigger (plunder.graph)

PG_COLUMNS = """
    SELECT column_name, is_nullable = 'YES' FROM information_schema.columns
    WHERE table_schema = current_schema() AND table_name = 'plunder_jobs'"""


def table_columns(url: str) -> dict[str, bool]:
    """The columns of plunder_jobs as the database has them: name -> nullable."""
    conn = raw_connect(url)
    try:
        if url.startswith("sqlite"):
            rows = conn.execute("PRAGMA table_info(plunder_jobs)").fetchall()
            return {name: not (notnull or pk) for _, name, _, notnull, _, pk in rows}
        return dict(conn.execute(PG_COLUMNS).fetchall())
    finally:
        conn.close()


def test_the_jobs_table_has_the_declared_columns(store: Store, store_url: str) -> None:
    found = table_columns(store_url)
    declared = {c.name: c.nullable for c in columns.COLUMNS}
    assert set(found) - set(declared) == RUN_KEPT | EDGES_KEPT | set(columns.UNSHOWN)
    assert {name: found[name] for name in declared} == declared


def test_a_job_with_every_option_set_reads_back_as_enqueued(store: Store) -> None:
    spec = JobSpec(
        "t", [1, "two"], {"k": [3]}, queue="q", priority=-4, delay=7.5, max_attempts=6,
        timeout=3.25, backoff_base=0.5, backoff_cap=9.0, retry_on_timeout=False, key="k1",
        retry_on_lost=False, expires_in=60.0,
    )  # fmt: skip
    assert {o.name for o in columns.OPTIONS} | set(columns.OWN) <= set(spec.__slots__)
    full, bare = enqueue(store, spec, JobSpec("t"))
    assert store.job_get(bare.id) == bare
    assert store.job_get(full.id) == full
    assert (full.queue, full.priority, full.max_attempts, full.timeout) == ("q", -4, 6, 3.25)
    assert (full.retry_on_timeout, full.retry_on_lost, full.key) == (False, False, "k1")
    assert full.expires_at is not None and full.created_at is not None
    assert abs((full.run_at - full.created_at).total_seconds() - 7.5) < 0.001
    assert abs((full.expires_at - full.created_at).total_seconds() - 60) < 0.001
    assert bare.expires_at is None and bare.run_at == bare.created_at
