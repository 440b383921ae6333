"""Slot cost through every link a worker may have (the SQL store's own and a real
gateway's), on SQLite and PostgreSQL: the worker's slots travel in its Hello, its free
slots in each claim, and a remote worker claims as a local one does (decision 0019)."""

from __future__ import annotations

from collections.abc import Callable

from plunder.model import JobSpec
from plunder.protocol import Hello, WorkerProtocol
from plunder.store import Store
from tests.gateway.test_affinity_contract import TASKS, claim, link, via

__all__ = ["link", "via"]  # the fixtures, shared


def hello(name: str, slots: int) -> Hello:
    return Hello(name, "h", 7, ("default",), TASKS, expiry=5.0, free_slots=slots, slots=slots)


def test_a_remote_worker_claims_by_cost_and_leaves_what_it_cannot_hold(
    link: Callable[[], WorkerProtocol], store: Store
) -> None:
    one = link()
    small = one.open(hello("small", 4))
    big = one.open(hello("big", 8))
    ids = store.job_enqueue_ids(
        [JobSpec("t.echo", [c], cost=c) for c in (5, 1, 3, 1, 2)]
    )  # fmt: skip
    # 5 is more than the small worker has: skipped; 1 and 3 fill its 4; then 1 + 2 fit 3
    assert [j.id for j in one.exchange(small.id, [], claim(4)).claimed] == ids[1:3]
    assert [j.id for j in one.exchange(small.id, [], claim(1)).claimed] == ids[3:4]
    assert one.exchange(small.id, [], claim(1)).claimed == ()  # 2 does not fit in 1
    (taken,) = one.exchange(big.id, [], claim(6)).claimed
    assert taken.id == ids[0] and taken.cost == 5
