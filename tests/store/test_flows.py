"""Workflows in the store (every backend): a graph in one transaction, children claimable
in the transaction that ends their last parent, the failure policy of each edge, cancel,
and bad graphs refused before anything is stored."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from plunder import errors
from plunder.graph import Edge
from plunder.model import Completion, ErrorInfo, Failure, JobSpec
from plunder.states import Status
from plunder.store import Store
from tests.store.helpers import claim, complete, open_session, raw_connect

DIAMOND = [Edge(0, 1), Edge(0, 2), Edge(1, 3), Edge(2, 3)]


def _specs(count: int) -> list[JobSpec]:
    return [JobSpec("t", [i]) for i in range(count)]


def _status(store: Store, job_id: int) -> Status:
    return store.job_get(job_id).status


def _fail(store: Store, record: object) -> None:
    error = ErrorInfo("RuntimeError", "boom")
    ack = store.job_fail_many([Failure(record.claim, error, retry_delay=None)])  # type: ignore[attr-defined]
    assert ack.accepted


def test_a_diamond_runs_in_order_and_d_sees_b_and_c(store: Store) -> None:
    a, b, c, d = store.flow_enqueue(_specs(4), DIAMOND)
    assert [_status(store, i) for i in (a, b, c, d)] == [
        Status.PENDING, Status.WAITING, Status.WAITING, Status.WAITING,
    ]  # fmt: skip
    session = open_session(store)
    (got,) = claim(store, session)
    assert got.id == a
    assert complete(store, got.claim, "a")
    # claimable in the transaction that completed A: nothing else ran in between
    got = claim(store, session)
    assert sorted(j.id for j in got) == [b, c]
    assert _status(store, d) == Status.WAITING
    by_id = {j.id: j for j in got}
    assert complete(store, by_id[b].claim, {"b": 2})
    assert _status(store, d) == Status.WAITING and claim(store, session) == []
    assert complete(store, by_id[c].claim, [3])
    (last,) = claim(store, session)
    assert last.id == d
    assert store.job_parent_results(d) == {b: ("succeeded", {"b": 2}), c: ("succeeded", [3])}
    state = store.flow_get(b)
    assert [j.id for j in state.jobs] == [a, b, c, d]
    assert state.parents(d) == [b, c] and state.children(a) == [b, c]


@pytest.mark.parametrize(
    ("policy", "ends"),
    [("skip", Status.SKIPPED), ("fail", Status.FAILED), ("run", Status.SUCCEEDED)],
)
def test_a_failing_b_with_each_policy(store: Store, policy: str, ends: Status) -> None:
    edges = [Edge(0, 1), Edge(0, 2), Edge(1, 3, policy), Edge(2, 3, policy)]
    _, b, c, d = store.flow_enqueue(_specs(4), edges)
    session = open_session(store)
    (got,) = claim(store, session)
    complete(store, got.claim, "a")
    by_id = {j.id: j for j in claim(store, session)}
    _fail(store, by_id[b])
    if policy == "run":
        assert _status(store, d) == Status.WAITING  # still waits for C
    else:
        assert _status(store, d) == ends  # at once, in the failing transaction
        record = store.job_get(d)
        assert record.error is not None and record.error["type"] == "plunder.ParentFailed"
        assert f"parent job {b} ended failed" in record.error["message"]
    complete(store, by_id[c].claim, "c")
    if policy == "run":
        (got_d,) = claim(store, session)
        assert store.job_parent_results(d) == {b: ("failed", None), c: ("succeeded", "c")}
        complete(store, got_d.claim, "d")
    assert _status(store, d) == ends
    assert claim(store, session) == []


def test_a_skip_cascades_down_a_chain(store: Store) -> None:
    a, b, c = store.flow_enqueue(_specs(3), [Edge(0, 1), Edge(1, 2)])
    session = open_session(store)
    (got,) = claim(store, session)
    _fail(store, got)
    assert [_status(store, i) for i in (a, b, c)] == [
        Status.FAILED, Status.SKIPPED, Status.SKIPPED,
    ]  # fmt: skip


def test_cancelling_a_workflow_cancels_what_has_not_started(store: Store) -> None:
    a, b, c, d = store.flow_enqueue(_specs(4), DIAMOND)
    session = open_session(store)
    (got,) = claim(store, session)
    assert got.id == a
    cancelled = store.flow_cancel(d)
    assert cancelled == [b, c, d]
    assert _status(store, a) == Status.RUNNING  # it runs on
    assert complete(store, got.claim, "a")
    assert [_status(store, i) for i in (b, c, d)] == [Status.CANCELLED] * 3
    assert claim(store, session) == []


def test_a_job_may_wait_for_jobs_enqueued_before(store: Store) -> None:
    session = open_session(store)
    (done,) = store.flow_enqueue(_specs(1), [])
    (running,) = store.flow_enqueue(_specs(1), [])
    first = {j.id: j for j in claim(store, session)}
    complete(store, first[done].claim, "early")
    (child,) = store.flow_enqueue(
        _specs(1), [Edge(done, 0, new=False), Edge(running, 0, new=False)]
    )
    assert _status(store, child) == Status.WAITING
    complete(store, first[running].claim, "late")
    (got,) = claim(store, session)
    assert got.id == child
    assert store.job_parent_results(child) == {
        done: ("succeeded", "early"), running: ("succeeded", "late"),
    }  # fmt: skip


def test_a_parent_failed_before_skips_the_child_at_once(store: Store) -> None:
    session = open_session(store)
    (parent,) = store.flow_enqueue(_specs(1), [])
    (got,) = claim(store, session)
    _fail(store, got)
    skipped, after = store.flow_enqueue(_specs(2), [Edge(parent, 0, new=False), Edge(0, 1)])
    assert _status(store, skipped) == Status.SKIPPED
    assert _status(store, after) == Status.SKIPPED
    (ran,) = store.flow_enqueue(_specs(1), [Edge(parent, 0, "run", new=False)])
    assert _status(store, ran) == Status.PENDING


def test_bad_graphs_are_refused_and_store_nothing(store: Store) -> None:
    before = store.job_list(limit=1000).jobs
    with pytest.raises(errors.JobNotFound, match="unknown parent"):
        store.flow_enqueue(_specs(2), [Edge(0, 1), Edge(987654, 1, new=False)])
    with pytest.raises(ValueError, match="cycle through its jobs \\[0, 1, 2\\]"):
        store.flow_enqueue(_specs(3), [Edge(0, 1), Edge(1, 2), Edge(2, 0)])
    with pytest.raises(ValueError, match="waits for itself"):
        store.flow_enqueue(_specs(1), [Edge(0, 0)])
    with pytest.raises(ValueError, match="on_failure must be one of"):
        store.flow_enqueue(_specs(2), [Edge(0, 1, "ignore")])
    with pytest.raises(ValueError, match="not one of the 2 jobs"):
        store.flow_enqueue(_specs(2), [Edge(0, 5)])
    with pytest.raises(ValueError, match="cannot have an idempotency key"):
        store.flow_enqueue([JobSpec("t"), JobSpec("t", key="k")], [Edge(0, 1)])
    assert store.job_list(limit=1000).jobs == before


def test_parents_ending_at_once_in_two_transactions_release_the_child_once(
    store: Store, store_url: str
) -> None:
    """B's completion is held open in a transaction of its own while C's commits in
    another: C's waits for B's (the child's row), and the child counts both."""
    _a, b, c, d = store.flow_enqueue(_specs(4), DIAMOND)
    session = open_session(store)
    complete(store, claim(store, session)[0].claim, "a")
    by_id = {j.id: j for j in claim(store, session)}
    conn = raw_connect(store_url)
    try:
        if store_url.startswith("sqlite"):
            conn.execute("BEGIN IMMEDIATE")
        ack = store.job_complete_many([Completion(by_id[b].claim, "b")], conn=conn)
        assert ack.accepted
        with ThreadPoolExecutor(1) as pool:
            other = pool.submit(store.job_complete_many, [Completion(by_id[c].claim, "c")])
            time.sleep(0.3)  # let it reach the lock B's transaction holds
            assert not other.done()
            conn.commit() if not store_url.startswith("sqlite") else conn.execute("COMMIT")
            assert other.result(timeout=30).accepted
    finally:
        conn.close()
    (got,) = claim(store, session)
    assert got.id == d and store.job_get(d).status == Status.RUNNING


def test_a_graph_s_edges_are_written_in_parts_of_one_transaction(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Edges go 10,000 to a statement (each part under the payload cap, the graph not):
    here 3 to a statement, so that a fan-out and fan-in of 7 takes five parts."""
    from plunder.store import edges

    monkeypatch.setattr(edges, "EDGES_A_STATEMENT", 3)
    graph = [Edge(0, i) for i in range(1, 8)] + [Edge(i, 8) for i in range(1, 8)]
    ids = store.flow_enqueue(_specs(9), graph)
    links = store.edge_list(ids)
    assert sorted((link.parent_id, link.child_id) for link in links) == sorted(
        (ids[e.parent], ids[e.child]) for e in graph
    )
    assert _status(store, ids[8]) is Status.WAITING


def test_a_turn_that_completes_a_parent_claims_its_children_or_says_to_claim_again(
    store: Store,
) -> None:
    """The turn's claim runs in the transaction that made the children pending: where it
    is a statement of its own (SQLite) it takes them; where one statement does both
    (PostgreSQL's job_exchange, one snapshot), it cannot see them and says so, and the
    next claim takes them. A turn completing a job without children never says so."""
    plain_id = store.job_enqueue_many([JobSpec("t", ["plain"])])[0].id
    a, b, c = store.flow_enqueue(_specs(3), [Edge(0, 1), Edge(0, 2)])
    session = open_session(store)
    first = {j.id: j for j in claim(store, session)}
    assert set(first) == {plain_id, a}

    def turn(job_id: int) -> tuple[set[int], bool]:
        done = store.job_exchange_many(
            [Completion(first[job_id].claim, None)], [], session_id=session.id,
            queues=["default"], tasks=["t"], limit=10,
        )  # fmt: skip
        assert done.completed.accepted == (first[job_id].claim,)
        return {j.id for j in done.claimed}, done.children

    assert turn(plain_id) == (set(), False)
    taken, children = turn(a)
    if store.dialect == "sqlite":
        assert (taken, children) == ({b, c}, False)
    else:
        assert (taken, children) == (set(), True)
        assert {j.id for j in claim(store, session)} == {b, c}
