"""Ordered keys across real worker processes (plunder.store.ordering): a SIGKILLed worker
running a key's job leaves the key stopped until the janitor rescues that job, which then
runs again before the key's later jobs; no two runs of one key ever overlap, as the runs'
start and end times on the database clock show."""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from datetime import datetime
from itertools import pairwise

from plunder.model import JobSpec
from plunder.states import Status
from tests.chaos.checker import DEFAULT, Observation, check
from tests.chaos.harness import System, witness


def keyed(key: str, **kwargs: object) -> JobSpec:
    return dataclasses.replace(witness(**kwargs), partition_key=key)  # type: ignore[arg-type]


def runs_by_key(obs: Observation) -> dict[str, list[tuple[datetime, datetime, int, str]]]:
    """Each key's runs (start, end, job id, session), by start; a lost run ends when the
    janitor rescued it."""
    found: dict[str, list[tuple[datetime, datetime, int, str]]] = defaultdict(list)
    for job in obs.jobs.values():
        assert job.limit_key is not None, f"job {job.id} is not ordered"
        for run in obs.runs[job.id]:
            assert run.finished_at is not None, f"job {job.id} attempt {run.attempt} open"
            found[job.limit_key].append((run.started_at, run.finished_at, job.id, run.session_id))
    for runs in found.values():
        runs.sort()
    return found


def assert_in_order(obs: Observation) -> dict[str, list[tuple[datetime, datetime, int, str]]]:
    found = runs_by_key(obs)
    for key, runs in found.items():
        ids = [r[2] for r in runs]
        assert ids == sorted(ids), f"{key}: started out of enqueue order: {ids}"
        for before, after in pairwise(runs):
            assert before[1] <= after[0], f"{key}: runs of jobs {before[2]}, {after[2]} overlap"
    return found


def test_a_killed_workers_key_keeps_its_order_and_never_overlaps(system: System) -> None:
    system.store.partition_declare("q1", 4, ordered=True)
    victim, *_ = system.workers(3, concurrency=4, queues="q1")
    keys = [f"k{i}" for i in range(4)]
    # the fourth job of each key fails once: its retry, too, runs before the key's fifth
    system.enqueue([keyed(k, sleep_ms=300, fail_times=int(i == 3)) for i in range(6) for k in keys])
    sid = system.session_of(victim).id  # type: ignore[union-attr]
    system.wait(lambda: system.running_on(sid), what="the victim runs a key's job")
    system.kill(victim)
    system.wait_terminal(timeout=120)
    obs = system.observe()
    report = check(obs, DEFAULT)
    print(report.summary())
    assert report.ok, report.summary() + "\n" + system.logs()[-4000:]
    assert all(j.status == Status.SUCCEEDED for j in obs.jobs.values())
    found = assert_in_order(obs)
    lost = [r for runs in found.values() for r in runs if r[3] == sid]
    assert lost, "the victim ran nothing"
    # the job the victim was running ran again (attempt 2), right after its lost run
    by_id = {j.id: j for j in obs.jobs.values()}
    cut = [r for r in lost if by_id[r[2]].attempt > 1]
    assert cut, "no job of the victim's was rescued and run again"
    for run in cut:
        runs = found[str(by_id[run[2]].limit_key)]
        at = runs.index(run)
        assert runs[at + 1][2] == run[2], "a later job of the key ran before the rescued one"
    print(f"{system.backend}: {len(lost)} runs on the killed worker, {len(cut)} rescued")


def test_keys_run_in_order_and_side_by_side_across_workers(system: System) -> None:
    system.store.partition_declare("q1", 4, ordered=True)
    system.workers(3, concurrency=4, queues="q1")
    keys = [f"k{i}" for i in range(6)]
    specs = [keyed(k, sleep_ms=30, fail_times=1 if i == 2 else 0) for i in range(8) for k in keys]
    system.enqueue(specs)
    system.wait_terminal(timeout=120)
    obs = system.observe()
    report = check(obs, DEFAULT)
    assert report.ok, report.summary() + "\n" + system.logs()[-4000:]
    found = assert_in_order(obs)
    assert sorted(found) == sorted(f"q1~{k}" for k in keys)
    starts = sorted((r[0], r[1]) for runs in found.values() for r in runs)
    most = max(sum(1 for s, e in starts if s <= t < e) for t, _ in starts)
    print(f"{system.backend}: at most {most} keys running at once")
    assert most >= 2, "the keys never ran side by side"
