"""Partitioned queues (plunder.store.partitions): jobs routed to their partition's queue,
partitions assigned to the live sessions of the queue by the janitor's pass, fenced by its
lease and by a generation that grows with every change, and heard by each heartbeat."""

from __future__ import annotations

import threading

import pytest

from plunder import errors
from plunder.model import JobSpec, Lease
from plunder.store import Store, open_store
from plunder.store.partitions import assign, partition_of
from tests.store.helpers import claim, enqueue, later, open_session

ALL = [f"q~{p}" for p in range(4)]


def lease(store: Store) -> Lease:
    held = store.lease_acquire("plunder.janitor", "test", 60)
    assert held is not None
    return held


def owned(store: Store, session_id: str) -> tuple[int, ...]:
    found = store.session_heartbeat(session_id).partitions or ()
    return next((p.owned for p in found if p.queue == "q"), ())


def test_jobs_go_to_their_partition_by_key_or_in_turn(store: Store) -> None:
    store.partition_declare("q", 4)
    keyed = enqueue(store, *[JobSpec("t", queue="q", partition_key="tenant-7")] * 3)
    assert {j.queue for j in keyed} == {f"q~{partition_of('tenant-7', 4)}"}
    turns = enqueue(store, *[JobSpec("t", queue="q")] * 8)
    assert sorted(j.queue for j in turns) == sorted(ALL * 2)  # round-robin: each twice
    assert enqueue(store, JobSpec("t", queue="other"))[0].queue == "other"
    assert store.partition_counts() == {"q": 4}


def test_a_partition_queue_is_no_name_a_user_gives(store: Store) -> None:
    store.partition_declare("q", 4)
    with pytest.raises(errors.InvalidName, match="q~1"):
        enqueue(store, JobSpec("t", queue="q~1"))
    with pytest.raises(errors.InvalidName):
        store.partition_declare("q~1", 2)
    with pytest.raises(ValueError, match="partitions"):
        store.partition_declare("q", 0)
    with pytest.raises(errors.PayloadError, match="partition_key"):
        enqueue(store, JobSpec("t", queue="q", partition_key=7))  # type: ignore[arg-type]


def test_the_live_sessions_own_disjoint_partitions_and_each_change_is_a_generation(
    store: Store,
) -> None:
    t0 = store.now()
    store.partition_declare("q", 4)
    a = open_session(store, queues=("q",), name="a", expiry=5, now=t0)
    b = open_session(store, queues=("q", "other"), name="b", expiry=60, now=t0)
    elsewhere = open_session(store, queues=("other",), name="c", now=t0)
    held = lease(store)
    assert store.partition_assign_many(held, now=t0) == ["q"]
    assert store.partition_assign_many(held, now=t0) == []  # nothing changed: no write
    mine, theirs = owned(store, a.id), owned(store, b.id)
    assert sorted(mine + theirs) == [0, 1, 2, 3] and len(mine) == len(theirs) == 2
    assert store.session_heartbeat(elsewhere.id).partitions == ()  # no partitioned queue
    first = (store.session_heartbeat(b.id).partitions or ())[0].generation
    # a expires: the next pass gives every partition to b, a new generation
    assert store.partition_assign_many(held, now=later(t0, 10)) == ["q"]
    found = (store.session_heartbeat(b.id).partitions or ())[0]
    assert found.owned == (0, 1, 2, 3) and found.generation == first + 1
    assert assign("q", 4, [a.id, b.id]) == assign("q", 4, [b.id, a.id])  # deterministic
    (listed,) = store.partition_list()
    assert (listed.queue, listed.partitions, listed.generation) == ("q", 4, first + 1)
    assert listed.owners == (b.id,) * 4


def test_a_stale_lease_assigns_nothing(store: Store) -> None:
    store.partition_declare("q", 2)
    open_session(store, queues=("q",))
    held = lease(store)
    stale = Lease(held.name, "nobody", held.term + 1, held.acquired_at, held.expires_at)
    with pytest.raises(errors.StaleLease):
        store.partition_assign_many(stale)
    assert store.partition_assign_many(held) == ["q"]


def test_claims_of_every_partition_take_each_job_once(store_url: str) -> None:
    """Two sessions on stores of their own, one claiming its own partitions then every
    partition, the other every partition at once, over and over: each job is claimed by
    exactly one of them (the claim's fence, not ownership, keeps a job from running twice)."""
    stores = [open_store(store_url) for _ in range(2)]
    try:
        stores[0].partition_declare("q", 4)
        enqueue(stores[0], *[JobSpec("t", queue="q", partition_key=str(i)) for i in range(200)])
        sessions = [open_session(s, queues=("q",), name=f"w{i}") for i, s in enumerate(stores)]
        taken: list[list[int]] = [[], []]

        def work(i: int, first: list[str]) -> None:
            while True:
                jobs = claim(stores[i], sessions[i], queues=first, limit=7)
                jobs = jobs or claim(stores[i], sessions[i], queues=["q", *ALL], limit=7)
                if not jobs:
                    return
                taken[i] += [j.id for j in jobs]

        start = threading.Barrier(2)

        def work_from(i: int, first: list[str]) -> None:
            start.wait()
            work(i, first)

        threads = [
            threading.Thread(target=work_from, args=(0, ["q~0", "q~1"])),
            threading.Thread(target=work_from, args=(1, ["q", *ALL])),
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert len(taken[0]) + len(taken[1]) == 200
        assert len(set(taken[0]) | set(taken[1])) == 200  # none twice, none left
    finally:
        for s in stores:
            s.close()


def test_reads_treat_a_partition_as_its_queue(store: Store) -> None:
    store.partition_declare("q", 4)
    jobs = enqueue(store, *[JobSpec("t", queue="q")] * 8, JobSpec("t", queue="qq"))
    assert len(store.job_list(queue="q").jobs) == 8  # not qq's
    assert [j.id for j in store.job_list(queue="q~1").jobs] == [
        j.id for j in reversed(jobs) if j.queue == "q~1"
    ]
    stats = {s.queue: s.counts["pending"] for s in store.queue_stats()}
    assert stats == {"q": 8, "qq": 1}
    assert {(u.queue, u.pending) for u in store.job_unrunnable()} == {("q", 8), ("qq", 1)}
    open_session(store, queues=("q",))
    assert {(u.queue, u.pending) for u in store.job_unrunnable()} == {("qq", 1)}
