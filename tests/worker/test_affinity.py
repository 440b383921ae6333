"""Affinity with real worker processes (docs/guide/affinity.md): labels from the command
line and from a task at run time, and a label holder stopped with SIGSTOP, whose
preferred jobs go to another worker within the free-slot window and are run once each."""

from __future__ import annotations

import signal
import subprocess
import time
from collections.abc import Callable
from typing import Any

import pytest

from plunder.model import JobSpec
from plunder.states import Status
from plunder.store import Store
from tests.worker.conftest import Workers, session_of, wait_for

FREE_WINDOW = 2.0  # a free-slot report counts this long (migration 22)


def _done(store: Store, ids: list[int]) -> bool:
    return all(store.job_get(i).status is Status.SUCCEEDED for i in ids)


def _ran_on(store: Store, ids: list[int]) -> set[int]:
    return {store.job_get(i).result for i in ids}


def _labels(store: Store, pid: int) -> tuple[str, ...]:
    return next((s.labels for s in store.session_list() if s.pid == pid), ())


def test_labels_a_task_sets_at_run_time_draw_the_jobs_that_require_them(
    store: Store, workers: Workers
) -> None:
    one = workers.start("-c", "2", "--label", "name=one")
    two = workers.start("-c", "2", "--label", "name=two")
    for proc in (one, two):
        wait_for(lambda p=proc: session_of(store, p.pid), what="the sessions")  # type: ignore[misc]
    assert _labels(store, one.pid) == ("name=one",)
    waiting = [j.id for j in store.job_enqueue_many(
        [JobSpec("whoami", require={"model": "m1"}) for _ in range(4)]
    )]  # fmt: skip
    time.sleep(0.5)  # nobody holds model=m1 yet: they wait, and status says so
    assert all(store.job_get(i).status is Status.PENDING for i in waiting)
    assert [u.pending for u in store.job_unrunnable() if u.require == "{model=m1}"] == [4]
    (load,) = store.job_enqueue_many([JobSpec("load_model", ["m1"], require={"name": "two"})])
    wait_for(lambda: _done(store, [load.id, *waiting]), what="the jobs requiring model=m1")
    assert _ran_on(store, [load.id, *waiting]) == {two.pid}
    assert _labels(store, two.pid) == ("model=m1", "name=two")
    (unload,) = store.job_enqueue_many([JobSpec("unload_model", require={"name": "two"})])
    wait_for(lambda: _done(store, [unload.id]), what="the unload")
    wait_for(lambda: _labels(store, two.pid) == ("name=two",), what="the label removed")


def test_a_stopped_holders_preferred_jobs_go_elsewhere_and_run_once(
    store: Store, workers: Workers, backend: str
) -> None:
    if backend == "sqlite":  # a process stopped inside a transaction holds the one lock
        pytest.skip("SQLite: a stopped worker may hold the database's single write lock")
    _preferred_jobs_of_a_stopped_holder_go_elsewhere(
        store, workers, lambda holder: holder.send_signal(signal.SIGSTOP)
    )


def test_a_holder_stopped_in_its_janitors_pass_does_not_hold_up_the_others(
    store: Store, workers: Workers, backend: str, store_url: str
) -> None:
    """The holder holds the janitor's lease and is stopped inside a pass, whose transaction
    keeps the lease row locked until the server ends it (the lease's ttl, 10 s here). The
    other worker, trying for the lease meanwhile, must not wait on that lock with one of
    its pooled connections: its claims need them, and the preferred jobs would wait the
    whole ttl instead of the free-slot window."""
    if backend == "sqlite":
        pytest.skip("SQLite: a stopped worker may hold the database's single write lock")
    _preferred_jobs_of_a_stopped_holder_go_elsewhere(
        store, workers, lambda holder: _stop_in_janitor_pass(holder, store_url, "holder")
    )


def _stop_in_janitor_pass(proc: subprocess.Popen[bytes], url: str, name: str) -> None:
    """SIGSTOP ``proc`` (worker ``name``) while its janitor is inside a pass, past the
    lease check: its transaction (seen in pg_stat_activity) holds the lease row locked,
    and still does a moment after the stop, so it stays so."""
    import psycopg

    in_pass = (
        "SELECT count(*) FROM pg_stat_activity WHERE xact_start IS NOT NULL"
        f" AND application_name = 'plunder:worker:{name}:janitor'"
    )
    unlocked = (
        "SELECT count(*) FROM (SELECT FROM plunder_leases WHERE name = 'plunder.janitor'"
        " FOR UPDATE SKIP LOCKED) AS free"
    )

    def count(conn: psycopg.Connection[Any], query: str) -> int:
        row = conn.execute(query).fetchone()
        return 0 if row is None else int(row[0])

    def holds(conn: psycopg.Connection[Any]) -> bool:
        return count(conn, in_pass) > 0 and count(conn, unlocked) == 0

    with psycopg.connect(url, autocommit=True) as conn:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if count(conn, in_pass):
                proc.send_signal(signal.SIGSTOP)
                if holds(conn):
                    time.sleep(0.05)  # a COMMIT already sent would have ended it by now
                    if holds(conn):
                        return
                proc.send_signal(signal.SIGCONT)
    raise AssertionError("the holder was never stopped inside its janitor's pass")


def _preferred_jobs_of_a_stopped_holder_go_elsewhere(
    store: Store, workers: Workers, stop: Callable[[subprocess.Popen[bytes]], None]
) -> None:
    # sessions live 10 s: a stopped holder keeps its session, only its free slots age
    holder = workers.start("-c", "2", "--label", "model=m", "--session-expiry", "10", name="holder")
    wait_for(lambda: session_of(store, holder.pid), what="the holder's session")
    # the holder (started first) holds the janitor's lease
    wait_for(lambda: _lease_holder(store).startswith("holder:"), what="the holder's lease")
    other = workers.start("-c", "2", "--session-expiry", "10", name="other")
    wait_for(lambda: session_of(store, other.pid), what="the other's session")
    first = [j.id for j in store.job_enqueue_many([JobSpec("whoami", affinity={"model": "m"})])]
    wait_for(lambda: _done(store, first), what="the first preferred job")
    assert _ran_on(store, first) == {holder.pid}

    stop(holder)
    stopped = time.monotonic()
    try:
        specs = [JobSpec("whoami", affinity={"model": "m"}) for _ in range(6)]
        during = [j.id for j in store.job_enqueue_many(specs)]
        wait_for(lambda: _done(store, during), timeout=30, what="the jobs while stopped")
        took = time.monotonic() - stopped
        assert _ran_on(store, during) == {other.pid}
        # the free-slot window, then a claim at the other worker's next poll (0.1 s); a
        # loaded machine gets generous slack
        assert took < FREE_WINDOW + 4.0, f"the preferred jobs waited {took:.2f}s"
        print(f"preferred jobs of a stopped holder ran elsewhere after {took:.2f}s")
    finally:
        holder.send_signal(signal.SIGCONT)

    # settled: the holder beats again and has its jobs; nothing ran twice
    wait_for(lambda: session_of(store, holder.pid), what="the holder's session")
    time.sleep(0.5)  # a heartbeat or two: its free slots count again
    after = [j.id for j in store.job_enqueue_many([JobSpec("whoami", affinity={"model": "m"})])]
    wait_for(lambda: _done(store, after), what="the jobs after SIGCONT")
    assert _ran_on(store, after) == {holder.pid}
    for job_id in [*first, *during, *after]:
        job = store.job_get(job_id)
        assert job.attempt == 1 and store.job_runs(job_id)[0].outcome is not None, job
        assert len(store.job_runs(job_id)) == 1


def _lease_holder(store: Store) -> str:
    lease = store.lease_get("plunder.janitor")
    return "" if lease is None else lease.holder
