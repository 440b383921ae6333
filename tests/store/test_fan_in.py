"""Fan-in under concurrency (every backend): many parents of the same children ending at
once in several sessions' transactions, some failing and retried, some failing for good.
A child is released once, never while a parent has not ended; a child whose edges skip
it ends skipped once and never runs."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

from plunder.graph import Edge
from plunder.model import Completion, ErrorInfo, Failure, JobSpec
from plunder.states import TERMINAL, Status
from plunder.store import Store
from plunder.store.connect import open_store
from tests.store.helpers import claim, open_session

PARENTS = 300
WORKERS = 6


def _work(store_url: str, name: str, finished: threading.Event) -> int:
    """Claim parents in batches and end them: a third fail once (retried), one in seven
    fails for good; the rest succeed. How many attempts it ended."""
    store = open_store(store_url)
    ended = 0
    try:
        session = open_session(store, name=name, tasks=("parent",))
        while not finished.is_set():
            jobs = claim(store, session, limit=10, tasks=("parent",))
            if not jobs:
                finished.wait(0.01)
                continue
            done, failed = [], []
            for job in jobs:
                index = job.args[0]
                if index % 7 == 0:
                    failed.append(Failure(job.claim, ErrorInfo("E", "for good"), retry_delay=None))
                elif index % 3 == 0 and job.attempt == 1:
                    failed.append(Failure(job.claim, ErrorInfo("E", "once"), retry_delay=0.0))
                else:
                    done.append(Completion(job.claim, index))
            if done:
                assert len(store.job_complete_many(done).accepted) == len(done)
            if failed:
                assert len(store.job_fail_many(failed).accepted) == len(failed)
            ended += len(jobs)
    finally:
        store.close()
    return ended


def test_many_parents_ending_at_once_release_each_child_once_and_never_early(
    store: Store, store_url: str
) -> None:
    specs = [JobSpec("parent", [i], max_attempts=2) for i in range(PARENTS)]
    specs += [JobSpec("child", ["runs"]), JobSpec("child", ["skipped"])]
    runs, skips = PARENTS, PARENTS + 1
    edges = [Edge(i, runs, "run") for i in range(PARENTS)]
    edges += [Edge(i, skips, "skip") for i in range(PARENTS)]
    ids = store.flow_enqueue(specs, edges)
    finished = threading.Event()
    early: list[str] = []

    def watch() -> None:  # each look one snapshot: the children's and parents' states
        while not finished.is_set():
            state = {job.id: job.status for job in store.flow_get(ids[0]).jobs}
            left = [i for i in ids[:PARENTS] if state[i] not in TERMINAL]
            if left and state[ids[runs]] is not Status.WAITING:
                early.append(f"released with {len(left)} parents left")
            if state[ids[skips]] not in (Status.WAITING, Status.SKIPPED):
                early.append(f"the skipped child became {state[ids[skips]]}")

    with ThreadPoolExecutor(WORKERS + 1) as pool:
        watcher = pool.submit(watch)
        workers = [pool.submit(_work, store_url, f"w{n}", finished) for n in range(WORKERS)]
        try:
            ended_all = False
            while not ended_all and not any(w.done() for w in workers):
                finished.wait(0.05)
                jobs = store.flow_get(ids[0]).jobs[:PARENTS]
                ended_all = all(job.status in TERMINAL for job in jobs)
        finally:
            finished.set()
        attempts = sum(w.result(timeout=60) for w in workers)
        watcher.result(timeout=60)
    retried = sum(1 for i in range(PARENTS) if i % 3 == 0 and i % 7)
    assert attempts == PARENTS + retried
    assert early == []
    session = open_session(store, name="last", tasks=("child",))
    (child,) = claim(store, session, tasks=("child",))
    assert child.id == ids[runs] and child.attempt == 1
    assert store.job_get(ids[skips]).status is Status.SKIPPED
    assert claim(store, session, tasks=("child",)) == []
    assert store.job_complete_many([Completion(child.claim, "ran")]).accepted
    assert len(store.job_runs(ids[runs])) == 1
    assert store.job_runs(ids[skips]) == []
