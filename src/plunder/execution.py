"""How a claimed job's function runs: plain functions on a thread of their own, ``async
def`` functions on the worker's event-loop thread, and ``pool="process"`` functions in a
child process that can be terminated. Each runner reports one outcome per job to the
worker's outcome queue and can be told to stop a job.

A thread cannot be killed: stopping a thread task sets ``ctx.cancelled`` and the worker
stops waiting for it (its result would be refused anyway).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import importlib
import multiprocessing
import multiprocessing.connection
import queue
import threading
from dataclasses import dataclass, field
from typing import Any

from plunder import payload
from plunder.context import Context
from plunder.model import ErrorInfo, JobRecord
from plunder.task import Task


@dataclass
class Outcome:
    """What one attempt produced: a result, or an error."""

    job: JobRecord
    ok: bool
    result: Any = None
    error: BaseException | None = None
    error_info: ErrorInfo | None = None


@dataclass
class Handle:
    """A job in flight, as its runner knows it."""

    job: JobRecord
    task: Task
    ctx: Context
    future: concurrent.futures.Future[Any] | None = None
    process: Any = None
    thread: threading.Thread | None = None
    extra: dict[str, Any] = field(default_factory=dict)


_fits: dict[tuple[Any, ...], str | None] = {}  # (function, shape of the call) -> why not


def call_arguments(task: Task, job: JobRecord, ctx: Context) -> tuple[list[Any], dict[str, Any]]:
    """Bind the job's JSON arguments (and the context) to the function's signature;
    TypeError names what does not fit. Whether they fit depends only on the number of
    positional arguments and the keyword names, so each shape is bound once per function."""
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
    """A cached thread pool: a job goes to an idle thread, or to a new one when none is
    idle, so a thread stuck in a task that ignores cancellation never takes a slot away
    from the jobs after it. Threads idle for IDLE_SECONDS exit."""

    IDLE_SECONDS = 60.0

    def __init__(self, outcomes: queue.SimpleQueue[Any]) -> None:
        self.outcomes = outcomes
        self._jobs: queue.SimpleQueue[Handle] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._idle = 0

    def start(self, handle: Handle) -> None:
        with self._lock:
            spawn = self._idle == 0
            if not spawn:
                self._idle -= 1
        self._jobs.put(handle)
        if spawn:
            threading.Thread(target=self._serve, name="plunder-task", daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                handle = self._jobs.get(timeout=self.IDLE_SECONDS)
            except queue.Empty:
                with self._lock:
                    if self._idle > 0:
                        self._idle -= 1
                        return
                continue  # a job is on its way to us
            self._run(handle)
            with self._lock:
                self._idle += 1

    def _run(self, handle: Handle) -> None:
        try:
            args, kwargs = call_arguments(handle.task, handle.job, handle.ctx)
            result = handle.task.fn(*args, **kwargs)
        except BaseException as exc:  # reported as the job's failure, never swallowed
            self.outcomes.put(Outcome(handle.job, False, error=exc))
            return
        self.outcomes.put(Outcome(handle.job, True, result=result))

    def stop(self, handle: Handle, reason: str) -> None:
        handle.ctx.cancel(reason)


class AsyncRunner:
    """One event loop on a thread of its own, shared by every ``async def`` task."""

    def __init__(self, outcomes: queue.SimpleQueue[Any]) -> None:
        self.outcomes = outcomes
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None

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
        async def run() -> None:
            try:
                args, kwargs = call_arguments(handle.task, handle.job, handle.ctx)
                result = await handle.task.fn(*args, **kwargs)
            except asyncio.CancelledError as exc:
                self.outcomes.put(Outcome(handle.job, False, error=exc))
                raise
            except BaseException as exc:
                self.outcomes.put(Outcome(handle.job, False, error=exc))
                return
            self.outcomes.put(Outcome(handle.job, True, result=result))

        handle.future = asyncio.run_coroutine_threadsafe(run(), self._ensure_loop())

    def stop(self, handle: Handle, reason: str) -> None:
        handle.ctx.cancel(reason)
        if handle.future is not None:
            handle.future.cancel()

    def close(self) -> None:
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._loop.stop)
            if self._thread is not None:
                self._thread.join(timeout=5)


def _child(
    module: str,
    attribute: str,
    args: list[Any],
    kwargs: dict[str, Any],
    conn: multiprocessing.connection.Connection,
) -> None:
    """Entry point of a process-pool child: import the task by name and run it."""
    try:
        target: Any = importlib.import_module(module)
        for part in attribute.split("."):
            target = getattr(target, part)
        function = getattr(target, "fn", target)
        conn.send(("ok", payload.encode(function(*args, **kwargs), what="result")))
    except BaseException as exc:
        conn.send(("error", ErrorInfo.from_exception(exc).as_dict()))
    finally:
        conn.close()


class ProcessRunner:
    """A fresh child process (spawned, so it inherits no connections or threads) per job;
    stopping a job terminates its process."""

    def __init__(self, outcomes: queue.SimpleQueue[Any]) -> None:
        self.outcomes = outcomes
        self._mp = multiprocessing.get_context("spawn")

    def start(self, handle: Handle) -> None:
        fn = handle.task.fn
        if fn.__module__ == "__main__":
            raise TypeError(
                f"process-pool task {handle.task.name} must live in an importable "
                "module, not __main__"
            )
        args, kwargs = call_arguments(handle.task, handle.job, handle.ctx)
        receive, send = self._mp.Pipe(duplex=False)
        process = self._mp.Process(
            target=_child,
            args=(fn.__module__, fn.__qualname__, args, kwargs, send),
            name=f"plunder-job-{handle.job.id}",
            daemon=True,
        )
        process.start()
        send.close()
        handle.process = process
        watcher = threading.Thread(
            target=self._watch,
            args=(handle, receive, process),
            name=f"plunder-watch-{handle.job.id}",
            daemon=True,
        )
        watcher.start()

    def _watch(
        self, handle: Handle, receive: multiprocessing.connection.Connection, process: Any
    ) -> None:
        try:
            kind, value = receive.recv()
        except (EOFError, OSError, ValueError):  # the child died, or sent something unreadable
            process.join()
            info = ErrorInfo(
                "plunder.ProcessDied",
                f"the task's process exited with code {process.exitcode} before returning a result",
            )
            self.outcomes.put(Outcome(handle.job, False, error_info=info))
            return
        finally:
            receive.close()
        process.join()
        if kind == "ok":
            self.outcomes.put(Outcome(handle.job, True, result=payload.decode(value)))
        else:
            self.outcomes.put(Outcome(handle.job, False, error_info=ErrorInfo.from_dict(value)))

    def stop(self, handle: Handle, reason: str) -> None:
        handle.ctx.cancel(reason)
        if handle.process is not None and handle.process.is_alive():
            handle.process.terminate()
