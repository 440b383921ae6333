"""The ``plunder`` command: parses, wires, prints, exits. Nothing imports it.

A user mistake (a bad URL, an unknown job, malformed JSON, an unreachable database) prints
one line on stderr and exits non-zero; a traceback means a bug in plunder.
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import logging
import os
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime
from enum import Enum
from typing import Any, TypeVar

import click
from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text

from plunder import config, errors, follow, payload
from plunder.app import App, Job
from plunder.execution import tune_gc
from plunder.model import JobRecord, Run, Unrunnable
from plunder.states import Status
from plunder.store import Store, open_store
from plunder.worker import Worker, WorkerOptions

F = TypeVar("F", bound=Callable[..., Any])
out = Console(highlight=False)
err = Console(stderr=True, highlight=False)
CLI_STORE: dict[str, Any] = {
    "busy_total": 5.0,
    "connect_timeout": 5.0,
    "pool_size": 2,
    "application_name": "plunder:cli",
    "create": False,  # a typo in a SQLite path is refused, not made an empty database
}


def _plain(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, Enum):
        return value.value
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value


def literal(value: object, style: str = "") -> Text:
    """Text that rich prints as it is: names, payloads and messages can hold ``[/x]`` or
    ``:smile:``, which rich would otherwise read as markup (and fail on) or as emoji."""
    return Text(str(value), style=style)


def error_line(message: object) -> Text:
    return Text.assemble(literal("error:", "red"), " ", literal(message))


def emit_json(value: Any) -> None:
    click.echo(json.dumps(_plain(value), indent=2, ensure_ascii=False))


@contextmanager
def user_errors() -> Iterator[None]:
    """Turn plunder's errors (and a wait that timed out) into one line and exit status 1."""
    try:
        yield
    except (errors.PlunderError, ValueError, TypeError, TimeoutError) as exc:
        err.print(error_line(" ".join(str(exc).split())), soft_wrap=True)
        sys.exit(1)


def json_option(fn: F) -> F:
    return click.option("--json", "as_json", is_flag=True, help="Print JSON.")(fn)


class State:
    def __init__(self, url: str, explicit: bool) -> None:
        self.url = url
        self.explicit = explicit
        self._store: Store | None = None

    def store(self, *, migrate: bool = False) -> Store:
        if self._store is None:
            # only init (migrate) may create a SQLite file
            store = open_store(self.url, **{**CLI_STORE, "create": migrate})
            store.migrate() if migrate else store.schema_check()
            self._store = store
        return self._store


@contextmanager
def one_line_usage() -> Iterator[None]:
    """A usage mistake (``--limit -1``, ``job abc``) is one line too: click prints the usage
    text above the error only when the error carries its context."""
    try:
        yield
    except click.UsageError as exc:
        if type(exc).show is click.UsageError.show:  # not the help shown for no arguments
            exc.ctx = None
        raise


def _db_after(ctx: click.Context, _: click.Parameter, value: str | None) -> None:
    """``--db`` given after the command: it wins over the one before it (or PLUNDER_URL)."""
    state = ctx.find_object(State)
    if value is not None and state is not None:
        state.url, state.explicit = value, True


NO_DB = {"bench"}  # the commands that take no --db


class Group(click.Group):
    def make_context(self, *args: Any, **kwargs: Any) -> click.Context:
        with one_line_usage():
            return super().make_context(*args, **kwargs)

    def invoke(self, ctx: click.Context) -> Any:
        with one_line_usage(), user_errors():
            return super().invoke(ctx)

    def add_command(self, cmd: click.Command, name: str | None = None) -> None:
        """Every command that uses the database takes ``--db`` after its name too."""
        if (name or cmd.name) not in NO_DB:
            cmd.params.append(
                click.Option(
                    ["--db"],
                    default=None,
                    expose_value=False,
                    is_eager=True,  # set before the command's other options are read
                    callback=_db_after,
                    help="Database URL, as before the command (this one wins).",
                )
            )
        super().add_command(cmd, name)


@click.group(cls=Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.option(
    "--db",
    envvar="PLUNDER_URL",
    default=config.DEFAULT_URL,
    show_default=True,
    help="Database URL (sqlite:///file.db or postgresql://…); env PLUNDER_URL.",
)
@click.option(
    "--log-level",
    default="INFO",
    show_default=True,
    type=click.Choice(["DEBUG", "INFO", "WARNING", "ERROR"], case_sensitive=False),
)
@click.version_option(package_name="plunder")
@click.pass_context
def main(ctx: click.Context, db: str, log_level: str) -> None:
    """plunder: a job queue where idle workers steal work from a database.

    --db goes before or after the command. Errors are one line on stderr: a usage mistake
    prints "Error: …" (click's) with exit status 2; anything else that fails (an unknown
    job, a database that is missing or refuses, a wait that timed out) prints "error: …"
    with exit status 1.
    """
    logging.basicConfig(
        level=log_level.upper(),
        stream=sys.stderr,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    source = ctx.get_parameter_source("db")
    explicit = source not in (click.core.ParameterSource.DEFAULT, None)
    ctx.obj = State(db, explicit)
    ctx.call_on_close(lambda: ctx.obj._store.close() if ctx.obj._store else None)


pass_state = click.make_pass_decorator(State)


@main.command()
@pass_state
def init(state: State) -> None:
    """Create or migrate plunder's tables."""
    with user_errors():
        store = state.store(migrate=True)
        click.echo(f"{store.url}: plunder schema version {store.schema_check()}")


def load_app(spec: str, state: State) -> App:
    module_name, _, attribute = spec.partition(":")
    if not module_name or not attribute:
        raise click.BadParameter("use -A module:attribute, e.g. -A myproject.jobs:app")
    sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise errors.ConfigError(f"cannot import {module_name}: {exc}") from exc
    app = getattr(module, attribute, None)
    if not isinstance(app, App):
        raise errors.ConfigError(f"{spec} is not a plunder.App (got {type(app).__name__})")
    if state.explicit:
        app.configure(url=state.url)
    return app


def interval_options(fn: F) -> F:
    for name in ("heartbeat-interval", "session-expiry", "poll-interval", "janitor-interval"):
        env = "PLUNDER_" + name.upper().replace("-", "_")
        fn = click.option(f"--{name}", type=float, default=None, help=f"Seconds (env {env}).")(fn)
    return fn


@main.command()
@click.option("-A", "--app", "app_spec", required=True, help="module:attribute of your App.")
@click.option(
    "-q",
    "--queues",
    default=None,
    help="Comma-separated queues (default: all queues of the app's tasks).",
)
@click.option("-c", "--concurrency", type=click.IntRange(1, 10_000), default=4, show_default=True)
@click.option(
    "--pool",
    type=click.Choice(["thread", "process"]),
    default=None,
    help="Run plain-function tasks in threads (default) or a warm pool of child processes.",
)
@click.option(
    "--grace",
    type=float,
    default=config.GRACE,
    show_default=True,
    help="Seconds running jobs get to finish after SIGTERM.",
)
@click.option("--name", default=None, help="Worker name shown in status and run history.")
@click.option("--no-janitor", is_flag=True, help="Do not take part in janitor duty.")
@click.option(
    "--no-listen",
    is_flag=True,
    help="No LISTEN/NOTIFY or data_version wake-ups: "
    "poll every --poll-interval (env PLUNDER_LISTEN=0).",
)
@click.option(
    "--parallel-acks",
    is_flag=True,
    help="PostgreSQL: write acknowledgements on a connection of their own while the next "
    "jobs are claimed (3 connections per worker instead of 2; faster on short jobs where "
    "the worker does not share its cores with the database).",
)
@click.option(
    "--turns-ahead/--no-turns-ahead",
    default=True,
    show_default=True,
    help="PostgreSQL: a busy worker sends its next turn (results and claim) while it starts "
    "the jobs of the last, on a connection it holds while busy (3 connections per worker "
    "instead of 2; turns claim up to a third of the slots, so -c 300 claims batches of "
    "100).",
)
@interval_options
@pass_state
def worker(
    state: State,
    /,
    app_spec: str,
    queues: str | None,
    concurrency: int,
    pool: str | None,
    grace: float,
    name: str | None,
    no_janitor: bool,
    no_listen: bool,
    parallel_acks: bool,
    turns_ahead: bool,
    **intervals: float | None,
) -> None:
    """Run a worker: claim jobs, run them, acknowledge them."""
    with user_errors():
        app = load_app(app_spec, state)
        app.configure(**intervals, listen=False if no_listen else None)
        queue_list = tuple(q.strip() for q in queues.split(",") if q.strip()) if queues else None
        options = WorkerOptions(
            queues=queue_list,
            concurrency=concurrency,
            name=name,
            janitor=not no_janitor,
            grace=grace,
            pool=pool,
            parallel_acks=parallel_acks,
            turns_ahead=turns_ahead,
        )
        tune_gc()
        Worker(app, options).run()


@main.command()
@interval_options
@pass_state
def janitor(state: State, /, **intervals: float | None) -> None:
    """Run only the janitor (reaping, timeouts, pruning) while holding its lease."""
    import threading

    from plunder.janitor import Janitor

    with user_errors():
        settings = config.load(url=state.url).with_overrides(**intervals)
        stop = threading.Event()
        import signal

        signal.signal(signal.SIGTERM, lambda *_: stop.set())
        signal.signal(signal.SIGINT, lambda *_: stop.set())
        # its own deadlines, so that a pass it leaves open (paused, cut off) cannot hold
        # up a successor's takeover for good
        deadlines = config.WorkerDeadlines.of(settings).janitor_store_options()
        store = open_store(state.url, **{**CLI_STORE, **deadlines})
        store.schema_check()
        try:
            Janitor(store, settings).run(stop)
        finally:
            store.close()


@main.command()
@click.argument("task")
@click.argument("args_json", required=False, default="[]")
@click.option("--queue", default=None, help="Default: the task's own.")
@click.option("--priority", type=int, default=None, help="Higher runs first.")
@click.option("--delay", type=float, default=None, help="Seconds before it may run.")
@click.option("--key", default=None, help="Idempotency key: one active job per key.")
@click.option("--retries", type=click.IntRange(0, 999), default=None)
@click.option("--timeout", type=float, default=None, help="Seconds a run may take.")
@click.option(
    "--unregistered",
    is_flag=True,
    help="Enqueue even if no worker ever registered TASK (with default options).",
)
@click.option("--wait", is_flag=True, help="Wait for the result and print it.")
@click.option("--wait-timeout", type=float, default=None, help="Give up waiting after this.")
@json_option
@pass_state
def enqueue(
    state: State,
    /,
    task: str,
    args_json: str,
    unregistered: bool,
    wait: bool,
    wait_timeout: float | None,
    as_json: bool,
    **flags: Any,
) -> None:
    """Enqueue TASK with ARGS_JSON: a JSON list (positional) or object (keyword).

    The job takes the task's own options (queue, retries, timeout, …) as its workers
    published them; the flags given override them. A task no worker ever registered is
    refused unless --unregistered."""
    with user_errors():
        value = payload.parse(args_json, what="ARGS_JSON")
        if isinstance(value, list):
            args, kwargs = value, {}
        elif isinstance(value, dict):
            args, kwargs = [], value
        else:
            raise errors.PayloadError("ARGS_JSON must be a JSON list or object")
        options = {name: v for name, v in flags.items() if v is not None}
        app = App(state.url, **CLI_STORE)
        try:
            job = app.enqueue(task, args, kwargs, allow_unregistered=unregistered, **options)
            result = _wait(job, wait_timeout) if wait else None
            record = job.refresh()
        finally:
            app.close()
        if as_json:
            emit_json({"job": record, "result": result} if wait else record)
        elif wait:
            click.echo(json.dumps(result, ensure_ascii=False))
        else:
            click.echo(f"job {record.id} {record.status.value} ({record.task} on {record.queue})")


def _wait(job: Job, timeout: float | None) -> Any:
    with err.status(f"waiting for job {job.id}…"):
        return job.result(timeout=timeout)


@main.command()
@json_option
@pass_state
def status(state: State, as_json: bool) -> None:
    """Queues, live workers, the janitor's holder, and the pending jobs no live worker
    can run (none serves both their queue and their task), by task."""
    from plunder.janitor import LEASE_NAME

    with user_errors():
        store = state.store()
        stats, sessions, lease, unrunnable = (
            store.queue_stats(),
            store.session_list(),
            store.lease_get(LEASE_NAME),
            store.job_unrunnable(),
        )
        if as_json:
            emit_json(
                {"queues": stats, "workers": sessions, "janitor": lease, "unrunnable": unrunnable}
            )
            return
        # no vertical rules, and headers that may wrap: a queue's row fits 80 columns
        table = Table(
            title="queues",
            box=box.SIMPLE_HEAD,
            show_edge=False,
            pad_edge=False,
            collapse_padding=True,
        )
        statuses = [status.value for status in Status]
        table.add_column("queue", no_wrap=True)
        for column in (*statuses, "oldest pending"):
            label = column.replace("_", " ")
            table.add_column(label, justify="right", no_wrap=" " not in label)
        for s in stats:
            age = "-" if s.oldest_pending_age is None else f"{s.oldest_pending_age:.1f}s"
            table.add_row(
                s.queue,
                *(str(s.counts[k]) for k in statuses),
                age,
            )
        out.print(table)
        workers = Table(title="live workers")
        for column in ("session", "name", "host", "pid", "queues", "last heartbeat"):
            workers.add_column(column)
        for w in sessions:
            workers.add_row(
                w.id[:12],
                literal(w.name),
                literal(w.host),
                str(w.pid),
                ",".join(w.queues),
                w.heartbeat_at.strftime("%H:%M:%S"),
            )
        out.print(workers)
        holder = "none" if lease is None else f"{lease.holder} (term {lease.term})"
        out.print(literal(f"janitor lease: {holder}"))
        if unrunnable:
            _print_unrunnable(unrunnable)


def _print_unrunnable(rows: list[Unrunnable]) -> None:
    table = Table(title="pending jobs no live worker can run")
    for column in ("task", "queue", "pending"):
        table.add_column(column, justify="right" if column == "pending" else "left")
    for row in rows:
        table.add_row(literal(row.task), literal(row.queue), str(row.pending))
    out.print(table)


def _job_row(job: JobRecord) -> list[str]:
    finished = job.finished_at.strftime("%H:%M:%S") if job.finished_at else "-"
    return [
        str(job.id),
        job.queue,
        job.task,
        job.status.value,
        f"{job.attempt}/{job.max_attempts}",
        str(job.priority),
        job.created_at.strftime("%Y-%m-%d %H:%M:%S"),
        finished,
    ]


@main.command()
@click.option("--queue", default=None)
@click.option("--status", "status_", default=None, help="pending, running, succeeded, …")
@click.option("--task", default=None)
@click.option("--limit", type=click.IntRange(1, 1000), default=50, show_default=True)
@click.option("--after", type=int, default=None, help="Show jobs older than this id.")
@json_option
@pass_state
def jobs(
    state: State,
    queue: str | None,
    status_: str | None,
    task: str | None,
    limit: int,
    after: int | None,
    as_json: bool,
) -> None:
    """List jobs, newest first (page with --after)."""
    with user_errors():
        page = state.store().job_list(
            queue=queue, status=status_, task=task, after=after, limit=limit
        )
        if as_json:
            emit_json({"jobs": page.jobs, "next_after": page.next_after})
            return
        table = Table()
        for column in (
            "id",
            "queue",
            "task",
            "status",
            "attempt",
            "priority",
            "created",
            "finished",
        ):
            table.add_column(column)
        for job in page.jobs:
            table.add_row(*_job_row(job))
        out.print(table)
        if page.next_after is not None:
            out.print(f"more: plunder jobs --after {page.next_after}")


def _runs_table(runs: list[Run]) -> Table:
    table = Table(title="runs")
    for column in ("attempt", "worker", "host", "pid", "started", "duration", "outcome", "error"):
        table.add_column(column)
    for run in runs:
        duration = "-" if run.duration is None else f"{run.duration:.3f}s"
        error = "" if not run.error else f"{run.error.get('type')}: {run.error.get('message')}"
        table.add_row(
            str(run.attempt),
            literal(run.worker),
            literal(run.host),
            str(run.pid),
            run.started_at.strftime("%H:%M:%S.%f")[:-3],
            duration,
            run.outcome.value if run.outcome else "running",
            literal(error[:80]),
        )
    return table


@main.command()
@click.argument("job_id", type=int)
@click.option("--follow", is_flag=True, help="Print the job's stream live until it ends.")
@click.option(
    "--no-progress",
    is_flag=True,
    help="With --follow: no progress status (shown only when stderr is a terminal).",
)
@json_option
@pass_state
def job(state: State, job_id: int, follow: bool, no_progress: bool, as_json: bool) -> None:
    """Show one job and its runs; with --follow, its stream: the text as it is on stdout,
    progress and attempts on stderr (--json: one JSON object per event)."""
    with user_errors():
        store = state.store()
        if follow:
            _follow(state, job_id, as_json, progress=not no_progress and sys.stderr.isatty())
            return
        record, runs = store.job_get(job_id), store.job_runs(job_id)
        if as_json:
            emit_json({"job": record, "runs": runs})
            return
        for field in (
            "id",
            "queue",
            "task",
            "status",
            "attempt",
            "max_attempts",
            "priority",
            "args",
            "kwargs",
            "key",
            "timeout",
            "created_at",
            "run_at",
            "started_at",
            "finished_at",
            "result",
        ):
            out.print(_field_line(field, _plain(getattr(record, field))))
        if record.error:
            message = f"{record.error.get('type')}: {record.error.get('message')}"
            out.print(_field_line("error", message))
        out.print(_runs_table(runs))


def _field_line(name: str, value: object) -> Text:
    return Text.assemble(literal(f"{name:>13}", "bold"), "  ", literal(value))


def _follow(state: State, job_id: int, as_json: bool, *, progress: bool) -> None:
    app = App(state.url, **CLI_STORE)
    shown = follow.Follower(sys.stdout, sys.stderr, progress=progress, as_json=as_json)
    try:
        handle = app.job(job_id)
        for event in handle.stream():
            shown.event(event)
        if not as_json:
            shown.note(f"job {job_id} {handle.refresh().status.value}")
    finally:
        app.close()


@main.command()
@click.argument("job_id", type=int)
@json_option
@pass_state
def cancel(state: State, job_id: int, as_json: bool) -> None:
    """Cancel a pending or running job."""
    with user_errors():
        record = state.store().job_cancel(job_id)
        emit_json(record) if as_json else click.echo(f"job {job_id} {record.status.value}")


@main.command()
@click.argument("job_id", type=int)
@json_option
@pass_state
def retry(state: State, job_id: int, as_json: bool) -> None:
    """Run a failed, timed-out or cancelled job again."""
    with user_errors():
        record = state.store().job_retry(job_id)
        emit_json(record) if as_json else click.echo(f"job {job_id} {record.status.value}")


@main.command()
@click.option("--workers", type=click.IntRange(2, 16), default=3, show_default=True)
@click.option("--jobs", "job_count", type=click.IntRange(20, 5000), default=300, show_default=True)
@json_option
@pass_state
def demo(state: State, workers: int, job_count: int, as_json: bool) -> None:
    """Watch work stealing: workers, a crash, a rescue. Uses a temporary SQLite file unless
    --db is given."""
    from plunder import demo as demo_module

    with user_errors():
        summary = demo_module.run(
            state.url if state.explicit else None,
            workers=workers,
            jobs=job_count,
            console=out,
            quiet=as_json,
        )
        if as_json:
            emit_json(summary)


@main.command()
@click.option("--quick", is_flag=True, help="Tiny sizes: checks that it works, measures nothing.")
@click.option("--repeat", type=click.IntRange(1, 100), default=3, show_default=True)
@click.option("--systems", default=None, help="Comma-separated systems (default: all).")
@click.option("--scenarios", default=None, help="Comma-separated scenario numbers 1-8.")
@click.option("--json", "json_path", type=click.Path(dir_okay=False), default=None)
def bench(
    quick: bool, repeat: int, systems: str | None, scenarios: str | None, json_path: str | None
) -> None:
    """Benchmark plunder beside its peers on a throwaway PostgreSQL cluster (a source
    checkout's bench/ package; the peers install into bench/.venv on first use)."""
    from pathlib import Path

    sys.path.insert(0, os.getcwd())
    sys.path.insert(1, str(Path(__file__).resolve().parents[2]))
    try:
        from bench import harness
    except ImportError as exc:
        err.print(f"[red]error:[/red] plunder bench runs from a source checkout: {exc}")
        sys.exit(1)
    options = harness.Options(quick=quick, repeat=repeat, echo=click.echo)
    if quick:
        options.sizes = harness.Sizes.quick()
    if systems:
        options.systems = [s.strip() for s in systems.split(",") if s.strip()]
    if scenarios:
        options.scenarios = [s.strip() for s in scenarios.split(",") if s.strip()]
    options.json_path = Path(json_path) if json_path else None
    sys.exit(harness.main(options))


if __name__ == "__main__":  # pragma: no cover
    main()
