"""A remote worker's turns sent ahead through a real gateway process (HttpPipe): several
exchanges in flight at once, each on an HTTP connection of its own; a claim sent ahead
never waits at the gateway, an idle worker's results ride its long-poll; a connection the
gateway closed loses no turn; a gateway killed with turns in flight fails them over;
remote workers drain every job once; TLS checked as the Client checks it."""

from __future__ import annotations

import http.client
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest

import plunder
from plunder import errors
from plunder.model import Completion, JobRecord, JobSpec
from plunder.states import Status
from plunder.store import Store
from plunder.store.http import Client, HttpLink
from plunder.store.http.pipe import DEPTH, REST, HttpPipe, connect
from plunder.worker import Worker, WorkerOptions
from tests.gateway.conftest import Keys
from tests.gateway.test_chaos import finished_once, stop
from tests.gateway.test_protocol_contract import enqueue, hello
from tests.gateway.test_remote_worker import remote_worker, serving
from tests.support import gateway as support
from tests.support.gateway import Gateway
from tests.support.pgcluster import free_port
from tests.worker.conftest import wait_for


@pytest.fixture
def link(gateway: Gateway, keys: Keys) -> Iterator[HttpLink]:
    made = HttpLink(Client(gateway.url, keys.worker, busy_total=2.0, call_timeout=10.0))
    yield made
    made.close_client()


def succeeded(store: Store) -> int:
    return sum(q.counts.get("succeeded", 0) for q in store.queue_stats())


def send(pipe: HttpPipe, session_id: str, done: list[JobRecord], **claim: Any) -> None:
    options = {"limit": 10, "wait": 0.0, **claim}
    assert pipe.send(
        [Completion(j.claim, {"done": j.id}) for j in done],
        session_id=session_id,
        queues=["default"],
        tasks=["t.echo"],
        take_suspect=True,
        **options,
    )


def test_turns_go_ahead_and_come_back_in_order(link: HttpLink, store: Store) -> None:
    ids = enqueue(store, 20)
    session = link.open(hello())
    pipe = link.pipe()
    assert pipe.depth == DEPTH == 2
    for _ in range(2):
        send(pipe, session.id, [])
    assert pipe.in_flight == 2 and pipe.claiming == 20  # both written, none read
    with pytest.raises(RuntimeError):
        send(pipe, session.id, [])
    answers = [pipe.receive() for _ in range(2)]
    claimed = [j for a in answers for j in a.jobs()]
    assert sorted(j.id for j in claimed) == ids and [a.claimed for a in answers] == [10] * 2
    assert all(j.status is Status.RUNNING and j.session_id == session.id for j in claimed)
    # their results go out with the next turns, two in flight at once
    send(pipe, session.id, claimed[:15])
    send(pipe, session.id, claimed[15:])
    assert len(pipe.completions()) == 20
    settled = [pipe.receive().settle() for _ in range(2)]
    assert sorted(c.job_id for s in settled for c in s.accepted) == ids
    assert [store.job_get(i).result for i in ids] == [{"done": i} for i in ids]
    assert pipe.in_flight == 0 and pipe.close() == []


def test_a_claim_sent_ahead_never_waits_at_the_gateway(link: HttpLink) -> None:
    """Only a turn alone (none in flight, no results) may wait for work: one sent while
    another is on its way must come back at once, or the results of the work on its way
    would wait behind it."""
    session = link.open(hello())
    pipe = link.pipe()
    began = time.monotonic()
    send(pipe, session.id, [], wait=0.5)  # alone: an idle worker's long-poll
    send(pipe, session.id, [], wait=20.0)  # sent ahead: must not wait
    assert pipe.receive().claimed == 0
    waited = time.monotonic() - began
    assert waited >= 0.4  # the first waited at the gateway, as asked
    assert pipe.receive().claimed == 0
    assert time.monotonic() - began - waited < 1.0  # the second did not


def test_an_idle_workers_results_ride_its_long_poll(link: HttpLink, store: Store) -> None:
    """A turn alone with results may wait for work: its results are written before the
    wait (others see them at once), their acknowledgement comes with the answer, which a
    new job brings before the wait ends."""
    session = link.open(hello())
    pipe = link.pipe()
    enqueue(store, 1)
    send(pipe, session.id, [])
    (job,) = pipe.receive().jobs()
    began = time.monotonic()
    send(pipe, session.id, [job], wait=20.0)
    wait_for(lambda: store.job_get(job.id).status is Status.SUCCEEDED, timeout=10,
             what="the result written before the wait")  # fmt: skip
    assert not pipe.answered()  # still waiting for work at the gateway
    (new,) = enqueue(store, 1)
    answer = pipe.receive()
    assert time.monotonic() - began < 10.0  # woken by the new job, not the wait's end
    assert answer.settle().accepted == (job.claim,)
    assert [j.id for j in answer.jobs()] == [new]


def test_turns_go_out_with_nagles_algorithm_off(gateway: Gateway) -> None:
    """http.client sends a request's headers and body apart: with Nagle's algorithm on,
    the body would wait for the gateway's (maybe delayed) acknowledgement of the headers."""
    parts = urlsplit(gateway.url)
    conn = http.client.HTTPConnection(parts.hostname or "", parts.port or 80, timeout=5)
    try:
        connect(conn)
        assert conn.sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)
    finally:
        conn.close()


def test_a_lost_session_cuts_the_turn_in_flight(link: HttpLink) -> None:
    """The heartbeat's thread gives up the calls of a lost session (``link.cut``): a read
    waiting at the gateway fails now, not when the long-poll ends."""
    session = link.open(hello())
    pipe = link.pipe()
    send(pipe, session.id, [], wait=20.0)
    cutter = threading.Timer(0.3, lambda: link.cut("the worker's session was lost"))
    began = time.monotonic()
    cutter.start()
    try:
        with pytest.raises(errors.StoreUnavailable):
            pipe.receive()
    finally:
        cutter.join()
    assert time.monotonic() - began < 5.0 and pipe.in_flight == 0
    assert link.cut("again") == 0  # nothing left in flight


def test_a_turn_of_a_closed_session_says_so_and_writes_nothing(
    link: HttpLink, store: Store
) -> None:
    enqueue(store, 1)
    session = link.open(hello())
    pipe = link.pipe()
    send(pipe, session.id, [])
    (job,) = pipe.receive().jobs()
    link.close(session.id)
    send(pipe, session.id, [job])
    answer = pipe.receive()
    assert answer.claimed == 0 and answer.jobs() == []
    with pytest.raises(errors.SessionGone):
        answer.settle()
    assert store.job_get(job.id).status is not Status.SUCCEEDED


def test_a_kept_connection_the_gateway_closed_loses_no_turn(
    gateway: Gateway, keys: Keys, store: Store, store_url: str, tmp_path: Path
) -> None:
    """The gateway restarts on the same port between two turns: the connection the pipe
    kept is closed under it, and the next turn goes out on a new one."""
    link = HttpLink(Client(gateway.url, keys.worker, busy_total=2.0))
    try:
        ids = enqueue(store, 2)
        session = link.open(hello())
        pipe = link.pipe()
        send(pipe, session.id, [], limit=1)
        (first,) = pipe.receive().jobs()
        gateway.stop()
        port = int(gateway.url.rsplit(":", 1)[1])
        again = support.start(store_url, tmp_path, port=port)
        try:
            send(pipe, session.id, [first], limit=1)
            answer = pipe.receive()
            assert answer.settle().accepted == (first.claim,)
            assert [j.id for j in answer.jobs()] == [ids[1]]
        finally:
            again.stop()
    finally:
        link.close_client()


@pytest.mark.parametrize("backend", ["postgres"])
def test_a_gateway_killed_with_turns_in_flight_fails_them_over(
    gateway: Gateway, keys: Keys, store: Store, store_url: str, tmp_path: Path
) -> None:
    """A turn waits at the gateway, another with results is sent behind it, and the
    gateway is killed: the read fails with the store's error and nothing is left in
    flight; the results sent again go to the other gateway and count once."""
    other = support.start(store_url, tmp_path)
    link = HttpLink(Client(f"{gateway.url},{other.url}", keys.worker, busy_total=5.0))
    try:
        ids = enqueue(store, 10)
        session = link.open(hello())
        pipe = link.pipe()
        send(pipe, session.id, [])
        claimed = pipe.receive().jobs()
        send(pipe, session.id, [], wait=20.0)  # alone: it waits at the gateway
        send(pipe, session.id, claimed)  # sent ahead, behind it
        sent = pipe.completions()
        gateway.process.send_signal(signal.SIGKILL)
        gateway.process.wait(timeout=10)
        with pytest.raises(errors.StoreError):
            pipe.receive()
        assert pipe.in_flight == 0 and pipe.completions() == []
        with pytest.raises(errors.StoreBusy):  # it rests: turns go the ordinary way
            send(pipe, session.id, [])
        time.sleep(REST)
        assert pipe.send(sent, session_id=session.id, queues=["default"], tasks=["t.echo"],
                         limit=0, take_suspect=False)  # fmt: skip
        settled = pipe.receive().settle()  # through the other gateway
        assert sorted(c.job_id for c in settled.accepted) == ids and not settled.stale
        finished = [store.job_get(i) for i in ids]
        assert all(j.status is Status.SUCCEEDED for j in finished)
        assert all(len(store.job_runs(i)) == 1 for i in ids)
    finally:
        link.close_client()
        other.stop()


class RecordingPipe(HttpPipe):
    """An HttpPipe that keeps the most turns it had in flight at once."""

    peak = 0

    def send(self, *args: Any, **kwargs: Any) -> bool:
        sent = super().send(*args, **kwargs)
        self.peak = max(self.peak, self.in_flight)
        return sent


class RecordingLink(HttpLink):
    def pipe(self) -> HttpPipe:
        self.recording = RecordingPipe(self.client)
        return self.recording


@pytest.mark.parametrize("backend", ["postgres"])
def test_a_worker_through_the_gateway_has_several_turns_in_flight(
    gateway: Gateway, keys: Keys, store: Store
) -> None:
    app = plunder.App("sqlite:////nonexistent-plunder-dir/never.db", heartbeat_interval=0.2,
                      session_expiry=2.0)  # fmt: skip
    app.task(name="t.echo", queue="default")(lambda n: n)
    link = RecordingLink(Client(gateway.url, keys.worker, busy_total=5.0))
    worker = Worker(app, WorkerOptions(concurrency=30), link=link)
    thread = threading.Thread(target=worker.run, kwargs={"install_signals": False}, daemon=True)
    thread.start()
    try:
        serving(store, 1)
        ids = enqueue(store, 1500)
        wait_for(lambda: succeeded(store) == 1500, timeout=60,
                 what="the drain")  # fmt: skip
    finally:
        worker.stop()
        thread.join(timeout=15)
        link.recording.release()
        link.close_client()
    assert not thread.is_alive() and worker.error is None
    assert link.recording.peak >= 2  # turns went ahead
    finished_once(store, ids)


@pytest.mark.parametrize("backend", ["postgres"])
def test_remote_workers_with_turns_ahead_drain_every_job_once(
    gateway: Gateway, keys: Keys, store: Store, tmp_path: Path
) -> None:
    """Two remote worker processes (-c 30: turns of 15, two in flight) drain 3,000
    short jobs: each succeeded by exactly one run."""
    log = tmp_path / "workers.log"
    workers = [remote_worker(gateway, keys.gpu_worker, log, "-c", "30") for _ in range(2)]
    try:
        serving(store, 2)
        ids = store.job_enqueue_ids([JobSpec("short", [i], queue="llm") for i in range(3000)])
        wait_for(lambda: succeeded(store) == 3000, timeout=90,
                 what="every job")  # fmt: skip
        finished_once(store, ids)
        assert all(w.poll() is None for w in workers), log.read_text()[-3000:]
    finally:
        stop(*workers)
    assert "Traceback" not in log.read_text()


@pytest.fixture
def tls_gateway(store_url: str, tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """A gateway serving HTTPS with a certificate of its own for 127.0.0.1 (openssl)."""
    if shutil.which("openssl") is None:
        pytest.skip("openssl is needed to make a certificate")
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
         "-keyout", str(key), "-out", str(cert), "-subj", "/CN=127.0.0.1",
         "-addext", "subjectAltName=IP:127.0.0.1"],
        check=True, capture_output=True,
    )  # fmt: skip
    port = free_port()
    log = (tmp_path / "tls-gateway.log").open("wb")
    process = subprocess.Popen(
        [sys.executable, "-m", "plunder", "--db", store_url, "serve", "--port", str(port),
         "--tls-cert", str(cert), "--tls-key", str(key)],
        stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
        env=support.env_without_database(), cwd=support.ROOT,
    )  # fmt: skip
    url = f"https://127.0.0.1:{port}"
    try:
        wait_for(lambda: _healthy(url, cert), timeout=30, what="the HTTPS gateway")
        yield url, cert
    finally:
        process.terminate()
        process.wait(timeout=10)
        log.close()


def _healthy(url: str, cert: Path) -> bool:
    try:
        context = ssl.create_default_context(cafile=str(cert))
        return httpx.get(url + "/v1/health", timeout=1, verify=context).status_code == 200
    except httpx.TransportError:
        return False


def test_turns_go_ahead_over_tls_checked_as_the_client_checks(
    tls_gateway: tuple[str, Path], keys: Keys, store: Store
) -> None:
    url, cert = tls_gateway
    ids = enqueue(store, 4)
    trusting = HttpLink(Client(url, keys.worker, verify=str(cert), busy_total=1.0))
    doubting = HttpLink(Client(url, keys.worker, busy_total=1.0))  # the system's CAs
    try:
        session = trusting.open(hello())
        pipe = trusting.pipe()
        send(pipe, session.id, [], limit=2)
        send(pipe, session.id, [], limit=2)
        claimed = [j for _ in range(2) for j in pipe.receive().jobs()]
        assert sorted(j.id for j in claimed) == ids
        with pytest.raises(errors.StoreUnavailable, match="CERTIFICATE_VERIFY_FAILED"):
            send(doubting.pipe(), session.id, [])
    finally:
        trusting.close_client()
        doubting.close_client()
