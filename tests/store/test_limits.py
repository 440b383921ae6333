"""Concurrency and rate limits by key (plunder.store.limits), on every backend: a limited
job is enqueued held and admitted as far as its limit allows; a held job is never claimed;
a job that ends frees its place; a limited job that goes back to pending goes back held; a
pause admits none until it ends and a shorter pause never ends a longer one."""

from __future__ import annotations

from datetime import datetime

import pytest

from plunder.model import ErrorInfo, Failure, JobRecord, JobSpec, Lease, Limit, Session
from plunder.states import Status
from plunder.store import Store
from tests.store import helpers
from tests.store.helpers import complete, enqueue, later, open_session


def claim(store: Store, session: Session, *, now: datetime) -> list[JobRecord]:
    """A claim a moment after ``now``: SQLite's times are floats, and a held job admitted
    is due within some microseconds of the time it had (see limit_admit)."""
    return helpers.claim(store, session, now=later(now, 0.001))


def limited(
    n: int, key: str = "openai", ceiling: int | None = 2, **options: object
) -> list[JobSpec]:
    return [JobSpec("t", [i], limit=Limit(key, ceiling), **options) for i in range(n)]  # type: ignore[arg-type]


def held(store: Store, key: str = "openai") -> tuple[int, int, int]:
    (state,) = [s for s in store.limit_list() if s.key == key]
    return state.running, state.admitted, state.held


def lease_at(store: Store, now: datetime) -> Lease:
    lease = store.lease_acquire("janitor", "j", 600, now=now)
    assert lease is not None
    return lease


def test_a_limit_admits_up_to_its_ceiling_and_a_claim_takes_no_held_job(store: Store) -> None:
    t0 = store.now()
    jobs = enqueue(store, *limited(5), JobSpec("t", ["free"]), now=t0)
    assert all(j.limit_key == "openai" for j in jobs[:5]) and jobs[5].limit_key is None
    assert held(store) == (0, 2, 3)
    session = open_session(store, now=t0)
    taken = claim(store, session, now=t0)
    assert sorted(str(j.args[0]) for j in taken) == ["0", "1", "free"]
    assert held(store) == (2, 0, 3)
    assert claim(store, session, now=t0) == []  # the rest wait, pending and visible
    waiting = store.job_get(jobs[4].id)
    assert waiting.status == Status.PENDING
    (state,) = store.limit_list()
    assert state.reason == "at its ceiling of 2" and state.ceiling == 2


def test_a_job_that_ends_frees_its_place_for_the_next_admission(store: Store) -> None:
    t0 = store.now()
    enqueue(store, *limited(4, max_attempts=3), now=t0)
    session = open_session(store, now=t0)
    first, second = claim(store, session, now=t0)
    assert complete(store, first.claim, now=t0)
    assert store.limit_admit_many(["openai"], now=t0) == 1
    assert store.limit_admit_many(["openai"], now=t0) == 0  # at the ceiling again
    (third,) = claim(store, session, now=t0)
    assert third.args == [2]
    # a failure that is retried goes back held: its place is free, and it waits its turn
    ack = store.job_fail_many([Failure(second.claim, ErrorInfo("E", "x"), 0.0)], now=t0)
    assert ack.accepted == (second.claim,)
    assert held(store) == (1, 0, 2)
    assert store.limit_admit_many(["openai"], now=t0) == 1
    (fourth,) = claim(store, session, now=t0)
    assert fourth.args[0] in (1, 3)


def test_the_ceiling_holds_across_sessions_and_enqueues(store: Store) -> None:
    t0 = store.now()
    sessions = [open_session(store, name=f"w{i}", now=t0) for i in range(3)]
    running = []
    for _ in range(4):
        enqueue(store, *limited(3, ceiling=3), now=t0)
        for session in sessions:
            running += claim(store, session, now=t0)
        assert len([j for j in running if store.job_get(j.id).status == Status.RUNNING]) <= 3
        for job in running[:1]:
            complete(store, job.claim, now=t0)
        running = running[1:]
        store.limit_admit_many(["openai"], now=t0)
    assert held(store)[0] + held(store)[1] <= 3


def test_a_lost_workers_limited_jobs_go_back_held_and_are_admitted_by_the_janitor(
    store: Store,
) -> None:
    t0 = store.now()
    enqueue(store, *limited(3, max_attempts=3), now=t0)
    dying = open_session(store, expiry=5, now=t0)
    lost = claim(store, dying, now=t0)
    assert len(lost) == 2
    swept = store.session_reap_many(lease_at(store, t0), now=later(t0, 6))
    assert sorted(swept.retried) == sorted(j.id for j in lost)
    assert held(store) == (0, 0, 3)  # back held: nothing of the key runs or is admitted
    assert store.limit_admit_due(now=later(t0, 6)) == 2
    alive = open_session(store, name="alive", now=later(t0, 6))
    assert len(claim(store, alive, now=later(t0, 6))) == 2


def test_a_delayed_limited_job_is_admitted_once_due(store: Store) -> None:
    t0 = store.now()
    (job,) = enqueue(store, *limited(1, delay=30.0), now=t0)
    assert store.limit_admit_due(now=later(t0, 10)) == 0
    assert store.limit_admit_due(now=later(t0, 31)) == 1
    admitted = store.job_get(job.id)
    assert abs((admitted.run_at - later(t0, 30)).total_seconds()) < 0.001


def test_a_pause_holds_admitted_jobs_and_admits_none_until_it_ends(store: Store) -> None:
    t0 = store.now()
    enqueue(store, *limited(3), now=t0)
    assert held(store) == (0, 2, 1)
    until = store.limit_pause("openai", 60, now=t0)
    assert until == later(t0, 60)
    assert held(store) == (0, 0, 3)  # the admitted ones are held again
    session = open_session(store, now=t0)
    assert claim(store, session, now=t0) == []
    assert store.limit_admit_many(["openai"], now=later(t0, 30)) == 0
    # a shorter pause does not end the longer one
    assert store.limit_pause("openai", 5, now=later(t0, 1)) == later(t0, 60)
    assert store.limit_admit_due(now=later(t0, 30)) == 0
    assert store.limit_admit_due(now=later(t0, 61)) == 2
    session = open_session(store, name="later", now=later(t0, 61))
    assert len(claim(store, session, now=later(t0, 61))) == 2


def test_a_job_given_back_during_a_pause_is_not_claimed(store: Store) -> None:
    t0 = store.now()
    enqueue(store, *limited(2), now=t0)
    session = open_session(store, now=t0)
    first, _ = claim(store, session, now=t0)
    store.limit_pause("openai", 60, now=t0)
    # released by a session that closes, while the key is paused
    store.job_release_many([first.claim], now=later(t0, 1))
    other = open_session(store, name="other", now=later(t0, 1))
    assert claim(store, other, now=later(t0, 2)) == []
    assert store.limit_admit_due(now=later(t0, 2)) == 0
    assert store.limit_resume("openai", now=later(t0, 3))
    (again,) = claim(store, other, now=later(t0, 3))  # one place: the other still runs
    assert again.id == first.id


def test_a_rate_admits_its_tokens_then_as_they_refill(store: Store) -> None:
    t0 = store.now()
    specs = [JobSpec("t", [i], limit=Limit("api", None, "2/s")) for i in range(5)]
    enqueue(store, *specs, now=t0)
    assert held(store, "api") == (0, 2, 3)  # a full bucket: two at once
    assert store.limit_admit_due(now=later(t0, 0.4)) == 0
    assert store.limit_admit_due(now=later(t0, 1.0)) == 2
    assert store.limit_admit_due(now=later(t0, 1.2)) == 0
    (state,) = store.limit_list()
    assert state.rate == "2/s" and state.ceiling is None and state.reason == "rate 2/s"


def test_set_changes_a_limit_and_admits_what_it_allows(store: Store) -> None:
    t0 = store.now()
    enqueue(store, *limited(5, ceiling=1), now=t0)
    # a job of the same key declaring another ceiling does not change the limit
    enqueue(store, *limited(1, ceiling=9), now=t0)
    assert held(store) == (0, 1, 5)
    state = store.limit_set("openai", 4)
    assert state.ceiling == 4 and (state.admitted, state.held) == (4, 2)
    with pytest.raises(ValueError, match="ceiling"):
        store.limit_set("openai", 0)


def test_cancel_and_retry_keep_the_ceiling(store: Store) -> None:
    t0 = store.now()
    jobs = enqueue(store, *limited(3, ceiling=1), now=t0)
    session = open_session(store, now=t0)
    (running,) = claim(store, session, now=t0)
    store.job_cancel(running.id)  # its place frees: the next is admitted
    assert held(store) == (0, 1, 1)
    retried = store.job_retry(running.id)
    assert retried.status == Status.PENDING
    assert held(store) == (0, 1, 2)  # back held behind the one admitted
    assert {j.id for j in jobs} >= {running.id}


def test_limit_declarations_are_checked() -> None:
    with pytest.raises(ValueError, match="same key"):
        Limit.declared(("a", 1), ("b", "1/s"))
    with pytest.raises(ValueError, match="COUNT/UNIT"):
        Limit("a", 1, "often")
    with pytest.raises(ValueError, match="ceiling"):
        Limit("a", 0)
    assert Limit.declared(None, ("k", "600/min")) == Limit("k", None, "600/min")


def test_limited_jobs_with_idempotency_keys_enqueue_once(store: Store) -> None:
    t0 = store.now()
    specs = [JobSpec("t", [i], key=f"k{i}", limit=Limit("openai", 2)) for i in range(3)]
    first = enqueue(store, *specs, now=t0)
    again = enqueue(store, *specs, now=t0)
    assert [j.id for j in again] == [j.id for j in first]
    assert held(store) == (0, 2, 1)
