"""A turn sent ahead settles the children of the jobs it acknowledges itself, before its
claim and in its transaction (PostgreSQL; decision 0023): a child whose last parent the
turn ended is claimed in that very turn when the claim would take it anyway, and through
every filter of the claim otherwise; each child counts each parent once, whichever way
that parent ended."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from plunder.graph import Edge
from plunder.model import Completion, ErrorInfo, Failure, JobSpec, Session
from plunder.states import Status
from plunder.store import Store, pauses
from plunder.store.base import TurnPipe
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


def turn(
    pipe: TurnPipe,
    session: Session,
    done: list[Completion],
    *,
    tasks: tuple[str, ...] = ("parent", "child"),
    limit: int = 10,
) -> tuple[int, list[tuple[int, str]]]:
    """One turn, read at once: how many it acknowledged; the (id, task) it claimed."""
    assert pipe.send(
        done, session_id=session.id, queues=["default"], tasks=list(tasks), limit=limit,
        take_suspect=True,
    )  # fmt: skip
    answer = pipe.receive()
    accepted = answer.settle().accepted
    return len(accepted), [(j.id, j.task) for j in answer.jobs()]


def test_the_turn_that_ends_the_last_parent_claims_the_child(store: Store, pipe: TurnPipe) -> None:
    """Two parents, ended in two turns: the first leaves the child waiting (and claims
    nothing), the second releases it and claims it, attempt 1, in the same turn."""
    specs = [JobSpec("parent", [0]), JobSpec("parent", [1]), JobSpec("child", [])]
    a, b, child = store.flow_enqueue(specs, [Edge(0, 2, "run"), Edge(1, 2, "run")])
    session = open_session(store, tasks=("parent", "child"))
    jobs = {j.id: j for j in claim(store, session, tasks=("parent",))}
    assert set(jobs) == {a, b}
    assert turn(pipe, session, [Completion(jobs[a].claim, "a")]) == (1, [])
    assert store.job_get(child).status is Status.WAITING
    assert turn(pipe, session, [Completion(jobs[b].claim, "b")]) == (1, [(child, "child")])
    record = store.job_get(child)
    assert (record.status, record.attempt) == (Status.RUNNING, 1)
    assert [p.id for p in store.flow_get(child).jobs if p.status is Status.SUCCEEDED] == [a, b]


def test_a_turn_ending_every_parent_at_once_releases_the_child_once(
    store: Store, pipe: TurnPipe
) -> None:
    """Fifty parents of one child and a child each, all in one turn: the fan-in child
    counts fifty at once and is released; every child is claimed by that turn, once."""
    specs = [JobSpec("parent", [i]) for i in range(50)]
    specs += [JobSpec("child", ["all"])] + [JobSpec("child", [i]) for i in range(50)]
    edges = [Edge(i, 50, "run") for i in range(50)] + [Edge(i, 51 + i, "run") for i in range(50)]
    ids = store.flow_enqueue(specs, edges)
    session = open_session(store, tasks=("parent", "child"))
    parents = claim(store, session, limit=50, tasks=("parent",))
    assert len(parents) == 50
    acked, claimed = turn(pipe, session, [Completion(p.claim, p.id) for p in parents], limit=100)
    assert acked == 50
    assert sorted(job_id for job_id, _ in claimed) == ids[50:]
    assert {store.job_get(i).status for i in ids[50:]} == {Status.RUNNING}
    assert claim(store, session, tasks=("child",)) == []


def test_the_released_child_goes_only_through_the_claims_filters(
    store: Store, pipe: TurnPipe
) -> None:
    """The turn's claim is the claim: a child of another queue, or of a task this worker
    does not run, is released (pending) but not taken by the turn; its own workers claim
    it."""
    specs = [JobSpec("parent", [0]), JobSpec("child", [], queue="other"), JobSpec("later", [])]
    parent, elsewhere, unrun = store.flow_enqueue(specs, [Edge(0, 1, "run"), Edge(0, 2, "run")])
    session = open_session(store, tasks=("parent", "child"))
    (job,) = claim(store, session, tasks=("parent",))
    assert turn(pipe, session, [Completion(job.claim, 1)]) == (1, [])
    assert store.job_get(elsewhere).status is Status.PENDING
    assert store.job_get(unrun).status is Status.PENDING
    other = open_session(store, queues=("other",), name="w2", tasks=("child",))
    assert [j.id for j in claim(store, other, queues=("other",), tasks=("child",))] == [elsewhere]
    assert store.job_get(parent).status is Status.SUCCEEDED


def test_parents_ended_by_turns_and_by_other_ways_count_once_each(
    store: Store, pipe: TurnPipe
) -> None:
    """A child of four parents: one ended by a turn, one by a plain acknowledgement, one
    failed (the edge runs the child anyway), one cancelled before it ran. It is pending
    after the last only, and a turn that resends a completion that committed already
    counts nothing again."""
    specs = [JobSpec("parent", [i]) for i in range(4)] + [JobSpec("child", [])]
    edges = [Edge(i, 4, "run") for i in range(4)]
    ids = store.flow_enqueue(specs, edges)
    child = ids[4]
    session = open_session(store, tasks=("parent",))
    store.job_cancel(ids[3])
    jobs = {j.id: j for j in claim(store, session, tasks=("parent",))}
    assert set(jobs) == set(ids[:3])
    first = Completion(jobs[ids[0]].claim, 0)
    assert turn(pipe, session, [first], tasks=("parent",)) == (1, [])
    assert turn(pipe, session, [first], tasks=("parent",)) == (1, [])  # sent again
    assert store.job_get(child).status is Status.WAITING
    assert store.job_complete_many([Completion(jobs[ids[1]].claim, 1)]).accepted
    assert store.job_get(child).status is Status.WAITING
    failure = Failure(jobs[ids[2]].claim, ErrorInfo("E", "no"), retry_delay=None)
    assert store.job_fail_many([failure]).accepted
    assert store.job_get(child).status is Status.PENDING


def test_a_child_of_a_paused_queue_is_released_but_not_claimed_by_the_turn(
    store: Store, pipe: TurnPipe
) -> None:
    """The turn's claim leaves paused queues out as every claim does: the child is pending,
    and claimed by the first turn after its queue is resumed."""
    specs = [JobSpec("parent", [0]), JobSpec("child", [], queue="other")]
    parent, child = store.flow_enqueue(specs, [Edge(0, 1, "run")])
    session = open_session(store, queues=("default", "other"), tasks=("parent", "child"))
    (job,) = claim(store, session, tasks=("parent",))
    assert pauses.of(store).queue_pause("other")
    queues = ["default", "other"]
    assert pipe.send(
        [Completion(job.claim, 0)], session_id=session.id, queues=queues,
        tasks=["parent", "child"], limit=10, take_suspect=True,
    )  # fmt: skip
    answer = pipe.receive()
    assert (len(answer.settle().accepted), answer.jobs()) == (1, [])
    assert store.job_get(child).status is Status.PENDING
    assert pauses.of(store).queue_resume("other")
    assert pipe.send(
        [], session_id=session.id, queues=queues, tasks=["child"], limit=10, take_suspect=True
    )
    assert [j.id for j in pipe.receive().jobs()] == [child]
    assert store.job_get(parent).status is Status.SUCCEEDED
