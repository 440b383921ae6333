"""A session's queues joined and left while it lives (session_queues), and heard by the
heartbeat: one guarded update each, so changes made at once all count."""

from __future__ import annotations

import threading

import pytest

from plunder import errors
from plunder.model import ErrorInfo, Failure, JobSpec
from plunder.states import Outcome, Status
from plunder.store import Store, open_store
from tests.store.helpers import claim, enqueue, later, open_session


def test_join_and_leave_change_the_session_row_and_its_heartbeat(store: Store) -> None:
    session = open_session(store, queues=("a", "b"))
    assert store.session_heartbeat(session.id).queues == ("a", "b")
    joined = store.session_queues(session.id, add=["c", "a", "d", "c"])
    assert joined.id == session.id
    assert joined.queues == ("a", "b", "c", "d")  # in order, each once
    assert store.session_queues(session.id, remove=["b", "zz"]).queues == ("a", "c", "d")
    assert store.session_queues(session.id, add=["b"], remove=["a"]).queues == ("c", "d", "b")
    assert store.session_heartbeat(session.id).queues == ("c", "d", "b")
    assert [s.queues for s in store.session_list()] == [("c", "d", "b")]
    assert store.session_queues(session.id, remove=["c", "d", "b"]).queues == ()
    assert store.session_queues(session.id).queues == ()  # nothing to change: read


def test_a_session_that_is_not_live_is_refused(store: Store) -> None:
    t0 = store.now()
    session = open_session(store, expiry=5, now=t0)
    with pytest.raises(errors.SessionGone):
        store.session_queues("no-such-session", add=["a"])
    with pytest.raises(errors.SessionGone):
        store.session_queues(session.id, add=["a"], now=later(t0, 6))
    store.session_close(session.id)
    with pytest.raises(errors.SessionGone):
        store.session_queues(session.id, add=["a"])


def test_bad_names_are_refused_before_anything_changes(store: Store) -> None:
    session = open_session(store, queues=("a",))
    with pytest.raises(errors.InvalidName, match="queue"):
        store.session_queues(session.id, add=["no spaces"])
    with pytest.raises(errors.InvalidName, match="both added and removed: a"):
        store.session_queues(session.id, add=["a"], remove=["a"])
    with pytest.raises(errors.InvalidName, match="one string"):
        store.session_queues(session.id, add="abc")
    assert store.session_heartbeat(session.id).queues == ("a",)


def test_changes_made_at_once_from_many_connections_all_count(store_url: str) -> None:
    """Each thread, on a store of its own, joins one queue and leaves another at the same
    moment: a read-modify-write would lose some; the set operations in SQL lose none."""
    stores = [open_store(store_url) for _ in range(6)]
    try:
        left = [f"old{i}" for i in range(len(stores))]
        session = open_session(stores[0], queues=("keep", *left))
        barrier = threading.Barrier(len(stores))
        failures: list[BaseException] = []

        def change(i: int) -> None:
            try:
                barrier.wait(timeout=10)
                for round_ in range(5):
                    stores[i].session_queues(session.id, add=[f"new{i}.{round_}"], remove=[left[i]])
            except BaseException as exc:  # reported below
                failures.append(exc)

        threads = [threading.Thread(target=change, args=(i,)) for i in range(len(stores))]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=60)
        assert not failures
        queues = stores[0].session_heartbeat(session.id).queues
        assert queues is not None and queues[0] == "keep"
        expected = {"keep"} | {f"new{i}.{r}" for i in range(len(stores)) for r in range(5)}
        assert sorted(queues) == sorted(expected)
    finally:
        for opened in stores:
            opened.close()


def test_a_lost_failure_ends_the_job_as_a_lost_run_does(store: Store) -> None:
    """What a worker sends for a started job it stopped on leaving its queue, when the
    job's retry_on_lost is off: timed_out, its run lost, never run again."""
    (job,) = enqueue(store, JobSpec("t", [1], retry_on_lost=False, max_attempts=3))
    session = open_session(store)
    (got,) = claim(store, session)
    info = ErrorInfo("plunder.WorkerLost", "its worker left queue default")
    ack = store.job_fail_many([Failure(got.claim, info, None, (), Outcome.LOST)])
    assert ack.accepted == (got.claim,)
    after = store.job_get(job.id)
    assert after.status == Status.TIMED_OUT
    assert after.error is not None and after.error["type"] == "plunder.WorkerLost"
    assert [r.outcome for r in store.job_runs(job.id)] == [Outcome.LOST]
