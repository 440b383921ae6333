"""The commands about the database as a whole: ``init`` makes its tables, ``status`` shows
its queues, live workers, the janitor's holder, the work no live worker can run and
the limits."""

from __future__ import annotations

import click
from rich import box
from rich.table import Table

from plunder.cli.limits import limits_table
from plunder.cli.output import emit_json, json_option, literal, out, plain, user_errors
from plunder.cli.state import State, pass_state
from plunder.model import QueueStats, Session, Unrunnable
from plunder.states import Status


@click.command()
@pass_state
def init(state: State) -> None:
    """Create or migrate plunder's tables."""
    with user_errors():
        state.direct("init")
        store = state.store(migrate=True)
        click.echo(f"{store.url}: plunder schema version {store.schema_check()}")


@click.command()
@json_option
@pass_state
def status(state: State, as_json: bool) -> None:
    """Queues, live workers, the janitor's holder, and the pending jobs no live worker
    can run (none serves both their queue and their task), by task."""
    from plunder.janitor import LEASE_NAME

    with user_errors():
        state.direct("status")
        store = state.store()
        stats, sessions, lease, unrunnable = (
            store.queue_stats(),
            store.session_list(),
            store.lease_get(LEASE_NAME),
            store.job_unrunnable(),
        )
        listed = getattr(store, "limit_list", None)  # not through a gateway
        found = [] if listed is None else listed()
        if as_json:
            emit_json(
                {"queues": stats, "workers": sessions, "janitor": lease, "unrunnable": unrunnable,
                 "limits": [{**plain(s), "reason": s.reason} for s in found]}
            )  # fmt: skip
            return
        out.print(_queues_table(stats))
        out.print(_workers_table(sessions))
        holder = "none" if lease is None else f"{lease.holder} (term {lease.term})"
        out.print(literal(f"janitor lease: {holder}"))
        if unrunnable:
            out.print(_unrunnable_table(unrunnable))
        if found:
            out.print(limits_table(found))


def _queues_table(stats: list[QueueStats]) -> Table:
    # no vertical rules, and headers that may wrap: a queue's row fits 80 columns
    table = Table(
        title="queues",
        box=box.SIMPLE_HEAD,
        show_edge=False,
        pad_edge=False,
        collapse_padding=True,
    )
    # a workflow's statuses only where some queue has jobs in them: the row fits 80 columns
    rare = {Status.WAITING.value, Status.SKIPPED.value}
    statuses = [
        status.value
        for status in Status
        if status.value not in rare or any(s.counts.get(status.value) for s in stats)
    ]
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
    return table


def _workers_table(sessions: list[Session]) -> Table:
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
    return workers


def _unrunnable_table(rows: list[Unrunnable]) -> Table:
    table = Table(title="pending jobs no live worker can run")
    for column in ("task", "queue", "requires", "pending"):
        table.add_column(column, justify="right" if column == "pending" else "left")
    for row in rows:
        requires = row.require.strip("{}") if row.require else ""
        if row.cost > 1:  # more slots than any live worker of theirs has
            requires = ", ".join(filter(None, [requires, f"{row.cost} slots"]))
        table.add_row(literal(row.task), literal(row.queue), literal(requires), str(row.pending))
    return table
