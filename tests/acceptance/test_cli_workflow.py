"""``plunder job`` shows a workflow job's parents and children; ``plunder workflow`` shows
its jobs and states, and cancels what has not started; an unknown job is one line."""

from __future__ import annotations

import json

from plunder.graph import Edge
from plunder.model import JobSpec
from plunder.store import Store
from tests.acceptance.test_cli import one_line_error, plunder


def test_job_and_workflow_show_the_graph_and_cancel_it(store_url: str, store: Store) -> None:
    edges = [Edge(0, 1), Edge(0, 2), Edge(1, 3), Edge(2, 3)]
    a, b, c, d = store.flow_enqueue([JobSpec("t", [i]) for i in range(4)], edges)
    shown = json.loads(plunder(store_url, "job", str(b), "--json").stdout)
    assert (shown["parents"], shown["children"]) == ([a], [d])
    text = plunder(store_url, "job", str(d)).stdout
    assert f"parents  {b}, {c}" in text
    table = plunder(store_url, "workflow", str(c))
    assert table.exit_code == 0 and "waiting" in table.stdout and f"{b}, {c}" in table.stdout
    cancelled = json.loads(plunder(store_url, "workflow", str(a), "--cancel", "--json").stdout)
    assert cancelled["cancelled"] == [a, b, c, d]
    assert {job["status"] for job in cancelled["jobs"]} == {"cancelled"}
    assert [(e["parent_id"], e["child_id"]) for e in cancelled["edges"]] == [
        (a, b), (a, c), (b, d), (c, d),
    ]  # fmt: skip
    assert "no job 999999" in one_line_error(plunder(store_url, "workflow", "999999"))
