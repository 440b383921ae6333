"""``partitions``: the partitioned queues and who owns each partition, or a declaration
(see plunder.store.partitions and docs/guide/partitions.md)."""

from __future__ import annotations

import click

from plunder import errors
from plunder.cli.output import emit_json, json_option, literal, out, user_errors
from plunder.cli.state import State, pass_state


@click.command("partitions")
@click.argument("queue", required=False)
@click.argument("count", type=int, required=False)
@json_option
@pass_state
def partitions(state: State, /, queue: str | None, count: int | None, as_json: bool) -> None:
    """Show the partitioned queues, each partition with the worker that owns it; with QUEUE
    and COUNT, declare QUEUE partitioned in COUNT partitions first (the janitor assigns
    them within its interval)."""
    with user_errors():
        if state.remote:
            raise errors.ConfigError("partitions reads the database: give its URL (--db)")
        if (queue is None) != (count is None):
            raise errors.ConfigError("give both QUEUE and COUNT to declare, or neither to show")
        store = state.store()
        if queue is not None and count is not None:
            store.partition_declare(queue, count)
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
