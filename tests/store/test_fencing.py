"""Fencing: a worker's write counts only while its (job, attempt, session) is current."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from plunder import errors
from plunder.model import Claim, Completion, ErrorInfo, Failure, JobRecord, JobSpec, Session
from plunder.states import Outcome, Status
from plunder.store import Store
from tests.store.helpers import (
    claim,
    complete,
    count_orders,
    enqueue,
    later,
    open_session,
    user_table,
)


def _running(store: Store) -> tuple[Session, JobRecord]:
    enqueue(store, JobSpec("t"))
    session = open_session(store)
    (job,) = claim(store, session)
    return session, job


def test_complete_records_result_and_closes_the_run(store: Store) -> None:
    _, job = _running(store)
    assert complete(store, job.claim, {"answer": 42})
    done = store.job_get(job.id)
    assert done.status == Status.SUCCEEDED and done.result == {"answer": 42}
    (run,) = store.job_runs(done.id)
    assert run.outcome == Outcome.SUCCEEDED and run.duration is not None and run.duration >= 0


@pytest.mark.parametrize("field", ["attempt", "session"])
def test_a_write_naming_another_claim_is_refused(store: Store, field: str) -> None:
    _, job = _running(store)
    real = job.claim
    forged = (
        Claim(real.job_id, real.attempt + 1, real.session_id)
        if field == "attempt"
        else Claim(real.job_id, real.attempt, open_session(store).id)
    )
    ack = store.job_complete_many([Completion(forged, "forged")])
    assert ack.stale == (forged,) and ack.accepted == ()
    fail = store.job_fail_many([Failure(forged, ErrorInfo("E", "x"))])
    assert fail.stale == (forged,)
    with pytest.raises(errors.StaleClaim):
        store.stream_append(forged, [("chunk", "forged")])
    now = store.job_get(real.job_id)
    assert now.status == Status.RUNNING and now.result is None
    assert store.stream_read(real.job_id) == []
    assert complete(store, real, "real")


def test_a_superseded_attempt_cannot_complete(store: Store) -> None:
    t0 = store.now()
    enqueue(store, JobSpec("t", max_attempts=3), now=t0)
    old = open_session(store, expiry=5, now=t0)
    (first,) = claim(store, old, now=t0)
    lease = store.lease_acquire("janitor", "j", 60, now=later(t0, 6))
    assert lease is not None
    store.session_reap_many(lease, now=later(t0, 6))
    new = open_session(store, name="new", now=later(t0, 6))
    (second,) = claim(store, new, now=later(t0, 7))
    assert second.attempt == 2
    assert not complete(store, first.claim, "late", now=later(t0, 8))
    assert complete(store, second.claim, "fresh", now=later(t0, 8))
    assert store.job_get(first.id).result == "fresh"
    runs = store.job_runs(first.id)
    assert [r.outcome for r in runs] == [Outcome.LOST, Outcome.SUCCEEDED]


def test_an_expired_session_cannot_complete_even_before_it_is_reaped(store: Store) -> None:
    t0 = store.now()
    enqueue(store, JobSpec("t"), now=t0)
    session = open_session(store, expiry=5, now=t0)
    (job,) = claim(store, session, now=t0)
    assert not complete(store, job.claim, "late", now=later(t0, 5.5))
    assert store.job_get(job.id).status == Status.RUNNING
    assert store.job_runs(job.id)[0].outcome == Outcome.STALE


def test_a_cancelled_job_refuses_its_running_attempt(store: Store) -> None:
    session, job = _running(store)
    cancelled = store.job_cancel(job.id)
    assert cancelled.status == Status.CANCELLED
    assert not complete(store, job.claim, "too late")
    assert store.job_get(cancelled.id).status == Status.CANCELLED
    assert store.job_runs(cancelled.id)[0].outcome == Outcome.CANCELLED
    beat = store.session_heartbeat(session.id, [job.claim])
    assert beat.alive and beat.stop == (job.claim,)


def test_a_terminal_job_refuses_every_write(store: Store) -> None:
    _, job = _running(store)
    assert complete(store, job.claim, "first")
    fail = store.job_fail_many([Failure(job.claim, ErrorInfo("E", "x"))])
    assert fail.stale == (job.claim,)
    assert store.job_release_many([job.claim]).stale == (job.claim,)
    with pytest.raises(errors.StaleClaim):
        store.stream_append(job.claim, [("chunk", "x")])
    assert store.job_get(job.id).status == Status.SUCCEEDED


def test_a_repeated_completion_is_idempotent_and_the_first_result_wins(store: Store) -> None:
    _, job = _running(store)
    assert complete(store, job.claim, "first")
    assert complete(store, job.claim, "second")
    assert store.job_get(job.id).result == "first"


def test_a_batch_accepts_current_claims_and_reports_stale_ones(store: Store) -> None:
    store.job_enqueue_many([JobSpec("t", [i]) for i in range(4)])
    session = open_session(store)
    jobs = claim(store, session)
    store.job_cancel(jobs[1].id)
    ack = store.job_complete_many([Completion(j.claim, j.args[0]) for j in jobs])
    assert ack.stale == (jobs[1].claim,)
    assert set(ack.accepted) == {jobs[0].claim, jobs[2].claim, jobs[3].claim}


def test_stream_events_are_fenced_and_ordered(store: Store) -> None:
    _, job = _running(store)
    ids = store.stream_append(
        job.claim, [("chunk", "a"), ("progress", [1, 3]), ("chunk", {"t": "b"})]
    )
    assert ids == sorted(ids)
    events = store.stream_read(job.id)
    assert [(e.kind, e.data) for e in events] == [
        ("chunk", "a"),
        ("progress", [1, 3]),
        ("chunk", {"t": "b"}),
    ]
    assert store.stream_read(job.id, after=ids[0])[0].data == [1, 3]
    with pytest.raises(ValueError, match="kind"):
        store.stream_append(job.claim, [("bogus", 1)])


def test_task_writes_commit_with_the_acknowledgement(store: Store, store_url: str) -> None:
    user_table(store_url)
    store.job_enqueue_many([JobSpec("t", [i]) for i in range(3)])
    session = open_session(store)
    ok, stale, broken = claim(store, session)
    store.job_cancel(stale.id)

    def write(note: str) -> Callable[[Any], Any]:
        return lambda conn: conn.execute(
            "INSERT INTO orders (note) VALUES (%s)"
            if not store_url.startswith("sqlite")
            else "INSERT INTO orders (note) VALUES (?)",
            (note,),
        )

    def explode(conn: object) -> None:
        write("half")(conn)
        raise RuntimeError("the task's own write failed")

    ack = store.job_complete_many(
        [
            Completion(ok.claim, "ok", effects=write("ok")),
            Completion(stale.claim, "stale", effects=write("stale")),
            Completion(broken.claim, "broken", effects=explode),
        ]
    )
    assert ack.accepted == (ok.claim,) and ack.stale == (stale.claim,)
    ((failed_claim, exc),) = ack.effect_errors
    assert failed_claim == broken.claim and isinstance(exc, RuntimeError)
    assert count_orders(store_url) == 1  # only the accepted completion's write exists
    assert store.job_get(broken.id).status == Status.RUNNING  # rolled back; caller fails it
    assert store.job_get(ok.id).status == Status.SUCCEEDED
    # the acknowledgement sent again (its commit looked lost): accepted, effects not rerun
    again = store.job_complete_many([Completion(ok.claim, "ok", effects=write("ok again"))])
    assert again.accepted == (ok.claim,) and not again.effect_errors
    assert count_orders(store_url) == 1


def test_an_unserializable_result_is_refused_before_anything_is_written(store: Store) -> None:
    _, job = _running(store)
    with pytest.raises(errors.PayloadError, match=f"result of job {job.id}"):
        store.job_complete_many([Completion(job.claim, object())])
    assert store.job_get(job.id).status == Status.RUNNING


def test_a_large_batch_completes_exactly_its_current_claims(store: Store) -> None:
    """More completions than one statement takes (SQLite splits them), current claims and
    forged ones interleaved: each current one completes with its own result and run, each
    forged one is stale, and the count says which."""
    enqueue(store, *[JobSpec("t", [i]) for i in range(1203)])
    session = open_session(store)
    jobs = claim(store, session, limit=1203)
    assert len(jobs) == 1203
    completions = []
    forged = []
    for i, job in enumerate(jobs):
        if i % 97 == 5:
            bad = Claim(job.id, job.attempt + 1, job.claim.session_id)
            forged.append(bad)
            completions.append(Completion(bad, "forged"))
        completions.append(Completion(job.claim, {"n": i}, logs=(f"line {i}",)))
    ack = store.job_complete_many(completions)
    assert set(ack.stale) == set(forged) and len(ack.accepted) == 1203
    for i in (0, 5, 499, 500, 501, 1000, 1202):
        done = store.job_get(jobs[i].id)
        assert done.status == Status.SUCCEEDED and done.result == {"n": i}
        (run,) = store.job_runs(done.id)
        assert run.outcome == Outcome.SUCCEEDED and run.logs == (f"line {i}",)
