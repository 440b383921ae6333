"""Paused queues (plunder.store.pauses) and the dashboard's reads (plunder.store.observing),
on every backend."""

from __future__ import annotations

import pytest

from plunder import errors
from plunder.model import Completion, JobSpec
from plunder.states import Outcome, Status
from plunder.store import Store, open_store, pauses
from plunder.store.observing import JobFilter
from plunder.store.observing import of as observing_of
from tests.store.helpers import claim, complete, enqueue, later, open_session


def test_a_claim_takes_nothing_from_a_paused_queue_and_its_running_jobs_finish(
    store: Store,
) -> None:
    enqueue(store, *[JobSpec("t", queue=q) for q in ("a", "a", "b", "b")])
    session = open_session(store, queues=("a", "b"))
    (running,) = claim(store, session, queues=("a",), limit=1)
    paused = pauses.of(store)
    assert paused.queue_pause("a", reason="maintenance") is True
    assert paused.queue_pause("a") is False  # paused already
    got = claim(store, session, queues=("a", "b"))
    assert sorted(j.queue for j in got) == ["b", "b"]
    assert store.job_next_due(queues=["a"], tasks=["t"]) is None
    assert complete(store, running.claim, 1)  # the job running there finishes
    assert paused.queue_resume("a") is True
    assert paused.queue_resume("a") is False
    assert [j.queue for j in claim(store, session, queues=("a",))] == ["a"]


def test_the_exchange_and_partitions_of_a_paused_queue_claim_nothing(store: Store) -> None:
    store.partition_declare("p", 1)
    enqueue(store, JobSpec("t", queue="p", partition_key="x"), JobSpec("t", queue="c"))
    session = open_session(store, queues=("p", "c"))
    pauses.of(store).queue_pause("p")
    turn = store.job_exchange_many(
        [], [], session_id=session.id, queues=["p~0"], tasks=["t"], limit=5
    )
    assert turn.claimed == ()
    pauses.of(store).queue_pause("c")
    (first,) = claim(store, session, queues=("c",)) or [None]  # paused too: nothing
    assert first is None
    pauses.of(store).queue_resume("p")
    assert [j.queue for j in claim(store, session, queues=("p~0", "c"))] == ["p~0"]


def test_another_store_sees_a_pause_once_its_reading_is_older_than_its_ttl(
    store_url: str, store: Store
) -> None:
    other = open_store(store_url)
    try:
        enqueue(store, JobSpec("t", queue="q"), JobSpec("t", queue="q"))
        session = open_session(store, queues=("q",))
        assert pauses.of(other).paused() == frozenset()  # read now: trusted for a second
        pauses.of(store).queue_pause("q")
        pauses.of(other).ttl = 0.0  # its next claim reads again
        assert other.job_claim_many(session.id, queues=["q"], tasks=["t"], limit=5) == []
        listed = pauses.of(other).queue_pause_list()
        assert [(p.queue, p.reason) for p in listed] == [("q", "")]
    finally:
        other.close()


def test_pausing_refuses_a_queue_no_job_can_have(store: Store) -> None:
    with pytest.raises(errors.InvalidName):
        pauses.of(store).queue_pause("bad~name")
    with pytest.raises(errors.InvalidName):
        pauses.of(store).queue_resume("")


def test_activity_counts_jobs_finished_and_started_by_minute_with_their_wait(
    store: Store,
) -> None:
    t0 = store.now()
    store.partition_declare("q", 1)
    jobs = enqueue(store, *[JobSpec("t", queue="q", partition_key="k") for _ in range(3)], now=t0)
    session = open_session(store, queues=("q",), expiry=600, now=t0)
    got = claim(store, session, queues=("q~0",), now=later(t0, 4))
    store.job_complete_many([Completion(j.claim, 1) for j in got], now=later(t0, 5))
    (activity,) = observing_of(store).activity(now=later(t0, 30))
    assert activity.queue == "q"  # a partition counts as its queue
    assert len(activity.finished) == 60 and activity.finished[-1] == 3
    assert sum(activity.finished) == 3 and sum(activity.started) == 3
    assert activity.wait[-1] == pytest.approx(4.0, abs=0.05)
    # an hour later, none of it is in the last hour
    assert observing_of(store).activity(now=later(t0, 3700)) == []
    assert {j.id for j in jobs} == {j.id for j in got}


def test_running_and_lost_sessions(store: Store) -> None:
    t0 = store.now()
    enqueue(store, JobSpec("t"), JobSpec("t"), now=t0)
    session = open_session(store, expiry=600, now=t0)
    got = claim(store, session, now=t0)
    observing = observing_of(store)
    assert observing.running() == {session.id: 2}
    lost = store.session_close(session.id, lost=True, now=later(t0, 2))
    assert sorted(lost) == sorted(j.id for j in got)
    assert observing.running() == {}
    (dead,) = observing.lost(now=later(t0, 10))
    assert dead.session_id == session.id and dead.worker == "worker-1" and dead.pid == 4242
    assert dead.lost == 2 and sorted(dead.job_ids) == sorted(j.id for j in got)
    assert all(r.outcome == Outcome.LOST for j in got for r in store.job_runs(j.id))
    assert observing.lost(now=later(t0, 3700)) == []


def test_jobs_by_every_filter_newest_first_and_by_page(store: Store) -> None:
    t0 = store.now()
    specs = [
        JobSpec("t", queue="a", key="k1"),
        JobSpec("u", queue="pa", partition_key="z"),
        JobSpec("t", queue="b"),
        JobSpec("t", queue="gpu"),
    ]
    store.partition_declare("pa", 1)
    a, a3, b, gpu = enqueue(store, *specs, now=t0)
    store.job_cancel(b.id)
    observing = observing_of(store)

    def ids(where: JobFilter) -> list[int]:
        return [j.id for j in observing.jobs(where).jobs]

    assert ids(JobFilter()) == [gpu.id, b.id, a3.id, a.id]
    assert ids(JobFilter(queue="a")) == [a.id]
    assert ids(JobFilter(queue="pa")) == [a3.id]  # its partitions' jobs
    assert ids(JobFilter(task="u")) == [a3.id]
    assert ids(JobFilter(status="cancelled")) == [b.id]
    assert ids(JobFilter(key="k1")) == [a.id]
    assert ids(JobFilter(only=("a", "pa"))) == [a3.id, a.id]
    assert ids(JobFilter(hide=("gpu", "a", "pa"))) == [b.id]
    assert ids(JobFilter(only=())) == []
    since = t0.timestamp() - 1
    assert ids(JobFilter(since=since, until=since + 60)) == [gpu.id, b.id, a3.id, a.id]
    assert ids(JobFilter(since=since + 60)) == []
    assert ids(JobFilter(queue="nul\x00")) == []
    page = observing.jobs(JobFilter(), limit=3)
    assert [j.id for j in page.jobs] == [gpu.id, b.id, a3.id] and page.next_after == a3.id
    rest = observing.jobs(JobFilter(), before=page.next_after, limit=3)
    assert [j.id for j in rest.jobs] == [a.id] and rest.next_after is None
    assert store.job_get(b.id).status == Status.CANCELLED
