"""Testing helpers for plunder's users, shipped as a pytest plugin (entry point
``pytest11``): the fixture ``plunder_app`` gives a throwaway SQLite app, ``run_until_idle``
runs every due job in the test's own thread, and ``eager`` runs tasks at enqueue.

``run_until_idle`` is a worker without threads: it opens a session, claims one job at a
time through the worker protocol (the same claim, fenced acknowledgement and retry policy
as ``plunder worker``), runs it here, and writes its outcome with the next claim::

    open session ─▶ exchange(outcome of the last, claim 1) ─▶ run it ─▶ … ─▶ none due ─▶ close

A retry whose backoff has not passed is not due yet, so it is not run (the database clock
decides; nothing here sleeps): give such tasks ``backoff_base=0`` in tests. A plain
function cannot be interrupted without a thread: one that runs past its ``timeout`` fails
as timed out when it returns (an ``async def`` task is cancelled at its timeout).

``eager`` tests no store at all: see its docstring for what it leaves out.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from plunder import errors, payload
from plunder.app import App
from plunder.context import Context, LinkSink
from plunder.execution import Finished, Handle, after_acknowledged, call_arguments, failure
from plunder.execution import failure_of as failure_of_task
from plunder.model import ErrorInfo, Failure, JobRecord, JobSpec, build_completion
from plunder.protocol import Beat, ClaimRequest, Hello, Outcome
from plunder.states import Outcome as RunOutcome
from plunder.states import Status
from plunder.store.link import StoreLink

__all__ = ["EagerJob", "Ran", "eager", "enqueued", "plunder_app", "run_until_idle"]


@dataclass
class Ran:
    """What ``run_until_idle`` did: the attempts it ran, and how each ended."""

    attempts: int = 0
    succeeded: list[int] = field(default_factory=list)  # job ids
    failed: list[int] = field(default_factory=list)  # attempts that failed or timed out
    stale: list[int] = field(default_factory=list)  # outcomes the store refused (fencing)


def run_until_idle(
    app: App, *, queues: Sequence[str] | None = None, max_attempts: int = 10_000
) -> Ran:
    """Run every job of ``app``'s tasks that is due, in this thread, until none is (those
    that become due meanwhile too: a retry with no backoff, a job a task enqueued).
    RuntimeError after ``max_attempts`` (a job that re-enqueues itself for ever)."""
    link = StoreLink(app.store)
    served = tuple(queues) if queues is not None else tuple(app.registry.queues())
    session = link.open(
        Hello(
            name="run_until_idle",
            host=socket.gethostname(),
            pid=os.getpid(),
            queues=served,
            tasks=tuple(app.registry.infos()),
            expiry=app.settings.session_expiry,
            free_slots=1,
        )
    )
    ran = Ran()
    pending: list[Outcome] = []
    request = ClaimRequest(served, tuple(app.registry.names()), 1)
    try:
        while True:
            # a long task must not lose the session; the claims whose outcomes go next
            link.heartbeat(Beat(session.id, tuple(o.claim for o in pending), 1))
            reply = link.exchange(session.id, pending, request)
            ran.stale += [c.job_id for c in (*reply.completed.stale, *reply.failed.stale)]
            pending = []
            if not reply.claimed:
                return ran
            if ran.attempts >= max_attempts:
                raise RuntimeError(f"run_until_idle: still busy after {max_attempts} attempts")
            for job in reply.claimed:
                ran.attempts += 1
                outcome = _run_one(app, link, job)
                if outcome is not None:
                    pending.append(outcome)
                    failed = isinstance(outcome, Failure)
                    (ran.failed if failed else ran.succeeded).append(job.id)
    finally:
        if pending:
            link.exchange(session.id, pending, None)
        link.close(session.id)


def _run_one(app: App, link: StoreLink, job: JobRecord) -> Outcome | None:
    """Run one claimed job here; its outcome as the worker's slots make it (None: its
    own transaction acknowledged it already)."""
    task = app.registry.get(job.task)
    handle = Handle(job=job, task=task, ctx=Context(job, LinkSink(link)))
    started = time.monotonic()
    try:
        args, kwargs = call_arguments(task, job, handle.ctx)
        if task.is_async:
            result = asyncio.run(asyncio.wait_for(task.fn(*args, **kwargs), job.timeout))
        else:
            result = task.fn(*args, **kwargs)
        finished = Finished(job, True, result=result)
    except TimeoutError:
        if not task.is_async:
            raise
        return _timed_out(handle)
    except BaseException as exc:  # the job's failure, as the worker reports it
        if isinstance(exc, KeyboardInterrupt | SystemExit):
            raise
        finished = Finished(job, False, error=exc)
    if job.timeout is not None and time.monotonic() - started > job.timeout:
        return _timed_out(handle)
    handle.flush_stream()
    if handle.ctx.acknowledged:
        after_acknowledged(handle, finished)
        return None
    if not finished.ok:
        return failure_of_task(handle, finished)
    try:
        text = payload.encode(finished.result, what="result", of=task.name)
    except errors.PayloadError as exc:
        return failure(handle, ErrorInfo.from_exception(exc), None)
    return build_completion(
        handle.ctx.claim, finished.result, tuple(handle.ctx.log_lines), None, text
    )


def _timed_out(handle: Handle) -> Outcome:
    job = handle.job
    info = ErrorInfo(
        "plunder.JobTimeout", f"the job ran past its timeout of {job.timeout}s and was stopped"
    )
    handle.flush_stream()
    return failure(handle, info, 0.0 if job.retry_on_timeout else None, RunOutcome.TIMED_OUT)


def enqueued(
    app: App, task: Any = None, *, status: Status | str | None = Status.PENDING
) -> list[JobRecord]:
    """The jobs in ``app``'s store (of ``task``, a Task or its name; in ``status``, None:
    any), oldest first: for assertions on what a test enqueued."""
    name = getattr(task, "name", task)
    state = None if status is None else Status(status).value
    found: list[JobRecord] = []
    after: int | None = None
    while True:
        page = app.store.job_list(task=name, status=state, after=after, limit=500)
        found += page.jobs
        if page.next_after is None:
            return sorted(found, key=lambda r: r.id)
        after = page.next_after


@dataclass
class EagerJob:
    """What an eager enqueue ran: its result or its error, never a stored job."""

    id: int
    task: str
    status: Status
    value: Any = None
    error: BaseException | None = None

    def result(self, timeout: float | None = None) -> Any:
        if self.error is not None:
            raise errors.JobFailed(
                f"eager job {self.id} failed: {self.error!r}",
                job_id=self.id,
                status=self.status.value,
                error=ErrorInfo.from_exception(self.error).as_dict(),
            )
        return self.value


@contextlib.contextmanager
def eager(app: App) -> Iterator[list[EagerJob]]:
    """While the block runs, enqueueing a task of ``app`` calls it at once, here, once, and
    returns an :class:`EagerJob`; the list yielded collects them. Arguments and results go
    through JSON as they would. What it does NOT test: the database (nothing is stored,
    ``enqueue_in`` joins no transaction), claims, retries and backoff, timeouts, fencing,
    priorities, delays, limits, partitions, cancellation, stream subscribers, and a task
    that needs ``plunder.Context`` (it gets none). Use ``run_until_idle`` for those."""
    ran: list[EagerJob] = []

    def enqueue_specs(specs: Sequence[JobSpec], *, conn: Any = None) -> list[EagerJob]:
        jobs = [_eager_call(app, spec, -(len(ran) + i + 1)) for i, spec in enumerate(specs)]
        ran.extend(jobs)
        return jobs

    app.enqueue_specs = enqueue_specs  # type: ignore[method-assign, assignment]
    try:
        yield ran
    finally:
        del app.enqueue_specs


def _eager_call(app: App, spec: JobSpec, job_id: int) -> EagerJob:
    task = app.registry.get(spec.task)
    if task.context_param is not None:
        raise errors.ConfigError(f"eager mode cannot run {task.name}: it takes a Context")
    args = payload.decode(payload.encode(spec.args, what="arguments", of=task.name))
    kwargs = payload.decode(payload.encode(spec.kwargs, what="arguments", of=task.name))
    try:
        value = task.fn(*args, **kwargs)
        if task.is_async:
            value = asyncio.run(value)
        value = payload.decode(payload.encode(value, what="result", of=task.name))
    except Exception as exc:
        return EagerJob(job_id, task.name, Status.FAILED, error=exc)
    return EagerJob(job_id, task.name, Status.SUCCEEDED, value=value)


@pytest.fixture
def plunder_app(tmp_path: Path) -> Iterator[App]:
    """A throwaway App on a fresh SQLite file, closed after the test. Register the tasks
    under test on it, or point your own App at ``plunder_app.url``."""
    app = App(f"sqlite:///{tmp_path / 'plunder-test.db'}")
    try:
        yield app
    finally:
        app.close()
