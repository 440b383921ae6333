"""Remote workers and producers as real processes: a worker started by the CLI with a
gateway URL and a worker key (no database URL in its environment), a producer App on the
gateway's URL with a producer key; a remote worker SIGKILLed and its job rescued."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import plunder
from plunder.states import Status
from plunder.store import Store
from tests.gateway.conftest import Keys
from tests.support.flows import run_diamond
from tests.support.gateway import ROOT, Gateway, env_without_database
from tests.worker.conftest import wait_for


def remote_worker(gateway: Gateway, key: str, log: Path, *extra: str) -> subprocess.Popen[bytes]:
    env = {**env_without_database(), "PLUNDER_URL": gateway.url, "PLUNDER_KEY": key,
           "PLUNDER_HEARTBEAT_INTERVAL": "0.2", "PLUNDER_SESSION_EXPIRY": "1.5"}  # fmt: skip
    with log.open("ab") as output:
        return subprocess.Popen(
            [sys.executable, "-m", "plunder", "worker", "-A", "tests.gateway.tasks:app", *extra],
            stdout=output, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env, cwd=ROOT,
        )  # fmt: skip


@pytest.fixture
def producer(gateway: Gateway, keys: Keys) -> Iterator[plunder.App]:
    app = plunder.App(gateway.url, key=keys.gpu_producer)
    yield app
    app.close()


def serving(store: Store, count: int) -> None:
    """Wait until ``count`` remote sessions are open (their tasks published)."""
    wait_for(lambda: len(store.session_list()) >= count, timeout=30, what="remote sessions")


def test_a_remote_worker_streams_and_completes_for_a_remote_producer(
    gateway: Gateway, keys: Keys, store: Store, producer: plunder.App, tmp_path: Path
) -> None:
    worker = remote_worker(gateway, keys.gpu_worker, tmp_path / "worker.log", "-c", "2")
    try:
        serving(store, 1)
        job = producer.enqueue("words", ["tokens stream back"])
        chunks = [e.data for e in job.stream(timeout=30)]
        assert chunks == ["tokens", "stream", "back"]
        assert job.result(timeout=30) == "TOKENS STREAM BACK"
        (run,) = job.runs
        assert run.outcome.value == "succeeded" and run.worker
        many = [producer.enqueue("words", [f"n{i}"]) for i in range(20)]
        assert [j.result(timeout=30) for j in many] == [f"N{i}" for i in range(20)]
    finally:
        worker.send_signal(signal.SIGTERM)
        assert worker.wait(timeout=30) == 0, (tmp_path / "worker.log").read_text()
    assert "Traceback" not in (tmp_path / "worker.log").read_text()


def test_a_killed_remote_worker_s_job_is_rescued_by_another(
    gateway: Gateway, keys: Keys, store: Store, producer: plunder.App, tmp_path: Path
) -> None:
    log = tmp_path / "workers.log"
    victim = remote_worker(gateway, keys.gpu_worker, log, "-c", "1")
    try:
        serving(store, 1)
        job = producer.enqueue("hold", [3.0])
        wait_for(lambda: job.refresh().status is Status.RUNNING, timeout=30, what="a start")
        victim.send_signal(signal.SIGKILL)
        victim.wait(timeout=10)
        rescuer = remote_worker(gateway, keys.gpu_worker, log, "-c", "1")
        try:
            assert job.result(timeout=60) == "held"
        finally:
            rescuer.send_signal(signal.SIGTERM)
            rescuer.wait(timeout=30)
    finally:
        if victim.poll() is None:
            victim.kill()
    runs = job.runs
    assert [r.outcome.value for r in runs] == ["lost", "succeeded"], log.read_text()
    assert store.job_get(job.id).attempt == 2


def test_a_workflow_run_by_a_remote_worker_gives_each_child_its_parents_results(
    gateway: Gateway, keys: Keys, store: Store, store_url: str, tmp_path: Path
) -> None:
    log = tmp_path / "worker.log"
    worker = remote_worker(gateway, keys.gpu_worker, log, "-c", "4")
    app = plunder.App(store_url)
    try:
        serving(store, 1)
        ids = run_diamond(app, log.read_text)
        assert {store.job_get(i).queue for i in ids} == {"llm"}
    finally:
        app.close()
        worker.send_signal(signal.SIGTERM)
        assert worker.wait(timeout=30) == 0, log.read_text()
    assert "Traceback" not in log.read_text()


def test_a_remote_worker_has_no_database_url(gateway: Gateway, keys: Keys, tmp_path: Path) -> None:
    env = env_without_database()
    assert not any(v.startswith(("postgresql:", "sqlite:")) for v in env.values())
    assert "PLUNDER_URL" not in env and os.environ.get("PLUNDER_URL") != gateway.url


def test_a_busy_remote_worker_takes_new_work_and_reports_results_at_once(
    gateway: Gateway, keys: Keys, store: Store, producer: plunder.App, tmp_path: Path
) -> None:
    log = tmp_path / "worker.log"
    worker = remote_worker(gateway, keys.gpu_worker, log, "-c", "2")
    try:
        serving(store, 1)
        long = producer.enqueue("hold", [4.0])
        wait_for(lambda: long.refresh().status is Status.RUNNING, timeout=30, what="a start")
        time.sleep(0.3)  # the worker is busy, one slot free, nothing else to claim
        begun = time.monotonic()
        short = producer.enqueue("words", ["quick"])
        assert short.result(timeout=30) == "QUICK"
        # woken by the gateway (plunder.waker), not by the poll interval (1 s); its result
        # written at once, not after a wait for work
        assert time.monotonic() - begun < 0.6
        assert long.refresh().status is Status.RUNNING
        assert long.result(timeout=30) == "held"
    finally:
        worker.send_signal(signal.SIGTERM)
        worker.wait(timeout=30)
    assert "Traceback" not in log.read_text()


def test_a_busy_remote_worker_starts_a_delayed_job_when_it_is_due(
    gateway: Gateway,
    keys: Keys,
    store: Store,
    producer: plunder.App,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """With a job running and a slot free, the worker's waker reads when the next delayed
    job is due and wakes the loop then: not the poll interval (10 s here), nor a
    notification (none comes when a delay ends). On PostgreSQL only: on SQLite any write
    (a heartbeat) wakes a watch (data_version), and the turn that follows finds it too."""
    log = tmp_path / "worker.log"
    monkeypatch.setenv("PLUNDER_POLL_INTERVAL", "10")
    worker = remote_worker(gateway, keys.gpu_worker, log, "-c", "2")
    try:
        serving(store, 1)
        long = producer.enqueue("hold", [6.0])
        wait_for(lambda: long.refresh().status is Status.RUNNING, timeout=30, what="a start")
        time.sleep(0.3)  # busy, one slot free: the waker watches
        late = producer.enqueue("words", ["late"], delay=1.0)
        assert late.result(timeout=15) == "LATE"
        record = store.job_get(late.id)
        assert record.started_at is not None
        waited = (record.started_at - record.created_at).total_seconds()
        # when due, not a watch later (2 s): a loaded machine has 0.9 s for the turn
        assert 0.9 <= waited < 1.9, waited
        assert long.refresh().status is Status.RUNNING
        assert long.result(timeout=30) == "held"
    finally:
        worker.send_signal(signal.SIGTERM)
        worker.wait(timeout=30)
    assert "Traceback" not in log.read_text()


def test_an_idle_remote_worker_stops_within_seconds(
    gateway: Gateway, keys: Keys, store: Store, tmp_path: Path
) -> None:
    """Its exchange waits at the gateway a couple of seconds at a time, so a SIGTERM is
    not held up by a long-poll."""
    worker = remote_worker(gateway, keys.gpu_worker, tmp_path / "worker.log", "-c", "2")
    serving(store, 1)
    time.sleep(1.0)  # idle: its exchange waits at the gateway
    stopping = time.monotonic()
    worker.send_signal(signal.SIGTERM)
    assert worker.wait(timeout=30) == 0
    assert time.monotonic() - stopping < 5.0
    assert store.session_list() == []  # closed, not left to expire
