"""Run by tests/worker/test_tracing.py in a process of its own (a tracer provider is set
once per process): a web request's span enqueues a job, a worker on a thread runs it, and
every finished span is printed as one JSON line."""

from __future__ import annotations

import json
import sys

from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from tests.worker.conftest import wait_for, worker_in_thread
from tests.worker.tasks import app


def main(url: str) -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
    with worker_in_thread(url):
        with trace.get_tracer("web").start_as_current_span("POST /orders"):
            job = app.enqueue("add", [2, 3])
        assert job.result(timeout=30) == 5
        wait_for(
            lambda: any(s.name == "plunder.acknowledge" for s in exporter.get_finished_spans()),
            30,
            "the acknowledgement's span",
        )
    for span in exporter.get_finished_spans():
        print(json.dumps({
            "name": span.name,
            "trace": span.context.trace_id,
            "span": span.context.span_id,
            "parent": span.parent.span_id if span.parent else None,
            "job_id": span.attributes.get("plunder.job_id"),
            "outcome": span.attributes.get("plunder.outcome"),
            "expected_job": job.id,
        }))  # fmt: skip


if __name__ == "__main__":
    main(sys.argv[1])
