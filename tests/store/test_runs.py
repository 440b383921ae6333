"""Run history: the run that succeeds is kept on its job; every other run that ends is one
history row, written once, naming the session that ran it (migration 0006)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from plunder.model import Claim, Completion, ErrorInfo, Failure, JobSpec, Run
from plunder.states import Outcome, Status
from plunder.store import Store
from tests.store.helpers import claim, complete, enqueue, later, open_session, raw_connect


def history_rows(url: str, job_id: int) -> list[tuple[Any, ...]]:
    """The job's rows in plunder_runs, as the table holds them."""
    conn = raw_connect(url)
    try:
        placeholder = "?" if url.startswith("sqlite") else "%s"
        return list(
            conn.execute(
                "SELECT attempt, session_id, outcome FROM plunder_runs "
                f"WHERE job_id = {placeholder} ORDER BY attempt",
                (job_id,),
            ).fetchall()
        )
    finally:
        conn.close()


def close_to(a: datetime | None, b: datetime) -> bool:
    return a is not None and abs((a - b).total_seconds()) < 0.01


def test_a_job_that_succeeds_writes_no_history_row_and_keeps_its_run(
    store: Store, store_url: str
) -> None:
    t0 = store.now()
    (job,) = enqueue(store, JobSpec("t"), now=t0)
    session = open_session(store, name="w-9", now=t0)
    (got,) = claim(store, session, now=later(t0, 1))
    (running,) = store.job_runs(job.id)  # read from the job and its session while it runs
    assert (running.attempt, running.session_id) == (1, session.id)
    assert (running.worker, running.host, running.pid) == ("w-9", "host-a", 4242)
    assert close_to(running.started_at, later(t0, 1))
    assert running.outcome is None and running.finished_at is None and running.logs == ()
    ack = store.job_complete_many([Completion(got.claim, 7, logs=("one", "two"))], now=later(t0, 3))
    assert ack.accepted == (got.claim,)
    assert history_rows(store_url, job.id) == []
    store.session_close(session.id)  # the run outlives the session that ran it
    (run,) = store.job_runs(job.id)
    assert run == Run(
        job_id=job.id,
        attempt=1,
        session_id=session.id,
        worker="w-9",
        host="host-a",
        pid=4242,
        started_at=run.started_at,
        finished_at=run.finished_at,
        outcome=Outcome.SUCCEEDED,
        error=None,
        logs=("one", "two"),
    )
    assert close_to(run.started_at, later(t0, 1)) and close_to(run.finished_at, later(t0, 3))
    assert run.duration is not None and abs(run.duration - 2.0) < 0.01


def test_each_run_that_ends_otherwise_is_one_row_naming_its_own_session(
    store: Store, store_url: str
) -> None:
    """Failed, lost and timed out: each of these takes the session off the job it sends back
    to pending; the history row still names the session, worker and start of that run."""
    t0 = store.now()
    (job,) = enqueue(store, JobSpec("t", max_attempts=5, timeout=10), now=t0)
    lease = store.lease_acquire("janitor", "j", 600, now=t0)
    assert lease is not None
    first = open_session(store, name="w-1", expiry=300, now=t0)
    (one,) = claim(store, first, now=t0)
    error = ErrorInfo("KeyError", "k")
    store.job_fail_many([Failure(one.claim, error, retry_delay=0)], now=later(t0, 1))
    dying = open_session(store, name="w-2", expiry=5, now=later(t0, 2))
    assert claim(store, dying, now=later(t0, 2))[0].attempt == 2
    assert store.session_reap_many(lease, now=later(t0, 8)).retried == (job.id,)
    slow = open_session(store, name="w-3", expiry=300, now=later(t0, 9))
    assert claim(store, slow, now=later(t0, 9))[0].attempt == 3
    assert store.job_timeout_many(lease, now=later(t0, 20)).retried == (job.id,)
    (four,) = claim(store, slow, now=later(t0, 21))
    assert four.attempt == 4
    runs = store.job_runs(job.id)
    assert [(r.attempt, r.session_id, r.worker, r.outcome) for r in runs] == [
        (1, first.id, "w-1", Outcome.FAILED),
        (2, dying.id, "w-2", Outcome.LOST),
        (3, slow.id, "w-3", Outcome.TIMED_OUT),
        (4, slow.id, "w-3", None),  # running: no row yet
    ]
    starts = [later(t0, 0), later(t0, 2), later(t0, 9), later(t0, 21)]
    ends = [later(t0, 1), later(t0, 8), later(t0, 20), None]
    for run, start, end in zip(runs, starts, ends, strict=True):
        assert close_to(run.started_at, start)
        assert (run.finished_at is None) if end is None else close_to(run.finished_at, end)
    assert [r[:2] for r in history_rows(store_url, job.id)] == [
        (1, first.id),
        (2, dying.id),
        (3, slow.id),
    ]


def test_release_and_cancel_write_a_row_only_for_a_run_that_was_running(
    store: Store, store_url: str
) -> None:
    t0 = store.now()
    released, cancelled, never_ran = enqueue(
        store, JobSpec("t", [1]), JobSpec("t", [2]), JobSpec("t", [3]), now=t0
    )
    session = open_session(store, now=t0)
    first, second = claim(store, session, limit=2, now=later(t0, 1))
    assert store.job_release_many([first.claim], now=later(t0, 2)).accepted == (first.claim,)
    store.job_cancel(cancelled.id, now=later(t0, 3))
    store.job_cancel(never_ran.id, now=later(t0, 3))
    (run,) = store.job_runs(released.id)
    assert (run.outcome, run.session_id) == (Outcome.RELEASED, session.id)
    assert close_to(run.started_at, later(t0, 1)) and close_to(run.finished_at, later(t0, 2))
    (run,) = store.job_runs(cancelled.id)
    assert (run.outcome, run.session_id) == (Outcome.CANCELLED, session.id)
    assert close_to(run.started_at, later(t0, 1))
    assert store.job_runs(never_ran.id) == []
    assert history_rows(store_url, never_ran.id) == []
    assert not complete(store, second.claim, "late")  # refused: its run is closed already
    assert [r.outcome for r in store.job_runs(cancelled.id)] == [Outcome.CANCELLED]


def test_a_refusal_for_a_claim_the_session_never_held_writes_no_row(
    store: Store, store_url: str
) -> None:
    (job,) = enqueue(store, JobSpec("t"))
    session = open_session(store)
    other = open_session(store, name="w-other")
    (got,) = claim(store, session)
    forged = Claim(got.id, got.attempt, other.id)
    assert not complete(store, forged, "mine")
    failed = store.job_fail_many([Failure(forged, ErrorInfo("E", "e"), retry_delay=None)])
    assert failed.stale == (forged,)
    assert history_rows(store_url, job.id) == []
    assert complete(store, got.claim, "theirs")
    assert [(r.session_id, r.outcome) for r in store.job_runs(job.id)] == [
        (session.id, Outcome.SUCCEEDED)
    ]
    assert store.job_get(job.id).status == Status.SUCCEEDED


def test_a_run_row_an_earlier_plunder_opened_is_read_as_one_run_and_closed_once(
    store: Store, store_url: str
) -> None:
    """Before schema version 6 a claim wrote an open history row (outcome NULL) for each
    attempt. A job claimed then, and completed or lost now, shows one run, not two."""
    done, lost = enqueue(store, JobSpec("t", [1]), JobSpec("t", [2], max_attempts=2))
    session = open_session(store, name="old")
    first, second = claim(store, session, limit=2)
    conn = raw_connect(store_url)
    try:
        p = "?" if store_url.startswith("sqlite") else "%s"
        for job in (first, second):
            conn.execute(
                "INSERT INTO plunder_runs (job_id, attempt, session_id, worker, host, pid, "
                f"started_at) SELECT id, attempt, session_id, 'old', 'host-a', 4242, started_at "
                f"FROM plunder_jobs WHERE id = {p}",
                (job.id,),
            )
        if not store_url.startswith("sqlite"):
            conn.commit()
    finally:
        conn.close()
    assert [r.outcome for r in store.job_runs(done.id)] == [None]
    assert complete(store, first.claim, 1)
    assert [r.outcome for r in store.job_runs(done.id)] == [Outcome.SUCCEEDED]
    assert store.session_close(session.id, lost=True) == [lost.id]
    (run,) = store.job_runs(lost.id)
    assert (run.outcome, run.worker, run.session_id) == (Outcome.LOST, "old", session.id)
    assert history_rows(store_url, lost.id) == [(1, session.id, "lost")]
