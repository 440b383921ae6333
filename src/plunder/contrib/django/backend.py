"""``PlunderBackend``: Django's tasks framework over plunder.

Each Django task is a plunder task named by its module path (``shop.tasks.send_receipt``),
registered with the backend's App when the task is defined (the framework validates every
task then). A result id is the plunder job id. Inside ``transaction.atomic()`` on the
database plunder uses, the job is written on Django's own connection: it exists if and
only if the caller's transaction commits. Outside one, it is written by plunder's store
at once (Django's autocommit).

The App is one per process and backend alias (the framework makes a backend object per
thread), on the project's ``DATABASES`` entry unless ``OPTIONS["URL"]`` names another.
"""

from __future__ import annotations

import inspect
import threading
from collections.abc import Callable
from contextvars import ContextVar
from typing import Any

from django.conf import settings
from django.db import close_old_connections, connections
from django.utils import timezone

from plunder import errors
from plunder.app import App
from plunder.context import Context
from plunder.contrib.django import compat, results

_apps: dict[tuple[str, str], App] = {}
_current: ContextVar[Context | None] = ContextVar("plunder_django_context", default=None)
_apps_lock = threading.Lock()
# plunder's Options a backend may set for every task (OPTIONS["TASK_OPTIONS"])
TASK_OPTIONS = {"retries", "timeout", "backoff_base", "backoff_cap", "retry_on_timeout"}
TASK_OPTIONS |= {"retry_on_lost", "expires_in"}
APP_OPTIONS = {"HEARTBEAT_INTERVAL", "SESSION_EXPIRY", "POLL_INTERVAL", "JANITOR_INTERVAL"}


def database_url(alias: str = "default") -> str:
    """A plunder URL for Django's ``DATABASES[alias]`` (SQLite or PostgreSQL)."""
    try:
        db = settings.DATABASES[alias]
    except KeyError:
        raise errors.ConfigError(f"DATABASES has no database {alias!r}") from None
    engine = db.get("ENGINE", "")
    if engine.endswith("sqlite3"):
        name = str(db.get("NAME", ""))
        if not name or name == ":memory:" or name.startswith("file:"):
            raise errors.ConfigError(
                f"plunder needs a SQLite file shared by its workers, not {name!r} "
                f"(DATABASES[{alias!r}]['NAME'])"
            )
        return f"sqlite:///{name}"
    if "postgresql" in engine:
        from urllib.parse import quote

        user = quote(str(db.get("USER") or ""), safe="")
        password = quote(str(db.get("PASSWORD") or ""), safe="")
        auth = f"{user}:{password}@" if password else (f"{user}@" if user else "")
        host = db.get("HOST") or "localhost"
        port = f":{db['PORT']}" if db.get("PORT") else ""
        return f"postgresql://{auth}{host}{port}/{db.get('NAME')}"
    raise errors.ConfigError(
        f"plunder runs on SQLite or PostgreSQL, not {engine!r} (DATABASES[{alias!r}]); "
        "set OPTIONS['URL'] to a plunder database"
    )


class PlunderBackend(compat.BaseTaskBackend):
    """``TASKS = {"default": {"BACKEND": "plunder.contrib.django.PlunderBackend",
    "OPTIONS": {...}}}``. OPTIONS (all optional): ``DATABASE`` (the Django alias, default
    ``"default"``), ``URL`` (another plunder database instead), ``TRANSACTIONAL`` (join
    the caller's atomic block, default True), ``TASK_OPTIONS`` (plunder options for every
    task: ``retries``, ``timeout``, …) and the intervals ``SESSION_EXPIRY``,
    ``HEARTBEAT_INTERVAL``, ``POLL_INTERVAL``, ``JANITOR_INTERVAL`` (seconds)."""

    supports_defer = True
    supports_async_task = True
    supports_get_result = True
    supports_priority = True

    def __init__(self, alias: str, params: dict[str, Any]) -> None:
        super().__init__(alias, params)
        options = dict(self.options)
        self.database = options.pop("DATABASE", "default")
        url = options.pop("URL", None)
        self.transactional = bool(options.pop("TRANSACTIONAL", True)) and url is None
        self.task_options = dict(options.pop("TASK_OPTIONS", {}))
        unknown = set(self.task_options) - TASK_OPTIONS
        if unknown:
            raise errors.ConfigError(f"unknown TASK_OPTIONS: {', '.join(sorted(unknown))}")
        intervals = {k.lower(): options.pop(k) for k in list(options) if k in APP_OPTIONS}
        if options:
            raise errors.ConfigError(
                f"unknown OPTIONS of task backend {alias!r}: {', '.join(sorted(options))}"
            )
        self.url = url or database_url(self.database)
        with _apps_lock:
            app = _apps.get((alias, self.url))
            if app is None:
                app = _apps[(alias, self.url)] = App(self.url, **intervals)
        self.app = app

    # -- tasks ----------------------------------------------------------------------------
    def validate_task(self, task: Any) -> None:
        super().validate_task(task)
        name = task.module_path
        if name not in self.app.registry:
            self.app.task(name=name, queue=task.queue_name)(_runner(self.alias, task))

    def enqueue(self, task: Any, args: Any, kwargs: Any) -> Any:
        self.validate_task(task)
        options: dict[str, Any] = {
            **self.task_options,
            "queue": task.queue_name,
            "priority": task.priority,
        }
        if task.run_after is not None:  # due that long after the database's now
            options["delay"] = max(0.0, (task.run_after - timezone.now()).total_seconds())
        # the framework's own JSON check first (TypeError for what JSON cannot carry)
        result = results.ready(task, "", list(args), dict(kwargs), self.alias)
        job = self.app.enqueue(
            task.module_path, result.args, result.kwargs, conn=self._caller_connection(), **options
        )
        object.__setattr__(result, "id", str(job.id))  # a frozen dataclass, made before its id
        compat.signals.task_enqueued.send(type(self), task_result=result)
        return result

    def _caller_connection(self) -> Any:
        """Django's DB-API connection while the caller is inside an atomic block on the
        database plunder uses (the job joins that transaction); else None."""
        if not self.transactional:
            return None
        connection = connections[self.database]
        if not connection.in_atomic_block:
            return None
        connection.ensure_connection()
        return connection.connection

    def get_result(self, result_id: str) -> Any:
        try:
            job_id = int(result_id)
        except (TypeError, ValueError):
            raise compat.ResultDoesNotExist(result_id) from None
        try:
            record = self.app.store.job_get(job_id)
        except errors.JobNotFound:
            raise compat.ResultDoesNotExist(result_id) from None
        try:
            return results.from_record(record, self.app.store.job_runs(job_id), self.alias)
        except errors.UnknownTask as exc:  # a job, but not one of a Django task
            raise compat.ResultDoesNotExist(result_id) from exc

    def close(self) -> None:
        """Close the process's App of this backend (tests; a worker's exit)."""
        with _apps_lock:
            _apps.pop((self.alias, self.url), None)
        self.app.close()


def current_context() -> Context:
    """The plunder Context of the Django task running in this thread or coroutine (to
    ``stream`` or report ``progress`` to the job's subscribers)."""
    ctx = _current.get()
    if ctx is None:
        raise errors.ConfigError("no plunder job is running here (only in a Django task)")
    return ctx


def _runner(alias: str, task: Any) -> Callable[..., Any]:
    """The function a plunder worker runs for a Django task: the task's function, with a
    TaskContext first where it takes one, between Django's connection housekeeping."""

    def context_for(ctx: Context) -> list[Any]:
        if not task.takes_context:
            return []
        backend = compat.task_backends[alias]
        return [compat.TaskContext(task_result=backend.get_result(str(ctx.job_id)))]

    if inspect.iscoroutinefunction(task.func):

        async def run_async(ctx: Context, *args: Any, **kwargs: Any) -> Any:
            from asgiref.sync import sync_to_async

            first = await sync_to_async(context_for)(ctx)
            _current.set(ctx)  # this coroutine's own copy of the context
            return await task.func(*first, *args, **kwargs)

        return run_async

    def run(ctx: Context, *args: Any, **kwargs: Any) -> Any:
        close_old_connections()
        token = _current.set(ctx)
        try:
            return task.func(*context_for(ctx), *args, **kwargs)
        finally:
            _current.reset(token)
            close_old_connections()

    return run
