"""Prometheus metrics after a known workload, parsed by prometheus_client's own parser and
checked against the database: the gateway's ``/metrics`` and a real worker process's
``--metrics-port``, on each backend; and ``--log-format json`` lines of a real worker."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from plunder.store import Store
from tests.gateway.conftest import Keys, client
from tests.support.gateway import ROOT, Gateway
from tests.support.pgcluster import free_port
from tests.worker.conftest import FAST, wait_for

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def parsed(text: str) -> Samples:
    """Every sample of a scrape, by name and labels (the parser's, so the format is real)."""
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples.get((name, frozenset(labels.items())), 0.0)


def total(samples: Samples, name: str, **labels: str) -> float:
    """The sum of ``name`` over the series that have ``labels``."""
    want = set(labels.items())
    return sum(v for (n, ls), v in samples.items() if n == name and want <= ls)


@pytest.fixture
def worker(store_url: str, tmp_path: Path) -> Iterator[tuple[subprocess.Popen[bytes], int, Path]]:
    """``plunder --log-format json worker --metrics-port P`` on the test database."""
    port = free_port()
    log = tmp_path / "worker.log"
    args = [sys.executable, "-m", "plunder", "--db", store_url, "--log-format", "json"]
    args += ["worker", "-A", "tests.worker.tasks:app", "-q", "default", "--metrics-port"]
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [*args, str(port), *FAST],
            cwd=ROOT,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env={**os.environ, "PLUNDER_URL": store_url},
        )
    try:
        yield proc, port, log
    finally:
        proc.kill()
        proc.wait(timeout=10)


def scrape(url: str, key: str | None = None) -> Samples:
    headers = {} if key is None else {"Authorization": f"Bearer {key}"}
    answer = httpx.get(url, headers=headers, timeout=10)
    assert answer.status_code == 200, answer.text
    assert answer.headers["content-type"].startswith("text/plain")
    return parsed(answer.text)


def test_metrics_match_the_database_after_a_known_workload(
    gateway: Gateway, keys: Keys, store: Store, worker: tuple[subprocess.Popen[bytes], int, Path]
) -> None:
    proc, port, log = worker
    worker_url = f"http://127.0.0.1:{port}/metrics"
    wait_for(lambda: store.task_get("add") is not None, 30, "the worker's published tasks")
    jobs = (
        [{"task": "add", "args": [i, 1]} for i in range(20)]
        + [{"task": "fails", "args": ["key"]} for _ in range(3)]
        + [{"task": "add", "args": [0, 0], "queue": "idle"} for _ in range(5)]  # not served
        + [{"task": "streamer", "args": [3]}]
    )
    with client(gateway, keys.producer) as http:
        for job in jobs:
            assert http.post("/v1/jobs", json={"jobs": [job]}).status_code == 201

    def counts() -> dict[str, dict[str, int]]:
        return {q.queue: q.counts for q in store.queue_stats()}

    wait_for(
        lambda: counts()["default"]["succeeded"] == 21 and counts()["default"]["failed"] == 3,
        60,
        "the workload to finish",
    )
    database = counts()

    def worker_done() -> Samples | None:
        samples = scrape(worker_url)
        done = total(samples, "plunder_jobs_finished_total") == 24
        fresh = value(samples, "plunder_jobs", queue="default", status="pending") == 0
        return samples if done and fresh else None

    mine = wait_for(worker_done, 30, "the worker's metrics to show the workload")
    assert isinstance(mine, dict)
    finished = "plunder_jobs_finished_total"
    assert value(mine, finished, queue="default", task="add", outcome="succeeded") == 20
    assert value(mine, finished, queue="default", task="fails", outcome="failed") == 3
    for status in ("succeeded", "failed"):  # the worker's counts are the database's
        assert total(mine, finished, outcome=status) == database["default"][status]
    assert total(mine, "plunder_jobs_started_total", queue="default") == 24
    assert total(mine, "plunder_job_run_seconds_count") == 24
    assert total(mine, "plunder_job_wait_seconds_count") == 24
    assert value(mine, "plunder_sessions_opened_total") == 1
    assert value(mine, "plunder_stale_acknowledgements_total") == 0
    assert total(mine, "plunder_janitor_passes_total") >= 1
    for queue, by_status in database.items():  # the gauges are the database's counts
        for status in ("pending", "running"):
            n = by_status[status]
            assert value(mine, "plunder_jobs", queue=queue, status=status) == n, (queue, status)
    assert value(mine, "plunder_jobs", queue="idle", status="pending") == 5
    assert value(mine, "plunder_oldest_pending_seconds", queue="idle") > 0

    theirs = scrape(f"{gateway.url}/metrics", keys.reader)  # any key that may read
    assert total(theirs, "plunder_jobs_enqueued_total") == len(jobs)
    assert value(theirs, "plunder_jobs_enqueued_total", queue="idle", task="add") == 5
    assert total(theirs, "plunder_jobs_finished_total") == 0  # its workers are elsewhere
    for queue, by_status in database.items():
        for status in ("pending", "running"):
            n = by_status[status]
            assert value(theirs, "plunder_jobs", queue=queue, status=status) == n, (queue, status)
    posted = dict(route="/v1/jobs", method="POST", status="201")
    assert value(theirs, "plunder_gateway_request_seconds_count", **posted) == len(jobs)

    # every line of the worker's log is JSON; the task's line names its job
    lines = [json.loads(line) for line in log.read_text().splitlines() if line.strip()]
    assert all({"time", "level", "logger", "message"} <= set(line) for line in lines)
    (streamed,) = [line for line in lines if line["message"] == "streamed 3 chunks"]
    job = store.job_get(int(streamed["job_id"]))
    assert (streamed["task"], streamed["attempt"], streamed["queue"]) == ("streamer", 1, "default")
    assert job.task == "streamer" and streamed["session"]
    assert proc.poll() is None


def test_metrics_need_a_key_that_may_read(gateway: Gateway, keys: Keys) -> None:
    for key, status in ((None, 401), ("plk_nothing", 401), (keys.worker, 403)):
        with client(gateway, key) as http:
            answer = http.get("/metrics")
            assert answer.status_code == status, answer.text
            assert "error" in answer.json()
    for key in (keys.reader, keys.producer, keys.admin, keys.gpu_producer):
        with client(gateway, key) as http:
            assert http.get("/metrics").status_code == 200
