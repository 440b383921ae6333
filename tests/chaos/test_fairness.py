"""Fair queues across real worker processes (docs/guide/fairness.md): a worker SIGKILLed
while it runs and claims jobs of a fair queue loses none of them and runs none twice
(the chaos checker's invariants), its jobs are rescued, and the fair queue's groups stay
consistent: every group with pending jobs has its row, and none is left once they end."""

from __future__ import annotations

import dataclasses

from plunder.model import JobSpec
from plunder.states import Status
from tests.chaos.checker import DEFAULT, check
from tests.chaos.harness import System, witness


def of(group: str, **kwargs: object) -> JobSpec:
    return dataclasses.replace(witness(**kwargs), group=group)  # type: ignore[arg-type]


def test_a_worker_killed_on_a_fair_queue_loses_nothing(system: System) -> None:
    store = system.store
    store.fair_declare("q1", {"b": 2})
    victim, _ = system.workers(2, concurrency=4)
    big = system.enqueue([of("a", sleep_ms=150) for _ in range(40)])
    small = system.enqueue([of("b", sleep_ms=150) for _ in range(10)])
    sid = system.session_of(victim).id  # type: ignore[union-attr]
    system.wait(lambda: system.running_on(sid), what="the victim holds fair claims")
    system.kill(victim)
    # while the victim's jobs wait for the rescue, each group with pending jobs has a row
    store.fair_prune_many()
    group_of = {j.id: "a" for j in big} | {j.id: "b" for j in small}
    pending = {group_of[j.id] for j in system.jobs() if j.status is Status.PENDING}
    rows = {g.group for g in store.fair_group_list()}
    assert pending <= rows, f"groups {pending - rows} have pending jobs and no row"
    system.wait_terminal(timeout=120)
    report = check(system.observe(), DEFAULT)
    print(report.summary())
    assert report.ok, report.summary() + "\n" + system.logs()[-4000:]
    lost = [r for j in big + small for r in store.job_runs(j.id) if r.session_id == sid]
    assert lost, "the victim ran nothing"
    # b's ten jobs, enqueued after a's forty, did not wait for a's backlog (the jobs run
    # once; a rescued job starts again when the victim's session expired)
    once = [j for j in big + small if len(store.job_runs(j.id)) == 1]
    started = {j.id: store.job_get(j.id).started_at or j.created_at for j in once}
    b_ids = {j.id for j in small}
    last_b = max((t for i, t in started.items() if i in b_ids), default=None)
    last_a = max((t for i, t in started.items() if i not in b_ids), default=None)
    if last_b is not None and last_a is not None:
        assert last_b < last_a, "tenant b waited behind tenant a's backlog"
    store.fair_prune_many()
    assert store.fair_group_list() == [], "idle groups were not pruned"
