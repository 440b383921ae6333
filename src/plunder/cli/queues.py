"""``plunder queues``: pause a queue (workers claim none of its jobs; those running run
on), resume it, list the paused ones."""

from __future__ import annotations

import click
from rich import box
from rich.table import Table

from plunder.cli.output import emit_json, json_option, literal, out, plain, user_errors
from plunder.cli.state import State, pass_state
from plunder.store import pauses


@click.group(invoke_without_command=True)
@json_option
@pass_state
@click.pass_context
def queues(ctx: click.Context, state: State, /, as_json: bool) -> None:
    """Paused queues. Subcommands: pause, resume, list (the default)."""
    if ctx.invoked_subcommand is None:
        ctx.invoke(list_paused, as_json=as_json)


@queues.command("list")
@json_option
@pass_state
def list_paused(state: State, /, as_json: bool) -> None:
    """The paused queues, and when and why each was paused."""
    with user_errors():
        state.direct("queues")
        found = pauses.of(state.store()).queue_pause_list()
        if as_json:
            emit_json([plain(p) for p in found])
            return
        table = Table(title="paused queues", box=box.SIMPLE_HEAD, show_edge=False)
        for column in ("queue", "paused at", "reason"):
            table.add_column(column)
        for p in found:
            table.add_row(literal(p.queue), f"{p.paused_at:%Y-%m-%d %H:%M:%S}", literal(p.reason))
        out.print(table if found else "no queue is paused")


@queues.command("pause")
@click.argument("queue")
@click.option("--reason", default="", help="A note shown in the list and the dashboard.")
@pass_state
def pause(state: State, /, queue: str, reason: str) -> None:
    """Workers claim no job of QUEUE (within a second); the jobs running there run on."""
    with user_errors():
        state.direct("queues pause")
        done = pauses.of(state.store()).queue_pause(queue, reason=reason)
        click.echo(f"queue {queue} {'paused' if done else 'was paused already'}")


@queues.command("resume")
@click.argument("queue")
@pass_state
def resume(state: State, /, queue: str) -> None:
    """Workers claim QUEUE's jobs again."""
    with user_errors():
        state.direct("queues resume")
        done = pauses.of(state.store()).queue_resume(queue)
        click.echo(f"queue {queue} {'resumed' if done else 'was not paused'}")
