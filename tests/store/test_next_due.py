"""When the next job is due (``job_next_due``, which an idle worker reads to know how long
it may sleep): the earliest pending job of the queues and tasks it serves, by the database
clock, across priority levels (more than a claim probes one by one included), and nothing
of other queues, other tasks or jobs already claimed."""

from __future__ import annotations

import random

import pytest

from plunder.model import JobSpec
from plunder.store import Store
from tests.store.helpers import claim, enqueue, later, open_session

DAY = 86_400.0


def test_nothing_pending_is_none(store: Store) -> None:
    assert store.job_next_due(queues=["default"], tasks=["t"]) is None
    assert store.job_next_due(queues=[], tasks=["t"]) is None
    assert store.job_next_due(queues=["default"], tasks=[]) is None


def test_a_job_due_now_is_due_in_zero_or_less(store: Store) -> None:
    t0 = store.now()
    enqueue(store, JobSpec("t", [1]), now=t0)
    due = store.job_next_due(queues=["default"], tasks=["t"], now=later(t0, 2.0))
    assert due == pytest.approx(-2.0, abs=1e-3)


def test_the_earliest_served_job_is_what_counts(store: Store) -> None:
    """Jobs of another queue or task, and claimed ones, do not shorten the sleep."""
    t0 = store.now()
    enqueue(
        store,
        JobSpec("t", ["claimed"], delay=1.0),
        JobSpec("t", ["other queue"], queue="other", delay=2.0),
        JobSpec("u", ["other task"], delay=3.0),
        JobSpec("t", ["low", 1], priority=-9, delay=40.0),
        JobSpec("t", ["high"], priority=9, delay=50.0),
        now=t0,
    )
    session = open_session(store, expiry=DAY, now=t0)
    assert len(claim(store, session, limit=5, now=later(t0, 1.5))) == 1
    due = store.job_next_due(queues=["default"], tasks=["t"], now=t0)
    assert due == pytest.approx(40.0, abs=1e-3)
    both = store.job_next_due(queues=["default", "other"], tasks=["t", "u"], now=t0)
    assert both == pytest.approx(2.0, abs=1e-3)


def test_a_job_overdue_longest_counts_in_whichever_order_the_queues_come(store: Store) -> None:
    t0 = store.now()
    enqueue(store, JobSpec("t", [1], queue="a", delay=1.0), now=t0)
    enqueue(store, JobSpec("t", [2], queue="b"), now=t0)
    for queues in (["a", "b"], ["b", "a"]):
        due = store.job_next_due(queues=queues, tasks=["t"], now=later(t0, 5.0))
        assert due == pytest.approx(-5.0, abs=1e-3), queues


def test_the_earliest_job_below_many_levels_counts(store: Store) -> None:
    """More levels than a claim probes one by one, all due later: the earliest job is
    below them (found by the walk of the rest of the queue)."""
    t0 = store.now()
    enqueue(store, *[JobSpec("t", [p], priority=p, delay=DAY - p) for p in range(100, 0, -1)])
    enqueue(store, JobSpec("t", ["low"], priority=-5, delay=5.0), now=t0)
    due = store.job_next_due(queues=["default"], tasks=["t"], now=t0)
    assert due == pytest.approx(5.0, abs=1e-3)


def test_a_bad_queue_name_is_refused(store: Store) -> None:
    with pytest.raises(ValueError, match="queue"):
        store.job_next_due(queues=[""], tasks=["t"])


def test_next_due_agrees_with_the_pending_jobs_across_queues_levels_and_tasks(
    store: Store,
) -> None:
    """Random mixes against the rule, with some jobs claimed; every other round has more
    priority levels than a claim reads one by one."""
    t0 = store.now()
    for round_ in range(40):
        rng = random.Random(round_)
        queues = [f"q{round_}-{n}" for n in range(3)]
        levels = (-3, 0, 0, 1, 7) if round_ % 2 else tuple(range(-25, 26))
        specs = [
            JobSpec(
                rng.choice(("t", "t", "u")),
                [i],
                queue=rng.choice(queues),
                priority=rng.choice(levels),
                delay=rng.choice((0.0, rng.uniform(0.0, 600.0), DAY)),
            )
            for i in range(rng.randint(1, 80))
        ]
        jobs = enqueue(store, *specs, now=t0)
        served = rng.sample(queues, rng.randint(1, 3))
        session = open_session(store, queues=served, name=f"w{round_}", expiry=DAY, now=t0)
        at = later(t0, rng.choice((0.5, 3.0, 60.0)))
        limit = rng.randint(1, 20)
        taken = {j.id for j in claim(store, session, queues=served, limit=limit, now=at)}
        tasks = rng.choice((["t"], ["u"], ["t", "u"]))
        pending = [j for j in jobs if j.queue in served and j.task in tasks and j.id not in taken]
        got = store.job_next_due(queues=served, tasks=tasks, now=at)
        if not pending:
            assert got is None, f"round {round_}"
            continue
        expected = (min(j.run_at for j in pending) - at).total_seconds()
        assert got == pytest.approx(expected, abs=1e-3), f"round {round_}"


def test_a_job_past_its_start_by_deadline_is_not_due(store: Store) -> None:
    """An expired job the janitor has not ended yet is not work: an idle worker that read it
    as due would claim nothing and ask again at once. So in every priority level and in
    the rest of a queue with more levels than a claim probes one by one."""
    t0 = store.now()
    levels = [JobSpec("t", [p], priority=p, expires_in=10) for p in range(40, 20, -1)]
    enqueue(store, *levels, JobSpec("t", ["rest"], priority=0, expires_in=10), now=t0)
    assert store.job_next_due(queues=["default"], tasks=["t"], now=later(t0, 10.0)) is None
    enqueue(store, JobSpec("t", ["later"], priority=-1, delay=30.0), now=t0)
    due = store.job_next_due(queues=["default"], tasks=["t"], now=later(t0, 10.0))
    assert due == pytest.approx(20.0, abs=1e-3)
    in_time = store.job_next_due(queues=["default"], tasks=["t"], now=later(t0, 9.9))
    assert in_time == pytest.approx(-9.9, abs=1e-3)
