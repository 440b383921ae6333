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
    for web, inside in (
        ("POST /orders", "inside the task"),
        ("POST /async", "inside the async task"),
    ):
        (request,) = [s for s in spans if s["name"] == web]
        in_trace = {s["name"]: s for s in spans if s["trace"] == request["trace"]}
        # one trace, from the web request through the enqueue to the run in the worker
        enqueue, claim = in_trace["plunder.enqueue"], in_trace["plunder.claim"]
        run, ack = in_trace["plunder.run"], in_trace["plunder.acknowledge"]
        assert enqueue["parent"] == request["span"]
        assert claim["parent"] == enqueue["span"] and run["parent"] == enqueue["span"]
        assert ack["parent"] == run["span"] and in_trace[inside]["parent"] == run["span"]
        assert run["outcome"] == "succeeded" and run["job_id"] is not None
    assert len(spans) == 2 * 6  # each trace: request, enqueue, claim, run, the task's, ack


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
