"""Ordered keys (plunder.store.ordering), on every backend: the jobs of one partition key
are admitted one at a time in enqueue order, whatever their priority; different keys run
side by side; a retry, a lost worker's job and a rebalance keep the order; a failed job
goes on to the next, or stops a key that says "stop" until it is released."""

from __future__ import annotations

import itertools
import threading
from collections import defaultdict
from dataclasses import replace
from datetime import datetime

import pytest

from plunder import errors
from plunder.model import Completion, ErrorInfo, Failure, JobRecord, JobSpec, Lease, Limit
from plunder.states import Status
from plunder.store import Store, open_store
from tests.store import helpers
from tests.store.helpers import complete, enqueue, later, open_session

QUEUES = [f"q~{p}" for p in range(4)]


def claim(store: Store, session: object, *, now: datetime | None = None) -> list[JobRecord]:
    """A claim over every partition of q, a moment after ``now`` (SQLite keeps an admitted
    job's time to some microseconds, see limit_admit)."""
    at = None if now is None else later(now, 0.001)
    return helpers.claim(store, session, queues=QUEUES, now=at)  # type: ignore[arg-type]


def jobs(key: str, n: int, **options: object) -> list[JobSpec]:
    return [JobSpec("t", [key, i], queue="q", partition_key=key, **options) for i in range(n)]  # type: ignore[arg-type]


def lease_at(store: Store, now: datetime) -> Lease:
    lease = store.lease_acquire("plunder.janitor", "j", 600, now=now)
    assert lease is not None
    return lease


@pytest.fixture
def ordered(store: Store) -> Store:
    store.partition_declare("q", 4, ordered=True)
    return store


def test_one_job_of_a_key_at_a_time_in_enqueue_order_whatever_its_priority(
    ordered: Store,
) -> None:
    store, t0 = ordered, ordered.now()
    specs = [
        JobSpec("t", ["a", i], queue="q", partition_key="a", priority=p)
        for i, p in enumerate([0, 9, 5, 7])
    ]
    made = enqueue(store, *specs, *jobs("b", 2), now=t0)
    assert {j.limit_key for j in made} == {"q~a", "q~b"}
    first, second = open_session(store, name="w1", now=t0), open_session(store, name="w2", now=t0)
    order: dict[str, list[int]] = defaultdict(list)
    for _ in range(10):
        taken = claim(store, first, now=t0) + claim(store, second, now=t0)
        if not taken:
            break
        assert len({j.args[0] for j in taken}) == len(taken), "two jobs of one key at once"
        for job in taken:
            order[job.args[0]].append(job.args[1])
            assert complete(store, job.claim, now=t0)
        store.limit_admit_many({j.limit_key for j in taken if j.limit_key}, now=t0)
    assert order == {"a": [0, 1, 2, 3], "b": [0, 1]}


def test_different_keys_run_side_by_side(ordered: Store) -> None:
    store, t0 = ordered, ordered.now()
    enqueue(store, *[s for k in "abcdef" for s in jobs(k, 3)], now=t0)
    sessions = [open_session(store, name=f"w{i}", now=t0) for i in range(3)]
    running = [j for s in sessions for j in claim(store, s, now=t0)]
    assert sorted((j.args[0], j.args[1]) for j in running) == [(k, 0) for k in "abcdef"]


def test_a_job_of_an_ordered_task_on_any_queue(store: Store) -> None:
    t0 = store.now()
    specs = [JobSpec("t", [i], partition_key="k", ordered=True) for i in range(3)]
    made = enqueue(store, *specs, JobSpec("t", ["free"]), now=t0)
    assert made[0].limit_key == "default~k" and made[3].limit_key is None
    session = open_session(store, now=t0)
    taken = helpers.claim(store, session, now=later(t0, 0.001))
    assert sorted(str(j.args[0]) for j in taken) == ["0", "free"]


def test_a_retry_keeps_its_place_before_the_keys_later_jobs(ordered: Store) -> None:
    store, t0 = ordered, ordered.now()
    enqueue(store, *jobs("a", 3, max_attempts=3), now=t0)
    session = open_session(store, now=t0)
    (head,) = claim(store, session, now=t0)
    failure = Failure(head.claim, ErrorInfo("E", "boom"), 10.0)  # retried in 10 s
    assert store.job_fail_many([failure], now=t0).accepted == (head.claim,)
    assert store.limit_admit_many(["q~a"], now=t0) == 0  # the next waits for the retry
    assert store.limit_admit_due(now=later(t0, 5)) == 0
    assert claim(store, session, now=later(t0, 5)) == []
    assert store.limit_admit_due(now=later(t0, 11)) == 1
    (again,) = claim(store, session, now=later(t0, 11))
    assert (again.id, again.attempt) == (head.id, 2)


def test_a_lost_workers_job_runs_again_before_the_keys_next(ordered: Store) -> None:
    store, t0 = ordered, ordered.now()
    # the head is due a second after the rest: it keeps its place all the same
    head, *rest = jobs("a", 3, max_attempts=3)
    made = enqueue(store, replace(head, delay=1.0), *rest, now=t0)
    dying = open_session(store, name="dying", expiry=5, now=t0)
    assert store.limit_admit_due(now=later(t0, 0.5)) == 0
    assert claim(store, dying, now=later(t0, 0.5)) == []
    assert store.limit_admit_due(now=later(t0, 1)) == 1
    (lost,) = claim(store, dying, now=later(t0, 1))
    assert lost.id == made[0].id
    # dead but not yet rescued: the run still counts, nothing of the key is admitted
    assert store.limit_admit_due(now=later(t0, 6)) == 0
    alive = open_session(store, name="alive", now=later(t0, 6))
    assert claim(store, alive, now=later(t0, 6)) == []
    swept = store.session_reap_many(lease_at(store, t0), now=later(t0, 6))
    assert swept.retried == (lost.id,) or list(swept.retried) == [lost.id]
    assert store.limit_admit_due(now=later(t0, 6)) == 1
    (again,) = claim(store, alive, now=later(t0, 6))
    assert (again.id, again.attempt) == (made[0].id, 2)


def test_a_rebalance_never_starts_the_keys_next_job_on_the_new_owner(ordered: Store) -> None:
    store, t0 = ordered, ordered.now()
    old = open_session(store, name="old", queues=["q"], now=t0)
    store.partition_assign_many(lease_at(store, t0), now=t0)
    keys = [f"k{i}" for i in range(40)]
    enqueue(store, *[s for k in keys for s in jobs(k, 2)], now=t0)
    held = claim(store, old, now=t0)
    assert len(held) == 10  # one claim's worth of heads, running on the old owner
    new = open_session(store, name="new", queues=["q"], now=t0)
    assert store.partition_assign_many(lease_at(store, t0), now=t0) == ["q"]
    (queue,) = store.partition_list()
    moved = {f"q~{p}" for p, owner in enumerate(queue.owners) if owner == new.id}
    assert moved, "the new session owns no partition"
    running = {j.args[0] for j in held}
    taken = [j for _ in range(10) for j in claim(store, new, now=t0)]
    assert not running & {j.args[0] for j in taken}, "a key's next job ran beside its first"
    assert all(j.args[1] == 0 for j in taken)
    for job in held:  # the old owner finishes: the keys' next jobs go to whoever claims
        assert complete(store, job.claim, now=t0)
    store.limit_admit_many({str(j.limit_key) for j in held}, now=t0)
    nexts = [j for _ in range(10) for j in claim(store, new, now=t0)]
    assert {(j.args[0], j.args[1]) for j in nexts} >= {(k, 1) for k in running}


def test_a_failed_job_lets_the_next_run_by_default(ordered: Store) -> None:
    store, t0 = ordered, ordered.now()
    made = enqueue(store, *jobs("a", 2), now=t0)  # one attempt each
    session = open_session(store, now=t0)
    (head,) = claim(store, session, now=t0)
    store.job_fail_many([Failure(head.claim, ErrorInfo("E", "boom"), 0.0)], now=t0)
    assert store.job_get(head.id).status == Status.FAILED
    assert store.limit_admit_many(["q~a"], now=t0) == 1
    (after,) = claim(store, session, now=t0)
    assert after.id == made[1].id


def test_a_stopping_key_waits_for_a_release_after_a_failure(store: Store) -> None:
    store.partition_declare("q", 4, ordered="stop")
    t0 = store.now()
    made = enqueue(store, *jobs("a", 3), *jobs("b", 1), now=t0)
    session = open_session(store, now=t0)
    heads = claim(store, session, now=t0)
    head = next(j for j in heads if j.args[0] == "a")
    store.job_fail_many([Failure(head.claim, ErrorInfo("E", "boom"), 0.0)], now=t0)
    assert store.limit_admit_many(["q~a"], now=t0) == 0
    assert store.limit_admit_due(now=later(t0, 1)) == 0
    (state,) = [k for k in store.order_list() if k.key == "q~a"]
    assert state.stopped and state.failed_job == head.id and state.pending == 2
    # a retry by hand of the failed job: it runs first, and the key goes on
    store.job_retry(head.id, now=t0)
    (again,) = [j for j in claim(store, session, now=t0) if j.args[0] == "a"]
    assert again.id == head.id
    store.job_fail_many([Failure(again.claim, ErrorInfo("E", "boom"), 0.0)], now=t0)
    assert store.limit_admit_many(["q~a"], now=t0) == 0
    assert store.order_release("q~a", now=t0)
    assert not store.order_release("q~nothing", now=t0)
    (after,) = claim(store, session, now=t0)
    assert after.id == made[1].id
    assert not next(k for k in store.order_list() if k.key == "q~a").stopped


def test_ordered_jobs_that_cannot_be_ordered_are_refused(store: Store) -> None:
    with pytest.raises(errors.PayloadError, match="partition_key"):
        enqueue(store, JobSpec("t", ordered=True))
    with pytest.raises(errors.PayloadError, match="one or the other"):
        enqueue(store, JobSpec("t", partition_key="k", ordered=True, limit=Limit("x", 2)))
    with pytest.raises(errors.PayloadError, match="ordered of 't'"):
        enqueue(store, JobSpec("t", partition_key="k", ordered="sometimes"))
    with pytest.raises(errors.PayloadError, match="ordered of queue"):
        store.partition_declare("q", 2, ordered="later")
    store.partition_declare("q", 2, ordered=True)
    with pytest.raises(errors.PayloadError, match="partition_key"):
        enqueue(store, JobSpec("t", queue="q"))
    store.partition_declare("q", 2, ordered=False)
    assert enqueue(store, JobSpec("t", queue="q"))[0].limit_key is None


def test_several_workers_at_once_keep_each_keys_order(store_url: str, ordered: Store) -> None:
    keys, per_key = [f"k{i}" for i in range(6)], 8
    enqueue(ordered, *[s for i in range(per_key) for k in keys for s in jobs(k, 1)])
    # enqueued one key after another, eight rounds: a key's enqueue order is its ids' order
    errors_seen: list[BaseException] = []

    def work(name: str) -> None:
        try:
            own = open_store(store_url)
            session = open_session(own, name=name)
            idle = 0
            while idle < 20:
                taken = claim(own, session)
                if not taken:
                    idle += 1
                    threading.Event().wait(0.02)
                    continue
                idle = 0
                own.job_complete_many([Completion(j.claim, None) for j in taken])
                own.limit_admit_many({str(j.limit_key) for j in taken})
            own.close()
        except BaseException as exc:
            errors_seen.append(exc)

    threads = [threading.Thread(target=work, args=(f"w{i}",)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors_seen, errors_seen
    done = [ordered.job_get(j.id) for j in ordered.job_list(limit=1000).jobs]
    assert all(j.status == Status.SUCCEEDED for j in done) and len(done) == 48
    by_key: dict[str, list[tuple[datetime, datetime, int]]] = defaultdict(list)
    for job in done:
        (run,) = ordered.job_runs(job.id)
        assert run.finished_at is not None
        by_key[str(job.limit_key)].append((run.started_at, run.finished_at, job.id))
    for key, runs in by_key.items():
        runs.sort()
        assert [r[2] for r in runs] == sorted(r[2] for r in runs), f"{key} out of order"
        for before, after in itertools.pairwise(runs):
            assert before[1] <= after[0], f"two jobs of {key} overlapped"
