"""The warm process pool of ``pool="process"`` tasks (``--pool process``): long-lived
children, spawned (so they inherit no connections or threads), each running one job at a
time and many in its life. A child imports a task's module once, at its first job of it,
so a model loaded at import serves every job after. As many children as the worker has
slots at most; one is started when a job finds none idle.

A child past its job's timeout, or whose job is cancelled, is killed (a thread in it
could not be) and replaced by the next job that needs one; a child that dies takes only
its own job with it (``plunder.ProcessDied``). Each child talks to its worker over two
pipes, read by a watcher thread per child::

    worker                                   child
      job spec (module, function, args) ──▶ import (cached), run
      ctx buffer ─▶ fenced flush       ◀── ("event", job, kind, json)   ctx.stream / progress
      the run's log lines              ◀── ("log", job, line)           ctx.logger
      outcome queue                    ◀── ("ok", job, json) | ("error", job, info)
      outcome: plunder.ProcessDied     ◀── EOF (it died)
"""

from __future__ import annotations

import enum
import importlib
import logging
import multiprocessing
import multiprocessing.connection
import queue
import threading
from dataclasses import dataclass
from typing import Any

from plunder import errors, payload
from plunder.context import JobIdentity
from plunder.execution import Finished, Handle, call_arguments
from plunder.logs import LOG_FORMAT
from plunder.model import ErrorInfo, JobRecord

log = logging.getLogger("plunder.execution")
_SEND = threading.Lock()  # in a child: its jobs' threads share one pipe to the worker


class _Slot(enum.Enum):
    """Where a process task's context goes among its arguments. An enum member pickles by
    name, so the child finds the very same marker and puts its own context there."""

    CONTEXT = "context"


class _PipeLines(logging.Handler):
    def __init__(self, ctx: ChildContext) -> None:
        super().__init__(logging.DEBUG)
        self.ctx = ctx
        self.setFormatter(logging.Formatter(LOG_FORMAT))

    def emit(self, record: logging.LogRecord) -> None:
        self.ctx.send("log", self.format(record))


class ChildContext(JobIdentity):
    """The context of a process-pool task, inside its child process. Stream chunks,
    progress and log lines go over the pipe as they happen, marked with their job; the
    worker buffers them and writes them, fenced, as it does for any task. ``cancelled`` is
    set just before the worker kills the child. The child holds no connection of
    plunder's, so ``transaction()`` is refused."""

    def __init__(
        self, job: JobRecord, conn: multiprocessing.connection.Connection, cancelled: Any
    ) -> None:
        self.job = job
        self.claim = job.claim
        self._conn = conn
        self._cancelled = cancelled  # a multiprocessing Event the worker sets
        self._logger: logging.Logger | None = None

    @property
    def cancelled(self) -> bool:
        return bool(self._cancelled.is_set())

    def wait_cancelled(self, timeout: float | None = None) -> bool:
        return bool(self._cancelled.wait(timeout))

    @property
    def logger(self) -> logging.Logger:
        if self._logger is None:
            logger = logging.Logger(f"plunder.task.{self.job.task}", logging.DEBUG)
            logger.addHandler(_PipeLines(self))
            self._logger = logger
        return self._logger

    def stream(self, data: Any) -> None:
        self.send("event", "chunk", payload.encode(data, what="stream data"))

    def progress(self, current: float, total: float | None = None) -> None:
        text = payload.encode({"current": current, "total": total}, what="progress")
        self.send("event", "progress", text)

    def flush(self) -> None:
        """Nothing to do: every event is already on its way to the worker."""

    def transaction(self, *, result: Any = None) -> Any:
        raise errors.PlunderError(
            f"job {self.job_id}: a process-pool task cannot write in its acknowledgement's "
            "transaction (its process holds no connection of plunder's); run it on a thread"
        )

    def send(self, kind: str, *values: Any) -> None:
        with _SEND:
            self._conn.send((kind, (self.job.id, self.job.attempt), *values))


@dataclass(frozen=True)
class _ChildJob:
    """What a process-pool child needs for a job: where its function lives, its arguments
    (with ``_Slot.CONTEXT`` where the context goes) and the job."""

    module: str
    attribute: str
    args: list[Any]
    kwargs: dict[str, Any]
    job: JobRecord


def _run_one(spec: _ChildJob, conn: multiprocessing.connection.Connection, cancelled: Any) -> None:
    ctx = ChildContext(spec.job, conn, cancelled)
    try:
        target: Any = importlib.import_module(spec.module)  # imported once per child
        for part in spec.attribute.split("."):
            target = getattr(target, part)
        function = getattr(target, "fn", target)
        args = [ctx if a is _Slot.CONTEXT else a for a in spec.args]
        kwargs = {k: ctx if v is _Slot.CONTEXT else v for k, v in spec.kwargs.items()}
        ctx.send("ok", payload.encode(function(*args, **kwargs), what="result"))
    except BaseException as exc:
        ctx.send("error", ErrorInfo.from_exception(exc).as_dict())


def _serve(
    jobs: multiprocessing.connection.Connection,
    events: multiprocessing.connection.Connection,
    cancelled: Any,
) -> None:
    """Entry point of a pool child: run the jobs that come, one at a time, until the
    worker closes the pipe."""
    while True:
        try:
            spec = jobs.recv()
        except EOFError:
            return
        _run_one(spec, events, cancelled)


class _Child:
    """One child of the pool, as the worker knows it."""

    def __init__(self, mp: Any, name: str) -> None:
        receive_jobs, self.jobs = mp.Pipe(duplex=False)
        self.events, send_events = mp.Pipe(duplex=False)
        self.cancelled = mp.Event()  # set once: a child whose job is stopped is killed
        self.process = mp.Process(
            target=_serve, args=(receive_jobs, send_events, self.cancelled), name=name, daemon=True
        )
        self.process.start()
        receive_jobs.close()
        send_events.close()
        self.handle: Handle | None = None  # the job it runs
        self.killed = False  # dying: given no job


class ProcessRunner:
    """The warm pool: up to ``size`` children, kept between jobs; stopping a job kills its
    child, and its slot frees once the child is dead."""

    def __init__(self, outcomes: queue.SimpleQueue[Any], size: int) -> None:
        self.outcomes = outcomes
        self.size = size
        self._mp = multiprocessing.get_context("spawn")
        self._lock = threading.Lock()
        self._children: list[_Child] = []  # alive, or dying and not yet reported
        self._started = 0

    def start(self, handle: Handle) -> None:
        fn = handle.task.fn
        if fn.__module__ == "__main__":
            raise TypeError(
                f"process-pool task {handle.task.name} must live in an importable "
                "module, not __main__"
            )
        args, kwargs = call_arguments(handle.task, handle.job, _Slot.CONTEXT)
        spec = _ChildJob(fn.__module__, fn.__qualname__, args, kwargs, handle.job)
        child = self._idle_child(handle)
        try:
            child.jobs.send(spec)
        except (OSError, ValueError):  # it died meanwhile: its watcher reports the job
            log.warning("job %d: its pool child died as it was handed the job", handle.job.id)
        if handle.ctx.cancelled:  # stopped before it had a child: stop() found none to kill
            self.stop(handle, handle.ctx.cancel_reason or "stopped")

    def _idle_child(self, handle: Handle) -> _Child:
        """An idle child, given ``handle``'s job, or a new one if none is idle."""
        with self._lock:
            for child in self._children:
                if child.handle is None and not child.killed:
                    child.handle = handle
                    return child
            if sum(not c.killed for c in self._children) >= self.size:
                raise errors.PlunderError(
                    f"job {handle.job.id}: all {self.size} pool children are busy"
                )
            self._started += 1
            child = _Child(self._mp, f"plunder-pool-{self._started}")
            child.handle = handle
            self._children.append(child)
        watcher = threading.Thread(
            target=self._watch, args=(child,), name=f"plunder-watch-{self._started}", daemon=True
        )
        watcher.start()
        return child

    def _watch(self, child: _Child) -> None:
        """A child's life, as its messages tell it: each job's events and outcome, then
        (it died, or was killed) the job it had, failed."""
        try:
            while True:
                if not self._relay(child, child.events.recv()):
                    break
        except (EOFError, OSError):  # it died
            pass
        child.events.close()
        child.process.join()
        with self._lock:
            self._children.remove(child)
            handle, child.handle = child.handle, None
            child.jobs.close()  # under the lock: close() may be closing it too
        if handle is not None:
            info = ErrorInfo(
                "plunder.ProcessDied",
                f"the task's process exited with code {child.process.exitcode} "
                "before returning a result",
            )
            self.outcomes.put(Finished(handle.job, False, error_info=info))

    def _relay(self, child: _Child, message: tuple[Any, ...]) -> bool:
        """Hand a message to the job it is of; False: an unreadable one, the child is
        killed."""
        kind, (job_id, attempt) = message[0], message[1]
        handle = child.handle
        if handle is None or (handle.job.id, handle.job.attempt) != (job_id, attempt):
            return True  # from a thread of an earlier job that outlived it: dropped
        if kind == "event":
            handle.ctx.add_encoded(message[2], message[3])
        elif kind == "log":
            handle.ctx.add_log_line(message[2])
        elif kind in ("ok", "error"):
            with self._lock:  # idle before its outcome frees the slot: the next job takes it
                child.handle = None
            if kind == "ok":
                outcome = Finished(handle.job, True, result=payload.decode(message[2]))
            else:
                outcome = Finished(handle.job, False, error_info=ErrorInfo.from_dict(message[2]))
            self.outcomes.put(outcome)
        else:
            log.warning("job %d: unknown message from its process: %r", job_id, kind)
            with self._lock:
                child.killed = True
            child.process.kill()
            return False
        return True

    def stop(self, handle: Handle, reason: str) -> None:
        """Kill the child that runs ``handle``'s job (if it still does): its watcher
        reports the job once the child is dead."""
        handle.ctx.cancel(reason)
        with self._lock:
            child = next((c for c in self._children if c.handle is handle), None)
            if child is not None:
                child.killed = True
        if child is not None:
            child.cancelled.set()
            child.process.kill()

    def pids(self) -> list[int]:
        """The pool's children, by process id."""
        with self._lock:
            return [c.process.pid for c in self._children]

    def close(self) -> None:
        """Let every child go: each exits once its pipe closes; a busy one is killed."""
        with self._lock:
            children = list(self._children)
            for child in children:  # under the lock: a child's watcher may close it too
                child.jobs.close()
        for child in children:
            if child.handle is not None:
                child.process.kill()
