"""The App: configuration, the task registry and the producer API. ``Job`` is a handle on
one job that reads through the store."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import AsyncIterator, Callable, Generator, Iterable, Sequence
from dataclasses import replace
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, overload

from plunder import adapters, config, errors, payload
from plunder.graph import WorkflowState
from plunder.hub import Hub
from plunder.model import JobRecord, JobSpec, LimitState, Run, StreamEvent
from plunder.states import Status, is_terminal
from plunder.store import Store, open_store
from plunder.streaming import StreamReader
from plunder.task import Options, Registry, Task, make_task, published_options

if TYPE_CHECKING:
    from plunder.store.http import HttpStore


class App:
    """``App("sqlite:///plunder.db")`` or ``App("postgresql://…")``; ``App()`` reads
    ``PLUNDER_URL`` (default ``sqlite:///plunder.db``). Intervals (seconds) are keywords
    here and ``PLUNDER_*`` environment variables. A SQLite file that does not exist is
    created, unless ``create=False`` (then the store's first use raises StoreUnavailable)."""

    def __init__(
        self,
        url: str | None = None,
        *,
        heartbeat_interval: float | None = None,
        session_expiry: float | None = None,
        poll_interval: float | None = None,
        janitor_interval: float | None = None,
        retention: float | None = None,
        listen: bool | None = None,
        auto_migrate: bool = True,
        create: bool = True,
        **store_options: Any,
    ) -> None:
        self.settings = config.load(
            url=url,
            heartbeat_interval=heartbeat_interval,
            session_expiry=session_expiry,
            poll_interval=poll_interval,
            janitor_interval=janitor_interval,
            retention=retention,
            listen=listen,
        )
        self.registry = Registry()
        self.auto_migrate = auto_migrate
        self.create = create  # False: a missing SQLite file is refused, not made empty
        self._store_options = store_options
        self._store: Store | None = None
        self._hub: Hub | None = None
        self._lock = threading.Lock()
        self.partitioned: dict[str, int] = {}  # @app.task(partitions=N): not declared yet

    def __repr__(self) -> str:
        return f"App({self.url!r}, tasks={self.registry.names()})"

    @property
    def url(self) -> str:
        return self.settings.url

    @property
    def store(self) -> Store:
        """The store, opened on first use (and migrated, unless ``auto_migrate=False``)."""
        with self._lock:
            if self._store is None:
                self._store = self._open(self._store_options)
            return self._store

    def _open(self, options: dict[str, Any]) -> Store:
        store = open_store(self.settings.url, create=self.create, **options)
        try:
            store.migrate() if self.auto_migrate else store.schema_check()
        except BaseException:
            store.close()
            raise
        return store

    def store_for(self, **options: Any) -> tuple[Store, bool]:
        """A store with these options over the app's store options, for a component that
        needs them (a worker's connection budget and deadlines), and whether the caller
        owns it. If the app's store is not open yet, it is opened now with them and shared
        (False: the app closes it). If it is open already (the process enqueued or read
        before), its options cannot change under its users: a store of the caller's own
        is opened on the same database (True: the caller closes it)."""
        with self._lock:
            if self._store is None:
                self._store_options.update(options)
                self._store = self._open(self._store_options)
                return self._store, False
        return self.another_store(**options), True

    def another_store(self, **options: Any) -> Store:
        """A store of its own on the app's database (the schema checked, or migrated, once,
        by the app's), with the app's store options and these; the caller closes it."""
        self.store  # noqa: B018 - the schema, before anyone uses it
        return open_store(
            self.settings.url, **{"create": self.create, **self._store_options, **options}
        )

    @property
    def hub(self) -> Hub:
        """This process's wake-up hub (one thread, one dedicated connection), started on
        first use."""
        store = self.store
        with self._lock:
            if self._hub is None:
                self._hub = Hub(
                    store,
                    listen=self.settings.listen,
                    application_name=self._store_options.get("application_name", "plunder")
                    + ":listen",
                    statement_timeout=config.WorkerDeadlines.of(self.settings).heartbeat_timeout,
                )
            return self._hub

    def set_store_options(self, **options: Any) -> None:
        """Options for the store (``pool_size``, ``application_name``, …) before first use."""
        with self._lock:
            if self._store is not None:
                raise errors.ConfigError("the app's store is already open")
            self._store_options.update(options)

    def configure(self, **settings: Any) -> None:
        """Change settings before first use (the command line does this for ``--db``)."""
        with self._lock:
            if self._store is not None:
                raise errors.ConfigError("the app's store is already open")
            self.settings = self.settings.with_overrides(**settings)

    def close(self) -> None:
        with self._lock:
            store, self._store = self._store, None
            hub, self._hub = self._hub, None
        if hub is not None:
            hub.close()
        if store is not None:
            store.close()

    # -- tasks ----------------------------------------------------------------------------
    @overload
    def task(self, fn: Callable[..., Any], /) -> Task: ...

    @overload
    def task(self, fn: None = None, /, **options: Any) -> Callable[[Callable[..., Any]], Task]: ...

    def task(
        self,
        fn: Callable[..., Any] | None = None,
        /,
        *,
        name: str | None = None,
        pool: str = "thread",
        no_retry: Iterable[type[BaseException]] = (),
        **options: Any,
    ) -> Task | Callable[[Callable[..., Any]], Task]:
        """Register a task: ``@app.task`` or ``@app.task(queue="llm", retries=3,
        timeout=60, priority=0, backoff_base=1, backoff_cap=300, retry_on_timeout=True,
        retry_on_lost=True, expires_in=None, no_retry=(ValueError,), pool="thread" |
        "process", name=...)``; the options and their defaults are in :class:`Options`."""
        unknown = set(options) - {*Options.__dataclass_fields__, "partitions"}
        if unknown:
            raise TypeError(f"unknown task option(s): {', '.join(sorted(unknown))}")

        partitions = options.pop("partitions", None)
        if partitions is not None:  # declared in the database before the first enqueue
            self.partitioned[options.get("queue", "default")] = partitions

        def register(function: Callable[..., Any]) -> Task:
            task = make_task(
                function, producer=self, name=name, pool=pool, no_retry=no_retry, **options
            )
            self.registry.add(task)
            return task

        return register(fn) if fn is not None else register

    def partition(self, queue: str, partitions: int) -> None:
        """Declare ``queue`` partitioned in ``partitions``, in the database, so that every
        producer and worker agrees (docs/guide/partitions.md)."""
        self.store.partition_declare(queue, partitions)

    def declare_partitions(self) -> None:
        """Declare the partitions that tasks' ``partitions=`` name, once."""
        while self.partitioned:
            self.partition(*self.partitioned.popitem())

    # -- producing ------------------------------------------------------------------------
    def enqueue_specs(self, specs: Sequence[JobSpec], *, conn: Any = None) -> list[Job]:
        self.declare_partitions()
        conn = None if conn is None else adapters.dbapi_connection(conn)  # SQLAlchemy's too
        # handles need only ids (their attributes read the store): no record per job
        return [Job(self, job_id) for job_id in self.store.job_enqueue_ids(list(specs), conn=conn)]

    def enqueue(
        self,
        task: str,
        args: Sequence[Any] = (),
        kwargs: dict[str, Any] | None = None,
        *,
        conn: Any = None,
        allow_unregistered: bool = False,
        **options: Any,
    ) -> Job:
        """Enqueue by task name, without the task's code (the producer need not import it),
        with the task's own options (see :meth:`task_options`); ``options`` override them."""
        unknown = set(options) - set(Options.__dataclass_fields__)
        if unknown:
            raise TypeError(f"unknown job option(s): {', '.join(sorted(unknown))}")
        if "queue" in options:  # a bad queue is the mistake to name, even for a bad task
            payload.check_queue(options["queue"])
        base = self.task_options(task, allow_unregistered=allow_unregistered)
        spec = replace(base, **options).spec(task, args, kwargs or {})
        return self.enqueue_specs([spec], conn=conn)[0]

    async def enqueue_async(
        self,
        task: str,
        args: Sequence[Any] = (),
        kwargs: dict[str, Any] | None = None,
        **options: Any,
    ) -> Job:
        """``await app.enqueue_async(name, ...)``: :meth:`enqueue` on a thread, so that the
        caller's event loop runs on while the store is written."""
        return await asyncio.to_thread(self.enqueue, task, args, kwargs, **options)

    def task_options(self, task: str, *, allow_unregistered: bool = False) -> Options:
        """The options of the task named ``task``: as registered with this app, else as the
        last worker serving it published them when its session opened. UnknownTask when no
        worker ever published it, unless ``allow_unregistered`` (then the defaults)."""
        task = payload.check_task(task)
        if task in self.registry:
            return self.registry.get(task).options_
        published = self.store.task_get(task)
        if published is not None:
            return published_options(published)
        if allow_unregistered:
            return Options()
        raise errors.UnknownTask(
            f"no worker has registered a task named {task!r}: start a worker that serves "
            "it, or enqueue it anyway with allow_unregistered=True (--unregistered)"
        )

    def job(self, job_id: int) -> Job:
        """A handle on an existing job (JobNotFound if there is none)."""
        return Job(self, job_id, self.store.job_get(job_id))

    def workflow(self, job_id: int) -> WorkflowState:  # plunder.flows
        """The jobs (with their states) and edges of the workflow ``job_id`` is in."""
        return self.store.flow_get(job_id)

    def cancel_workflow(self, job_id: int) -> list[int]:
        """Cancel the jobs of ``job_id``'s workflow not started yet; the ids cancelled."""
        return self.store.flow_cancel(job_id)

    # -- limits (docs/guide/limits.md) ------------------------------------------------------
    def set_limit(self, key: str, ceiling: int | None, rate: str | None = None) -> LimitState:
        """At most ``ceiling`` of its jobs run at once on all workers (None: any number) and
        at most ``rate`` (``"600/min"``) start; replaces what was set."""
        return self.store.limit_set(key, ceiling, rate)

    def pause_limit(
        self, key: str, *, until: datetime | None = None, seconds: float = 0
    ) -> datetime:
        """Start none of the key's jobs until ``until`` (aware) or for ``seconds``; a longer
        pause already set stays. Returns the datetime it ends; its jobs then resume."""
        if until is not None:
            seconds = (until - datetime.now(UTC)).total_seconds()
        return self.store.limit_pause(key, max(0.0, seconds))

    def resume_limit(self, key: str) -> bool:
        """End the key's pause now; False if the key has no limit."""
        return self.store.limit_resume(key)

    def limits(self) -> list[LimitState]:
        return self.store.limit_list()  # with their jobs running, admitted and held


class Job:
    """A handle on one job. Attributes read the latest state from the store."""

    __slots__ = ("_record", "app", "id")  # an enqueue_many makes one per job

    def __init__(self, app: App, job_id: int, record: JobRecord | None = None) -> None:
        self.app = app
        self.id = job_id
        self._record = record

    def __repr__(self) -> str:
        if self._record is None:  # not read yet
            return f"<Job {self.id}>"
        return f"<Job {self.id} {self._record.status.value}>"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Job) and other.id == self.id and other.app is self.app

    def __hash__(self) -> int:
        return hash(self.id)

    def refresh(self) -> JobRecord:
        self._record = self.app.store.job_get(self.id)
        return self._record

    @property
    def record(self) -> JobRecord:
        return self.refresh()

    @property
    def status(self) -> Status:
        return self.refresh().status

    @property
    def runs(self) -> list[Run]:
        return self.app.store.job_runs(self.id)

    def cancel(self) -> JobRecord:
        self._record = self.app.store.job_cancel(self.id)
        return self._record

    def retry(self) -> JobRecord:
        self._record = self.app.store.job_retry(self.id)
        return self._record

    def wait(self, timeout: float | None = None) -> JobRecord:
        """Wait until the job is terminal; TimeoutError when ``timeout`` passes first (the
        job keeps running). Woken by the hub; re-checks at least every poll interval."""
        store = _remote(self.app.store)
        if store is not None:  # the gateway waits for it
            self._record = store.job_wait(self.id, timeout)
            return self._record
        deadline = None if timeout is None else time.monotonic() + timeout
        woken = threading.Event()
        unwatch = self.app.hub.watch("done", self.id, woken.set)
        try:
            while True:
                record = self.refresh()
                if is_terminal(record.status):
                    return record
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    raise TimeoutError(f"job {self.id} is still {record.status} after {timeout}s")
                poll = self.app.settings.poll_interval
                woken.wait(poll if left is None else min(poll, left))
                woken.clear()
        finally:
            unwatch()

    async def result_async(self, timeout: float | None = None) -> Any:
        """``await job.result_async()``: :meth:`result` without blocking the event loop."""
        return await asyncio.to_thread(self.result, timeout)

    def result(self, timeout: float | None = None) -> Any:
        """The job's result once it succeeded; :class:`JobFailed` (with the error type,
        message and traceback of the last run) if it ended otherwise."""
        record = self.wait(timeout)
        if record.status == Status.SUCCEEDED:
            return record.result
        error = record.error or {}
        detail = f": {error.get('type')}: {error.get('message')}" if error else ""
        raise errors.JobFailed(
            f"job {self.id} {record.status.value}{detail}",
            job_id=self.id,
            status=record.status.value,
            error=error,
        )

    async def stream_async(self, *, timeout: float | None = None) -> AsyncIterator[StreamEvent]:
        """``async for event in job.stream_async()``: :meth:`stream` for an event loop.
        Each read is a short call on a thread and each wait an asyncio wait, so that the
        loop runs on meanwhile, and cancelling the consumer (or leaving the loop early)
        ends it at once, with no thread left waiting."""
        store = _remote(self.app.store)
        if store is not None:  # the gateway follows it; each read on a thread
            remote = store.job_stream(self.id, timeout=timeout)
            try:
                while (event := await asyncio.to_thread(next, remote, None)) is not None:
                    yield event
            finally:
                await asyncio.to_thread(remote.close)
            return
        loop = asyncio.get_running_loop()
        woken = asyncio.Event()

        def wake() -> None:  # on the hub's thread
            try:
                loop.call_soon_threadsafe(woken.set)
            except RuntimeError:
                if not loop.is_closed():
                    raise
                # closed: the consumer is gone, and unwatches in its finally

        reader = StreamReader(self)
        unwatch = await asyncio.to_thread(self.watch, wake)
        try:
            while True:
                events = await asyncio.to_thread(reader.read)
                if events is None:
                    return
                for event in events:
                    yield event
                if not events:
                    wait = reader.wait_time(timeout)
                    with contextlib.suppress(TimeoutError):  # a poll, not an error
                        await asyncio.wait_for(woken.wait(), wait)
                    woken.clear()
        finally:
            unwatch()

    def stream(self, *, timeout: float | None = None) -> Generator[StreamEvent, None, None]:
        """Yield the job's stream events in order — what is stored first, then new ones as
        they are written — until the job is terminal. Woken by the hub. Each event names
        its attempt; when a retry's events follow an earlier attempt's, an event of kind
        ``"attempt"`` comes first (see :class:`plunder.StreamEvent`): what was streamed
        before it belongs to an attempt that did not succeed. A stream that ends with
        events of an attempt other than the job's last (which streamed nothing) ends with
        that mark too."""
        store = _remote(self.app.store)
        if store is not None:  # the gateway follows it
            yield from store.job_stream(self.id, timeout=timeout)
            return
        reader = StreamReader(self)
        woken = threading.Event()
        unwatch = self.watch(woken.set)
        try:
            while True:
                events = reader.read()
                if events is None:
                    return
                yield from events
                if not events:
                    woken.wait(reader.wait_time(timeout))
                    woken.clear()
        finally:
            unwatch()

    def watch(self, callback: Callable[[], None]) -> Callable[[], None]:
        """Call ``callback`` when the job writes stream events or finishes; returns the
        function that stops it."""
        unwatch_stream = self.app.hub.watch("stream", self.id, callback)
        unwatch_done = self.app.hub.watch("done", self.id, callback)

        def unwatch() -> None:
            unwatch_stream()
            unwatch_done()

        return unwatch


def _remote(store: Store) -> HttpStore | None:
    """The store, if it is a gateway's (imported only then: httpx is not needed else)."""
    if store.dialect != "http":
        return None
    from plunder.store.http import HttpStore

    assert isinstance(store, HttpStore)
    return store
