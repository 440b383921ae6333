"""``workflow``: a workflow's jobs, their states and edges, or its cancel; and the parents
and children that ``plunder job`` shows (see plunder.flows, docs/guide/workflows.md)."""

from __future__ import annotations

from typing import Any

import click
from rich.table import Table

from plunder.cli.output import emit_json, json_option, literal, out, user_errors
from plunder.cli.state import State, pass_state


def relatives(store: Any, job_id: int) -> dict[str, list[int]]:
    """The job's parents and children by id (through a gateway, those its key may see;
    none where the store has no edges)."""
    if not hasattr(store, "edge_list"):
        return {"parents": [], "children": []}
    links = store.edge_list([job_id])
    return {
        "parents": [link.parent_id for link in links if link.child_id == job_id],
        "children": [link.child_id for link in links if link.parent_id == job_id],
    }


@click.command("workflow")
@click.argument("job_id", type=int)
@click.option("--cancel", is_flag=True, help="Cancel its jobs that have not started.")
@json_option
@pass_state
def workflow(state: State, /, job_id: int, cancel: bool, as_json: bool) -> None:
    """Show the workflow JOB_ID belongs to: each job, its state and the jobs it waits for;
    with --cancel, cancel its jobs not started yet first (those running run on). Through
    a gateway (--db https://… --key …): the jobs that the key may see."""
    with user_errors():
        store = state.store()
        cancelled = store.flow_cancel(job_id) if cancel else None
        found = store.flow_get(job_id)
        if as_json:
            emit_json({"id": job_id, "jobs": found.jobs, "edges": found.links,
                       "cancelled": cancelled})  # fmt: skip
            return
        if cancelled is not None:
            out.print(literal(f"cancelled {len(cancelled)} jobs: {cancelled}"))
        table = Table(title=f"workflow of job {job_id}")
        for column in ("id", "task", "queue", "status", "attempt", "waits for"):
            table.add_column(column)
        for job in found.jobs:
            parents = ", ".join(map(str, found.parents(job.id))) or "-"
            table.add_row(
                str(job.id),
                literal(job.task),
                literal(job.queue),
                job.status.value,
                f"{job.attempt}/{job.max_attempts}",
                parents,
            )
        out.print(table)
