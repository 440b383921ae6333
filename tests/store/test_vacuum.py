"""A claim reads a queue's pending jobs from the head of their index. On PostgreSQL each job
claimed leaves a dead entry there until a VACUUM, so after a drain every claim walked the
dead entries of all the jobs that ran since the last one; the janitor's job_table_vacuum
removes them once enough piled up (docs/decisions/0027-vacuum-the-claim-index.md). On SQLite
an update takes its index entries out at once: nothing piles up, nothing to vacuum."""

from __future__ import annotations

import time

import pytest

from plunder.model import SUSPECT_LOSSES, Completion, JobSpec, Session
from plunder.store import Store, maintenance
from tests.store.helpers import claim, database_work, open_session

DRAINED = 20_000  # jobs claimed and ended before the claim that is measured
DUE = 5  # the jobs that claim finds
STATS_WAIT = 60.0  # seconds for the server to count the dead rows (about one, normally)


def _claim_work(store: Store, store_url: str, session: Session) -> int:
    """What one claim of DUE jobs of queue "mine", enqueued now, costs the database (see
    database_work: on PostgreSQL the claim is EXPLAINed and rolled back)."""
    store.job_enqueue_ids([JobSpec("t", [i], queue="mine") for i in range(DUE)])

    def run() -> None:
        assert len(claim(store, session, queues=["mine"], limit=DUE)) == DUE

    params = {
        "session_id": session.id, "queues": ["mine"], "tasks": ["t"], "limit": DUE,
        "take_suspect": True, "suspect_losses": SUSPECT_LOSSES,
    }  # fmt: skip
    return database_work(store, store_url, run, "job_claim_many", params)


def _drain(store: Store, session: Session, count: int) -> None:
    """``count`` jobs of queue "mine" enqueued, claimed and completed, the DUE jobs already
    there with them."""
    store.job_enqueue_ids([JobSpec("t", [i], queue="mine") for i in range(count)])
    while jobs := claim(store, session, queues=["mine"], limit=500):
        ack = store.job_complete_many([Completion(j.claim, None) for j in jobs])
        assert len(ack.accepted) == len(jobs)


def test_a_claim_after_a_drain_reads_as_much_as_on_a_fresh_table_once_vacuumed(
    store: Store, store_url: str, backend: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The dead entries a drain leaves at the head of the claim's index cost every later
    claim until job_table_vacuum removes them; after it, a claim reads about as much as it
    did on a fresh table (its indexes one level deeper). Once vacuumed, the next pass has
    nothing to do."""
    monkeypatch.setattr(maintenance, "VACUUM_DEAD", DRAINED)  # two dead rows per job drained
    if backend == "postgres":  # the janitor's VACUUM is measured, not autovacuum's, which
        import psycopg  # could clean the drain's dead head first, at a moment of its own

        with psycopg.connect(store_url, autocommit=True) as conn:
            conn.execute("ALTER TABLE plunder_jobs SET (autovacuum_enabled = false)")
    session = open_session(store, queues=["mine"], expiry=600.0)
    fresh = _claim_work(store, store_url, session)
    _drain(store, session, DRAINED)
    before = _claim_work(store, store_url, session)
    if backend == "sqlite":
        assert store.job_table_vacuum() is False  # nothing piles up
        assert before < 2 * fresh + 20, f"{fresh} on a fresh table, {before} after a drain"
        return
    # the dead head is real: the claim walked it (so the assertion below can fail)
    assert before > fresh + DRAINED // 200, f"{fresh} on a fresh table, {before} after a drain"
    deadline = time.monotonic() + STATS_WAIT
    while not store.job_table_vacuum():  # once the server counted the dead rows
        assert time.monotonic() < deadline, "the dead rows were never counted"
        time.sleep(0.2)
    after = _claim_work(store, store_url, session)
    # what is left is a deeper index, not the dead entries of the drain
    assert after - fresh < (before - fresh) / 4, f"{fresh}, {before} drained, {after} vacuumed"
    assert store.job_table_vacuum() is False  # only once as many are dead again
