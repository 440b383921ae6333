"""OpenTelemetry traces (the ``otel`` extra), on where the process set a tracer provider.

```
 producer  ── span "plunder.enqueue" (a child of the caller's: a web request's) ─┐
              its W3C trace context stored with the jobs (plunder_traces)        │
 worker    ── per job, children of that context:                                 ▼
              "plunder.claim" (at its claim) ─ "plunder.run" (start to acknowledgement)
                                                ├─ the task's own spans (threads, async)
                                                └─ "plunder.acknowledge" (the outcome)
```

plunder never imports OpenTelemetry itself: a process traces when its program imported
``opentelemetry.trace`` and set a tracer provider (the SDK's, with an exporter). Otherwise
each hook is a look in ``sys.modules`` and nothing is written to the database.
"""

from __future__ import annotations

import contextlib
import json
import logging
import sys
import threading
from collections.abc import Awaitable, Callable, Iterator, Sequence
from typing import Any

from plunder import errors
from plunder.model import AckResult, JobRecord, JobSpec

log = logging.getLogger("plunder.tracing")

MAX_OPEN = 100_000  # run spans awaiting their acknowledgement (then forgotten)
_open: dict[tuple[int, int], Any] = {}  # (job id, attempt): its run span
_lock = threading.Lock()


def _trace() -> Any:
    """The ``opentelemetry.trace`` module where the process set a tracer provider."""
    module = sys.modules.get("opentelemetry.trace")
    if module is None:
        return None
    provider = module.get_tracer_provider()
    if isinstance(provider, module.ProxyTracerProvider | module.NoOpTracerProvider):
        return None
    return module


def active() -> bool:
    return _trace() is not None


@contextlib.contextmanager
def enqueue_span(specs: Sequence[JobSpec]) -> Iterator[str | None]:
    """A "plunder.enqueue" span around an enqueue, and its context as the text to store
    with the jobs; None (and no span) where the process does not trace."""
    trace = _trace()
    if trace is None or not specs:
        yield None
        return
    from opentelemetry import propagate

    tracer = trace.get_tracer("plunder")
    with tracer.start_as_current_span("plunder.enqueue", kind=trace.SpanKind.PRODUCER) as span:
        span.set_attribute("plunder.task", specs[0].task)
        span.set_attribute("plunder.queue", specs[0].queue)
        span.set_attribute("plunder.jobs", len(specs))
        carrier: dict[str, str] = {}
        propagate.inject(carrier)
        yield json.dumps(carrier)


def started(jobs: Sequence[JobRecord], store: Any) -> None:
    """Jobs claimed and started: a "plunder.claim" span and an open "plunder.run" span for
    each, children of the context each was enqueued under (read from ``store``, a
    plunder Store, in one query; None: the jobs came from a gateway, no parent)."""
    trace = _trace()
    if trace is None or not jobs:
        return
    from opentelemetry import propagate

    try:
        carriers = store.trace_get_many([job.id for job in jobs]) if store is not None else {}
    except errors.StoreError as exc:  # the jobs run all the same: tracing never stops them
        log.warning("could not read the jobs' trace contexts (%s); their spans have no parent", exc)
        carriers = {}
    tracer = trace.get_tracer("plunder")
    with _lock:
        if len(_open) > MAX_OPEN:
            _open.clear()
        for job in jobs:
            text = carriers.get(job.id)
            parent = propagate.extract(json.loads(text)) if text else None
            attributes = {
                "plunder.job_id": job.id,
                "plunder.attempt": job.attempt,
                "plunder.task": job.task,
                "plunder.queue": job.queue,
            }
            kind = trace.SpanKind.CONSUMER
            tracer.start_span("plunder.claim", parent, kind=kind, attributes=attributes).end()
            run = tracer.start_span("plunder.run", parent, kind=kind, attributes=attributes)
            _open[(job.id, job.attempt)] = run


def acknowledged(ack: AckResult, outcome: str) -> None:
    """Results written: each run span gets a "plunder.acknowledge" child and ends, with
    ``outcome`` (or "stale", for a result refused)."""
    trace = _trace()
    if trace is None:
        return
    tracer = trace.get_tracer("plunder")
    ended = [(claim, outcome) for claim in ack.accepted] + [(c, "stale") for c in ack.stale]
    with _lock:
        runs = [(_open.pop((c.job_id, c.attempt), None), result) for c, result in ended]
    for run, result in runs:
        if run is None:
            continue
        run.set_attribute("plunder.outcome", result)
        if result != "succeeded":
            run.set_status(trace.Status(trace.StatusCode.ERROR, result))
        context = trace.set_span_in_context(run)
        tracer.start_span(
            "plunder.acknowledge", context, attributes={"plunder.outcome": result}
        ).end()
        run.end()


def call(job: JobRecord, fn: Callable[..., Any], args: list[Any], kwargs: dict[str, Any]) -> Any:
    """``fn(*args, **kwargs)`` (a task, on its thread), inside the job's run span where it
    has one: the task's own spans are its children."""
    run = _open.get((job.id, job.attempt)) if _open else None
    if run is None:
        return fn(*args, **kwargs)
    from opentelemetry import context

    token = context.attach(sys.modules["opentelemetry.trace"].set_span_in_context(run))
    try:
        return fn(*args, **kwargs)
    finally:
        context.detach(token)


def awaited(job: JobRecord, coroutine: Awaitable[Any]) -> Awaitable[Any]:
    """An async task's coroutine, awaited inside the job's run span where it has one (the
    coroutine itself otherwise: nothing added to await)."""
    run = _open.get((job.id, job.attempt)) if _open else None
    return coroutine if run is None else _in_span(run, coroutine)


async def _in_span(run: Any, coroutine: Awaitable[Any]) -> Any:
    from opentelemetry import context

    token = context.attach(sys.modules["opentelemetry.trace"].set_span_in_context(run))
    try:
        return await coroutine
    finally:
        context.detach(token)
