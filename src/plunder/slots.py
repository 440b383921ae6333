"""A worker's slots: the jobs it runs, the outcomes they come back with, and the results
waiting to be sent.

```
 start(jobs) ─▶ a runner per task (threads, the event loop, the warm process pool)
                    │ each job's Finished (result or error), or a Wake posted by another thread
                    ▼
 collect() ─── outcomes ─▶ results in the Outbox (sent by plunder.turns) ─ slot freed
 enforce_deadlines() ───▶ a job past its timeout is stopped, failed as timed out
```

A job takes as many slots as it costs (``cost``, decision 0019), from its start until its
task has returned: a job stopped (cancelled, timed out, its session lost) keeps them while
its thread or child still runs (plunder.stopping). Only the worker's main thread starts,
collects and forgets; the heartbeat's thread reads the running claims and stops tasks.
"""

from __future__ import annotations

import contextlib
import logging
import queue
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from plunder import errors, payload
from plunder.context import Context, Sink
from plunder.execution import (
    AsyncRunner,
    Finished,
    Handle,
    ThreadRunner,
    after_acknowledged,
    failure,
    failure_of,
)
from plunder.labels import Labels
from plunder.model import Claim, Completion, ErrorInfo, Failure, JobRecord, build_completion
from plunder.pool import ProcessRunner
from plunder.states import Outcome as RunOutcome
from plunder.stopping import Stopping

log = logging.getLogger("plunder.worker")


@dataclass(frozen=True)
class Wake:
    """Posted by another thread to wake the main loop: forget these claims (their tasks
    were told to stop already), or look at a lost session or new work."""

    claims: tuple[Claim, ...] = ()


@dataclass
class Outbox:
    """Results of finished attempts not sent yet, in the order they finished."""

    completions: list[Completion] = field(default_factory=list)
    failures: list[Failure] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.completions or self.failures)

    def job_ids(self) -> set[int]:
        return {c.claim.job_id for c in self.completions} | {f.claim.job_id for f in self.failures}

    def clear(self) -> int:
        """Forget them all (their session is gone: they would be refused); how many."""
        dropped = len(self.completions) + len(self.failures)
        self.completions.clear()
        self.failures.clear()
        return dropped


class Slots:
    def __init__(
        self,
        concurrency: int,
        *,
        pool: str | None,
        task: Callable[[str], Any],
        sink: Sink,
        on_stream: Callable[[], None],
    ) -> None:
        """``task(name)``: a registered task; ``sink``: where tasks' streams and
        transactions go; ``on_stream()``: a task has stream events to write."""
        self.concurrency = concurrency
        self.labels: Labels | None = None  # the worker's, which its tasks may change
        self.outbox = Outbox()
        self.outcomes: queue.SimpleQueue[Finished | Wake] = queue.SimpleQueue()
        self._pool = pool
        self._task = task
        self._sink = sink
        self._on_stream = on_stream
        self._threads = ThreadRunner(self.outcomes)
        self._async = AsyncRunner(self.outcomes)
        self._processes = ProcessRunner(self.outcomes, size=concurrency)
        self._lock = threading.Lock()
        self._running: dict[int, Handle] = {}
        self._taken = 0  # the slots of the running jobs: the sum of their costs
        self._stopping = Stopping()  # stopped, not returned yet: each holds its slot
        self._deadlines: dict[int, float] = {}  # job id: time.monotonic() of its timeout
        self._suspects = 0  # suspects among the running
        self.limited: dict[int, str] = {}  # job id: limit key, until its result is written
        # told the limit keys of jobs whose results committed in their own transaction
        self.on_acknowledged: Callable[[list[str]], None] | None = None

    # -- what is taken ----------------------------------------------------------------------
    def busy(self) -> int:
        """The slots taken: by running jobs, and by stopped ones not returned yet, each
        its cost."""
        return self._taken + self._stopping.count

    def free(self) -> int:
        return max(0, self.concurrency - self.busy())

    def handles(self) -> list[Handle]:
        """The running jobs (from any thread)."""
        with self._lock:
            return list(self._running.values())

    def claims(self) -> list[Claim]:
        return [h.ctx.claim for h in self.handles()]

    def running_ids(self) -> set[int]:
        with self._lock:
            return set(self._running)

    def may_take_suspect(self) -> bool:
        """At most one suspect at a time in the process: a suspect may be the job that
        killed its last worker, and whatever runs beside it dies with it if so."""
        return not self._suspects

    def next_due(self) -> float:
        """When the next task deadline or stop grace falls due (time.monotonic())."""
        return min([*self._deadlines.values(), self._stopping.next_due() or float("inf")])

    # -- starting ---------------------------------------------------------------------------
    def start(self, jobs: Sequence[JobRecord]) -> None:
        """Start claimed jobs, each on its task's runner: those of the thread pool are
        handed to it together (one look at its lock, one thread called for them all)."""
        get, sink, wake = self._task, self._sink, self._on_stream
        handles = [
            Handle(job=job, task=get(job.task), ctx=Context(job, sink, on_flush_needed=wake))
            for job in jobs
        ]
        with self._lock:
            for handle in handles:
                self._running[handle.job.id] = handle
                self._taken += handle.job.cost
        self.limited.update((j.id, j.limit_key) for j in jobs if j.limit_key is not None)
        for handle in handles:
            handle.ctx.labels = self.labels
        now = time.monotonic()
        pooled = []
        for handle in handles:
            job = handle.job
            if job.suspect:
                self._suspects += 1
            if job.timeout is not None:
                self._deadlines[job.id] = now + job.timeout
            runner = self._runner(handle.task)
            if runner is self._threads:
                pooled.append(handle)
                continue
            try:
                runner.start(handle)
            except Exception as exc:  # could not even start: the job fails with why
                self.outcomes.put(Finished(job, False, error=exc))
        for handle, why in self._threads.start_many(pooled):
            self.outcomes.put(Finished(handle.job, False, error=why))
        self._started(bool(handles), bool(pooled))

    def _started(self, any_job: bool, threads_woken: bool) -> None:
        if any_job:
            self._on_stream()  # the streamer, idle while nothing ran, keeps their pace
        if threads_woken:
            time.sleep(0)  # hand the GIL to the task thread just woken before our bookkeeping

    def _runner(self, task: Any) -> ThreadRunner | AsyncRunner | ProcessRunner:
        if task.is_async:
            return self._async
        if task.pool == "process" or self._pool == "process":
            return self._processes
        return self._threads

    # -- outcomes ---------------------------------------------------------------------------
    def collect(self, *, block: bool, timeout: float = 0.0) -> None:
        """Take in the outcomes that are ready (waiting up to ``timeout`` for the first if
        ``block``): they go out in the same batch."""
        try:
            first = self.outcomes.get(block=block, timeout=timeout if block else None)
        except queue.Empty:
            return
        self.record([first, *self.ready()])

    def ready(self) -> list[Finished | Wake]:
        """Every outcome waiting, taken but not yet recorded."""
        taken: list[Finished | Wake] = []
        with contextlib.suppress(queue.Empty):
            while True:
                taken.append(self.outcomes.get_nowait())
        return taken

    def record(self, outcomes: Sequence[Finished | Wake]) -> None:
        """Take in outcomes, in order: the results to send, the failures to report; the
        slots of the jobs they end are freed together (one look at the lock)."""
        ended: list[tuple[Handle, Finished]] = []
        for outcome in outcomes:
            if isinstance(outcome, Wake):
                self._end(ended)  # those before it first, as they came
                ended = []
                for claim in outcome.claims:
                    handle = self._running.get(claim.job_id)
                    if handle is not None and handle.job.attempt == claim.attempt:
                        self.forget(claim.job_id)
                continue
            handle = self.current(outcome)
            if handle is not None:
                ended.append((handle, outcome))
            else:  # stopped earlier (cancelled, timed out, session lost): its slot frees
                self._stopping.returned(outcome.job.id, outcome.job.attempt)
        self._end(ended)

    def current(self, outcome: Finished | Wake) -> Handle | None:
        """The running job an outcome is of, unless stopped since (or a Wake)."""
        if isinstance(outcome, Wake):
            return None
        handle = self._running.get(outcome.job.id)
        return handle if handle is not None and handle.job.attempt == outcome.job.attempt else None

    def _end(self, ended: list[tuple[Handle, Finished]]) -> None:
        """The jobs of these outcomes no longer run (each unless ended already, by an
        earlier outcome): their results or failures go out with the next turn."""
        with self._lock:
            running = self._running
            ended = [(h, o) for h, o in ended if running.get(h.job.id) is h]
            for handle, _ in ended:
                del running[handle.job.id]
                self._taken -= handle.job.cost
        for handle, outcome in ended:
            self._forgotten(handle)
            handle.flush_stream()
            if handle.ctx.acknowledged:  # its result committed with its acknowledgement
                after_acknowledged(handle, outcome)
                key = self.limited.pop(handle.job.id, None)
                if key is not None and self.on_acknowledged is not None:
                    self.on_acknowledged([key])  # its place is free: admit the key's next
            elif outcome.ok:
                self._succeeded(handle, outcome.result)
            else:
                self.outbox.failures.append(failure_of(handle, outcome))

    def _succeeded(self, handle: Handle, result: Any) -> None:
        try:
            text = payload.encode(result, what="result", of=handle.task.name)
        except errors.PayloadError as exc:
            self.outbox.failures.append(failure(handle, ErrorInfo.from_exception(exc), None))
            return
        self.outbox.completions.append(
            build_completion(handle.ctx.claim, result, tuple(handle.ctx.log_lines), None, text)
        )

    # -- stopping ---------------------------------------------------------------------------
    def forget(self, job_id: int) -> Handle | None:
        """The job no longer runs here (its task was told to stop): its slot is free once
        the task returns."""
        with self._lock:
            handle = self._running.pop(job_id, None)
            if handle is not None:
                self._taken -= handle.job.cost
        if handle is None:
            self._deadlines.pop(job_id, None)
        else:
            self._forgotten(handle)
            self._stopping.add(handle)
        return handle

    def _forgotten(self, handle: Handle) -> None:
        """A job no longer running (out of ``_running``): its deadline and suspect count."""
        self._deadlines.pop(handle.job.id, None)
        if handle.job.suspect:
            self._suspects -= 1

    def stop(self, handle: Handle, reason: str) -> None:
        self._runner(handle.task).stop(handle, reason)

    def enforce_deadlines(self) -> None:
        """Stop the jobs past their timeout; each fails as timed out."""
        now = time.monotonic()
        self._stopping.overdue(now)
        for job_id in [j for j, deadline in self._deadlines.items() if deadline <= now]:
            handle = self.forget(job_id)
            if handle is None:
                continue
            self.stop(handle, "timed out")
            job = handle.job
            info = ErrorInfo(
                "plunder.JobTimeout",
                f"the job ran past its timeout of {job.timeout}s and was stopped",
            )
            delay = 0.0 if job.retry_on_timeout else None
            self.outbox.failures.append(failure(handle, info, delay, RunOutcome.TIMED_OUT))
            log.warning("job %d (%s) timed out after %ss", job.id, job.task, job.timeout)

    def stop_claims(self, claims: Sequence[Claim], reason: str) -> None:
        """Stop the tasks of claims no longer current (from any thread: stopping is
        thread-safe; the main loop forgets them when it wakes)."""
        for claim in claims:
            handle = self._running.get(claim.job_id)
            if handle is not None and handle.job.attempt == claim.attempt:
                self.stop(handle, reason)
                log.warning("job %d attempt %d: stopped (%s)", claim.job_id, claim.attempt, reason)
        self.outcomes.put(Wake(tuple(claims)))

    def stop_all(self, reason: str, *, forget: bool) -> list[Handle]:
        """Tell every running task to stop; with ``forget``, they no longer run here (each
        keeps its slot until it returns). The handles."""
        with self._lock:
            handles = list(self._running.values())
            if forget:
                self._running.clear()
                self._taken = 0
        for handle in handles:
            self.stop(handle, reason)
        if forget:
            self._deadlines.clear()
            self._suspects = 0
            for handle in handles:
                self._stopping.add(handle)
        return handles

    def close(self, timeout: float = 5) -> None:
        """The runners that hold threads or children of their own end (the event loop's
        thread is waited for ``timeout`` seconds at most)."""
        self._async.close(timeout)
        self._processes.close()
