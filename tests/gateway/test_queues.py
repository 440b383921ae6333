"""Remote workers that join and leave queues through a real gateway: only queues their key
may use, and their heartbeats carry the session's queues (see plunder.membership)."""

from __future__ import annotations

import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

import plunder
from plunder import errors
from plunder.model import JobSpec, Partitioning, TaskInfo
from plunder.protocol import Beat, ClaimRequest, Hello
from plunder.states import Status
from plunder.store import Store
from plunder.store.http import Client, HttpLink
from plunder.store.partitions import partition_of
from tests.gateway.conftest import Keys, client
from tests.gateway.test_remote_worker import remote_worker
from tests.support.gateway import Gateway
from tests.worker.conftest import wait_for

TASKS = (TaskInfo("t.echo", "default", "thread", {}),)


@pytest.fixture
def link_of(gateway: Gateway) -> Iterator[dict[str, HttpLink]]:
    made: dict[str, HttpLink] = {}
    yield made
    for link in made.values():
        link.close_client()


def _link(made: dict[str, HttpLink], gateway: Gateway, key: str) -> HttpLink:
    made[key] = HttpLink(Client(gateway.url, key, busy_total=2.0))
    return made[key]


def _hello(*queues: str) -> Hello:
    return Hello("remote", "elsewhere", 7, queues, TASKS, expiry=5.0, free_slots=4)


def test_a_remote_worker_joins_only_queues_its_key_may_use(
    gateway: Gateway, keys: Keys, store: Store, link_of: dict[str, HttpLink]
) -> None:
    remote = _link(link_of, gateway, keys.worker)
    session = remote.open(_hello("default"))
    assert remote.change_queues(session.id, add=["extra"]) == ("default", "extra")
    assert remote.heartbeat(Beat(session.id)).queues == ("default", "extra")
    assert remote.change_queues(session.id, remove=["default"]) == ("extra",)
    # the queue "llm" belongs to the group "gpu": not this key's
    with pytest.raises(errors.AccessDenied, match="llm"):
        remote.change_queues(session.id, add=["llm"])
    assert store.session_heartbeat(session.id).queues == ("extra",)
    with pytest.raises(errors.InvalidName):
        remote.change_queues(session.id, add=["not a queue"])

    gpu = _link(link_of, gateway, keys.gpu_worker)
    gpu_session = gpu.open(_hello("llm"))
    with pytest.raises(errors.AccessDenied, match="default"):
        gpu.change_queues(gpu_session.id, add=["default"])
    # another key may not change this session at all (as if it did not exist)
    with pytest.raises(errors.PlunderError, match="no session"):
        remote.change_queues(gpu_session.id, add=["extra"])
    # joined by someone with the database: the remote worker hears only what its key serves
    store.session_queues(gpu_session.id, add=["default"])
    assert gpu.heartbeat(Beat(gpu_session.id)).queues == ("llm",)


def test_a_heartbeat_names_queues_only_to_a_worker_that_asks(
    gateway: Gateway, keys: Keys, link_of: dict[str, HttpLink]
) -> None:
    """A worker older than the field would refuse an answer that has it."""
    session = _link(link_of, gateway, keys.worker).open(_hello("default"))
    with client(gateway, keys.worker) as http:
        path = f"/v1/sessions/{session.id}/heartbeat"
        plain = http.post(path, json={"running": []})
        asked = http.post(path, json={"running": []}, params={"queues": "1"})
    assert plain.status_code == asked.status_code == 200
    assert "queues" not in plain.json()
    assert asked.json()["queues"] == ["default"]


def test_a_remote_worker_process_follows_a_queue_joined_in_the_database(
    gateway: Gateway, keys: Keys, store: Store, tmp_path: Path
) -> None:
    log = tmp_path / "worker.log"
    worker = remote_worker(gateway, keys.worker, log, "-q", "default", "-c", "1")
    try:
        wait_for(store.session_list, timeout=30, what="the remote session")
        (session,) = store.session_list()
        (job,) = store.job_enqueue_many([JobSpec("short", [7], queue="extra")])
        store.session_queues(session.id, add=["extra"])
        done = lambda: store.job_get(job.id).status is Status.SUCCEEDED  # noqa: E731
        wait_for(done, timeout=30, what="the joined queue's job")
        store.session_queues(session.id, remove=["extra"])
        wait_for(lambda: "left: extra" in log.read_text(), timeout=30, what="the leave")
    finally:
        worker.send_signal(signal.SIGTERM)
        assert worker.wait(timeout=30) == 0, log.read_text()
    assert "Traceback" not in log.read_text()


def test_a_remote_worker_hears_its_partitions_and_claims_them(
    gateway: Gateway, keys: Keys, store: Store, link_of: dict[str, HttpLink]
) -> None:
    """The heartbeat names the partitions a remote session owns (to a worker that asks),
    and a claim naming a partition's queue ("parts~1") is of the key's queue "parts"."""
    store.partition_declare("parts", 2)
    remote = _link(link_of, gateway, keys.worker)
    session = remote.open(_hello("parts"))

    # the gateway's janitor assigns them (a pass every janitor interval)
    def heard() -> Partitioning | None:
        found = remote.heartbeat(Beat(session.id)).partitions or ()
        return found[0] if found and found[0].owned else None

    found = wait_for(heard, what="the partitions assigned")
    assert isinstance(found, Partitioning)
    assert (found.queue, found.partitions, found.owned) == ("parts", 2, (0, 1))
    with client(gateway, keys.worker) as http:
        plain = http.post(f"/v1/sessions/{session.id}/heartbeat", json={"running": []})
    assert "partitions" not in plain.json()  # an older worker would refuse the field
    (job,) = store.job_enqueue_many([JobSpec("t.echo", queue="parts", partition_key="k")])
    request = ClaimRequest((job.queue,), ("t.echo",), 1)
    assert [j.id for j in remote.exchange(session.id, [], request).claimed] == [job.id]


def test_a_remote_producer_routes_by_partition_key(
    gateway: Gateway, keys: Keys, store: Store
) -> None:
    store.partition_declare("llm", 4)
    producer = plunder.App(gateway.url, key=keys.gpu_producer)
    try:
        job = producer.enqueue(
            "t.echo", ["x"], queue="llm", partition_key="tenant-9", allow_unregistered=True
        )
        plain = producer.enqueue("t.echo", ["y"], queue="llm", allow_unregistered=True)
    finally:
        producer.close()
    assert store.job_get(job.id).queue == f"llm~{partition_of('tenant-9', 4)}"
    assert store.job_get(plain.id).queue.startswith("llm~")
    # a key of another group reaches no partition of the group's queue
    other = plunder.App(gateway.url, key=keys.producer)
    try:
        with pytest.raises(errors.AccessDenied):
            other.enqueue("t.echo", ["z"], queue="llm", partition_key="k", allow_unregistered=True)
    finally:
        other.close()


def test_a_remote_producer_names_its_jobs_group_on_a_fair_queue(
    gateway: Gateway, keys: Keys, store: Store
) -> None:
    store.fair_declare("default")
    producer = plunder.App(gateway.url, key=keys.producer)
    try:
        for group in ("a", "a", "a", "b"):
            producer.enqueue("t.echo", [group], group=group, allow_unregistered=True)
    finally:
        producer.close()
    assert {g.group for g in store.fair_group_list()} == {"a", "b"}
    echo = (TaskInfo("t.echo", "default", "thread", {}),)
    session = store.session_open(
        name="w", host="h", pid=1, queues=["default"], expiry=30.0, tasks=echo
    )
    claimed = store.job_claim_many(session.id, queues=["default"], tasks=["t.echo"], limit=2)
    assert sorted(j.args[0] for j in claimed) == ["a", "b"]  # b's one job is not last
