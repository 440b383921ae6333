"""Turns sent ahead, ``Store.turn_pipe()``: a worker's turn (completions and a claim) sent
on a connection the pipe holds, committed by the database as soon as it has run it, and
read later. SQLite has none; on PostgreSQL a turn through the pipe is fenced and claims
exactly as ``job_exchange_many`` does."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from datetime import UTC

import psycopg
import pytest

import plunder
from plunder import errors
from plunder.graph import Edge
from plunder.model import Claim, Completion, JobSpec, Session
from plunder.states import Status
from plunder.store import Store
from plunder.store.postgres import turns
from plunder.store.turnpipe import TurnPipe
from tests.store.helpers import claim, open_session


@pytest.fixture
def pipe(store: Store) -> Iterator[TurnPipe]:
    made = store.turn_pipe()
    if made is None:
        assert store.dialect == "sqlite"
        pytest.skip("SQLite has no turns sent ahead")
    try:
        yield made
    finally:
        made.close()


def send(pipe: TurnPipe, session: Session, done: list[Claim], *, limit: int = 10) -> None:
    sent = pipe.send(
        [Completion(c, {"job": c.job_id}) for c in done],
        session_id=session.id,
        queues=["default"],
        tasks=["t"],
        limit=limit,
        take_suspect=True,
    )
    assert sent


def running(url: str) -> int:
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute("SELECT count(*) FROM plunder_jobs WHERE status = 'running'").fetchone()
        assert row is not None
        return int(row[0])


def test_sqlite_has_no_pipe_and_neither_has_a_pool_of_one(store_url: str) -> None:
    one = plunder.open_store(store_url, pool_size=1)
    try:
        assert one.turn_pipe() is None
    finally:
        one.close()


def test_turns_through_the_pipe_complete_and_claim_in_order(store: Store, pipe: TurnPipe) -> None:
    store.job_enqueue_many([JobSpec("t", [i]) for i in range(5)])
    session = open_session(store)
    assert pipe.sent_at is None
    send(pipe, session, [], limit=2)
    assert pipe.sent_at is not None
    answer = pipe.receive()
    assert pipe.sent_at is None
    assert answer.claimed == 2
    first = answer.jobs()
    assert [j.args for j in first] == [[0], [1]]
    assert answer.settle().accepted == ()
    for job in first:
        assert job.status == Status.RUNNING and job.attempt == 1
        assert job.claim.session_id == session.id
    send(pipe, session, [j.claim for j in first], limit=2)
    answer = pipe.receive()
    assert answer.settle().accepted == tuple(j.claim for j in first)
    assert [j.args for j in answer.jobs()] == [[2], [3]]
    for job in first:
        done = store.job_get(job.id)
        assert done.status == Status.SUCCEEDED and done.result == {"job": job.id}


def test_a_resting_pipe_keeps_its_connection_for_the_next_claim(
    store: Store, pipe: TurnPipe
) -> None:
    """Nothing in flight, the worker idle: the pipe keeps its connection, in pipeline mode,
    so that the next claim goes out at once (no pool checkout, no mode to enter); close()
    gives it back. One job claimed alone comes back whole."""
    pool = store.driver.pool()  # type: ignore[attr-defined]
    session = open_session(store)
    store.job_enqueue_many([JobSpec("t", [0], kwargs={"k": "v"}, priority=3)])
    send(pipe, session, [], limit=4)
    answer = pipe.receive()
    pipe.rest()
    held = pool.get_stats()["pool_available"]
    (job,) = answer.jobs()
    assert (job.args, job.kwargs, job.priority, job.attempt) == ([0], {"k": "v"}, 3, 1)
    store.job_enqueue_many([JobSpec("t", [1])])
    send(pipe, session, [job.claim], limit=4)
    answer = pipe.receive()
    assert [j.args for j in answer.jobs()] == [[1]]
    assert answer.settle().accepted == (job.claim,)
    pipe.rest()
    assert pool.get_stats()["pool_available"] == held
    pipe.close()
    assert pool.get_stats()["pool_available"] == held + 1


def test_a_turn_commits_before_its_answer_is_read(
    store: Store, store_url: str, pipe: TurnPipe
) -> None:
    """The point of the pipe: the database runs and commits the turn while the worker does
    something else; another connection sees its claims before ``receive()``."""
    store.job_enqueue_many([JobSpec("t", [i]) for i in range(3)])
    session = open_session(store)
    send(pipe, session, [], limit=3)
    deadline = time.monotonic() + 10
    while running(store_url) < 3:
        assert time.monotonic() < deadline, "the turn did not commit before it was read"
        time.sleep(0.01)
    assert pipe.receive().claimed == 3


def test_a_pipe_turn_refuses_stale_completions_and_still_claims(
    store: Store, pipe: TurnPipe
) -> None:
    store.job_enqueue_many([JobSpec("t", [i]) for i in range(4)])
    session = open_session(store)
    jobs = claim(store, session, limit=2)
    store.job_cancel(jobs[1].id)
    forged = Claim(jobs[0].id, jobs[0].attempt + 1, session.id)
    send(pipe, session, [jobs[0].claim, jobs[1].claim, forged], limit=2)
    answer = pipe.receive()
    settled = answer.settle()
    assert settled.accepted == (jobs[0].claim,)
    assert set(settled.stale) == {jobs[1].claim, forged}
    assert [j.args for j in answer.jobs()] == [[2], [3]]


def test_a_turn_of_a_closed_session_claims_nothing_and_says_so(
    store: Store, pipe: TurnPipe
) -> None:
    store.job_enqueue_many([JobSpec("t", [1])])
    session = open_session(store)
    store.session_close(session.id)
    send(pipe, session, [])
    answer = pipe.receive()
    assert answer.claimed == 0 and answer.jobs() == []
    with pytest.raises(errors.SessionGone):
        answer.settle()
    assert store.job_list().jobs[0].status == Status.PENDING


def test_a_cut_turn_fails_busy_and_the_next_one_goes_on_a_fresh_connection(
    store: Store, store_url: str, pipe: TurnPipe
) -> None:
    store.job_enqueue_many([JobSpec("t", [i]) for i in range(4)])
    session = open_session(store)
    send(pipe, session, [], limit=1)
    assert pipe.receive().claimed == 1  # the pipe's connection is open
    (held,) = claim(store, session, limit=1)
    with psycopg.connect(store_url) as blocker:  # the turn waits on this lock: in flight
        blocker.execute("SELECT 1 FROM plunder_jobs WHERE id = %s FOR UPDATE", (held.id,))
        send(pipe, session, [held.claim], limit=1)
        cut: list[int] = []  # by another thread, as a worker's heartbeat would
        cutter = threading.Thread(target=lambda: cut.append(store.calls_cut("the test cut it")))
        cutter.start()
        cutter.join()
        assert cut == [1]
        with pytest.raises(errors.StoreBusy, match="the test cut it"):
            pipe.receive()
        blocker.rollback()
    assert pipe.sent_at is None
    send(pipe, session, [held.claim], limit=1)  # sent again: accepted, committed before or not
    answer = pipe.receive()
    assert answer.claimed == 1 and answer.settle().accepted == (held.claim,)
    assert store.job_get(held.id).status == Status.SUCCEEDED


def test_a_turn_the_server_refuses_raises_the_stores_error_and_ends_its_connection(
    store: Store, store_url: str, pipe: TurnPipe
) -> None:
    """The server's error for a turn (its SQLSTATE read from the result) is the store's
    error, as for any statement; the next turn goes on another connection."""
    store.job_enqueue_many([JobSpec("t", [0])])
    session = open_session(store)
    with psycopg.connect(store_url, autocommit=True) as admin:
        admin.execute("ALTER TABLE plunder_jobs RENAME TO plunder_jobs_away")
        try:
            send(pipe, session, [])
            with pytest.raises(errors.SchemaError, match="no plunder schema"):
                pipe.receive()
        finally:
            admin.execute("ALTER TABLE plunder_jobs_away RENAME TO plunder_jobs")
    assert pipe.in_flight == 0 and pipe._conn is None  # type: ignore[attr-defined]
    send(pipe, session, [])
    assert pipe.receive().claimed == 1


def test_an_answer_is_read_after_its_connection_is_gone(store: Store, pipe: TurnPipe) -> None:
    """A turn's rows are read into records after the caller moved on: the pipe may have
    closed the connection the answer came on by then."""
    store.job_enqueue_many([JobSpec("t", [i]) for i in range(2)])
    session = open_session(store)
    send(pipe, session, [], limit=2)
    answer = pipe.receive()
    pipe.close(discard=True)
    assert [j.args for j in answer.jobs()] == [[0], [1]]
    assert all(j.started_at.tzinfo is UTC for j in answer.jobs())  # as psycopg reads them


def test_closing_with_a_turn_in_flight_gives_the_connection_back(
    store: Store, pipe: TurnPipe
) -> None:
    store.job_enqueue_many([JobSpec("t", [i]) for i in range(2)])
    session = open_session(store)
    send(pipe, session, [], limit=1)
    pipe.close()
    assert pipe.sent_at is None
    assert len(store.job_list().jobs) == 2  # the pool serves on
    send(pipe, session, [], limit=1)  # and the pipe opens another connection
    assert pipe.receive().claimed == 1  # the turn never read claimed one or none


def test_up_to_three_turns_at_a_time_and_only_plain_completions(
    store: Store, pipe: TurnPipe
) -> None:
    session = open_session(store)
    with pytest.raises(RuntimeError, match="no turn is in flight"):
        pipe.receive()
    assert pipe.depth == 3
    for _ in range(3):
        send(pipe, session, [])
    with pytest.raises(RuntimeError, match="3 turns are in flight already"):
        send(pipe, session, [])
    for _ in range(3):
        pipe.receive()
    with pytest.raises(ValueError, match="claim limit"):
        send(pipe, session, [], limit=0)
    effects = Completion(Claim(1, 1, session.id), None, effects=lambda conn: None)
    with pytest.raises(ValueError, match="effects"):
        pipe.send(
            [effects], session_id=session.id, queues=["default"], tasks=["t"], limit=1,
            take_suspect=False,
        )  # fmt: skip
    assert pipe.in_flight == 0


def test_three_turns_in_flight_commit_in_order_and_are_read_one_at_a_time(
    store: Store, store_url: str, pipe: TurnPipe
) -> None:
    store.job_enqueue_many([JobSpec("t", [i]) for i in range(7)])
    session = open_session(store)
    send(pipe, session, [], limit=2)
    first_sent = pipe.sent_at
    send(pipe, session, [], limit=3)
    send(pipe, session, [], limit=1)
    assert pipe.in_flight == 3 and pipe.claiming == 6 and pipe.sent_at == first_sent
    deadline = time.monotonic() + 10
    while running(store_url) < 6:  # all committed, none read
        assert time.monotonic() < deadline, "the turns did not commit before they were read"
        time.sleep(0.01)
    assert pipe.answered()
    first = pipe.receive()
    assert (first.claimed, first.limit) == (2, 2) and pipe.in_flight == 2
    assert pipe.sent_at is not None and pipe.sent_at > first_sent
    second_sent = pipe.sent_at
    second = pipe.receive()
    assert (second.claimed, second.limit) == (3, 3) and pipe.in_flight == 1
    assert pipe.sent_at is not None and pipe.sent_at > second_sent
    third = pipe.receive()
    assert (third.claimed, third.limit) == (1, 1) and pipe.in_flight == 0
    assert [j.args for j in first.jobs()] == [[0], [1]]
    assert [j.args for j in second.jobs()] == [[2], [3], [4]]
    assert [j.args for j in third.jobs()] == [[5]]
    assert not pipe.answered() and pipe.sent_at is None and pipe.claiming == 0


def test_the_first_turn_is_read_while_the_second_still_runs(
    store: Store, store_url: str, pipe: TurnPipe
) -> None:
    """Reading the oldest turn never waits for the one sent after it."""
    store.job_enqueue_many([JobSpec("t", [i]) for i in range(4)])
    session = open_session(store)
    (held,) = claim(store, session, limit=1)
    with psycopg.connect(store_url) as blocker:  # the second turn waits on this lock
        blocker.execute("SELECT 1 FROM plunder_jobs WHERE id = %s FOR UPDATE", (held.id,))
        send(pipe, session, [], limit=1)
        send(pipe, session, [held.claim], limit=1)
        assert pipe.completions() == [Completion(held.claim, {"job": held.id})]
        first = pipe.receive()  # returns while the second is stuck behind the lock
        assert first.claimed == 1 and pipe.in_flight == 1
        time.sleep(0.2)
        assert not pipe.answered()
        blocker.rollback()
    second = pipe.receive()
    assert second.claimed == 1 and second.settle().accepted == (held.claim,)
    assert second.completions == [Completion(held.claim, {"job": held.id})]
    assert store.job_get(held.id).status == Status.SUCCEEDED


def blocked_by(observer: psycopg.Connection[object], blocker: psycopg.Connection[object]) -> int:
    """How many server backends wait for a lock that ``blocker`` holds."""
    row = observer.execute(
        "SELECT count(*) FROM pg_stat_activity WHERE %s = ANY(pg_blocking_pids(pid))",
        (blocker.info.backend_pid,),
    ).fetchone()
    assert row is not None
    return int(row[0])


def test_three_turns_go_ahead_and_two_are_read_while_the_third_runs_on_the_server(
    store_url: str,
) -> None:
    """Turns really go ahead, whatever psycopg's version: three are in flight before any
    is read, the server runs the third (it waits there on a row lock) before the first
    answer is read, and the first two answers are read while it still waits. A pipe that
    sent one turn at a time, held turns back until read, or read every answer at once
    would fail here (the last within the store's call deadline, not the test's timeout)."""
    if not store_url.startswith("postgres"):
        pytest.skip("SQLite has no turns sent ahead")
    store = plunder.open_store(store_url, call_timeout=10.0)
    pipe = store.turn_pipe()
    assert pipe is not None and pipe.depth == 3
    try:
        store.job_enqueue_many([JobSpec("t", [i]) for i in range(4)])
        session = open_session(store)
        (held,) = claim(store, session, limit=1)
        with (
            psycopg.connect(store_url, autocommit=True) as observer,
            psycopg.connect(store_url) as blocker,
        ):
            blocker.execute("SELECT 1 FROM plunder_jobs WHERE id = %s FOR UPDATE", (held.id,))
            send(pipe, session, [], limit=1)
            send(pipe, session, [], limit=1)
            send(pipe, session, [held.claim], limit=1)  # waits on the lock, on the server
            assert pipe.in_flight == 3
            deadline = time.monotonic() + 10
            while blocked_by(observer, blocker) != 1:
                assert time.monotonic() < deadline, "the third turn never reached the server"
                time.sleep(0.01)
            first, second = pipe.receive(), pipe.receive()
            assert (first.claimed, second.claimed, pipe.in_flight) == (1, 1, 1)
            assert blocked_by(observer, blocker) == 1  # the third still waits there
            assert not pipe.answered()
            blocker.rollback()
        third = pipe.receive()
        assert third.settle().accepted == (held.claim,)
        assert [j.args for j in first.jobs() + second.jobs() + third.jobs()] == [[1], [2], [3]]
    finally:
        pipe.close()
        store.close()


def test_a_cut_turn_takes_the_turn_after_it_along_and_close_returns_their_results(
    store: Store, store_url: str, pipe: TurnPipe
) -> None:
    store.job_enqueue_many([JobSpec("t", [i]) for i in range(4)])
    session = open_session(store)
    held, other = claim(store, session, limit=2)
    with psycopg.connect(store_url) as blocker:
        blocker.execute("SELECT 1 FROM plunder_jobs WHERE id = %s FOR UPDATE", (held.id,))
        send(pipe, session, [held.claim], limit=1)
        send(pipe, session, [other.claim], limit=1)
        assert [c.claim for c in pipe.close()] == [held.claim, other.claim]  # never read
        assert pipe.in_flight == 0
        send(pipe, session, [held.claim], limit=1)
        send(pipe, session, [other.claim], limit=1)
        cutter = threading.Thread(target=store.calls_cut, args=("the test cut it",))
        cutter.start()
        cutter.join()
        with pytest.raises(errors.StoreBusy, match="the test cut it"):
            pipe.receive()
        assert pipe.in_flight == 0 and pipe.completions() == []
        blocker.rollback()
    send(pipe, session, [held.claim, other.claim], limit=1)  # sent again, on a fresh one
    answer = pipe.receive()
    assert set(answer.settle().accepted) == {held.claim, other.claim}


def plan_of_turn(conn: psycopg.Connection[object]) -> str:
    """The plan the connection keeps for the turn it prepared (its generic plan), as text."""
    (name, types) = conn.execute(
        "SELECT name, cardinality(parameter_types) FROM pg_prepared_statements"
        " WHERE statement LIKE '%%plunder_done%%' AND statement LIKE '%%picked%%'"
    ).fetchone() or (None, 0)
    assert name is not None, "the turn was not prepared on its connection"
    nulls = ", ".join(["NULL"] * int(types))
    rows = conn.execute(f"EXPLAIN EXECUTE {name}({nulls})").fetchall()
    return "\n".join(str(r[0]) for r in rows)


def test_a_turn_planned_on_an_empty_table_finds_its_jobs_by_index_once_it_fills(
    store: Store, pipe: TurnPipe
) -> None:
    """The turn is prepared at its first run on a connection, and that plan serves the
    connection from then on: made while the jobs table was empty, it must still read the
    table through its indexes, not scan it whole at every turn once it holds jobs. The
    connection goes back to the pool with the server's own planner setting."""
    session = open_session(store)
    send(pipe, session, [])  # the queue is empty: the turn is planned for an empty table
    assert pipe.receive().claimed == 0
    store.job_enqueue_many([JobSpec("t", [i]) for i in range(2_000)])
    send(pipe, session, [], limit=50)
    answer = pipe.receive()
    assert answer.claimed == 50
    send(pipe, session, [j.claim for j in answer.jobs()], limit=50)
    answer = pipe.receive()
    assert len(answer.settle().accepted) == 50
    conn = pipe._conn  # type: ignore[attr-defined]
    assert conn is not None
    pipe.close()
    assert conn.execute("SHOW enable_seqscan").fetchone() == ("on",)
    plan = plan_of_turn(conn)
    assert "Index Scan using plunder_jobs_pkey on plunder_jobs" in plan, plan
    assert "Seq Scan on plunder_jobs" not in plan, plan


def prepared_turns(store: Store) -> list[tuple[int, bool]]:
    """On each connection of the pool (held together, so each is another): how many turn
    statements the server has prepared there (under plunder's own name), and whether
    plunder recorded it as planned by its indexes."""
    pool = store.driver.pool()  # type: ignore[attr-defined]
    held = [pool.getconn() for _ in range(store.driver.pool_size)]  # type: ignore[attr-defined]
    try:
        seen = []
        for conn in held:
            names = conn.execute(
                "SELECT name FROM pg_prepared_statements WHERE statement LIKE %s",
                ("%done AS(%",),
            ).fetchall()
            assert all(name == (turns.STATEMENT,) for name in names), names
            seen.append((len(names), turns.STATEMENT in conn.index_planned))
        return seen
    finally:
        for conn in held:
            pool.putconn(conn)


def test_ready_prepares_the_turn_on_every_pooled_connection_and_claims_nothing(
    store: Store, pipe: TurnPipe
) -> None:
    """As a worker starts, its turns' statement is prepared on each connection the pipe
    may hold, by a turn that names no session: nothing is claimed or written. The turns
    after it run that same prepared statement (the same parameter types: a second one
    prepared would mean the first turn of each connection still parsed and planned)."""
    jobs = store.job_enqueue_many([JobSpec("t", [i]) for i in range(3)])
    size = store.driver.pool_size  # type: ignore[attr-defined]
    assert size >= 2
    assert pipe.ready(queues=["default"], tasks=["t"]) == size
    assert prepared_turns(store) == [(1, True)] * size
    assert {j.id: store.job_get(j.id).status for j in jobs} == {j.id: Status.PENDING for j in jobs}
    session = open_session(store)
    send(pipe, session, [], limit=2)
    first = pipe.receive()
    send(pipe, session, [j.claim for j in first.jobs()], limit=2)
    second = pipe.receive()
    assert second.settle().accepted == tuple(j.claim for j in first.jobs())
    assert [j.args for j in second.jobs()] == [[2]]
    pipe.close()
    assert prepared_turns(store) == [(1, True)] * size


def test_a_turn_that_completes_a_parent_says_its_children_may_be_pending(
    store: Store, pipe: TurnPipe
) -> None:
    """Its claim read the statement's snapshot, before the children were pending: the
    answer says so, and the next turn claims them."""
    ids = store.flow_enqueue([JobSpec("t", [0]), JobSpec("t", [1])], [Edge(0, 1)])
    session = open_session(store)
    send(pipe, session, [])
    answer = pipe.receive()
    (parent,) = answer.jobs()
    assert parent.id == ids[0] and not answer.children
    send(pipe, session, [parent.claim])
    answer = pipe.receive()
    assert answer.settle().accepted == (parent.claim,)
    assert answer.claimed == 0 and answer.children
    send(pipe, session, [])
    answer = pipe.receive()
    assert [j.id for j in answer.jobs()] == [ids[1]] and not answer.children
