"""How a claimed job's function runs: plain functions on a thread of their own, ``async
def`` functions on the worker's event-loop thread, and ``pool="process"`` functions in a
child process that can be terminated. Each runner reports one outcome per job to the
worker's outcome queue and can be told to stop a job.

A thread cannot be killed: a plain-function task stops cooperatively. Stopping it sets
``ctx.cancelled`` (and wakes ``ctx.wait_cancelled``); its job's outcome is written at once,
but its slot stays taken until the function returns (see plunder.stopping). An ``async
def`` task is cancelled (``CancelledError`` at its next ``await``), and a process-pool
task's child is terminated; each holds its slot until its coroutine ended or its child is
dead. Every runner reports one outcome per job, when the job has really ended.

The process pool's runner is in plunder.pool.
"""

from __future__ import annotations

import asyncio
import collections
import functools
import gc
import logging
import queue
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from plunder import errors, policy, tracing
from plunder.context import Context
from plunder.model import ErrorInfo, Failure, JobRecord
from plunder.states import Outcome as RunOutcome
from plunder.task import Task

log = logging.getLogger("plunder.execution")
STREAM_INTERVAL = 0.05
IDLE_STREAM_INTERVAL = 1.0  # with no job running: woken when one starts (see Slots.start)
worker_log = logging.getLogger("plunder.worker")  # what happened to a worker's jobs

# young objects the collector lets pile up before it looks at them (Python's default: 700)
GC_YOUNG = 20_000


def tune_gc() -> None:
    """For a process that runs a worker (``plunder worker``), once its modules are
    imported. Each job makes a dozen short-lived objects (its record, context, handle,
    outcome, completion), and at Python's default threshold the collector looks at the
    young ones every 700 allocations: every few jobs, while a claim's hundred jobs are still
    alive, so they are traversed again and again and promoted to older generations, whose
    collections then walk every object of the process. Here the young generation is
    collected every GC_YOUNG allocations, by which time most of those objects were freed by
    their reference counts, and what was imported before the work began is moved out of
    the collector's sight (``gc.freeze``); measured in docs/decisions/0005-collector-tuning.md.
    Reference cycles are still collected, a little later."""
    gc.collect()
    gc.freeze()
    _, older, oldest = gc.get_threshold()
    gc.set_threshold(GC_YOUNG, older, oldest)


@dataclass(slots=True)
class Finished:
    """What one attempt produced: a result, or an error."""

    job: JobRecord
    ok: bool
    result: Any = None
    error: BaseException | None = None
    error_info: ErrorInfo | None = None


@dataclass(slots=True)
class Handle:
    """A job in flight, as its runner knows it."""

    job: JobRecord
    task: Task
    ctx: Context
    future: asyncio.Task[Any] | None = None  # an async task's, on the runner's loop

    def flush_stream(self) -> None:
        """Write the stream events and progress its task buffered (fenced by its claim);
        a failure is logged, and what failed to go out is tried again at the next flush."""
        try:
            self.ctx.flush()
        except errors.StaleClaim:
            log.warning("job %d: stream refused, claim no longer current", self.job.id)
        except errors.StoreError as exc:
            log.warning("job %d: stream write failed (%s); will retry", self.job.id, exc)


def stream_loop(
    handles: Callable[[], list[Handle]], wake: threading.Event, stop: threading.Event
) -> None:
    """A worker's streamer, until ``stop``: flush the running jobs' streams every
    STREAM_INTERVAL, or at once when a task buffered FLUSH_BYTES (``wake``). With no job
    running it sleeps until ``wake`` (set as jobs start), so that an idle worker stays
    idle."""
    running: list[Handle] = []
    while not stop.is_set():
        wake.wait(STREAM_INTERVAL if running else IDLE_STREAM_INTERVAL)
        wake.clear()
        running = handles()
        for handle in running:
            handle.flush_stream()


def failure(
    handle: Handle, info: ErrorInfo, delay: float | None, outcome: RunOutcome = RunOutcome.FAILED
) -> Failure:
    """The failure of a handle's attempt, retried after ``delay`` seconds (None: not)."""
    logs = tuple(handle.ctx.log_lines)
    return Failure(handle.ctx.claim, info, retry_delay=delay, logs=logs, outcome=outcome)


def failure_of(handle: Handle, outcome: Finished) -> Failure:
    """A task that raised: retried after its backoff if its task retries that error
    (attempts left are the store's to count), never if its arguments did not fit."""
    exc = outcome.error
    info = outcome.error_info or ErrorInfo.from_exception(exc or RuntimeError("unknown"))
    retry = exc is None or handle.task.should_retry(exc)
    if isinstance(exc, TypeError) and "do not fit task" in str(exc):
        retry = False  # the arguments will not fit next time either
    job = handle.job
    delay = policy.retry_delay(job.attempt, job.backoff_base, job.backoff_cap)
    worker_log.info(
        "job %d (%s) attempt %d failed: %s: %s",
        job.id,
        job.task,
        job.attempt,
        info.type,
        info.message,
    )
    return failure(handle, info, delay if retry else None)


def after_acknowledged(handle: Handle, outcome: Finished) -> None:
    """The task's own transaction acknowledged it with its result: an error raised after
    that, or a return value other than that result, cannot change the job (it committed).
    Either is refused and logged as an error naming the job."""
    if handle.ctx.released:  # given back by pause_limit: its LimitPaused ended it
        return
    if not outcome.ok:
        worker_log.error(
            "job %d (%s) raised after its transaction acknowledged it; the job keeps "
            "its committed result: %r",
            handle.job.id,
            handle.job.task,
            outcome.error,
        )
        return
    refused = handle.ctx.refused_return(outcome.result)
    if refused is not None:
        worker_log.error("%s (task %s)", refused, handle.job.task)


_fits: dict[tuple[Any, ...], str | None] = {}  # (function, shape of the call) -> why not


def call_arguments(task: Task, job: JobRecord, ctx: object) -> tuple[list[Any], dict[str, Any]]:
    """Bind the job's JSON arguments (and the context, or a marker for it) to the
    function's signature; TypeError names what does not fit. Whether they fit depends only
    on the number of positional arguments and the keyword names, so each shape is bound
    once per function."""
    args, kwargs = list(job.args), dict(job.kwargs)
    signature = task.signature
    if task.context_param:
        names = list(signature.parameters)
        parameter = signature.parameters[task.context_param]
        if parameter.kind in (parameter.POSITIONAL_ONLY, parameter.POSITIONAL_OR_KEYWORD):
            position = names.index(task.context_param)
            args.insert(min(position, len(args)), ctx)
        else:
            kwargs[task.context_param] = ctx
    shape = (task.fn, len(args), *kwargs)
    try:
        problem = _fits[shape]
    except KeyError:
        try:
            signature.bind(*args, **kwargs)
            problem = None
        except TypeError as exc:
            problem = str(exc)
        if len(_fits) >= 4096:
            _fits.clear()
        _fits[shape] = problem
    if problem is not None:
        raise TypeError(
            f"arguments {job.args!r} {job.kwargs!r} do not fit task {task.name}: {problem}"
        )
    return args, kwargs


class ThreadRunner:
    """A cached thread pool that wakes as few threads as the jobs need. Started jobs wait
    in a queue, and one thread at a time is *called* to it (an idle one woken, or a new
    one): a called thread takes a job, and if more are waiting it calls the next thread
    before it runs its own. So every queued job soon has a thread of its own, however long
    the jobs before it take — a thread stuck in a task that ignores cancellation never
    holds up a job queued after it (how many run at once is the worker's slots' to bound:
    a stopped job keeps its slot until its thread returns) — but a thread that finishes a short job
    takes the next one itself, and a hundred short jobs run on a few threads instead of
    waking a hundred (each wake-up is a thread switch and a turn at the GIL). Threads idle
    for IDLE_SECONDS exit."""

    IDLE_SECONDS = 60.0

    def __init__(self, outcomes: queue.SimpleQueue[Any]) -> None:
        self.outcomes = outcomes
        self._lock = threading.Lock()
        self._jobs: collections.deque[Handle] = collections.deque()
        self._sleeping: list[threading.Lock] = []  # idle threads, each blocked on its lock
        self._called = 0  # threads called to the queue that have not looked at it yet

    def start(self, handle: Handle) -> None:
        for _, exc in self.start_many([handle]):
            raise exc

    def start_many(self, handles: Sequence[Handle]) -> list[tuple[Handle, Exception]]:
        """Queue jobs to start, and call a thread to them. The jobs that did not start,
        with why (no thread could be made, the process is out of them, and no running
        thread took them): the caller fails them. Those a running thread took run; the
        ones behind them wait for a free thread."""
        if not handles:
            return []
        with self._lock:
            self._jobs.extend(handles)
            spawn = self._call()
        if not spawn:
            return []
        try:
            self._spawn()
        except Exception as exc:
            with self._lock:
                waiting = {id(handle) for handle in self._jobs}
                left = [handle for handle in handles if id(handle) in waiting]
                for handle in left:
                    self._jobs.remove(handle)
            return [(handle, exc) for handle in left]
        return []

    def _call(self) -> bool:
        """Under the lock, with jobs waiting: unless a thread is already called, call one.
        An idle one is woken here (releasing a lock never blocks, and nothing can come
        between the choice and the wake-up); True: a new one must be made (``_spawn``)."""
        if self._called:
            return False
        self._called += 1
        if self._sleeping:
            self._sleeping.pop().release()
            return False
        return True

    def _spawn(self) -> None:
        try:
            threading.Thread(target=self._serve, name="plunder-task", daemon=True).start()
        except BaseException:
            with self._lock:
                self._called -= 1  # nobody is coming: the next start calls again
            raise

    def _serve(self) -> None:
        """A thread's life: take a job (calling the next thread if more wait), run it, and
        look again; with none waiting, sleep until called or idle too long."""
        asleep = threading.Lock()  # held while this thread sleeps; released to wake it
        counted = True  # among the called (a new thread was called to be made)
        while True:
            with self._lock:
                if counted:
                    self._called -= 1
                    counted = False
                if self._jobs:
                    handle: Handle | None = self._jobs.popleft()
                    spawn = bool(self._jobs) and self._call()
                else:
                    handle = None
                    asleep.acquire()
                    self._sleeping.append(asleep)
            if handle is not None:
                if spawn:
                    try:
                        self._spawn()
                    except Exception as exc:  # the jobs behind wait for a free thread
                        log.warning("could not start a task thread: %s", exc)
                self._run(handle)
                continue
            if not asleep.acquire(timeout=self.IDLE_SECONDS):
                with self._lock:
                    if asleep in self._sleeping:  # idle too long, and nobody called
                        self._sleeping.remove(asleep)
                        return
                asleep.acquire()  # called just as the wait ended: released already, by the caller
            asleep.release()
            counted = True

    def _run(self, handle: Handle) -> None:
        if handle.ctx.cancelled:  # stopped while it waited for a thread: never started
            stopped = RuntimeError(f"stopped before it started: {handle.ctx.cancel_reason}")
            self.outcomes.put(Finished(handle.job, False, error=stopped))
            return
        try:
            args, kwargs = call_arguments(handle.task, handle.job, handle.ctx)
            result = tracing.call(handle.job, handle.task.fn, args, kwargs)
        except BaseException as exc:  # reported as the job's failure, never swallowed
            self.outcomes.put(Finished(handle.job, False, error=exc))
            return
        self.outcomes.put(Finished(handle.job, True, result=result))

    def stop(self, handle: Handle, reason: str) -> None:
        """Ask the task to stop (``ctx.cancelled``): a thread cannot be killed, so it
        runs until it looks, and its outcome comes when it returns."""
        handle.ctx.cancel(reason)


class AsyncRunner:
    """One event loop on a thread of its own, shared by every ``async def`` task. Jobs
    started together reach the loop together: the first wakes it, and the rest join the
    same hand-over instead of each writing to the loop's wake-up pipe."""

    def __init__(self, outcomes: queue.SimpleQueue[Any]) -> None:
        self.outcomes = outcomes
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._arriving: list[Handle] = []  # started, not yet handed to the loop

    def _ensure_loop(self) -> asyncio.AbstractEventLoop:
        if self._loop is None:
            loop = asyncio.new_event_loop()
            ready = threading.Event()

            def serve() -> None:
                asyncio.set_event_loop(loop)
                loop.call_soon(ready.set)
                try:
                    loop.run_forever()
                    left = asyncio.all_tasks(loop)
                    for task in left:
                        task.cancel()
                    loop.run_until_complete(asyncio.gather(*left, return_exceptions=True))
                    loop.run_until_complete(loop.shutdown_asyncgens())
                finally:
                    loop.close()

            self._thread = threading.Thread(target=serve, name="plunder-event-loop", daemon=True)
            self._thread.start()
            ready.wait()
            self._loop = loop
        return self._loop

    def start(self, handle: Handle) -> None:
        loop = self._ensure_loop()
        with self._lock:
            self._arriving.append(handle)
            first = len(self._arriving) == 1
        if first:
            try:
                loop.call_soon_threadsafe(self._hand_over)
            except BaseException:  # a closed loop: nothing will take these jobs
                with self._lock:
                    self._arriving.clear()
                raise

    def _hand_over(self) -> None:
        """On the loop: a task for every job started since the last hand-over."""
        with self._lock:
            handles, self._arriving = self._arriving, []
        loop = asyncio.get_running_loop()
        for handle in handles:
            task = handle.future = loop.create_task(self._run(handle))
            task.add_done_callback(functools.partial(self._cancelled, handle.job))
            if handle.ctx.cancelled:  # stopped from another thread before its task existed
                task.cancel()

    def _cancelled(self, job: JobRecord, task: asyncio.Task[Any]) -> None:
        """A task's outcome if it ended cancelled, even before its coroutine began (then
        no ``except`` in it ran); a coroutine that swallows the cancellation and goes on
        reports its outcome when it returns."""
        if task.cancelled():
            self.outcomes.put(Finished(job, False, error=asyncio.CancelledError()))

    async def _run(self, handle: Handle) -> None:
        try:
            args, kwargs = call_arguments(handle.task, handle.job, handle.ctx)
            result = await tracing.awaited(handle.job, handle.task.fn(*args, **kwargs))
        except asyncio.CancelledError:
            raise  # reported by _cancelled, once the task is done
        except BaseException as exc:
            self.outcomes.put(Finished(handle.job, False, error=exc))
            return
        self.outcomes.put(Finished(handle.job, True, result=result))

    def stop(self, handle: Handle, reason: str) -> None:
        handle.ctx.cancel(reason)  # before the cancel below: a hand-over still to come sees it
        loop = self._loop
        if loop is None:
            return
        try:
            loop.call_soon_threadsafe(self._cancel, handle)
        except RuntimeError:
            if not loop.is_closed():
                raise
            # closed: the loop cancelled every task it had before it closed

    @staticmethod
    def _cancel(handle: Handle) -> None:
        if handle.future is not None:
            handle.future.cancel()

    def close(self, timeout: float = 5) -> None:
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._loop.stop)
            if self._thread is not None:
                self._thread.join(timeout=timeout)
