"""Fair queues (plunder.store.fairness): a claim takes the groups of a fair queue in turn,
weighted, reading each group's jobs alone; a late group is served within a round; the
janitor's pass prunes the rows of idle groups and makes those that are missing."""

from __future__ import annotations

import collections

import pytest

import plunder
from plunder import errors
from plunder.model import JobRecord, JobSpec
from plunder.store import Store
from tests.store.helpers import claim, enqueue, open_session


def burst(store: Store, group: str, n: int, queue: str = "q") -> None:
    enqueue(store, *[JobSpec("t", [group, i], queue=queue, group=group) for i in range(n)])


def groups(jobs: list[JobRecord]) -> list[str]:
    return [str(j.args[0]) for j in jobs]


def test_claims_take_the_groups_in_turn(store: Store) -> None:
    store.fair_declare("q")
    burst(store, "a", 50)
    burst(store, "b", 3)
    burst(store, "c", 3)
    session = open_session(store, queues=("q",))
    order: list[str] = []
    for _ in range(9):
        order += groups(claim(store, session, limit=1, queues=("q",)))
    # each round serves every group with jobs once; a, b, c joined at the same virtual time
    assert sorted(order[:3]) == ["a", "b", "c"]
    assert sorted(order[3:6]) == ["a", "b", "c"]
    assert sorted(order[6:9]) == ["a", "b", "c"]
    assert groups(claim(store, session, limit=10, queues=("q",))) == ["a"] * 10
    # within a group, oldest first
    assert [j.args[1] for j in claim(store, session, limit=3, queues=("q",))] == [13, 14, 15]


def test_a_batch_claim_is_split_across_the_groups(store: Store) -> None:
    store.fair_declare("q")
    burst(store, "a", 100)
    burst(store, "b", 100)
    burst(store, "c", 4)
    session = open_session(store, queues=("q",))
    counts = collections.Counter(groups(claim(store, session, limit=12, queues=("q",))))
    assert counts == {"a": 4, "b": 4, "c": 4}
    # c has no more: the next batch is shared by a and b alone
    counts = collections.Counter(groups(claim(store, session, limit=12, queues=("q",))))
    assert counts == {"a": 6, "b": 6}


def test_weights_share_claims_in_proportion(store: Store) -> None:
    store.fair_declare("q", {"a": 3})
    burst(store, "a", 200)
    burst(store, "b", 200)
    session = open_session(store, queues=("q",))
    counts: collections.Counter[str] = collections.Counter()
    for _ in range(10):
        counts.update(groups(claim(store, session, limit=4, queues=("q",))))
    assert counts == {"a": 30, "b": 10}
    with pytest.raises(ValueError, match="weight"):
        store.fair_declare("q", {"a": 0})
    with pytest.raises(errors.InvalidName):
        store.fair_declare("q", {"bad group": 1})


def test_a_late_group_is_served_within_one_round(store: Store) -> None:
    store.fair_declare("q")
    burst(store, "a", 500)
    burst(store, "b", 500)
    session = open_session(store, queues=("q",))
    for _ in range(20):  # a and b's virtual times move on
        claim(store, session, limit=5, queues=("q",))
    burst(store, "late", 2)
    # the late group starts at the lowest virtual time: in the next claim, not after a's
    # and b's backlog (450 jobs ahead of it in age)
    assert "late" in groups(claim(store, session, limit=3, queues=("q",)))


def test_idle_groups_are_pruned_and_missing_ones_made(store: Store) -> None:
    store.fair_declare("q")
    burst(store, "a", 2)
    burst(store, "b", 1)
    assert {g.group for g in store.fair_group_list()} == {"a", "b"}
    session = open_session(store, queues=("q",))
    claim(store, session, limit=3, queues=("q",))
    assert store.fair_prune_many() == (2, 0)  # no pending job: both go
    assert store.fair_group_list() == []
    # a job back to pending without a row (here: a row deleted behind the store's back,
    # as a retry after the prune leaves it) gets one again in the janitor's pass
    burst(store, "c", 1)
    store.fair_prune_many()
    assert [g.group for g in store.fair_group_list()] == ["c"]


def test_jobs_no_group_row_shows_are_still_claimed(store: Store) -> None:
    # jobs enqueued before the queue was declared fair join the group "default"; and a
    # claim that the groups' turn does not fill takes the rest in plain order
    burst(store, "a", 2)
    enqueue(store, JobSpec("t", ["none", 0], queue="q"))
    store.fair_declare("q")
    session = open_session(store, queues=("q",))
    assert sorted(groups(claim(store, session, limit=10, queues=("q",)))) == ["a", "a", "none"]
    assert store.fair_queues() == {"q": {}}


def test_a_fair_queue_beside_plain_ones_starves_neither(store: Store) -> None:
    store.fair_declare("q")
    burst(store, "a", 40)
    enqueue(store, *[JobSpec("t", ["plain", i], queue="p") for i in range(40)])
    session = open_session(store, queues=("q", "p"))
    counts: collections.Counter[str] = collections.Counter()
    for _ in range(8):
        counts.update(groups(claim(store, session, limit=2, queues=("q", "p"))))
    assert counts["a"] >= 4 and counts["plain"] >= 4
    # a plain queue's claims are as before: no group is read
    only_plain = open_session(store, queues=("p",), name="w2")
    assert groups(claim(store, only_plain, limit=2, queues=("p",))) == ["plain", "plain"]


def test_groups_are_checked(store: Store) -> None:
    with pytest.raises(errors.InvalidName, match="group"):
        enqueue(store, JobSpec("t", queue="q", group="no spaces"))


def test_a_partitioned_queue_cannot_be_fair(store: Store) -> None:
    store.partition_declare("parts", 4)
    with pytest.raises(errors.ConfigError, match="partitioned"):
        store.fair_declare("parts")


def test_a_task_declares_its_fair_queue_and_keeps_declared_weights(store_url: str) -> None:
    app = plunder.App(store_url)
    try:

        @app.task(queue="prompts", fair=True, name="generate")
        def generate(prompt: str) -> None: ...

        assert app.store.fair_queues(fresh=0) == {}  # not before it is needed
        app.fair("prompts", weights={"acme": 3})
        generate.options(group="acme").enqueue("x")
        generate.enqueue("y")  # no group: "default"
        assert app.store.fair_queues(fresh=0) == {"prompts": {"acme": 3.0}}
        groups = {(g.group, g.weight) for g in app.store.fair_group_list()}
        assert groups == {("acme", 3.0), ("default", 1.0)}
    finally:
        app.close()
