"""The worker protocol's contract, on every link a worker may have: the SQL store's own
(StoreLink) and a real gateway process's (HttpLink), each on SQLite and PostgreSQL. What
one link does, the other does the same; the long-poll is the gateway's alone."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator

import httpx
import pytest

from plunder import errors, wire
from plunder.graph import Edge, ParentResult
from plunder.model import Claim, Completion, ErrorInfo, Failure, JobSpec, Limit, TaskInfo
from plunder.protocol import Beat, ClaimRequest, Hello, WorkerProtocol
from plunder.states import Status
from plunder.store import Store
from plunder.store.http import Client, HttpLink
from plunder.store.link import StoreLink
from tests.gateway.conftest import Keys
from tests.support.gateway import Gateway

TASKS = (TaskInfo("t.echo", "default", "thread", {}),)


@pytest.fixture(params=["store", "gateway"])
def via(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def links(
    via: str, store: Store, request: pytest.FixtureRequest
) -> Iterator[Callable[[str], WorkerProtocol]]:
    """A maker of links for a key: the store's own (the key unused), or a gateway's."""
    made: list[HttpLink] = []

    def make(key: str) -> WorkerProtocol:
        if via == "store":
            return StoreLink(store)
        gateway: Gateway = request.getfixturevalue("gateway")
        made.append(HttpLink(Client(gateway.url, key, busy_total=2.0)))
        return made[-1]

    yield make
    for one in made:
        one.close_client()


def hello() -> Hello:
    return Hello("remote", "elsewhere", 7, ("default",), TASKS, expiry=5.0, free_slots=4)


def claim(limit: int = 10, wait: float = 0.0) -> ClaimRequest:
    return ClaimRequest(("default",), ("t.echo",), limit, True, wait)


def enqueue(store: Store, count: int) -> list[int]:
    return store.job_enqueue_ids([JobSpec("t.echo", [i]) for i in range(count)])


def test_a_remote_worker_claims_and_completes_through_the_gateway(
    links: Callable[[str], WorkerProtocol], keys: Keys, store: Store
) -> None:
    ids = enqueue(store, 3)
    remote = links(keys.worker)
    session = remote.open(hello())
    reply = remote.exchange(session.id, [], claim())
    assert sorted(j.id for j in reply.claimed) == ids
    assert all(j.status is Status.RUNNING and j.session_id == session.id for j in reply.claimed)
    done = [Completion(j.claim, {"echo": j.args}) for j in reply.claimed]
    answer = remote.exchange(session.id, done, None)
    assert sorted(c.job_id for c in answer.completed.accepted) == ids
    assert [store.job_get(i).result for i in ids] == [{"echo": [i]} for i in range(3)]
    # the same outcomes sent again (a retried request) are acknowledged once
    again = remote.exchange(session.id, done, None)
    assert not again.completed.stale
    assert [len(store.job_runs(i)) for i in ids] == [1, 1, 1]
    assert remote.close(session.id) == []


def test_a_claim_that_moved_on_is_refused_as_stale(
    links: Callable[[str], WorkerProtocol], keys: Keys, store: Store
) -> None:
    (job_id,) = enqueue(store, 1)
    remote = links(keys.worker)
    session = remote.open(hello())
    (job,) = remote.exchange(session.id, [], claim()).claimed
    store.job_cancel(job_id)
    beat = remote.heartbeat(Beat(session.id, (job.claim,), 3))
    assert beat.alive and beat.stop == (job.claim,)
    answer = remote.exchange(session.id, [Completion(job.claim, "late")], None)
    assert answer.completed.stale == (job.claim,)
    assert store.job_get(job_id).status is Status.CANCELLED


def test_a_closed_session_is_gone_for_its_worker(
    links: Callable[[str], WorkerProtocol], keys: Keys
) -> None:
    remote = links(keys.worker)
    session = remote.open(hello())
    remote.close(session.id)
    with pytest.raises(errors.SessionGone):
        remote.exchange(session.id, [], claim())
    assert not remote.heartbeat(Beat(session.id)).alive


def test_an_idle_exchange_waits_at_the_gateway_and_wakes_for_a_new_job(
    links: Callable[[str], WorkerProtocol], keys: Keys, store: Store, via: str
) -> None:
    if via == "store":
        pytest.skip("the store's link does not long-poll: its worker's hub wakes it")
    remote = links(keys.worker)
    session = remote.open(hello())
    assert remote.exchange(session.id, [], claim(wait=0.3)).claimed == ()  # nothing: waited
    enqueued: list[float] = []

    def later() -> None:
        time.sleep(1.5)
        enqueued.append(time.monotonic())
        enqueue(store, 1)

    thread = threading.Thread(target=later)
    thread.start()
    reply = remote.exchange(session.id, [], claim(wait=20))
    woke = time.monotonic()
    thread.join()
    assert len(reply.claimed) == 1
    # woken by the gateway's own LISTEN / data_version, not by its once-a-second poll
    assert woke - enqueued[0] < 0.9


def test_stream_events_are_fenced_by_the_claim(
    links: Callable[[str], WorkerProtocol], keys: Keys, store: Store
) -> None:
    (job_id,) = enqueue(store, 1)
    remote = links(keys.worker)
    session = remote.open(hello())
    (job,) = remote.exchange(session.id, [], claim()).claimed
    remote.append(job.claim, [("chunk", "one"), ("progress", {"done": 1, "total": 2})])
    assert [e.data for e in store.stream_read(job_id)] == ["one", {"done": 1, "total": 2}]
    store.job_cancel(job_id)
    with pytest.raises(errors.StaleClaim):
        remote.append(job.claim, [("chunk", "late")])
    assert len(store.stream_read(job_id)) == 2


def test_stream_events_carry_any_json_value(
    links: Callable[[str], WorkerProtocol], keys: Keys, store: Store
) -> None:
    (job_id,) = enqueue(store, 1)
    remote = links(keys.worker)
    session = remote.open(hello())
    (job,) = remote.exchange(session.id, [], claim()).claimed
    values = [True, False, None, 0, -1.5, "", [1, "two"], {"k": [None]}]
    remote.append(job.claim, [("chunk", v) for v in values])
    assert [e.data for e in store.stream_read(job_id)] == values
    answer = remote.exchange(session.id, [Completion(job.claim, False)], None)
    assert answer.completed.accepted == (job.claim,)
    assert store.job_get(job_id).result is False


def test_a_worker_pauses_its_jobs_limit_key_and_gives_the_job_back(
    links: Callable[[str], WorkerProtocol], keys: Keys, store: Store, via: str
) -> None:
    spec = JobSpec("t.echo", [1], limit=Limit("provider", 1), max_attempts=1)
    (job_id,) = store.job_enqueue_ids([spec])
    remote = links(keys.worker)
    session = remote.open(hello())
    (job,) = remote.exchange(session.id, [], claim()).claimed
    if via == "gateway":  # a worker key pauses no limit key but its job's own
        with pytest.raises(errors.AccessDenied, match="limit key"):
            remote.pause_limit(job.claim, "another", 60.0)
    ends = remote.pause_limit(job.claim, "provider", 60.0)
    assert 59 <= (ends - store.now()).total_seconds() <= 61
    back = store.job_get(job_id)
    # no attempt spent: one more is allowed (a released attempt's history row stays)
    assert (back.status, back.attempt, back.max_attempts) == (Status.PENDING, 1, 2)
    (state,) = store.limit_list()
    assert state.paused_until == ends and state.held == 1
    assert remote.exchange(session.id, [], claim()).claimed == ()
    with pytest.raises(errors.StaleClaim):  # fenced: the claim is no longer current
        remote.pause_limit(job.claim, "provider", 60.0)


def test_a_fair_queue_is_claimed_in_turn_through_either_link(
    links: Callable[[str], WorkerProtocol], keys: Keys, store: Store
) -> None:
    store.fair_declare("default", {"b": 2})
    store.job_enqueue_ids([JobSpec("t.echo", ["a", i], group="a") for i in range(20)])
    store.job_enqueue_ids([JobSpec("t.echo", ["b", i], group="b") for i in range(20)])
    remote = links(keys.worker)
    session = remote.open(hello())
    first = remote.exchange(session.id, [], claim(limit=6)).claimed
    assert sorted(j.args[0] for j in first) == ["a", "a", "b", "b", "b", "b"]
    done = [Completion(j.claim, None) for j in first]
    # a turn that acknowledges and claims (one statement on PostgreSQL for plain queues)
    second = remote.exchange(session.id, done, claim(limit=3)).claimed
    assert sorted(j.args[0] for j in second) == ["a", "b", "b"]


def test_a_child_reads_its_parents_results_by_its_claim_only(
    links: Callable[[str], WorkerProtocol], keys: Keys, store: Store
) -> None:
    specs = [JobSpec("t.echo", [n]) for n in ("a", "b", "child")]
    a, b, child = store.flow_enqueue(specs, [Edge(0, 2), Edge(1, 2, "run")])
    remote = links(keys.worker)
    session = remote.open(hello())
    parents = {j.id: j for j in remote.exchange(session.id, [], claim()).claimed}
    assert sorted(parents) == [a, b]
    assert remote.parent_results(parents[a].claim) == ()  # a job with no parents
    outcomes = [Completion(parents[a].claim, {"a": [1, None]}),
                Failure(parents[b].claim, ErrorInfo("E", "no"), retry_delay=None)]  # fmt: skip
    remote.exchange(session.id, outcomes, None)
    (job,) = remote.exchange(session.id, [], claim()).claimed
    assert job.id == child
    assert remote.parent_results(job.claim) == (
        ParentResult(a, "succeeded", {"a": [1, None]}),
        ParentResult(b, "failed", None),
    )
    remote.exchange(session.id, [Completion(job.claim, "done")], None)
    with pytest.raises(errors.StaleClaim):  # fenced: the attempt has ended
        remote.parent_results(job.claim)
    with pytest.raises(errors.StaleClaim):  # a job never claimed, or none at all
        remote.parent_results(Claim(a + 1000, 1, session.id))


def test_a_key_of_another_group_cannot_tell_a_foreign_job_from_none(
    gateway: Gateway, keys: Keys, store: Store
) -> None:
    a, child = store.flow_enqueue([JobSpec("t.echo", [0]), JobSpec("t.echo", [1])], [Edge(0, 1)])
    mine = HttpLink(Client(gateway.url, keys.worker, busy_total=2.0))
    session = mine.open(hello())
    (parent,) = mine.exchange(session.id, [], claim()).claimed
    mine.exchange(session.id, [Completion(parent.claim, 7)], None)
    (job,) = mine.exchange(session.id, [], claim()).claimed
    assert mine.parent_results(job.claim) == (ParentResult(a, "succeeded", 7),)
    gpu = Hello("gpu", "elsewhere", 8, ("llm",), (TaskInfo("t.echo", "llm", "thread", {}),), 5.0)
    with httpx.Client(base_url=gateway.url, timeout=30) as http:
        headers = {"Authorization": f"Bearer {keys.gpu_worker}"}
        theirs = http.post("/v1/sessions", json=wire.hello_out(gpu), headers=headers).json()["id"]
        answers = []
        for job_id, session_id in [(child, theirs), (child, session.id), (child + 1000, theirs)]:
            body = {"claim": {"job_id": job_id, "attempt": 1, "session_id": session_id}}
            path = f"/v1/sessions/{theirs}/parent-results"
            answer = http.post(path, json=body, headers=headers)
            answers.append((answer.status_code, answer.json()["error"].replace(str(job_id), "N")))
        # another session's URL: refused as a session that does not exist
        path = f"/v1/sessions/{session.id}/parent-results"
        body = {"claim": wire.claim_out(job.claim)}
        assert http.post(path, json=body, headers=headers).status_code == 404
    assert answers == [(404, "no job N claimed by this session")] * 3
    assert mine.parent_results(job.claim)  # still readable by the session holding it
    mine.close_client()
