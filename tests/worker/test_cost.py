"""Slot cost with real worker processes (docs/decisions/0019): a job of cost N holds N of
its worker's slots while it runs, measured from the times the jobs themselves wrote in
their results; a job costing more than a worker has waits, listed, for a bigger one."""

from __future__ import annotations

from plunder.model import JobSpec
from plunder.states import Status
from plunder.store import Store
from tests.worker.conftest import Workers, session_of, wait_for


def _done(store: Store, ids: list[int]) -> bool:
    return all(store.job_get(i).status is Status.SUCCEEDED for i in ids)


def _most_at_once(runs: list[tuple[int, float, float]]) -> int:
    """The most slots taken at once by runs of (cost, start, end): at each start, the
    costs of the runs started and not ended yet."""
    return max(sum(c for c, s, e in runs if s <= start < e) for _, start, _ in runs)


def test_jobs_take_their_cost_in_slots_and_a_big_one_waits_for_a_big_worker(
    store: Store, workers: Workers
) -> None:
    small = workers.start("-c", "4")
    wait_for(lambda: session_of(store, small.pid), what="the -c 4 worker's session")
    (big,) = store.job_enqueue_many([JobSpec("span", [0.1], cost=5)])
    costly = [1, 3, 1, 1, 3, 1, 1, 1, 3, 1, 1, 1, 1, 3, 1, 1]
    specs = [JobSpec("span", [0.3 if c == 3 else 0.1], cost=c) for c in costly]
    ids = [j.id for j in store.job_enqueue_many(specs)]
    wait_for(lambda: _done(store, ids), timeout=60, what="the jobs of cost 1 and 3")

    runs = [(c, *store.job_get(i).result[1:]) for c, i in zip(costly, ids, strict=True)]
    most = _most_at_once(runs)
    assert 3 <= most <= 4, f"{most} slots taken at once by a worker of 4"
    # the job of 5 was never taken by the worker of 4: pending, and listed as such
    assert store.job_get(big.id).status is Status.PENDING
    assert [(u.task, u.cost, u.pending) for u in store.job_unrunnable()] == [("span", 5, 1)]

    large = workers.start("-c", "8")
    wait_for(lambda: _done(store, [big.id]), timeout=30, what="the job of 5 on the -c 8 worker")
    assert store.job_get(big.id).result[0] == large.pid
    assert store.job_unrunnable() == []
