"""Tasks: a function registered under a name, with the options its jobs are enqueued with.

Arguments and results travel as JSON (never pickle): positional arguments as a list,
keyword arguments as an object. A task that wants its :class:`~plunder.context.Context`
declares a parameter annotated ``plunder.Context``; the worker passes it by name.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import typing
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, fields, replace
from typing import Any, Protocol

from plunder import adapters, errors, payload
from plunder.context import Context
from plunder.model import JobSpec, Limit, TaskInfo, positional_builder

POOLS = ("thread", "process")
# JobSpec(*values), fields in declaration order: an enqueue makes one per job
build_spec = positional_builder(JobSpec)
# JobSpec's fields after (task, args, kwargs): each an Options field of the same name but
# max_attempts, which is retries + 1
SPEC_OPTIONS = tuple(f.name for f in fields(JobSpec))[3:]


class Producer(Protocol):
    """What a task needs from its app to enqueue (the app implements it)."""

    def enqueue_specs(self, specs: Sequence[JobSpec], *, conn: Any = None) -> list[Any]: ...


@dataclass(frozen=True, slots=True)
class Options:
    """How a task's jobs are enqueued and run: ``@app.task(...)`` sets them,
    ``Task.options(...)`` and ``app.enqueue(name, ..., **options)`` override them per call.

    An attempt ends in one of three ways that may be retried, each with its own policy: it
    *failed* (the task raised), it *timed out* (it ran past ``timeout``) or it was *lost*
    (its worker's session expired while it ran: the worker died, hung or lost the
    database). Each such attempt counts against ``retries``; a job whose policy says no, or
    with no attempts left, ends at once. A *start-by* deadline (``expires_in``) ends a job
    that is not started in time, for its first attempt or a retry, as ``expired``.

    | option | meaning | default |
    |---|---|---|
    | `queue` | the queue its jobs are claimed from | `'default'` |
    | `priority` | higher is claimed first | `0` |
    | `delay` | seconds after the enqueue before the job is due | `0.0` |
    | `key` | idempotency key: names at most one pending or running job | `None` |
    | `retries` | *failed*: attempts after the first (losses and timeouts use them too) | `3` |
    | `no_retry` | *failed*: exception types never retried (`@app.task` only) | `()` |
    | `backoff_base` | *failed*: retry n waits up to `base * 2**(n-1)` seconds (jittered) | `1.0` |
    | `backoff_cap` | *failed*: the longest wait before a retry, seconds | `300.0` |
    | `timeout` | seconds an attempt may run (`None`: no limit) | `None` |
    | `retry_on_timeout` | *timed out*: retried at once; `False`: ends `timed_out` | `True` |
    | `retry_on_lost` | *lost*: retried at once; `False`: ends `timed_out`, never rerun | `True` |
    | `expires_in` | start-by deadline, seconds after the enqueue; else `expired` | `None` |
    | `limit` | `(key, n)`: at most n jobs of the key run at once, on all workers | `None` |
    | `rate` | `(key, "600/min")`: at most that many of the key's jobs start | `None` |
    | `partition_key` | a partitioned queue's partition: its hash (`None`: round-robin) | `None` |
    | `ordered` | a `partition_key`'s jobs one at a time, in order (`"stop"`: see guide) | `False` |
    | `group` | its group (a tenant): a fair queue's claims take groups in turn | `None` |
    | `affinity` | labels preferred: a free holder first, else any worker at once | `None` |
    | `require` | labels required: only a worker holding them all runs it | `None` |
    | `cost` | slots of its worker it takes while it runs | `1` |

    A lost attempt that is not retried ends the job ``timed_out`` (as a lost last attempt
    always has), with a ``plunder.WorkerLost`` error naming the session: nothing whose
    worker died mid-run is run again (a stale request is dead), where the
    default runs it again (at least once). The start-by deadline is read on the database
    clock and bounds every start: a job still waiting for a retry at the deadline ends
    ``expired`` too; a job retried by hand (also from ``expired``) has none. It must be
    longer than ``delay``.

    Timed out or lost is read on the database clock: a run past its ``timeout`` whose
    worker's session still lives has timed out, even if the worker has just died unseen
    (``retry_on_timeout`` decides: a job that must never run twice sets both to False).
    Once the session has expired the run is lost, and the janitor reaps dead sessions
    before it times out late runs, so *lost* decides when both have passed. A graceful
    shutdown past its grace period stops its tasks: it releases their jobs, but ends one
    whose ``retry_on_lost`` is False as lost.
    """

    queue: str = "default"
    priority: int = 0
    delay: float = 0.0
    retries: int = 3
    timeout: float | None = None
    backoff_base: float = 1.0
    backoff_cap: float = 300.0
    retry_on_timeout: bool = True
    key: str | None = None
    retry_on_lost: bool = True
    expires_in: float | None = None
    limit: tuple[str, int] | None = None
    rate: tuple[str, str] | None = None
    partition_key: str | None = None
    ordered: bool | str = False
    group: str | None = None
    affinity: dict[str, str] | None = None  # see docs/guide/affinity.md
    require: dict[str, str] | None = None
    cost: int = 1

    def spec(self, task: str, args: Sequence[Any], kwargs: dict[str, Any]) -> JobSpec:
        return self.maker(task)(args, kwargs)

    def maker(self, task: str) -> Callable[[Sequence[Any], dict[str, Any]], JobSpec]:
        """``spec`` for many calls of one task: the options are checked once."""
        if (
            isinstance(self.retries, bool)
            or not isinstance(self.retries, int)
            or (self.retries < 0)
        ):
            raise ValueError(f"retries must be a non-negative integer, not {self.retries!r}")
        limit = Limit.declared(self.limit, self.rate)  # see docs/guide/limits.md
        special = {"max_attempts": self.retries + 1, "limit": limit}
        options = tuple(
            special[name] if name in special else getattr(self, name) for name in SPEC_OPTIONS
        )

        def make(args: Sequence[Any], kwargs: dict[str, Any]) -> JobSpec:
            # Refused, not converted: list() of a dict keeps its keys and of a string its
            # letters.
            if not isinstance(args, list | tuple):
                raise errors.PayloadError(
                    f"arguments of {task!r} must be a list or tuple, not {type(args).__name__}"
                )
            if not isinstance(kwargs, dict):
                raise errors.PayloadError(
                    f"keyword arguments of {task!r} must be a dict, not {type(kwargs).__name__}"
                )
            return build_spec(task, list(args), dict(kwargs), *options)

        return make


def _call_arguments(call: Any) -> tuple[Sequence[Any], dict[str, Any]]:
    """The positional and keyword arguments of one call given to ``enqueue_many``."""
    if isinstance(call, tuple):
        if len(call) == 2 and isinstance(call[0], list | tuple) and isinstance(call[1], dict):
            return call[0], call[1]
        return call, {}
    if isinstance(call, dict):
        return (), call
    if isinstance(call, list):
        return call, {}
    return (call,), {}


@functools.lru_cache(maxsize=1024)
def _signature(fn: Callable[..., Any]) -> inspect.Signature:
    return inspect.signature(fn)


def _context_parameter(fn: Callable[..., Any]) -> str | None:
    """The name of the parameter annotated ``Context``, if any."""
    try:
        hints = typing.get_type_hints(fn)
    except Exception:  # unresolvable annotations: fall back to their text
        hints = {}
    for name, parameter in inspect.signature(fn).parameters.items():
        annotation = hints.get(name, parameter.annotation)
        if annotation is Context or (
            isinstance(annotation, str) and annotation.split(".")[-1] == "Context"
        ):
            return name
    return None


@dataclass(frozen=True)
class Task:
    """A registered task. Calling it runs the function here and now (no queue)."""

    fn: Callable[..., Any]
    name: str
    options_: Options
    producer: Producer | None = field(default=None, repr=False, compare=False)
    no_retry: tuple[type[BaseException], ...] = ()
    pool: str = "thread"
    context_param: str | None = None

    @functools.cached_property
    def is_async(self) -> bool:  # asked for every job the worker starts
        return inspect.iscoroutinefunction(self.fn)

    @property
    def signature(self) -> inspect.Signature:
        return _signature(self.fn)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.fn(*args, **kwargs)

    def options(self, **overrides: Any) -> Task:
        """A copy whose next enqueues use these options (any field of :class:`Options`)."""
        unknown = set(overrides) - set(Options.__dataclass_fields__)
        if unknown:
            raise TypeError(f"unknown task option(s): {', '.join(sorted(unknown))}")
        return replace(self, options_=replace(self.options_, **overrides))

    def spec(self, args: Sequence[Any] = (), kwargs: dict[str, Any] | None = None) -> JobSpec:
        return self.options_.spec(self.name, args, kwargs or {})

    def enqueue(self, *args: Any, **kwargs: Any) -> Any:
        """Enqueue one job and return its :class:`plunder.Job` handle."""
        return self._producer().enqueue_specs([self.spec(args, kwargs)])[0]

    def enqueue_many(self, calls: Iterable[Any], *, conn: Any = None) -> list[Any]:
        """Enqueue many jobs in one transaction. Each call is a tuple of positional
        arguments, a dict of keyword arguments, or an ``(args, kwargs)`` pair."""
        producer = self._producer()
        make = self.options_.maker(self.name)
        return producer.enqueue_specs([make(*_call_arguments(c)) for c in calls], conn=conn)

    async def enqueue_async(self, *args: Any, **kwargs: Any) -> Any:
        """``await task.enqueue_async(...)``: :meth:`enqueue` on a thread, so that the
        caller's event loop runs on while the store is written."""
        return await asyncio.to_thread(self.enqueue, *args, **kwargs)

    async def enqueue_many_async(self, calls: Iterable[Any]) -> list[Any]:
        """``await task.enqueue_many_async(calls)``: :meth:`enqueue_many` on a thread."""
        return await asyncio.to_thread(self.enqueue_many, list(calls))

    def enqueue_in(self, conn: Any, *args: Any, **kwargs: Any) -> Any:
        """Enqueue inside the caller's open transaction on ``conn`` (sqlite3, psycopg, or
        a sync SQLAlchemy Connection or Session over one of them; see plunder.adapters):
        the job exists if and only if that transaction commits."""
        return self._producer().enqueue_specs([self.spec(args, kwargs)], conn=conn)[0]

    async def enqueue_in_async(self, conn: Any, *args: Any, **kwargs: Any) -> Any:
        """``await task.enqueue_in_async(conn, ...)``: :meth:`enqueue_in` on an async
        SQLAlchemy ``AsyncConnection`` or ``AsyncSession`` (over psycopg or aiosqlite): the
        job exists if and only if its transaction commits."""
        producer, spec = self._producer(), self.spec(args, kwargs)
        jobs = await adapters.run_sync_on(
            conn, lambda sync: producer.enqueue_specs([spec], conn=sync)
        )
        return jobs[0]

    def _producer(self) -> Producer:
        if self.producer is None:
            raise errors.ConfigError(f"task {self.name} is not registered with an app")
        return self.producer

    def should_retry(self, exc: BaseException) -> bool:
        return not isinstance(exc, self.no_retry)


def make_task(
    fn: Callable[..., Any],
    *,
    producer: Producer | None,
    name: str | None,
    pool: str,
    no_retry: Iterable[type[BaseException]],
    **options: Any,
) -> Task:
    if not callable(fn):
        raise TypeError(f"a task must be a function, not {fn!r}")
    if pool not in POOLS:
        raise errors.ConfigError(f"pool must be one of {', '.join(POOLS)}, not {pool!r}")
    task_name = payload.check_task(f"{fn.__module__}.{fn.__qualname__}" if name is None else name)
    context_param = _context_parameter(fn)
    if pool == "process" and inspect.iscoroutinefunction(fn):
        raise errors.ConfigError(
            f"task {task_name}: process-pool tasks must be plain functions, not async def"
        )
    return Task(
        fn=fn,
        name=task_name,
        options_=Options(**options),
        producer=producer,
        no_retry=tuple(no_retry),
        pool=pool,
        context_param=context_param,
    )


def task_info(task: Task) -> TaskInfo:
    """The task as its workers publish it: its queue, its pool and its other options."""
    options = task.options_
    return TaskInfo(
        task.name,
        options.queue,
        task.pool,
        {name: getattr(options, name) for name in Options.__dataclass_fields__ if name != "queue"},
    )


def published_options(info: TaskInfo) -> Options:
    """The options a worker published for a task, as this plunder knows them (an option it
    does not know, from a newer worker, is left out; one it lacks takes its default)."""
    known = set(Options.__dataclass_fields__) - {"queue"}
    return Options(queue=info.queue, **{k: v for k, v in info.options.items() if k in known})


class Registry:
    """Task name -> Task."""

    def __init__(self) -> None:
        self._tasks: dict[str, Task] = {}

    def add(self, task: Task) -> None:
        existing = self._tasks.get(task.name)
        if existing is not None and existing.fn is not task.fn:
            raise errors.ConfigError(f"two different functions are registered as {task.name}")
        self._tasks[task.name] = task

    def get(self, name: str) -> Task:
        try:
            return self._tasks[name]
        except KeyError:
            raise errors.UnknownTask(f"no task named {name!r} is registered") from None

    def names(self) -> list[str]:
        return sorted(self._tasks)

    def infos(self) -> list[TaskInfo]:
        """Every task as its workers publish it, by name."""
        return [task_info(self._tasks[name]) for name in sorted(self._tasks)]

    def queues(self) -> list[str]:
        return sorted({t.options_.queue for t in self._tasks.values()})

    def __contains__(self, name: object) -> bool:
        return name in self._tasks

    def __len__(self) -> int:
        return len(self._tasks)
