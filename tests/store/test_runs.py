"""Run history: the run that succeeds is kept on its job; every other run that ends is one
history row, written once, naming the session that ran it (migration 0006)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

import pytest

from plunder.model import Claim, Completion, ErrorInfo, Failure, JobSpec, Run
from plunder.states import Outcome, Status
from plunder.store import Store, open_store, queries
from tests.store.helpers import claim, complete, enqueue, later, open_session, raw_connect


def history_rows(url: str, job_id: int) -> list[tuple[Any, ...]]:
    """The job's rows in plunder_runs, as the table holds them."""
    return sql(
        url,
        "SELECT attempt, session_id, outcome FROM plunder_runs WHERE job_id = ? ORDER BY attempt",
        job_id,
    )


def sql(url: str, text: str, *params: Any) -> list[tuple[Any, ...]]:
    """One statement on a connection of its own, committed (``?`` placeholders)."""
    conn = raw_connect(url)
    try:
        if not url.startswith("sqlite"):
            text = text.replace("?", "%s")
        cur = conn.execute(text, params)
        rows = list(cur.fetchall()) if cur.description else []
        if not url.startswith("sqlite"):
            conn.commit()
        return rows
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


OPEN_ROW = (
    "INSERT INTO plunder_runs (job_id, attempt, session_id, worker, host, pid, started_at) "
    "SELECT id, attempt, session_id, 'old', 'host-a', 4242, started_at FROM plunder_jobs "
    "WHERE id = ?"
)


def test_a_run_row_an_earlier_plunder_opened_is_read_as_one_run_and_closed_once(
    store: Store, store_url: str
) -> None:
    """Before schema version 6 a claim wrote an open history row (outcome NULL) for each
    attempt. A job claimed then, and completed or lost now, shows one run, not two."""
    done, lost = enqueue(store, JobSpec("t", [1]), JobSpec("t", [2], max_attempts=2))
    session = open_session(store, name="old")
    first, second = claim(store, session, limit=2)
    for job in (first, second):
        sql(store_url, OPEN_ROW, job.id)
    assert [r.outcome for r in store.job_runs(done.id)] == [None]
    assert complete(store, first.claim, 1)
    assert [r.outcome for r in store.job_runs(done.id)] == [Outcome.SUCCEEDED]
    assert store.session_close(session.id, lost=True) == [lost.id]
    (run,) = store.job_runs(lost.id)
    assert (run.outcome, run.worker, run.session_id) == (Outcome.LOST, "old", session.id)
    assert history_rows(store_url, lost.id) == [(1, session.id, "lost")]


def test_a_refused_failure_after_the_tasks_own_acknowledgement_leaves_the_success(
    store: Store, store_url: str
) -> None:
    """A task's own transaction acknowledged it, then its worker reports it failed (its
    local deadline fired, or the reply to that COMMIT was lost): refused, and the run that
    succeeded stays the only run."""
    (job,) = enqueue(store, JobSpec("t", max_attempts=3))
    session = open_session(store)
    (got,) = claim(store, session)
    assert complete(store, got.claim, "done")
    failure = Failure(got.claim, ErrorInfo("TimeoutError", "late"), retry_delay=0)
    assert store.job_fail_many([failure]).stale == (got.claim,)
    assert [(r.attempt, r.outcome) for r in store.job_runs(job.id)] == [(1, Outcome.SUCCEEDED)]
    assert history_rows(store_url, job.id) == []


def test_a_batch_that_names_a_claim_twice_writes_its_run_once(store: Store, store_url: str) -> None:
    t0 = store.now()
    failed, released, late = enqueue(
        store, JobSpec("t", [1]), JobSpec("t", [2]), JobSpec("t", [3]), now=t0
    )
    session = open_session(store, expiry=5, now=t0)
    one, two, three = claim(store, session, limit=3, now=t0)
    failure = Failure(one.claim, ErrorInfo("E", "e"), retry_delay=None)
    assert store.job_fail_many([failure, failure], now=later(t0, 1)).stale == ()
    assert store.job_release_many([two.claim, two.claim], now=later(t0, 1)).stale == ()
    completion = Completion(three.claim, 3)
    ack = store.job_complete_many([completion, completion], now=later(t0, 6))  # expired
    assert ack.accepted == ()
    for job, outcome in ((failed, "failed"), (released, "released"), (late, "stale")):
        assert history_rows(store_url, job.id) == [(1, session.id, outcome)]


def test_a_run_whose_session_row_is_gone_still_names_its_worker(
    store: Store, store_url: str
) -> None:
    """A claim that committed after its session was reaped: the lost run still says who ran
    it (the claim wrote that on the job)."""
    (job,) = enqueue(store, JobSpec("t", max_attempts=2))
    session = open_session(store, name="w-7")
    claim(store, session)
    sql(store_url, "DELETE FROM plunder_sessions")
    (running,) = store.job_runs(job.id)
    assert (running.worker, running.host, running.pid) == ("w-7", "host-a", 4242)
    lease = store.lease_acquire("janitor", "j", 60)
    assert lease is not None
    assert store.session_reap_many(lease).retried == (job.id,)
    (run,) = store.job_runs(job.id)
    assert (run.outcome, run.session_id) == (Outcome.LOST, session.id)
    assert (run.worker, run.host, run.pid) == ("w-7", "host-a", 4242)


def test_an_attempt_running_across_the_upgrade_keeps_its_worker(
    empty_url: str, backend: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A job claimed under schema version 5 (an open history row, no worker on the job),
    the schema migrated to 6, then completed: its run still names its worker once the
    session is gone."""
    every = queries.migrations(backend)
    monkeypatch.setattr(queries, "migrations", lambda dialect: every[:5])
    old = open_store(empty_url)
    # today's statements stand in for the old plunder's; those that notify would look for
    # listeners in plunder_listeners, which version 5 has not
    old.notifies = False
    try:
        assert old.migrate(fresh_schema=False) == 5
    finally:
        old.close()
    now = "(julianday('now') - 2440587.5) * 86400.0" if backend == "sqlite" else "now()"
    # a session as version 5 wrote it (today's session_open names later columns)
    queues = '["default"]' if backend == "sqlite" else "{default}"
    expires = f"{now} + " + ("30" if backend == "sqlite" else "interval '30 seconds'")
    sql(
        empty_url,
        "INSERT INTO plunder_sessions (id, name, host, pid, queues, expiry, started_at, "
        f"heartbeat_at, expires_at) VALUES ('s5', 'worker-1', 'host-a', 4242, ?, 30, {now}, "
        f"{now}, {expires})",
        queues,
    )
    session_id = "s5"
    # the job as version 5 stored it (today's enqueue writes columns it lacks), claimed
    ((job_id,),) = sql(
        empty_url,
        "INSERT INTO plunder_jobs (queue, task, status, attempt, session_id, run_at, "
        f"created_at, started_at) VALUES ('default', 't', 'running', 1, ?, {now}, {now}, {now}) "
        "RETURNING id",
        session_id,
    )
    sql(empty_url, OPEN_ROW, job_id)
    monkeypatch.undo()
    store = open_store(empty_url)
    try:
        assert store.migrate() == len(every)
        assert complete(store, Claim(job_id, 1, session_id), "ok")
        store.session_close(session_id)
        (run,) = store.job_runs(job_id)
        assert (run.outcome, run.worker, run.host, run.pid) == (
            Outcome.SUCCEEDED,
            "old",  # as the open row has it
            "host-a",
            4242,
        )
    finally:
        store.close()
