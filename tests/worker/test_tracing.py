"""OpenTelemetry traces: a producer's span continues into the job's spans in the worker
(the SDK's in-memory exporter, in a process of its own), and nothing is stored for jobs
enqueued where the process does not trace."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from plunder.model import JobSpec
from plunder.store import Store
from tests.worker.conftest import ROOT


def test_a_producers_trace_continues_into_the_jobs_spans(store_url: str) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "tests.worker.otel_trace", store_url],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PLUNDER_URL": store_url},
        check=False,
    )
    assert done.returncode == 0, done.stderr
    spans = [json.loads(line) for line in done.stdout.splitlines()]
    by_name = {span["name"]: span for span in spans}
    request, enqueue = by_name["POST /orders"], by_name["plunder.enqueue"]
    claim, run, ack = (
        by_name["plunder.claim"],
        by_name["plunder.run"],
        by_name["plunder.acknowledge"],
    )
    # one trace, from the web request through the enqueue to the run in the worker
    assert {s["trace"] for s in (request, enqueue, claim, run, ack)} == {request["trace"]}
    assert enqueue["parent"] == request["span"]
    assert claim["parent"] == enqueue["span"] and run["parent"] == enqueue["span"]
    assert ack["parent"] == run["span"]
    assert run["job_id"] == run["expected_job"] and run["outcome"] == "succeeded"


def test_nothing_is_stored_where_the_process_does_not_trace(store: Store) -> None:
    ids = store.job_enqueue_ids([JobSpec("t", [1]), JobSpec("t", [2])])
    assert store.trace_get_many(ids) == {}


def test_plunder_never_imports_opentelemetry_itself(store_url: str) -> None:
    script = (
        "import sys, plunder\n"
        "app = plunder.App(sys.argv[1])\n"
        "job = app.enqueue('t', [1], allow_unregistered=True)\n"
        "print(sorted(m for m in sys.modules if m.startswith('opentelemetry')))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script, store_url],
        cwd=ROOT, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
