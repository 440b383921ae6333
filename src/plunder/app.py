"""The App: configuration, the task registry and the producer API (``Job``, the handle on
one job, is plunder.handle's)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import replace
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, overload

from plunder import adapters, config, errors, payload, schedules
from plunder.cron import Schedule, ScheduleSpec
from plunder.graph import WorkflowState
from plunder.handle import Job
from plunder.hub import Hub
from plunder.model import JobSpec, LimitState
from plunder.store import Store, open_store
from plunder.task import Options, Registry, Task, make_task, published_options

if TYPE_CHECKING:
    pass


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
        self.fair_queued: dict[str, None] = {}  # @app.task(fair=True): not declared yet
        self.schedules = schedules.Declared()  # upserted at worker start (declare_schedules)

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
        unknown = set(options) - {*Options.__dataclass_fields__, "partitions", "fair"}
        if unknown:
            raise TypeError(f"unknown task option(s): {', '.join(sorted(unknown))}")

        partitions = options.pop("partitions", None)
        if partitions is not None:  # declared in the database before the first enqueue
            self.partitioned[options.get("queue", "default")] = partitions
        if options.pop("fair", False):  # the same; weights: app.fair(queue, weights)
            self.fair_queued[options.get("queue", "default")] = None

        def register(function: Callable[..., Any]) -> Task:
            task = make_task(
                function, producer=self, name=name, pool=pool, no_retry=no_retry, **options
            )
            self.registry.add(task)
            return task

        return register(fn) if fn is not None else register

    def partition(self, queue: str, partitions: int, *, ordered: bool | str | None = None) -> None:
        """Declare ``queue`` partitioned in ``partitions``, in the database, so that every
        producer and worker agrees; ``ordered``: its jobs by partition key (see
        docs/guide/partitions.md)."""
        self.store.partition_declare(queue, partitions, ordered=ordered)

    def fair(self, queue: str, weights: Mapping[str, float] | None = None) -> None:
        """Declare ``queue`` fair, in the database: its claims take the jobs' groups in
        turn, ``weights[group]`` jobs for each 1 of a group not named
        (docs/guide/fairness.md)."""
        self.store.fair_declare(queue, weights)

    def declare_partitions(self) -> None:
        """Declare the partitions that tasks' ``partitions=`` name, and the fair queues
        that their ``fair=True`` name, once."""
        while self.partitioned:
            self.partition(*self.partitioned.popitem())
        while self.fair_queued:
            queue, _ = self.fair_queued.popitem()
            # through a gateway a worker with the database declares it; declared weights stay
            if hasattr(self.store, "fair_queues") and queue not in self.store.fair_queues(fresh=0):
                self.fair(queue)

    # -- schedules (docs/guide/periodic.md) ---------------------------------------------------
    def periodic(self, cron: str, **options: Any) -> Callable[[Callable[..., Any]], Task]:
        """``@app.periodic("*/5 * * * *", queue=..., args=[...], timezone="UTC",
        catch_up="latest")``: a task (other options as :meth:`task`'s) enqueued at every tick."""
        keep = ("timezone", "args", "kwargs", "catch_up")  # name= names task and schedule
        of_schedule = {k: options.pop(k) for k in keep if k in options}
        schedules.spec_of("_", cron_=cron, **of_schedule)  # a mistake, before any task is made

        def register(fn: Callable[..., Any]) -> Task:
            task = self.task(**options)(fn)
            self.schedule(task, cron=cron, **of_schedule)
            return task

        return register

    def schedule(self, task: Task | str, *, cron: str, **options: Any) -> ScheduleSpec:
        """Enqueue ``task`` at every tick of ``cron`` (options: name, timezone, queue, args,
        kwargs, catch_up), upserted into the database at worker start."""
        return self.schedules.add(schedules.spec_of(task, cron_=cron, **options))

    def declare_schedules(self) -> list[Schedule]:
        return self.schedules.declare(self.store)

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
