"""The commands about jobs: ``enqueue``, ``jobs``, ``job`` (``--follow``), ``cancel``,
``retry``."""

from __future__ import annotations

import json
import sys
from typing import Any

import click
from rich.table import Table
from rich.text import Text

from plunder import errors, payload
from plunder.cli import follow, workflow
from plunder.cli.output import emit_json, err, json_option, literal, out, plain, user_errors
from plunder.cli.state import State, pass_state
from plunder.handle import Job
from plunder.model import JobRecord, Run

JOB_FIELDS = (
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
)


@click.command()
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
        args, kwargs = _arguments(args_json)
        options = {name: v for name, v in flags.items() if v is not None}
        app = state.app()
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


def _arguments(args_json: str) -> tuple[list[Any], dict[str, Any]]:
    """ARGS_JSON as positional arguments (a list) or keyword arguments (an object)."""
    value = payload.parse(args_json, what="ARGS_JSON")
    if isinstance(value, list):
        return value, {}
    if isinstance(value, dict):
        return [], value
    raise errors.PayloadError("ARGS_JSON must be a JSON list or object")


def _wait(job: Job, timeout: float | None) -> Any:
    with err.status(f"waiting for job {job.id}…"):
        return job.result(timeout=timeout)


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


@click.command()
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


@click.command()
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
        family = workflow.relatives(store, job_id)  # a workflow's parents and children
        if as_json:
            emit_json({"job": record, "runs": runs, **family})
            return
        for field in JOB_FIELDS:
            out.print(_field_line(field, plain(getattr(record, field))))
        for name, ids in family.items():
            if ids:
                out.print(_field_line(name, ", ".join(map(str, ids))))
        if record.error:
            message = f"{record.error.get('type')}: {record.error.get('message')}"
            out.print(_field_line("error", message))
        out.print(_runs_table(runs))


def _field_line(name: str, value: object) -> Text:
    return Text.assemble(literal(f"{name:>13}", "bold"), "  ", literal(value))


def _follow(state: State, job_id: int, as_json: bool, *, progress: bool) -> None:
    app = state.app()
    shown = follow.Follower(sys.stdout, sys.stderr, progress=progress, as_json=as_json)
    try:
        handle = app.job(job_id)
        for event in handle.stream():
            shown.event(event)
        if not as_json:
            shown.note(f"job {job_id} {handle.refresh().status.value}")
    finally:
        app.close()


@click.command()
@click.argument("job_id", type=int)
@json_option
@pass_state
def cancel(state: State, job_id: int, as_json: bool) -> None:
    """Cancel a pending or running job."""
    with user_errors():
        record = state.store().job_cancel(job_id)
        emit_json(record) if as_json else click.echo(f"job {job_id} {record.status.value}")


@click.command()
@click.argument("job_id", type=int)
@json_option
@pass_state
def retry(state: State, job_id: int, as_json: bool) -> None:
    """Run a failed, timed-out or cancelled job again."""
    with user_errors():
        record = state.store().job_retry(job_id)
        emit_json(record) if as_json else click.echo(f"job {job_id} {record.status.value}")
