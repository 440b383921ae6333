"""Affinity through every link a worker may have (the SQL store's own and a real
gateway's), on SQLite and PostgreSQL: a preferred job goes to a holder with a free slot,
to anyone at once when every holder is busy; a required job waits for a holder; labels
may change while the worker runs (docs/guide/affinity.md)."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from plunder.model import JobSpec, TaskInfo
from plunder.protocol import Beat, ClaimRequest, Hello, WorkerProtocol
from plunder.store import Store
from plunder.store.http import Client, HttpLink
from plunder.store.link import StoreLink
from tests.gateway.conftest import Keys
from tests.support.gateway import Gateway

TASKS = (TaskInfo("t.echo", "default", "thread", {}),)
MODEL = {"model": "llama3-70b"}


@pytest.fixture(params=["store", "gateway"])
def via(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def link(via: str, store: Store, keys: Keys, request: pytest.FixtureRequest) -> Iterator[
    Callable[[], WorkerProtocol]
]:  # fmt: skip
    made: list[HttpLink] = []

    def make() -> WorkerProtocol:
        if via == "store":
            return StoreLink(store)
        gateway: Gateway = request.getfixturevalue("gateway")
        made.append(HttpLink(Client(gateway.url, keys.worker, busy_total=2.0)))
        return made[-1]

    yield make
    for one in made:
        one.close_client()


def hello(name: str, free: int, labels: tuple[str, ...] = ()) -> Hello:
    return Hello(name, "h", 7, ("default",), TASKS, expiry=5.0, free_slots=free, labels=labels)


def claim(limit: int) -> ClaimRequest:
    return ClaimRequest(("default",), ("t.echo",), limit, True, 0.0)


def enqueue(store: Store, count: int, **options: object) -> list[int]:
    return store.job_enqueue_ids([JobSpec("t.echo", [i], **options) for i in range(count)])  # type: ignore[arg-type]


def test_a_preferred_job_goes_to_a_free_holder_and_not_elsewhere(
    link: Callable[[], WorkerProtocol], store: Store
) -> None:
    one = link()
    holder = one.open(hello("holder", 2, ("model=llama3-70b", "gpu=a100")))
    other = one.open(hello("other", 4))
    (job_id,) = enqueue(store, 1, affinity=MODEL)
    plain = enqueue(store, 1)
    # the other worker takes the plain job behind it, not the preferred one
    assert [j.id for j in one.exchange(other.id, [], claim(4)).claimed] == plain
    (taken,) = one.exchange(holder.id, [], claim(2)).claimed
    assert taken.id == job_id and taken.affinity == "{model=llama3-70b}"
    assert store.job_get(job_id).session_id == holder.id


def test_a_preferred_job_goes_elsewhere_at_once_when_every_holder_is_busy(
    link: Callable[[], WorkerProtocol], store: Store
) -> None:
    one = link()
    holder = one.open(hello("holder", 1, ("model=llama3-70b",)))
    other = one.open(hello("other", 4))
    busy = enqueue(store, 1)
    # the holder's claim fills its only slot: its free slots are reported with it
    assert [j.id for j in one.exchange(holder.id, [], claim(1)).claimed] == busy
    wanted = enqueue(store, 3, affinity=MODEL)
    assert sorted(j.id for j in one.exchange(other.id, [], claim(4)).claimed) == wanted
    # a heartbeat reports free slots too: a free holder has its jobs again
    assert one.heartbeat(Beat(holder.id, (), 1)).alive
    (again,) = enqueue(store, 1, affinity=MODEL)
    assert one.exchange(other.id, [], claim(4)).claimed == ()
    assert [j.id for j in one.exchange(holder.id, [], claim(1)).claimed] == [again]


def test_a_required_job_waits_for_a_holder_even_a_busy_one(
    link: Callable[[], WorkerProtocol], store: Store
) -> None:
    one = link()
    holder = one.open(hello("holder", 0, ("model=llama3-70b",)))
    other = one.open(hello("other", 4, ("gpu=a100",)))
    (job_id,) = enqueue(store, 1, require=MODEL)
    assert one.exchange(other.id, [], claim(4)).claimed == ()
    assert [j.id for j in one.exchange(holder.id, [], claim(1)).claimed] == [job_id]


def test_labels_changed_at_run_time_reach_the_claims(
    link: Callable[[], WorkerProtocol], store: Store
) -> None:
    one = link()
    worker = one.open(hello("worker", 2))
    (job_id,) = enqueue(store, 1, require=MODEL)
    assert one.exchange(worker.id, [], claim(2)).claimed == ()
    assert one.heartbeat(Beat(worker.id, (), 2, ("model=llama3-70b",))).alive
    assert [s.labels for s in store.session_list()] == [("model=llama3-70b",)]
    assert [j.id for j in one.exchange(worker.id, [], claim(2)).claimed] == [job_id]
    # and taken away again: a heartbeat without labels leaves the next job waiting
    assert one.heartbeat(Beat(worker.id, (), 2, ())).alive
    enqueue(store, 1, require=MODEL)
    assert one.exchange(worker.id, [], claim(2)).claimed == ()
