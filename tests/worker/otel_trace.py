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


@app.task(name="traced")
def traced(a: int) -> int:
    with trace.get_tracer("task").start_as_current_span("inside the task"):
        return a + 1


@app.task(name="traced_async")
async def traced_async(a: int) -> int:
    with trace.get_tracer("task").start_as_current_span("inside the async task"):
        return a + 2


def main(url: str) -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
    with worker_in_thread(url):
        with trace.get_tracer("web").start_as_current_span("POST /orders"):
            job = app.enqueue("traced", [2])
        with trace.get_tracer("web").start_as_current_span("POST /async"):
            other = app.enqueue("traced_async", [2])
        assert job.result(timeout=30) == 3 and other.result(timeout=30) == 4
        wait_for(
            lambda: (
                sum(s.name == "plunder.acknowledge" for s in exporter.get_finished_spans()) == 2
            ),
            30,
            "the acknowledgements' spans",
        )
    for span in exporter.get_finished_spans():
        print(json.dumps({
            "name": span.name,
            "trace": span.context.trace_id,
            "span": span.context.span_id,
            "parent": span.parent.span_id if span.parent else None,
            "job_id": (span.attributes or {}).get("plunder.job_id"),
            "outcome": (span.attributes or {}).get("plunder.outcome"),
        }))  # fmt: skip


if __name__ == "__main__":
    main(sys.argv[1])
