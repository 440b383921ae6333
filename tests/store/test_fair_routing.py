"""Fair queues honour what a plain claim does (docs/decisions/0019), on every backend:
within a group, higher priority first; labels preferred and required, and slot cost,
exactly as in the plain claim."""

from __future__ import annotations

from plunder.model import JobSpec, Session, TaskInfo
from plunder.store import Store
from tests.store.helpers import claim, enqueue, later


def worker(
    store: Store, name: str, *, labels: tuple[str, ...] = (), slots: int | None = None
) -> Session:
    return store.session_open(
        name=name, host="h", pid=1, queues=["q"], expiry=30.0,
        tasks=[TaskInfo("t", "q", "thread", {})], free_slots=4, labels=labels, slots=slots,
    )  # fmt: skip


def job(group: str, tag: str, **options: object) -> JobSpec:
    return JobSpec("t", [tag], queue="q", group=group, **options)  # type: ignore[arg-type]


def tags(store: Store, session: Session, limit: int) -> list[str]:
    return [str(j.args[0]) for j in claim(store, session, limit=limit, queues=("q",))]


def test_within_a_group_higher_priority_comes_first(store: Store) -> None:
    store.fair_declare("q")
    enqueue(store, job("a", "a-low"), job("a", "a-high", priority=5), job("a", "a-mid", priority=2))
    enqueue(store, job("b", "b-low"), job("b", "b-high", priority=9))
    session = worker(store, "w")
    first = tags(store, session, 2)
    assert sorted(first) == ["a-high", "b-high"]  # one of each group, its best
    assert sorted(tags(store, session, 2)) == ["a-mid", "b-low"]
    assert tags(store, session, 2) == ["a-low"]


def test_a_group_walked_twice_in_one_claim_goes_on_in_claim_order(store: Store) -> None:
    """Rounds: what a group that ran out left is shared again, walking on from the last
    job read, by priority first."""
    store.fair_declare("q")
    enqueue(store, *(job("a", f"a{p}", priority=p) for p in (1, 4, 3, 2, 5)))
    enqueue(store, job("b", "b0"))
    session = worker(store, "w")
    # shares of 2 each; b ran out, so a's next in claim order takes what it left
    assert sorted(tags(store, session, 4)) == ["a3", "a4", "a5", "b0"]
    assert sorted(tags(store, session, 4)) == ["a1", "a2"]


def test_required_and_preferred_labels_hold_in_a_fair_queue(store: Store) -> None:
    store.fair_declare("q")
    holder = worker(store, "holder", labels=("model=m",))
    other = worker(store, "other")
    enqueue(store, job("a", "needs-m", require={"model": "m"}), job("a", "likes-m",
            affinity={"model": "m"}), job("b", "plain"))  # fmt: skip
    # the holder is free: the preferred job is left to it, the required one too
    assert tags(store, other, 4) == ["plain"]
    assert sorted(tags(store, holder, 4)) == ["likes-m", "needs-m"]


def test_slot_cost_holds_in_a_fair_queue(store: Store) -> None:
    store.fair_declare("q")
    small = worker(store, "small", slots=4)
    big = worker(store, "big", slots=8)
    enqueue(store, job("a", "a5", cost=5), job("a", "a1", cost=1))
    enqueue(store, job("b", "b3", cost=3), job("b", "b1", cost=1))
    # too costly for the small worker: skipped; b's 3 then a's 1 fit its 4 slots
    assert sorted(tags(store, small, 4)) == ["a1", "b3"]
    # a's turn comes first, and its 5 does not fit in 4: the claim ends there, b's 1 waits
    assert tags(store, big, 4) == []
    assert tags(store, big, 5) == ["a5"]
    assert tags(store, big, 4) == ["b1"]


def test_a_groups_turn_shares_slots_not_jobs(store: Store) -> None:
    """Two groups always backlogged, one's jobs costing 2 slots each, the other's 1: each
    gets half of the slots, not half of the jobs (which would give the costly one 2/3)."""
    store.fair_declare("q")
    enqueue(store, *(job("big", "big", cost=2) for _ in range(20)))
    enqueue(store, *(job("small", "small") for _ in range(40)))
    session = worker(store, "w", slots=8)
    slots = {"big": 0, "small": 0}
    for _ in range(6):
        for found in claim(store, session, limit=4, queues=("q",)):
            slots[str(found.args[0])] += found.cost
    assert slots == {"big": 12, "small": 12}


def test_a_job_costing_more_than_its_groups_share_still_runs(store: Store) -> None:
    """A group's first job of its turn may go past its share of the claim (its virtual
    time then moves on by all it took), or a job costing more than any share never runs."""
    store.fair_declare("q")
    enqueue(store, job("big", "big", cost=3), job("big", "big", cost=3))
    enqueue(store, *(job("small", "small") for _ in range(6)))
    session = worker(store, "w", slots=8)
    # shares of 2 each: big's first job (3) goes past its share, small takes 1 of its 2
    assert sorted(tags(store, session, 4)) == ["big", "small"]
    # big is 3 slots along, small 1: small's turn, all of it
    assert tags(store, session, 2) == ["small", "small"]
    assert sorted(tags(store, session, 4)) == ["big", "small"]


def test_jobs_taken_in_a_groups_turn_count_in_a_labelled_workers_free_slots(
    store: Store,
) -> None:
    """A labelled worker's free slots, as the others' claims read them, are less all its
    claim took in a fair queue's groups' turn: a job preferring its labels then goes
    elsewhere at once, instead of being left to it for the free-slot window."""
    store.fair_declare("q")
    holder = worker(store, "holder", labels=("model=m",), slots=4)
    other = worker(store, "other")
    enqueue(store, job("a", "a", cost=2), job("b", "b", cost=2))
    (likes,) = enqueue(store, job("c", "likes-m", affinity={"model": "m"}, delay=1.0))
    t0 = store.now()
    store.session_heartbeat(holder.id, free_slots=4, now=t0)  # counted until t0 + 2 s
    # the groups' turn fills the holder's 4 slots
    taken = claim(store, holder, limit=4, queues=("q",), now=t0)
    assert sorted(str(j.args[0]) for j in taken) == ["a", "b"]
    (found,) = [s for s in store.session_list() if s.id == holder.id]
    assert found.free_slots == 0
    # due now, its holder full: elsewhere at once
    got = claim(store, other, limit=4, queues=("q",), now=later(t0, 1.5))
    assert [j.id for j in got] == [likes.id]
