"""Affinity in the store (docs/guide/affinity.md), on every backend: what the claim reads
of the other sessions' labels and free slots, by the database clock, and what a person
sees of jobs no live worker can run."""

from __future__ import annotations

import pytest

from plunder.model import JobSpec, TaskInfo, Unrunnable
from plunder.store import Store
from tests.store.helpers import claim, later, raw_connect


def session(store: Store, name: str, free: int, labels: tuple[str, ...] = (), now: object = None):  # type: ignore[no-untyped-def]
    return store.session_open(
        name=name, host="h", pid=1, queues=["default"], expiry=30.0,
        tasks=[TaskInfo("t", "default", "thread", {})], free_slots=free, labels=labels,
        now=now,  # type: ignore[arg-type]
    )  # fmt: skip


def test_a_holder_that_stops_reporting_stops_counting_within_two_seconds(store: Store) -> None:
    """A holder that neither beats nor claims (SIGSTOPped) keeps its session for its expiry
    (30 s here), but its free slots count for 2 s only: then its preferred jobs go
    elsewhere, at the first claim after."""
    t0 = store.now()
    holder = session(store, "holder", 4, ("model=m",), now=t0)
    other = session(store, "other", 4, now=t0)
    (job,) = store.job_enqueue_many([JobSpec("t", affinity={"model": "m"})], now=t0)
    assert claim(store, other, now=later(t0, 1.5)) == []
    assert [j.id for j in claim(store, other, now=later(t0, 2.5))] == [job.id]
    # a heartbeat with free slots makes them count again, from its own time
    store.session_heartbeat(holder.id, free_slots=4, now=later(t0, 3))
    store.job_enqueue_many([JobSpec("t", affinity={"model": "m"})], now=later(t0, 3))
    assert claim(store, other, now=later(t0, 4.5)) == []
    assert len(claim(store, other, now=later(t0, 5.5))) == 1


def test_a_required_job_never_goes_elsewhere_whatever_the_holders_do(store: Store) -> None:
    t0 = store.now()
    session(store, "holder", 4, ("model=m",), now=t0)
    other = session(store, "other", 4, ("model=n",), now=t0)
    store.job_enqueue_many([JobSpec("t", require={"model": "m"})], now=t0)
    assert claim(store, other, now=later(t0, 20)) == []


def test_a_job_may_prefer_some_labels_and_require_others(store: Store) -> None:
    t0 = store.now()
    # the only holder of the preferred label lacks the required one: not a holder at all
    session(store, "a", 4, ("model=m",), now=t0)
    gpu = session(store, "b", 4, ("gpu=a100",), now=t0)
    (job,) = store.job_enqueue_many(
        [JobSpec("t", affinity={"model": "m"}, require={"gpu": "a100"})], now=t0
    )
    assert job.affinity == "{model=m}" and job.require == "{gpu=a100}"
    assert [j.id for j in claim(store, gpu, now=t0)] == [job.id]


def test_jobs_requiring_labels_no_live_worker_holds_are_listed(store: Store) -> None:
    t0 = store.now()
    session(store, "holder", 4, ("model=m",), now=t0)
    store.job_enqueue_many(
        [JobSpec("t", require={"model": "m"}), JobSpec("t", require={"model": "x"}),
         JobSpec("t", require={"model": "x"}), JobSpec("t")], now=t0,
    )  # fmt: skip
    assert store.job_unrunnable(now=t0) == [Unrunnable("t", "default", 2, "{model=x}")]


def test_bad_labels_and_affinity_are_refused_with_their_name(store: Store) -> None:
    with pytest.raises(ValueError, match="label's key"):
        session(store, "w", 1, ("mo del=m",))
    with pytest.raises(ValueError, match="affinity must be a dict"):
        store.job_enqueue_many([JobSpec("t", affinity="model=m")])  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="its value"):
        store.job_enqueue_many([JobSpec("t", require={"model": "a,b"})])


def test_a_job_keeps_its_cost(store: Store) -> None:
    (job,) = store.job_enqueue_many([JobSpec("t", cost=4)])
    assert job.cost == 4 and store.job_get(job.id).cost == 4


def test_an_idle_holders_report_is_written_again_only_when_it_changes_or_nears_its_end(
    store: Store, store_url: str
) -> None:
    """On SQLite every commit wakes every worker of the file: a labelled worker whose idle
    claim wrote its unchanged report each time woke the others, whose claims woke it, and
    idle labelled workers spent a sixth of a core each. The same count, counted for over
    half its 2 s still, is not written again."""
    if store.dialect != "sqlite":
        pytest.skip("PostgreSQL wakes workers by NOTIFY, not by any commit")
    t0 = store.now()
    holder = session(store, "holder", 4, ("model=m",), now=t0)
    watcher = raw_connect(store_url)
    try:

        def version() -> int:
            return int(watcher.execute("PRAGMA data_version").fetchone()[0])

        assert claim(store, holder, limit=4, now=later(t0, 0.1)) == []
        seen = version()
        assert claim(store, holder, limit=4, now=later(t0, 0.6)) == []
        assert version() == seen  # the same count, counted until t0 + 2.1: nothing written
        assert claim(store, holder, limit=3, now=later(t0, 0.7)) == []
        assert version() != seen  # another count
        seen = version()
        assert claim(store, holder, limit=3, now=later(t0, 1.8)) == []
        assert version() != seen  # counted for less than a second more: written again
    finally:
        watcher.close()
