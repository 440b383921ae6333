"""Real worker processes and real signals: SIGKILL, SIGTERM, SIGSTOP/SIGCONT, poison jobs,
janitor takeover."""

from __future__ import annotations

import signal
import sqlite3
import subprocess
import time

from plunder.janitor import LEASE_NAME
from plunder.model import JobSpec
from plunder.states import Outcome, Status
from plunder.store import Store
from tests.store.helpers import raw_connect
from tests.worker.conftest import EXPIRY, JANITOR, Workers, session_of, wait_for

SLACK = 2.0


def _running_on(store: Store, session_id: str) -> list[int]:
    jobs = store.job_list(status="running", limit=1000).jobs
    return [j.id for j in jobs if j.session_id == session_id]


def test_sigkill_jobs_are_rescued_within_expiry_and_janitor_interval(
    store: Store, workers: Workers
) -> None:
    victim = workers.start("-c", "4")
    sid = wait_for(lambda: session_of(store, victim.pid), what="victim session")
    assert isinstance(sid, str)
    # long enough to outlast the rescuer's start (seconds on a loaded machine): a job that
    # finished before the kill has nothing to be rescued from
    jobs = store.job_enqueue_many([JobSpec("sleepy", [6.0], max_attempts=3) for _ in range(4)])
    wait_for(lambda: len(_running_on(store, sid)) == 4, what="victim holds the jobs")
    rescuer = workers.start("-c", "4")
    wait_for(lambda: session_of(store, rescuer.pid), what="rescuer session")
    assert len(_running_on(store, sid)) == 4, "the jobs ended before the rescuer started"
    victim.send_signal(signal.SIGKILL)
    killed = time.time()
    victim.wait()

    def restarted() -> bool:
        return all(len(store.job_runs(j.id)) >= 2 for j in jobs)

    wait_for(restarted, timeout=EXPIRY + JANITOR + 10, what="rescue")
    rescue = max(store.job_runs(j.id)[1].started_at.timestamp() for j in jobs) - killed
    assert rescue < EXPIRY + JANITOR + SLACK, f"rescue took {rescue:.2f}s"
    wait_for(
        lambda: all(store.job_get(j.id).status == Status.SUCCEEDED for j in jobs),
        what="rescued jobs succeed",
    )
    for job in jobs:
        first, second = store.job_runs(job.id)[:2]
        assert first.outcome == Outcome.LOST and second.session_id != sid
    print(f"kill-to-rescue: {rescue:.2f}s")


def test_a_sigkilled_workers_job_that_must_not_run_again_ends_and_is_not_rerun(
    store: Store, workers: Workers
) -> None:
    """retry_on_lost=False: the job its killed worker held ends timed_out with
    plunder.WorkerLost and one run, while the default job beside it is rescued."""
    victim = workers.start("-c", "2")
    sid = wait_for(lambda: session_of(store, victim.pid), what="victim session")
    assert isinstance(sid, str)
    once, again = store.job_enqueue_many(
        [
            JobSpec("sleepy", [30], max_attempts=3, retry_on_lost=False),
            JobSpec("sleepy", [0.5], max_attempts=3),
        ]
    )
    wait_for(lambda: len(_running_on(store, sid)) == 2, what="victim holds the jobs")
    workers.start("-c", "2")  # would run both again
    victim.send_signal(signal.SIGKILL)
    victim.wait()
    wait_for(
        lambda: store.job_get(again.id).status == Status.SUCCEEDED,
        timeout=EXPIRY + JANITOR + 10,
        what="the default job is rescued and succeeds",
    )
    ended = store.job_get(once.id)
    assert ended.status == Status.TIMED_OUT and ended.attempt == 1
    assert ended.error is not None and ended.error["type"] == "plunder.WorkerLost"
    assert sid in ended.error["message"]
    (run,) = store.job_runs(once.id)
    assert run.outcome == Outcome.LOST and run.session_id == sid
    assert [r.outcome for r in store.job_runs(again.id)] == [Outcome.LOST, Outcome.SUCCEEDED]


def test_sigterm_lets_running_jobs_finish_then_closes_the_session(
    store: Store, workers: Workers
) -> None:
    proc = workers.start("-c", "2", "--grace", "10")
    sid = wait_for(lambda: session_of(store, proc.pid), what="session")
    assert isinstance(sid, str)
    (job,) = store.job_enqueue_many([JobSpec("effect", ["graceful", 0.8])])
    _effects_table(workers.url)
    wait_for(lambda: _running_on(store, sid), what="claim")
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=10) == 0
    assert store.job_get(job.id).status == Status.SUCCEEDED
    assert session_of(store, proc.pid) is None  # closed, not left to expire


def test_sigterm_past_the_grace_period_releases_jobs_at_once(
    store: Store, workers: Workers
) -> None:
    proc = workers.start("-c", "2", "--grace", "0.3")
    sid = wait_for(lambda: session_of(store, proc.pid), what="session")
    assert isinstance(sid, str)
    (job,) = store.job_enqueue_many([JobSpec("sleepy", [30], max_attempts=1)])
    wait_for(lambda: _running_on(store, sid), what="claim")
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=10) == 0
    released = store.job_get(job.id)
    assert released.status == Status.PENDING and released.attempts_left == 1
    assert store.job_runs(job.id)[0].outcome == Outcome.RELEASED


def test_sigterm_past_the_grace_period_ends_a_job_that_must_not_run_again(
    store: Store, workers: Workers
) -> None:
    """retry_on_lost=False: the task stopped past the grace period may run on in its thread,
    so its job ends timed_out with plunder.WorkerLost instead of being released to run
    again elsewhere; the default job beside it is released."""
    proc = workers.start("-c", "2", "--grace", "0.3")
    sid = wait_for(lambda: session_of(store, proc.pid), what="session")
    assert isinstance(sid, str)
    once, again = store.job_enqueue_many(
        [
            JobSpec("sleepy", [30], max_attempts=3, retry_on_lost=False),
            JobSpec("sleepy", [30], max_attempts=3),
        ]
    )
    wait_for(lambda: len(_running_on(store, sid)) == 2, what="claims")
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=10) == 0
    ended = store.job_get(once.id)
    assert ended.status == Status.TIMED_OUT and ended.attempt == 1
    assert ended.error is not None and ended.error["type"] == "plunder.WorkerLost"
    (run,) = store.job_runs(once.id)
    assert run.outcome == Outcome.LOST and run.session_id == sid
    released = store.job_get(again.id)
    assert released.status == Status.PENDING and released.attempts_left == 3
    assert [r.outcome for r in store.job_runs(again.id)] == [Outcome.RELEASED]


def _effects_table(url: str) -> None:
    conn = raw_connect(url)
    try:
        conn.execute("CREATE TABLE IF NOT EXISTS effects (token TEXT NOT NULL, pid INTEGER)")
        if not url.startswith("sqlite"):
            conn.commit()
    finally:
        conn.close()


def _effects(url: str) -> list[tuple[str, int]]:
    conn = raw_connect(url)
    try:
        return [tuple(r) for r in conn.execute("SELECT token, pid FROM effects").fetchall()]
    finally:
        conn.close()


def test_a_paused_worker_is_fenced_and_carries_on_under_a_new_session(
    store: Store, workers: Workers
) -> None:
    _effects_table(workers.url)
    paused = workers.start("-c", "4")
    old_sid = wait_for(lambda: session_of(store, paused.pid), what="session")
    assert isinstance(old_sid, str)
    # each task sleeps longer than it takes to see the claims and pause the worker (on a
    # loaded machine, more than half a second)
    jobs = store.job_enqueue_many(
        [JobSpec("effect", [f"tok-{i}", 1.5], max_attempts=3) for i in range(3)]
    )
    wait_for(lambda: len(_running_on(store, old_sid)) == 3, what="claims")
    _pause_outside_a_write(paused, workers.url)
    try:
        assert _effects(workers.url) == [], "the window was missed: a task committed first"
        rescuer = workers.start("-c", "4")
        wait_for(
            lambda: all(store.job_get(j.id).status == Status.SUCCEEDED for j in jobs),
            timeout=EXPIRY + JANITOR + 10,
            what="rescue while paused",
        )
    finally:
        paused.send_signal(signal.SIGCONT)
    new_sid = wait_for(
        lambda: (s := session_of(store, paused.pid)) != old_sid and s,
        what="a new session for the resumed worker",
    )
    assert new_sid != old_sid
    rows = _effects(workers.url)
    assert sorted(token for token, _ in rows) == ["tok-0", "tok-1", "tok-2"]  # exactly once
    assert {pid for _, pid in rows} == {rescuer.pid}
    for job in jobs:  # committed by the task's own transaction, with its acknowledgement
        assert store.job_get(job.id).result == job.args[0]
    # the resumed worker goes on working
    (later,) = store.job_enqueue_many([JobSpec("add", [2, 3])])
    wait_for(lambda: store.job_get(later.id).status == Status.SUCCEEDED, what="new work")
    assert "SESSION LOST" in workers.log(0)  # the window was hit, and said so loudly


def _pause_outside_a_write(proc: subprocess.Popen[bytes], url: str) -> None:
    """SIGSTOP ``proc`` at a moment it holds no SQLite write lock. Paused inside a write
    transaction it would block every other process until it resumes (SQLite has one
    writer; the chaos suite's S25 covers that case): this test is about a zombie whose
    session expires while others go on."""
    for _ in range(50):
        proc.send_signal(signal.SIGSTOP)
        if not url.startswith("sqlite"):
            return
        probe = sqlite3.connect(url[len("sqlite:///") :], timeout=0.2, isolation_level=None)
        try:
            probe.execute("BEGIN IMMEDIATE")
            probe.execute("ROLLBACK")
            return
        except sqlite3.OperationalError:  # locked by the paused worker: let it finish
            proc.send_signal(signal.SIGCONT)
            time.sleep(0.01)
        finally:
            probe.close()
    raise AssertionError("the worker held the write lock at every try")


def test_a_poison_job_ends_after_max_attempts_and_the_rest_finish(
    store: Store, workers: Workers
) -> None:
    procs = [workers.start("-c", "2") for _ in range(3)]
    wait_for(lambda: all(session_of(store, p.pid) for p in procs), what="sessions")
    (poison,) = store.job_enqueue_many([JobSpec("poison", max_attempts=2)])
    others = store.job_enqueue_many([JobSpec("add", [i, i], max_attempts=3) for i in range(20)])
    wait_for(
        lambda: store.job_get(poison.id).status == Status.TIMED_OUT,
        timeout=4 * (EXPIRY + JANITOR) + 10,
        what="poison job ends",
    )
    runs = store.job_runs(poison.id)
    assert [r.outcome for r in runs] == [Outcome.LOST, Outcome.LOST]
    assert runs[0].session_id != runs[1].session_id  # retried on a different worker
    wait_for(
        lambda: all(store.job_get(j.id).status == Status.SUCCEEDED for j in others),
        timeout=4 * (EXPIRY + JANITOR) + 10,
        what="other jobs finish",
    )
    assert sum(p.poll() is not None for p in procs) == 2


def test_janitor_takeover_after_the_holder_dies(store: Store, workers: Workers) -> None:
    first = workers.start(command="janitor")
    holder = wait_for(lambda: store.lease_get(LEASE_NAME), what="first holder")
    second = workers.start(command="janitor")
    time.sleep(3 * JANITOR)  # the second one must not take a live lease
    # the same holder under the same term (its renewals move only expires_at)
    current = store.lease_get(LEASE_NAME)
    assert current is not None
    assert (current.holder, current.term) == (holder.holder, holder.term)  # type: ignore[attr-defined]
    first.send_signal(signal.SIGKILL)
    killed = time.monotonic()
    first.wait()
    taken = wait_for(
        lambda: (lease := store.lease_get(LEASE_NAME)) and lease.term > current.term and lease,
        timeout=10,
        what="takeover",
    )
    took = time.monotonic() - killed
    assert took < max(EXPIRY, 2 * JANITOR) + JANITOR + SLACK
    assert taken.holder != current.holder  # type: ignore[attr-defined]
    assert second.poll() is None


def test_a_stopped_thread_task_keeps_its_slot_until_it_returns(
    store: Store, workers: Workers
) -> None:
    """-c 1: a plain-function task past its timeout that ignores the stop is marked timed
    out at once, but no job starts before its thread has returned."""
    proc = workers.start("-c", "1")
    wait_for(lambda: session_of(store, proc.pid), what="worker session")
    returned = workers.tmp / "stubborn"
    (hog,) = store.job_enqueue_many(
        [JobSpec("stubborn", [3.0, str(returned)], timeout=0.3, retry_on_timeout=False)]
    )
    wait_for(lambda: store.job_get(hog.id).status == Status.RUNNING, what="stubborn runs")
    marks = [workers.tmp / f"quick-{n}" for n in range(3)]
    quick = store.job_enqueue_many([JobSpec("started_at", [str(mark)]) for mark in marks])
    wait_for(lambda: store.job_get(hog.id).status == Status.TIMED_OUT, timeout=3.0, what="time out")
    assert not returned.exists(), "the timeout was written only once the task returned"
    wait_for(
        lambda: all(store.job_get(j.id).status == Status.SUCCEEDED for j in quick),
        what="quick jobs",
    )
    wait_for(returned.exists, what="the stubborn task returns")
    end = float(returned.read_text())
    starts = [float(mark.read_text()) for mark in marks]
    assert min(starts) >= end, f"a job started {end - min(starts):.2f}s before the slot was free"
    assert "still runs" not in workers.log(0)  # returned within the grace period
