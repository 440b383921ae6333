"""The long-poll's claim started by a wake-up on the gateway's hub thread
(plunder.gateway.longpoll), through a real gateway process on each backend: one job for
two waiting workers goes to one of them, and a claim that fails on the claim thread
answers its worker with the error, as the loop's own claim would."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest

from plunder import errors
from plunder.model import JobSpec, TaskInfo
from plunder.protocol import ClaimRequest, Hello, Reply
from plunder.states import Status
from plunder.store import Store
from plunder.store.http import Client, HttpLink
from tests.gateway.conftest import Keys
from tests.support.gateway import Gateway

TASKS = (TaskInfo("t.echo", "default", "thread", {}),)
PARKED = 1.0  # seconds for the long-polls to reach the gateway and wait there


@pytest.fixture
def links(gateway: Gateway, keys: Keys) -> Iterator[list[HttpLink]]:
    made = [HttpLink(Client(gateway.url, keys.worker, busy_total=2.0)) for _ in range(2)]
    yield made
    for link in made:
        link.close_client()


def hello() -> Hello:
    return Hello("remote", "elsewhere", 7, ("default",), TASKS, expiry=5.0, free_slots=4)


def waiting(wait: float) -> ClaimRequest:
    return ClaimRequest(("default",), ("t.echo",), 4, True, wait)


def test_one_job_for_two_waiting_workers_goes_to_one(links: list[HttpLink], store: Store) -> None:
    sessions = [link.open(hello()) for link in links]
    replies: dict[int, tuple[Reply, float]] = {}

    def poll(i: int) -> None:
        reply = links[i].exchange(sessions[i].id, [], waiting(4.0))
        replies[i] = (reply, time.monotonic())

    threads = [threading.Thread(target=poll, args=(i,)) for i in range(2)]
    for thread in threads:
        thread.start()
    time.sleep(PARKED)
    enqueued = time.monotonic()
    (job_id,) = store.job_enqueue_ids([JobSpec("t.echo", [1])])
    for thread in threads:
        thread.join(timeout=30)
    assert sorted(len(reply.claimed) for reply, _ in replies.values()) == [0, 1]
    ((job,),) = [reply.claimed for reply, _ in replies.values() if reply.claimed]
    assert (job.id, job.attempt) == (job_id, 1)
    # woken by the gateway's LISTEN / data_version, not found by its once-a-second poll
    (woke,) = [at for reply, at in replies.values() if reply.claimed]
    assert woke - enqueued < 0.9
    assert store.job_get(job_id).status is Status.RUNNING


def test_a_woken_claim_of_a_closed_session_answers_session_gone(
    links: list[HttpLink], store: Store
) -> None:
    link = links[0]
    session = link.open(hello())
    outcome: list[BaseException | Reply] = []

    def poll() -> None:
        try:
            outcome.append(link.exchange(session.id, [], waiting(20.0)))
        except errors.SessionGone as exc:
            outcome.append(exc)

    thread = threading.Thread(target=poll)
    thread.start()
    time.sleep(PARKED)
    store.session_close(session.id)
    (job_id,) = store.job_enqueue_ids([JobSpec("t.echo", [1])])
    thread.join(timeout=30)
    assert len(outcome) == 1 and isinstance(outcome[0], errors.SessionGone), outcome
    assert store.job_get(job_id).status is Status.PENDING
