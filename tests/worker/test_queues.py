"""Workers that join and leave queues while they run: real worker processes, and the
``plunder worker-queues`` command as a subprocess (see plunder.membership)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from plunder import errors
from plunder.context import LinkSink
from plunder.membership import Membership
from plunder.model import JobSpec
from plunder.protocol import Hello
from plunder.slots import Slots
from plunder.states import Outcome, Status
from plunder.store import Store
from tests.support.memlink import MemoryLink
from tests.worker.conftest import ROOT, Workers, session_of, wait_for, worker_in_thread

HEARTBEAT = 0.2  # the FAST interval of tests.worker.conftest


def worker_queues(url: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "plunder", "--db", url, "worker-queues", *args],
        check=False,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PLUNDER_URL": url},
    )


def _session(store: Store, pid: int) -> str:
    sid = wait_for(lambda: session_of(store, pid), what="the worker's session")
    assert isinstance(sid, str)
    return sid


def _status(store: Store, job_id: int) -> Status:
    return store.job_get(job_id).status


def test_a_queue_joined_from_the_command_line_is_claimed_within_heartbeats(
    store: Store, store_url: str, workers: Workers
) -> None:
    proc = workers.start("-q", "default", "-c", "2")
    sid = _session(store, proc.pid)
    (job,) = store.job_enqueue_many([JobSpec("add", [2, 3], queue="extra")])
    # the worker claims again after this default job, and still leaves the older one
    (first,) = store.job_enqueue_many([JobSpec("add", [1, 1])])
    wait_for(lambda: _status(store, first.id) == Status.SUCCEEDED, what="the default job")
    assert _status(store, job.id) == Status.PENDING

    done = worker_queues(store_url, sid[:12], "--add", "extra", "--json")
    joined = time.monotonic()
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["queues"] == ["default", "extra"]
    wait_for(lambda: _status(store, job.id) == Status.SUCCEEDED, what="the joined queue's job")
    took = time.monotonic() - joined
    # within a couple of heartbeats; a loaded machine gets some slack
    assert took < 10 * HEARTBEAT, f"claimed {took:.2f}s after the join"
    assert store.job_get(job.id).result == 5
    assert [s.queues for s in store.session_list()] == [("default", "extra")]
    assert "joined: extra" in workers.log(0)
    # no task of the app names "extra" (a typo looks the same): said, and joined anyway
    assert "joined queue(s) extra, which no task of this app names" in workers.log(0)


def test_a_left_queue_is_claimed_no_more_and_its_running_job_finishes(
    store: Store, store_url: str, workers: Workers
) -> None:
    proc = workers.start("-q", "default,extra", "-c", "2", "--grace", "30")
    sid = _session(store, proc.pid)
    (running,) = store.job_enqueue_many([JobSpec("sleepy", [1.0], queue="extra")])
    wait_for(lambda: _status(store, running.id) == Status.RUNNING, what="the extra job to run")

    done = worker_queues(store_url, sid, "--remove", "extra")
    assert done.returncode == 0, done.stderr
    assert "queues default" in done.stdout
    wait_for(lambda: "left: extra" in workers.log(0), what="the worker to hear it")
    # a job of the left queue, older and more urgent than the next default one: a worker
    # still claiming from the left queue would take it first
    (left,) = store.job_enqueue_many([JobSpec("add", [1, 2], queue="extra", priority=9)])
    (after,) = store.job_enqueue_many([JobSpec("add", [3, 4])])
    wait_for(lambda: _status(store, after.id) == Status.SUCCEEDED, what="the default job")
    assert _status(store, left.id) == Status.PENDING
    # the job that ran when the worker left finishes within the grace period, once
    wait_for(lambda: _status(store, running.id) == Status.SUCCEEDED, what="the running job")
    assert [r.outcome for r in store.job_runs(running.id)] == [Outcome.SUCCEEDED]
    assert store.job_get(running.id).attempt == 1


def test_a_job_still_running_after_the_grace_is_given_back_and_runs_once_elsewhere(
    store: Store, store_url: str, workers: Workers
) -> None:
    proc = workers.start("-q", "default,extra", "-c", "2", "--grace", "0.5")
    sid = _session(store, proc.pid)
    (job,) = store.job_enqueue_many([JobSpec("sleepy", [3.0], queue="extra", max_attempts=1)])
    wait_for(lambda: _status(store, job.id) == Status.RUNNING, what="the extra job to run")

    assert worker_queues(store_url, sid, "--remove", "extra").returncode == 0
    # stopped after the grace period, and given back: pending, its attempt not counted
    wait_for(lambda: _status(store, job.id) == Status.PENDING, what="the job given back")
    released = store.job_get(job.id)
    assert released.max_attempts == 2
    assert [r.outcome for r in store.job_runs(job.id)] == [Outcome.RELEASED]
    assert "still running" in workers.log(0)

    other = workers.start("-q", "extra", "-c", "1", name="other")
    wait_for(lambda: _status(store, job.id) == Status.SUCCEEDED, what="the job elsewhere")
    runs = store.job_runs(job.id)
    assert [r.outcome for r in runs] == [Outcome.RELEASED, Outcome.SUCCEEDED]
    assert runs[-1].worker == "other" and other.poll() is None


def test_a_job_that_must_not_run_twice_ends_as_lost_after_the_grace(
    store: Store, store_url: str, workers: Workers
) -> None:
    proc = workers.start("-q", "default,extra", "-c", "2", "--grace", "0.5")
    sid = _session(store, proc.pid)
    spec = JobSpec("sleepy", [5.0], queue="extra", retry_on_lost=False, max_attempts=3)
    (job,) = store.job_enqueue_many([spec])
    wait_for(lambda: _status(store, job.id) == Status.RUNNING, what="the extra job to run")

    assert worker_queues(store_url, sid, "--remove", "extra").returncode == 0
    wait_for(lambda: _status(store, job.id) == Status.TIMED_OUT, what="the job ended")
    ended = store.job_get(job.id)
    assert ended.error is not None and ended.error["type"] == "plunder.WorkerLost"
    assert "left queue extra" in ended.error["message"]
    assert [r.outcome for r in store.job_runs(job.id)] == [Outcome.LOST]
    assert ended.attempt == 1
    # the worker goes on with the queues it kept
    (after,) = store.job_enqueue_many([JobSpec("add", [1, 1])])
    wait_for(lambda: _status(store, after.id) == Status.SUCCEEDED, what="a default job")


def test_the_command_shows_queues_and_refuses_what_it_cannot_change(
    store: Store, store_url: str, workers: Workers
) -> None:
    proc = workers.start("-q", "default")
    sid = _session(store, proc.pid)
    shown = worker_queues(store_url, sid)
    assert shown.returncode == 0 and f"session {sid}" in shown.stdout, shown.stderr
    assert "queues default" in shown.stdout
    for args, message in [
        (("nosuchsession",), "no live session"),
        ((sid[:3],), "no live session"),
        ((sid, "--add", "bad name"), "queue"),
        ((sid, "--add", "a", "--remove", "a"), "both added and removed"),
    ]:
        failed = worker_queues(store_url, *args)
        assert failed.returncode == 1, args
        assert message in failed.stderr and len(failed.stderr.strip().splitlines()) == 1


def test_join_and_leave_in_process(store_url: str, store: Store) -> None:
    with worker_in_thread(store_url) as worker:
        assert worker.join("extra", "more") == ("default", "llm", "extra", "more")
        (job,) = store.job_enqueue_many([JobSpec("add", [4, 4], queue="more")])
        wait_for(lambda: _status(store, job.id) == Status.SUCCEEDED, what="the joined job")
        assert worker.leave("more", "llm") == ("default", "extra")
        wait_for(lambda: worker.queues == ["default", "extra"], what="the main loop to follow")
        assert worker.session is not None
        assert store.session_heartbeat(worker.session.id).queues == ("default", "extra")
        with pytest.raises(errors.InvalidName):
            worker.join("not a queue")
        # every queue left: the worker lives on, claims nothing, and may join again
        assert worker.leave("default", "extra") == ()
        wait_for(lambda: worker.queues == [], what="the main loop to follow")
        (later,) = store.job_enqueue_many([JobSpec("add", [5, 5])])
        assert worker.join("default") == ("default",)
        wait_for(lambda: _status(store, later.id) == Status.SUCCEEDED, what="a job joined again")


def test_an_answer_older_than_the_workers_own_change_does_not_undo_it() -> None:
    """A heartbeat sent before worker.join() and answered after it names the old queues:
    taken, it would undo the join until the next beat."""
    link = MemoryLink()
    hello = Hello("w", "host", 1, ("a",), (), expiry=5.0)
    session = link.open(hello)
    slots = Slots(1, pool=None, task=lambda name: None, sink=LinkSink(link), on_stream=print)
    try:
        membership = Membership(["a"], slots, grace=1.0)
        before = time.monotonic()
        assert membership.change(link, session, add=["b"]) == ("a", "b")
        membership.heard(("a",), before)  # the old beat's answer, arriving late
        membership.follow(link, session)
        assert membership.queues == ["a", "b"]
        membership.heard(("b",), time.monotonic())  # a later beat: "a" was left elsewhere
        membership.follow(link, session)
        assert membership.queues == ["b"]
        with pytest.raises(errors.SessionGone):
            membership.change(link, None, add=["c"])
    finally:
        slots.close()
