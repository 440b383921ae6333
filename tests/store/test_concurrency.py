"""Many real OS processes claim and complete the same jobs at once: every job is claimed
by exactly one of them, once, and every completion that is reported accepted is unique."""

from __future__ import annotations

import multiprocessing
import os
import queue
import traceback
from collections import Counter
from typing import Any

import pytest

import plunder
from plunder.model import Completion, JobSpec
from plunder.states import Status
from plunder.store import Store

PROCESSES = 8
JOBS = 1000
DEADLINE = 60.0  # seconds for every child to report; the suite's timeout is the real cap


def claimer(url: str, index: int, limit: int, start: Any, holding: Any, results: Any) -> None:
    """A child process: its own store and session; claim → complete until a claim returns
    nothing; report the (job_id, attempt) pairs whose completion was accepted."""
    try:
        store = plunder.open_store(url)
        session = store.session_open(
            name=f"claimer-{index}", host="test", pid=os.getpid(), queues=["default"], expiry=60
        )

        def claim() -> list[plunder.JobRecord]:
            return store.job_claim_many(session.id, queues=["default"], tasks=["t"], limit=limit)

        start.wait(timeout=DEADLINE)  # every claimer is ready: they all begin together
        jobs = claim()
        holding.wait(timeout=DEADLINE)  # every claimer holds a claim: they surely overlap
        done: list[tuple[int, int]] = []
        stale = 0
        while jobs:
            ack = store.job_complete_many([Completion(j.claim, j.args[0]) for j in jobs])
            done += [(c.job_id, c.attempt) for c in ack.accepted]
            stale += len(ack.stale) + len(ack.effect_errors)
            jobs = claim()
        store.session_close(session.id)
        store.close()
        results.put((index, "ok", done, stale))
    except BaseException:
        results.put((index, "error", traceback.format_exc(), 0))


def run_claimers(url: str, limits: list[int]) -> dict[int, list[tuple[int, int]]]:
    ctx = multiprocessing.get_context("spawn")
    start = ctx.Barrier(len(limits) + 1)
    holding = ctx.Barrier(len(limits))
    results = ctx.Queue()
    children = [
        ctx.Process(target=claimer, args=(url, i, limit, start, holding, results), daemon=True)
        for i, limit in enumerate(limits)
    ]
    for child in children:
        child.start()
    reports: dict[int, list[tuple[int, int]]] = {}
    try:
        start.wait(timeout=DEADLINE)
        for _ in children:
            try:
                index, status, value, stale = results.get(timeout=DEADLINE)
            except queue.Empty:
                pytest.fail(f"only {len(reports)} of {len(children)} claimers reported")
            assert status == "ok", f"claimer {index} failed:\n{value}"
            assert stale == 0, f"claimer {index} had {stale} completions refused"
            reports[index] = [tuple(pair) for pair in value]
    finally:
        for child in children:
            child.join(timeout=10)
            if child.is_alive():
                child.kill()
                child.join()
    assert all(child.exitcode == 0 for child in children)
    assert all(reports.values()), "a claimer completed nothing"
    return reports


def check_exactly_once(store: Store, jobs: list[plunder.JobRecord], reports: dict) -> None:
    every = [pair for pairs in reports.values() for pair in pairs]
    owners = Counter(pair for pairs in reports.values() for pair in set(pairs))
    assert [pair for pair, n in owners.items() if n > 1] == []  # no pair in two processes
    assert len(every) == len(set(every)) == len(jobs)  # and none twice in one
    assert {job_id for job_id, _ in every} == {j.id for j in jobs}
    for job in jobs:
        record = store.job_get(job.id)
        assert (record.status, record.attempt, record.result) == (
            Status.SUCCEEDED,
            1,
            job.args[0],
        )
        (run,) = store.job_runs(job.id)
        assert (run.attempt, run.outcome) == (1, plunder.Outcome.SUCCEEDED)
    assert store.job_list(status="pending", limit=1).jobs == ()
    assert store.job_list(status="running", limit=1).jobs == ()


def test_eight_processes_complete_each_job_exactly_once(store: Store, store_url: str) -> None:
    jobs = store.job_enqueue_many([JobSpec("t", [i]) for i in range(JOBS)])
    reports = run_claimers(store_url, [10] * PROCESSES)
    check_exactly_once(store, jobs, reports)


def test_single_job_claimers_contend_with_batch_claimers(store: Store, store_url: str) -> None:
    """Half the processes claim one job at a time, so claims collide as often as possible."""
    jobs = store.job_enqueue_many([JobSpec("t", [i]) for i in range(JOBS // 2)])
    reports = run_claimers(store_url, [1, 10] * (PROCESSES // 2))
    check_exactly_once(store, jobs, reports)
