"""Chaos through the gateway, with real processes and real signals (the gateway's share of
the chaos suite): a gateway killed mid-exchange while two others serve (G1), a remote
worker SIGSTOPped past its session's expiry (G2), a key revoked mid-job (G3), and the
database restarted under a gateway (G4), a remote worker partitioned from its gateway (G5)
and one stopped after its gateway died (G6). Each ends with every job finished once, by the
run history the database keeps."""

from __future__ import annotations

import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

import plunder
from plunder.model import JobSpec
from plunder.states import Outcome, Status
from plunder.store import Store, open_store
from tests.gateway.conftest import Keys
from tests.gateway.test_remote_worker import remote_worker, serving
from tests.support import gateway as support
from tests.support import pgcluster
from tests.support.gateway import Gateway
from tests.worker.conftest import wait_for


def finished_once(store: Store, ids: list[int]) -> None:
    """Every job succeeded, by exactly one run; any run before it ended unfinished (lost
    with its session, given back, or its result refused because its session had expired
    when the result arrived: stale), never with a result of its own."""
    for job_id in ids:
        job = store.job_get(job_id)
        assert job.status is Status.SUCCEEDED, (job_id, job.status, job.error)
        runs = store.job_runs(job_id)
        told = [(r.attempt, r.outcome, r.session_id, r.started_at, r.finished_at) for r in runs]
        assert [r.outcome for r in runs].count(Outcome.SUCCEEDED) == 1, (job_id, told)
        unfinished = (Outcome.LOST, Outcome.RELEASED, Outcome.STALE)
        assert all(r.outcome in unfinished for r in runs[:-1]), (
            job_id, told, job.attempt,
        )  # fmt: skip


def stop(*procs: subprocess.Popen[bytes]) -> None:
    for proc in procs:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
    for proc in procs:
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.mark.parametrize("backend", ["postgres"])
def test_g1_a_gateway_killed_mid_exchange_while_two_others_serve(
    gateway: Gateway, keys: Keys, store: Store, store_url: str, tmp_path: Path
) -> None:
    others = [support.start(store_url, tmp_path) for _ in range(2)]
    urls = ",".join([gateway.url, *(g.url for g in others)])
    log = tmp_path / "workers.log"
    workers = [remote_worker(gateway, keys.gpu_worker, log, "--url", urls, "-c", "20")
               for _ in range(2)]  # fmt: skip
    try:
        serving(store, 2)
        # attempts to spare: a session (1.5 s) may expire on a loaded machine; a lost run
        # must then end as finished_once allows, and its job run again
        specs = [JobSpec("short", [i], queue="llm", max_attempts=3) for i in range(1500)]
        ids = store.job_enqueue_ids(specs)
        wait_for(lambda: store.job_get(ids[300]).status is Status.SUCCEEDED, timeout=60,
                 what="the drain under way")  # fmt: skip
        gateway.process.send_signal(signal.SIGKILL)  # every worker's preferred gateway
        wait_for(
            lambda: all(store.job_get(i).status is Status.SUCCEEDED for i in ids[-50:]),
            timeout=90,
            what="the drain through the other gateways",
        )
        finished_once(store, ids)
        assert all(w.poll() is None for w in workers), log.read_text()[-3000:]
    finally:
        stop(*workers)
        for other in others:
            other.stop()
    assert "Traceback" not in log.read_text()


def test_g2_a_remote_worker_stopped_past_its_expiry(
    gateway: Gateway, keys: Keys, store: Store, tmp_path: Path
) -> None:
    log = tmp_path / "workers.log"
    paused = remote_worker(gateway, keys.gpu_worker, log, "-c", "2", "--name", "paused")
    try:
        serving(store, 1)
        ids = store.job_enqueue_ids(
            [JobSpec("whoami", [1.0], queue="llm", max_attempts=3) for _ in range(2)]
        )
        wait_for(lambda: all(store.job_get(i).status is Status.RUNNING for i in ids),
                 timeout=30, what="the paused worker's starts")  # fmt: skip
        paused.send_signal(signal.SIGSTOP)
        rescuer = remote_worker(gateway, keys.gpu_worker, log, "-c", "2", "--name", "rescuer")
        try:
            # expiry 1.5 s (remote_worker's settings), then the gateway's janitor
            wait_for(lambda: all(store.job_get(i).status is Status.SUCCEEDED for i in ids),
                     timeout=60, what="the rescue")  # fmt: skip
            paused.send_signal(signal.SIGCONT)  # its late results are refused by the fence
            time.sleep(3)
            finished_once(store, ids)
            assert {store.job_get(i).result for i in ids} == {rescuer.pid}
            assert paused.poll() is None, "the paused worker must come back, not exit"
        finally:
            stop(rescuer)
    finally:
        paused.send_signal(signal.SIGCONT)
        stop(paused)
    # on waking it judged its session lost by its own clock, dropped what it ran, went on
    assert "SESSION LOST" in log.read_text() and "Opening a new session" in log.read_text()


def test_g3_a_key_revoked_mid_job(
    gateway: Gateway, keys: Keys, store: Store, tmp_path: Path
) -> None:
    revoked_key, kept_key = (store.key_create(role="worker", group="gpu")[1] for _ in range(2))
    log = tmp_path / "workers.log"
    doomed = remote_worker(gateway, revoked_key, log, "-c", "1", "--name", "doomed")
    try:
        serving(store, 1)
        (job_id,) = store.job_enqueue_ids([JobSpec("whoami", [2.0], queue="llm", max_attempts=3)])
        wait_for(lambda: store.job_get(job_id).status is Status.RUNNING, timeout=30,
                 what="the start")  # fmt: skip
        kept = remote_worker(gateway, kept_key, log, "-c", "1", "--name", "kept")
        try:
            _, ended = store.key_revoke(revoked_key.split("_")[1])
            assert len(ended) == 1
            assert doomed.wait(timeout=30) != 0  # refused: it cannot open another session
            wait_for(lambda: store.job_get(job_id).status is Status.SUCCEEDED, timeout=60,
                     what="the rescue")  # fmt: skip
            finished_once(store, [job_id])
            assert store.job_get(job_id).result == kept.pid
        finally:
            stop(kept)
    finally:
        stop(doomed)
    assert "revoked or expired" in log.read_text()


@pytest.fixture
def own_cluster() -> Iterator[pgcluster.Cluster]:
    cluster = pgcluster.create({})  # durable: fsync and synchronous commit on
    try:
        with psycopg.connect(cluster.url(), autocommit=True) as conn:
            conn.execute("CREATE DATABASE chaos")
        yield cluster
    finally:
        cluster.destroy()


def test_g4_the_database_restarted_under_a_gateway(
    own_cluster: pgcluster.Cluster, tmp_path: Path
) -> None:
    url = own_cluster.url("chaos")
    store = open_store(url)
    store.migrate()
    worker_key = store.key_create(role="worker", group="gpu", queues=["llm"])[1]
    producer_key = store.key_create(role="producer", group="gpu")[1]
    gateway = support.start(url, tmp_path)
    log = tmp_path / "workers.log"
    worker = remote_worker(gateway, worker_key, log, "-c", "4")
    producer = plunder.App(gateway.url, key=producer_key)
    try:
        serving(store, 1)

        # a restart may outlast the worker's session (1.5 s): a job it ran then is lost,
        # and with a retry left it runs again (retries=0 would end it timed_out, rightly)
        def send(numbers: range) -> list[int]:
            return [producer.enqueue("short", [i], retries=3).id for i in numbers]

        ids = send(range(100))
        own_cluster.stop("fast")
        own_cluster.start()
        ids += send(range(100, 200))
        own_cluster.stop("immediate")
        own_cluster.start()
        ids += send(range(200, 300))
        wait_for(lambda: all(store.job_get(i).status is Status.SUCCEEDED for i in ids),
                 timeout=120, what="every job, after two restarts")  # fmt: skip
        finished_once(store, ids)
        assert worker.poll() is None, log.read_text()[-3000:]
    finally:
        producer.close()
        stop(worker)
        gateway.stop()
        store.close()
    assert "Traceback" not in gateway.output()


def test_g5_a_remote_worker_partitioned_from_its_gateway(
    gateway: Gateway, keys: Keys, store: Store, tmp_path: Path
) -> None:
    """The worker's traffic to its gateway goes through a proxy that starts dropping
    everything (the kernel still ACKs: a hung peer, not a dead one). Its heartbeats time
    out (half its session expiry), it judges its session lost, its jobs are rescued by a
    worker that still reaches the gateway; healed, it opens a new session and works on."""
    from tests.chaos.chaosproxy import ChaosProxy

    port = int(gateway.url.rsplit(":", 1)[1])
    log = tmp_path / "workers.log"
    with ChaosProxy("127.0.0.1", port) as proxy:
        through = f"http://127.0.0.1:{proxy.port}"
        cut_off = remote_worker(gateway, keys.gpu_worker, log, "--url", through, "-c", "2",
                                "--name", "cut-off")  # fmt: skip
        try:
            serving(store, 1)
            ids = store.job_enqueue_ids(
                [JobSpec("whoami", [1.5], queue="llm", max_attempts=3) for _ in range(2)]
            )
            wait_for(lambda: all(store.job_get(i).status is Status.RUNNING for i in ids),
                     timeout=30, what="the cut-off worker's starts")  # fmt: skip
            proxy.mode = "blackhole"
            rescuer = remote_worker(gateway, keys.gpu_worker, log, "-c", "2", "--name", "rescuer")
            try:
                wait_for(lambda: all(store.job_get(i).status is Status.SUCCEEDED for i in ids),
                         timeout=60, what="the rescue")  # fmt: skip
                assert {store.job_get(i).result for i in ids} == {rescuer.pid}
                proxy.mode = "pass"
                (late,) = store.job_enqueue_ids([JobSpec("whoami", [0.0], queue="llm")])
                wait_for(
                    lambda: (
                        sum(s.name == "cut-off" for s in store.session_list()) == 1
                        and store.job_get(late).status is Status.SUCCEEDED
                    ),
                    timeout=60,
                    what="the healed worker back with a new session",
                )
                finished_once(store, ids)
                assert cut_off.poll() is None, log.read_text()[-3000:]
            finally:
                stop(rescuer)
        finally:
            proxy.mode = "pass"
            stop(cut_off)
    assert "SESSION LOST" in log.read_text()


@pytest.mark.parametrize("backend", ["sqlite"])
@pytest.mark.parametrize("running", [False, True], ids=["idle", "running"])
def test_g6_a_remote_worker_stops_soon_after_its_gateway_died(
    keys: Keys, store: Store, store_url: str, tmp_path: Path, running: bool
) -> None:
    """SIGTERM after the gateway is gone: the worker judges its session lost at its
    expiry (1.5 s here), gives up the calls still trying the dead gateway (they would
    try for their whole budget otherwise) and exits, its close bounded like a heartbeat."""
    alone = support.start(store_url, tmp_path)
    log = tmp_path / "worker.log"
    worker = remote_worker(alone, keys.gpu_worker, log, "-c", "2", "--grace", "60")
    try:
        serving(store, 1)
        if running:
            (job,) = store.job_enqueue_ids([JobSpec("whoami", [60.0], queue="llm")])
            wait_for(lambda: store.job_get(job).status is Status.RUNNING, timeout=30,
                     what="the job's start")  # fmt: skip
        alone.process.kill()
        alone.process.wait()
        time.sleep(0.5)  # its next exchange or heartbeat meets the refusal
        worker.send_signal(signal.SIGTERM)
        started = time.monotonic()
        try:
            worker.wait(timeout=20)  # each call's budget alone would be 3 s, the stop 60 s
        except subprocess.TimeoutExpired:
            pytest.fail(f"still running 20 s after SIGTERM: {log.read_text()[-3000:]}")
        took = time.monotonic() - started
        assert took < 10, (took, log.read_text()[-3000:])
    finally:
        stop(worker)
        alone.stop()
    assert worker.returncode == 0 and "Traceback" not in log.read_text(), log.read_text()[-3000:]
