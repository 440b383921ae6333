"""Fan-in under concurrency (every backend): many parents of the same children ending at
once in several sessions' transactions, some failing and retried, some failing for good,
and on PostgreSQL half of the sessions acknowledging through turns sent ahead (which settle
the children themselves, decision 0023) beside the others' trigger. A child is released
once, never while a parent has not ended; a child whose edges skip it ends skipped once
and never runs. Turns ending parents of two children in opposite orders never deadlock."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import psycopg
import pytest

from plunder.graph import Edge
from plunder.model import Completion, ErrorInfo, Failure, JobRecord, JobSpec, Session
from plunder.states import TERMINAL, Status
from plunder.store import Store
from plunder.store.base import TurnPipe
from plunder.store.connect import open_store
from tests.store.helpers import claim, open_session, raw_connect

PARENTS = 300
WORKERS = 6


def _outcomes(jobs: list[JobRecord]) -> tuple[list[Completion], list[Failure]]:
    """A third fail once (retried), one in seven fails for good; the rest succeed."""
    done, failed = [], []
    for job in jobs:
        index = job.args[0]
        if index % 7 == 0:
            failed.append(Failure(job.claim, ErrorInfo("E", "for good"), retry_delay=None))
        elif index % 3 == 0 and job.attempt == 1:
            failed.append(Failure(job.claim, ErrorInfo("E", "once"), retry_delay=0.0))
        else:
            done.append(Completion(job.claim, index))
    return done, failed


def _work(store_url: str, name: str, finished: threading.Event, *, piped: bool = False) -> int:
    """Claim parents in batches and end them (see _outcomes); ``piped``: claim and
    acknowledge through turns sent ahead where the store has them. How many attempts it
    ended."""
    store = open_store(store_url)
    pipe = store.turn_pipe() if piped else None
    ended = 0
    try:
        session = open_session(store, name=name, tasks=("parent",))
        done: list[Completion] = []
        while not finished.is_set() or done:
            if pipe is not None:
                jobs = _turn(pipe, session, done)
            else:
                jobs = claim(store, session, limit=10, tasks=("parent",))
                if done:
                    assert len(store.job_complete_many(done).accepted) == len(done)
            done, failed = _outcomes(jobs)
            if failed:
                assert len(store.job_fail_many(failed).accepted) == len(failed)
            if pipe is None and done:
                assert len(store.job_complete_many(done).accepted) == len(done)
                done = []
            ended += len(jobs)
            if not jobs:
                finished.wait(0.01)
    finally:
        if pipe is not None:
            pipe.close()
        store.close()
    return ended


def _turn(pipe: TurnPipe, session: Session, done: list[Completion]) -> list[JobRecord]:
    """One turn through the pipe: ``done`` acknowledged (all of them), up to 10 claimed."""
    assert pipe.send(
        done, session_id=session.id, queues=["default"], tasks=["parent"], limit=10,
        take_suspect=True,
    )  # fmt: skip
    answer = pipe.receive()
    assert len(answer.settle().accepted) == len(done)
    return answer.jobs()


@pytest.mark.parametrize("piped", ["half", "all"])
def test_many_parents_ending_at_once_release_each_child_once_and_never_early(
    store: Store, store_url: str, piped: str
) -> None:
    """``piped``: which sessions acknowledge through turns sent ahead (PostgreSQL), the
    others through job_complete_many; failures always go through job_fail_many."""
    if piped == "all" and store.dialect == "sqlite":
        pytest.skip("SQLite has no turns sent ahead: the other case covers it")
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
        workers = [
            pool.submit(_work, store_url, f"w{n}", finished, piped=piped == "all" or n % 2 == 1)
            for n in range(WORKERS)
        ]
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
    # released by the count reaching zero, not before (which no later parent would undo)
    assert _parents_left(store_url, ids[runs]) == 0
    session = open_session(store, name="last", tasks=("child",))
    (child,) = claim(store, session, tasks=("child",))
    assert child.id == ids[runs] and child.attempt == 1
    assert store.job_get(ids[skips]).status is Status.SKIPPED
    assert claim(store, session, tasks=("child",)) == []
    assert store.job_complete_many([Completion(child.claim, "ran")]).accepted
    assert len(store.job_runs(ids[runs])) == 1
    assert store.job_runs(ids[skips]) == []


def _parents_left(url: str, job_id: int) -> int:
    """A child's count of parents not ended, as its row holds it."""
    conn = raw_connect(url)
    try:
        row = conn.execute(f"SELECT parents_left FROM plunder_jobs WHERE id = {int(job_id)}")
        return int(row.fetchone()[0])
    finally:
        conn.close()


def _waiting_for_locks(url: str, count: int) -> None:
    """Wait until ``count`` sessions of the database wait for a lock (60 s at most)."""
    with psycopg.connect(url, autocommit=True) as conn:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            row = conn.execute(
                "SELECT count(*) FROM pg_stat_activity"
                " WHERE datname = current_database() AND wait_event_type = 'Lock'"
            ).fetchone()
            if row is not None and row[0] >= count:
                return
            time.sleep(0.01)
    raise AssertionError(f"{count} sessions never waited for a lock")


def test_turns_ending_parents_of_two_children_in_opposite_orders_do_not_deadlock(
    store: Store, store_url: str
) -> None:
    """Children X and Y with two parents each; turn A ends X's parent then Y's, turn B
    Y's then X's, each on its own connection. A third transaction holds X's row while A
    and B run, so that both are in flight at once: locking the children in the order of
    the parents ended, A would wait for X while B held Y and waited for X, and, X free,
    A would wait for Y — a deadlock, one turn aborted. In the children's id order, B waits
    for X holding nothing, and both turns commit."""
    if store.dialect == "sqlite":
        pytest.skip("SQLite has one writer at a time")
    specs = [JobSpec("parent", [i]) for i in range(4)] + [JobSpec("child", [x]) for x in "XY"]
    edges = [Edge(0, 4, "run"), Edge(1, 5, "run"), Edge(2, 5, "run"), Edge(3, 4, "run")]
    ids = store.flow_enqueue(specs, edges)
    x, y = ids[4], ids[5]
    stores = [open_store(store_url) for _ in range(2)]
    pipes = [s.turn_pipe() for s in stores]
    try:
        sessions, jobs = [], {}
        for n, s in enumerate(stores):  # the first claims ids[0] and ids[1]
            session = open_session(s, name=f"w{n}", tasks=("parent",))
            claimed = {j.id: j for j in claim(s, session, limit=2, tasks=("parent",))}
            assert len(claimed) == 2
            sessions.append(session)
            jobs.update(claimed)
        # A: X's parent (ids[0]) then Y's (ids[1]); B: Y's (ids[2]) then X's (ids[3])
        done = [[ids[0], ids[1]], [ids[2], ids[3]]]
        assert {j.session_id for j in (jobs[ids[0]], jobs[ids[1]])} == {sessions[0].id}
        with psycopg.connect(store_url) as blocker:
            blocker.execute("SELECT 1 FROM plunder_jobs WHERE id = %s FOR UPDATE", (x,))
            for n, pipe in enumerate(pipes):
                assert pipe is not None
                assert pipe.send(
                    [Completion(jobs[i].claim, i) for i in done[n]], session_id=sessions[n].id,
                    queues=["default"], tasks=["nothing"], limit=1, take_suspect=True,
                )  # fmt: skip
                _waiting_for_locks(store_url, n + 1)
            blocker.rollback()
        for pipe in pipes:
            assert pipe is not None
            assert len(pipe.receive().settle().accepted) == 2
        assert store.job_get(x).status is Status.PENDING
        assert store.job_get(y).status is Status.PENDING
    finally:
        for pipe in pipes:
            if pipe is not None:
                pipe.close()
        for s in stores:
            s.close()
