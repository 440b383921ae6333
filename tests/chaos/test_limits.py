"""Concurrency limits across real worker processes (docs/guide/limits.md): the ceiling is
never exceeded, as the runs' start and end times in the database show, neither in a
steady drain nor when a worker holding limited jobs is SIGKILLed; every job runs to its
end once (the chaos checker's invariants), and unlimited jobs beside them drain."""

from __future__ import annotations

import dataclasses
from datetime import datetime

from plunder.model import JobSpec, Limit
from tests.chaos.checker import DEFAULT, Observation, check
from tests.chaos.harness import System, witness


def limited(ceiling: int, **kwargs: object) -> JobSpec:
    return dataclasses.replace(witness(**kwargs), limit=Limit("api", ceiling))  # type: ignore[arg-type]


def most_at_once(obs: Observation) -> int:
    """The most runs of limited jobs that overlapped, from the runs' times: a run holds its
    place from its start to its end (a lost run's end: when the janitor rescued it)."""
    edges: list[tuple[datetime, int]] = []
    for job in obs.jobs.values():
        if job.limit_key is None:
            continue
        for run in obs.runs[job.id]:
            assert run.finished_at is not None, f"job {job.id} attempt {run.attempt} open"
            edges += [(run.started_at, 1), (run.finished_at, -1)]
    edges.sort(key=lambda edge: (edge[0], edge[1]))  # an end before a start at one time
    most = now = 0
    for _, step in edges:
        now += step
        most = max(most, now)
    return most


def assert_ok(system: System) -> Observation:
    obs = system.observe()
    report = check(obs, DEFAULT)
    print(report.summary())
    assert report.ok, report.summary() + "\n" + system.logs()[-4000:]
    return obs


def test_the_ceiling_holds_across_workers(system: System) -> None:
    system.workers(3, concurrency=8)
    jobs = system.enqueue(
        [limited(3, sleep_ms=40) for _ in range(45)] + [witness(sleep_ms=5) for _ in range(45)]
    )
    system.wait_terminal()
    obs = assert_ok(system)
    most = most_at_once(obs)
    print(f"{system.backend}: at most {most} limited runs at once (ceiling 3)")
    assert most <= 3
    assert most >= 2, "the limit was never used beyond one: admission is starving it"
    assert len(jobs) == 90


def test_a_killed_worker_holding_limited_jobs_keeps_the_ceiling(system: System) -> None:
    victim, *_ = system.workers(3, concurrency=4)
    system.enqueue([limited(4, sleep_ms=400) for _ in range(30)])
    sid = system.session_of(victim).id  # type: ignore[union-attr]
    system.wait(lambda: system.running_on(sid), what="the victim holds limited claims")
    system.kill(victim)
    system.wait_terminal(timeout=120)
    obs = assert_ok(system)
    lost = [r for runs in obs.runs.values() for r in runs if r.session_id == sid]
    assert lost, "the victim ran nothing"
    most = most_at_once(obs)
    print(f"{system.backend}: {len(lost)} runs on the killed worker; at most {most} at once")
    assert most <= 4
