"""``plunder limits``: the concurrency and rate limits by key (docs/guide/limits.md) — list
them, set one, pause one, resume one. ``plunder status`` shows the same table."""

from __future__ import annotations

import click
from rich import box
from rich.table import Table

from plunder.cli.output import emit_json, json_option, literal, out, plain, user_errors
from plunder.cli.state import State, pass_state
from plunder.model import LimitState


@click.group(invoke_without_command=True)
@json_option
@pass_state
@click.pass_context
def limits(ctx: click.Context, state: State, /, as_json: bool) -> None:
    """Concurrency and rate limits by key: their jobs running, admitted and held, and why
    the held ones wait. Subcommands: set, pause, resume."""
    if ctx.invoked_subcommand is None:
        with user_errors():
            show(state.store().limit_list(), as_json)


def show(found: list[LimitState], as_json: bool) -> None:
    if as_json:
        emit_json([{**plain(s), "reason": s.reason} for s in found])
        return
    out.print(limits_table(found))


def limits_table(found: list[LimitState]) -> Table:
    """One row per key; the end of a pause is in its reason (``--json``: paused_until)."""
    table = Table(
        title="limits", box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False, collapse_padding=True
    )
    for column in ("key", "ceiling", "rate", "running", "admitted", "held"):
        left = column in ("key", "rate")
        table.add_column(column, justify="left" if left else "right", no_wrap=True)
    table.add_column("why the held wait", overflow="fold")
    for s in found:
        table.add_row(
            literal(s.key),
            "-" if s.ceiling is None else str(s.ceiling),
            s.rate or "-",
            str(s.running),
            str(s.admitted),
            str(s.held),
            literal(s.reason),
        )
    return table


@limits.command("set")
@click.argument("key")
@click.argument("ceiling", type=int, required=False)
@click.option("--rate", default=None, help="At most this many started: 600/min, 10/s, 1000/h.")
@json_option
@pass_state
def set_limit(
    state: State, /, key: str, ceiling: int | None, rate: str | None, as_json: bool
) -> None:
    """Set KEY's ceiling (at most CEILING of its jobs running at once; none: no ceiling)
    and its rate; its held jobs are admitted as far as the new limit allows."""
    with user_errors():
        show([state.store().limit_set(key, ceiling, rate)], as_json)


@limits.command("pause")
@click.argument("key")
@click.option("--seconds", type=float, required=True, help="How long none of its jobs starts.")
@json_option
@pass_state
def pause(state: State, /, key: str, seconds: float, as_json: bool) -> None:
    """Start none of KEY's jobs for --seconds (a longer pause already set stays); those
    admitted but not started are held again. They resume on their own after it."""
    with user_errors():
        ends = state.store().limit_pause(key, seconds)
        if as_json:
            emit_json({"key": key, "paused_until": ends})
        else:
            click.echo(f"limit {key} paused until {ends:%Y-%m-%d %H:%M:%S} UTC")


@limits.command("resume")
@click.argument("key")
@json_option
@pass_state
def resume(state: State, /, key: str, as_json: bool) -> None:
    """End KEY's pause now: its held jobs are admitted as its limit allows."""
    with user_errors():
        found = state.store().limit_resume(key)
        if not found:
            raise click.ClickException(f"no limit named {key!r}")
        if as_json:
            emit_json({"key": key, "resumed": True})
        else:
            click.echo(f"limit {key} resumed")
