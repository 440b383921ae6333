"""A workflow's edges and its state as JSON (plunder.wire_specs): what one side writes the
other reads back equal, and what does not follow the format is refused naming why."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest

from plunder import wire_specs
from plunder.graph import Edge, Link, WorkflowState
from plunder.model import JobRecord
from plunder.states import Status
from plunder.wire import WireError


def _job(job_id: int) -> JobRecord:
    now = datetime(2026, 11, 29, 9, 0, tzinfo=UTC)
    values = dict.fromkeys(JobRecord.__slots__)
    values.update(id=job_id, queue="llm", task="t", args=[job_id], kwargs={}, priority=0,
                  status=Status.WAITING, attempt=0, max_attempts=1, run_at=now, created_at=now,
                  failed_sessions=())  # fmt: skip
    return JobRecord(**values)  # type: ignore[arg-type]


def test_edges_and_a_workflow_cross_as_they_were() -> None:
    for edge in (Edge(0, 1), Edge(7, 0, "run", new=False), Edge(1, 2, "fail")):
        sent = json.loads(json.dumps(wire_specs.edge_out(edge)))
        assert wire_specs.edge_in(sent) == edge
    assert wire_specs.edge_in({"parent": 0, "child": 1}) == Edge(0, 1, "skip", True)
    state = WorkflowState(1, (_job(1), _job(2)), (Link(1, 2, "skip"),))
    sent = json.loads(json.dumps(wire_specs.workflow_out(state)))
    assert wire_specs.workflow_in(sent) == state


@pytest.mark.parametrize(
    ("data", "why"),
    [
        ({"parent": 0}, "'child' is missing"),
        ({"parent": 0, "child": 1, "when": 2}, "unknown field 'when'"),
        ({"parent": "0", "child": 1}, "'parent' must be an integer"),
        ({"parent": 0.5, "child": 1}, "'parent' must be an integer"),
        ({"parent": 0, "child": True}, "not a boolean"),
        ({"parent": 0, "child": 1, "new": 1}, "'new' must be a boolean"),
        ({"parent": -1, "child": 1}, "from 0 to 2**63 - 1"),
        ({"parent": 2**63, "child": 1, "new": False}, "from 0 to 2**63 - 1"),
        ([0, 1], "must be a JSON object"),
    ],
)
def test_a_bad_edge_is_refused_naming_why(data: object, why: str) -> None:
    with pytest.raises(WireError) as refused:
        wire_specs.edge_in(data)
    assert why in str(refused.value)
