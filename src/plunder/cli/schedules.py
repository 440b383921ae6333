"""``plunder schedules``: the periodic jobs stored in the database (docs/guide/periodic.md)
— list them, add or change one, pause, resume, remove. A change is seen by the janitor's
next pass: no deploy, no restart."""

from __future__ import annotations

import json

import click
from rich import box
from rich.table import Table

from plunder import cron
from plunder.cli.output import emit_json, json_option, literal, out, plain, user_errors
from plunder.cli.state import State, pass_state
from plunder.cron import Schedule, ScheduleSpec


@click.group(invoke_without_command=True)
@json_option
@pass_state
@click.pass_context
def schedules(ctx: click.Context, state: State, /, as_json: bool) -> None:
    """Periodic jobs: each schedule's cron, time zone and next tick. Subcommands: list,
    add, pause, resume, remove."""
    if ctx.invoked_subcommand is None:
        with user_errors():
            state.direct("schedules")
            show(state.store().schedule_list(), as_json)


@schedules.command("list")
@json_option
@pass_state
def list_schedules(state: State, /, as_json: bool) -> None:
    """Every schedule, by name."""
    with user_errors():
        state.direct("schedules")
        show(state.store().schedule_list(), as_json)


def show(found: list[Schedule], as_json: bool) -> None:
    if as_json:
        emit_json([plain(s) for s in found])
        return
    table = Table(
        title="schedules",
        box=box.SIMPLE_HEAD,
        show_edge=False,
        pad_edge=False,
        collapse_padding=True,
    )
    for column in ("name", "task", "cron (zone)", "queue", "catch-up", "next tick (UTC)"):
        table.add_column(column, overflow="fold")
    for s in found:
        if s.paused:
            upcoming = "paused"
        else:
            upcoming = "never" if s.next_at is None else f"{s.next_at:%Y-%m-%d %H:%M:%S}"
        table.add_row(
            literal(s.name),
            literal(s.task),
            literal(f"{s.cron} ({s.timezone})"),
            literal(s.queue or "-"),
            s.catch_up,
            upcoming,
        )
    out.print(table)


def _json(text: str, what: str, kind: type) -> object:
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise click.BadParameter(f"{what} is not JSON: {exc}") from exc
    if not isinstance(value, kind):
        raise click.BadParameter(f"{what} must be a JSON {kind.__name__}, not {text}")
    return value


@schedules.command("add")
@click.argument("name")
@click.argument("task")
@click.argument("cron_expression", metavar="CRON")
@click.option("--timezone", default="UTC", show_default=True, help="An IANA zone: Europe/Paris.")
@click.option("--queue", default=None, help="The jobs' queue (default: the task's own).")
@click.option("--args", "args_json", default="[]", help="The jobs' arguments, a JSON list.")
@click.option("--kwargs", "kwargs_json", default="{}", help="Keyword arguments, a JSON object.")
@click.option(
    "--catch-up",
    type=click.Choice(cron.CATCH_UP),
    default=cron.DEFAULT_CATCH_UP,
    show_default=True,
    help="Ticks missed while every janitor was down: run all, the latest, or none.",
)
@json_option
@pass_state
def add(
    state: State,
    /,
    name: str,
    task: str,
    cron_expression: str,
    timezone: str,
    queue: str | None,
    args_json: str,
    kwargs_json: str,
    catch_up: str,
    as_json: bool,
) -> None:
    """Add schedule NAME, enqueuing TASK at every tick of CRON (5 fields, or 6 with
    seconds first: "*/5 * * * *"), or give an existing one this definition (its pause is
    kept; a new CRON or time zone ticks first after now)."""
    args = _json(args_json, "--args", list)
    kwargs = _json(kwargs_json, "--kwargs", dict)
    with user_errors():
        state.direct("schedules")
        spec = ScheduleSpec(
            name=name,
            task=task,
            cron=cron_expression,
            timezone=timezone,
            queue=queue,
            args=list(args),  # type: ignore[call-overload]
            kwargs=dict(kwargs),  # type: ignore[call-overload]
            catch_up=catch_up,
        )
        show([state.store().schedule_upsert(spec)], as_json)


@schedules.command("pause")
@click.argument("name")
@json_option
@pass_state
def pause(state: State, /, name: str, as_json: bool) -> None:
    """Enqueue nothing for NAME until it is resumed."""
    with user_errors():
        state.direct("schedules")
        show([state.store().schedule_pause(name, True)], as_json)


@schedules.command("resume")
@click.argument("name")
@json_option
@pass_state
def resume(state: State, /, name: str, as_json: bool) -> None:
    """Tick NAME again from its first tick after now (the paused ticks are not run)."""
    with user_errors():
        state.direct("schedules")
        show([state.store().schedule_pause(name, False)], as_json)


@schedules.command("remove")
@click.argument("name")
@json_option
@pass_state
def remove(state: State, /, name: str, as_json: bool) -> None:
    """Delete schedule NAME (its jobs stay). A schedule declared in code comes back at the
    next worker start: remove it from the code, or pause it."""
    with user_errors():
        state.direct("schedules")
        if not state.store().schedule_remove(name):
            raise click.ClickException(f"no schedule named {name!r}")
        if as_json:
            emit_json({"name": name, "removed": True})
        else:
            click.echo(f"schedule {name} removed")
