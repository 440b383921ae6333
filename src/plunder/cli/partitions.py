"""``partitions``: the partitioned queues and who owns each partition, or a declaration
(see plunder.store.partitions and docs/guide/partitions.md)."""

from __future__ import annotations

import click

from plunder import errors
from plunder.cli.output import emit_json, json_option, literal, out, plain, user_errors
from plunder.cli.state import State, pass_state


@click.command("partitions")
@click.argument("queue", required=False)
@click.argument("count", type=int, required=False)
@click.option(
    "--ordered",
    type=click.Choice(["continue", "stop", "off"]),
    default=None,
    help="With QUEUE and COUNT: one job of a partition key at a time, in order; after a "
    "failed job go on with the next (continue) or stop the key until released (stop).",
)
@json_option
@pass_state
def partitions(
    state: State, /, queue: str | None, count: int | None, ordered: str | None, as_json: bool
) -> None:
    """Show the partitioned queues, each partition with the worker that owns it; with QUEUE
    and COUNT, declare QUEUE partitioned in COUNT partitions first (the janitor assigns
    them within its interval)."""
    with user_errors():
        if state.remote:
            raise errors.ConfigError("partitions reads the database: give its URL (--db)")
        if (queue is None) != (count is None) or (ordered is not None and queue is None):
            raise errors.ConfigError("give both QUEUE and COUNT to declare, or neither to show")
        store = state.store()
        if queue is not None and count is not None:
            mode = False if ordered == "off" else ordered
            store.partition_declare(queue, count, ordered=mode)
        found = store.partition_list()
        if as_json:
            emit_json(found)
            return
        names = {s.id: s.name for s in store.session_list()}
        if not found:
            out.print("no partitioned queues")
        for each in found:
            out.print(
                literal(f"{each.queue}: {each.partitions} partitions, generation {each.generation}")
            )
            for p, owner in enumerate(each.owners):
                who = "none" if owner is None else f"{names.get(owner, '?')} ({owner[:12]})"
                out.print(literal(f"  {each.queue}~{p}: {who}"))


@click.group("ordered", invoke_without_command=True)
@json_option
@pass_state
@click.pass_context
def ordered(ctx: click.Context, state: State, /, as_json: bool) -> None:
    """Ordered keys (one job of a partition key at a time, in order): what a failed job
    does to each, the failed job that stops it, its jobs pending. Subcommand: release."""
    if ctx.invoked_subcommand is not None:
        return
    with user_errors():
        if state.remote:
            raise errors.ConfigError("ordered reads the database: give its URL (--db)")
        found = state.store().order_list()
        if as_json:
            emit_json([{**plain(k), "stopped": k.stopped} for k in found])
            return
        if not found:
            out.print("no ordered keys")
        for k in found:
            how = f"stopped by failed job {k.failed_job}" if k.stopped else "running"
            out.print(literal(f"{k.key}: {how}, {k.pending} pending (on failure: {k.on_failure})"))


@ordered.command("release")
@click.argument("key")
@pass_state
def release(state: State, /, key: str) -> None:
    """Let KEY, stopped by a failed job, go on with its next jobs (the failed jobs stay
    failed; retry one by hand first to run it again before the rest)."""
    with user_errors():
        if state.remote:
            raise errors.ConfigError("ordered reads the database: give its URL (--db)")
        if not state.store().order_release(key):
            raise errors.ConfigError(f"no ordered key {key!r} (see plunder ordered)")
        out.print(literal(f"{key}: released"))
