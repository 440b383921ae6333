"""Slot cost in the store (docs/decisions/0019), on every backend: a claim takes jobs in
claim order while their costs fit the slots it offers and stops at the first that does
not; it skips a job costing more than its session's slots in all, which a bigger worker
takes; such a job, with no live worker big enough, is listed as unrunnable."""

from __future__ import annotations

from datetime import datetime

import pytest

from plunder.model import Completion, JobSpec, Session, TaskInfo, Unrunnable
from plunder.store import Store
from tests.store.helpers import claim, enqueue


def session(
    store: Store,
    name: str,
    slots: int | None,
    *,
    labels: tuple[str, ...] = (),
    now: datetime | None = None,
) -> Session:
    return store.session_open(
        name=name, host="h", pid=1, queues=["default"], expiry=30.0,
        tasks=[TaskInfo("t", "default", "thread", {})], free_slots=slots or 4, labels=labels,
        slots=slots, now=now,
    )  # fmt: skip


def costs(store: Store, *values: int, priority: int = 0) -> list[int]:
    jobs = enqueue(store, *(JobSpec("t", cost=c, priority=priority) for c in values))
    return [j.id for j in jobs]


def test_a_claim_takes_jobs_while_their_costs_fit_its_slots(store: Store) -> None:
    worker = session(store, "w", 8)
    ids = costs(store, 2, 1, 3, 1, 1)
    taken = claim(store, worker, limit=6)
    assert [j.id for j in taken] == ids[:3]  # 2 + 1 + 3 = 6
    assert [j.cost for j in taken] == [2, 1, 3]
    assert [j.id for j in claim(store, worker, limit=6)] == ids[3:]


def test_a_job_that_does_not_fit_ends_the_claim_cheaper_ones_behind_it_wait(
    store: Store,
) -> None:
    """The costly job at the head is not overtaken by the cheap ones behind it: the claim
    stops there, and one that offers enough slots takes it first."""
    worker = session(store, "w", 4)
    ids = costs(store, 1, 3, 1, 1)
    assert [j.id for j in claim(store, worker, limit=3)] == ids[:1]  # 3 does not fit in 2
    assert claim(store, worker, limit=2) == []  # nor in 2: nothing behind it either
    assert [j.id for j in claim(store, worker, limit=3)] == [ids[1]]
    assert [j.id for j in claim(store, worker, limit=3)] == ids[2:]


def test_claim_order_is_priority_first_whatever_the_cost(store: Store) -> None:
    worker = session(store, "w", 4)
    (low,) = costs(store, 1)
    (high,) = costs(store, 4, priority=5)
    assert [j.id for j in claim(store, worker, limit=3)] == []  # the head costs 4
    assert [j.id for j in claim(store, worker, limit=4)] == [high]
    assert [j.id for j in claim(store, worker, limit=4)] == [low]


def test_a_job_costing_more_than_a_worker_has_is_left_to_a_bigger_one(store: Store) -> None:
    small = session(store, "small", 4)
    big = session(store, "big", 8)
    ids = costs(store, 5, 1, 1)
    # skipped, not stopped at: the small worker takes what is behind it
    assert [j.id for j in claim(store, small, limit=4)] == ids[1:]
    assert [j.id for j in claim(store, big, limit=8)] == [ids[0]]


def test_a_session_that_does_not_say_its_slots_takes_any_cost(store: Store) -> None:
    anyone = session(store, "w", None)
    (job,) = costs(store, 700)
    assert claim(store, anyone, limit=699) == []
    assert [j.id for j in claim(store, anyone, limit=700)] == [job]


def test_a_turn_claims_by_cost_too(store: Store) -> None:
    """The worker's turn (acknowledge and claim in one commit: PostgreSQL's one statement)
    counts costs as the claim alone does."""
    worker = session(store, "w", 4)
    (first,) = costs(store, 1)
    (running,) = claim(store, worker, limit=1)
    assert running.id == first
    ids = costs(store, 2, 2, 1)
    turn = store.job_exchange_many(
        [Completion(running.claim, "ok")], [], session_id=worker.id, queues=["default"],
        tasks=["t"], limit=3,
    )  # fmt: skip
    assert turn.completed.accepted == (running.claim,)
    assert [j.id for j in turn.claimed] == ids[:1]  # 2, then 2 more do not fit in 1


def test_a_labelled_session_reports_its_free_slots_less_the_costs_it_took(
    store: Store,
) -> None:
    worker = session(store, "w", 8, labels=("gpu=a100",))
    costs(store, 3, 2)
    assert len(claim(store, worker, limit=8)) == 2
    (found,) = [s for s in store.session_list() if s.id == worker.id]
    assert found.free_slots == 3


def test_jobs_costing_more_than_every_live_worker_has_are_listed(store: Store) -> None:
    t0 = store.now()
    session(store, "small", 4, now=t0)
    costs(store, 5, 5, 4, 1)
    assert store.job_unrunnable(now=t0) == [Unrunnable("t", "default", 2, None, 5)]
    session(store, "big", 8, now=t0)
    assert store.job_unrunnable(now=t0) == []


@pytest.mark.parametrize("bad", [0, 1001, 2.5, True])
def test_a_cost_out_of_range_is_refused_with_its_name(store: Store, bad: object) -> None:
    with pytest.raises(ValueError, match="cost must be an integer from 1 to 1000"):
        enqueue(store, JobSpec("t", cost=bad))  # type: ignore[arg-type]


def test_a_worker_slots_out_of_range_are_refused(store: Store) -> None:
    with pytest.raises(ValueError, match="slots must be a positive integer"):
        session(store, "w", 0)


def test_a_preferred_job_is_left_only_to_a_holder_with_its_cost_free(store: Store) -> None:
    t0 = store.now()
    session(store, "holder", 4, labels=("model=m",), now=t0)
    store.session_heartbeat(
        next(s.id for s in store.session_list() if s.name == "holder"), free_slots=1, now=t0
    )
    other = session(store, "other", 4, now=t0)
    cheap, costly = enqueue(
        store, JobSpec("t", affinity={"model": "m"}), JobSpec("t", affinity={"model": "m"},
        cost=2), now=t0,
    )  # fmt: skip
    # the holder has 1 slot free: the job of 1 is left to it, the job of 2 is not
    assert [j.id for j in claim(store, other, limit=4, now=t0)] == [costly.id]
    assert store.job_get(cheap.id).status.value == "pending"
