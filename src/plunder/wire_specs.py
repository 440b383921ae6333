"""Jobs to enqueue as JSON, for the gateway's producers, and the edges of a workflow both
ways: enqueued with its jobs, and read back with them (plunder.wire has the rest)."""

from __future__ import annotations

from typing import Any

from plunder.graph import Edge, Link, WorkflowState
from plunder.model import JobSpec, Limit
from plunder.wire import MISSING, Fields, WireError, job_in, job_out


def spec_out(spec: JobSpec) -> dict[str, Any]:
    """Every field, but the newer ones only where set (a gateway older than a field refuses
    it)."""
    data = {name: getattr(spec, name) for name in JobSpec.__slots__}
    for name in ("partition_key", "ordered", "group", "affinity", "require", "cost"):
        value = data[name]
        if value is None or value is False or value == _SPEC_UNSET.get(name):
            del data[name]
    limit = spec.limit
    data["limit"] = None if limit is None else {"key": limit.key, "ceiling": limit.ceiling,
                                                "rate": limit.rate}  # fmt: skip
    return data


def _limit_in(data: Any) -> Limit | None:
    if data is None:
        return None
    f = Fields(data, "a job's limit")
    key, ceiling = f.take("key", str), f.take("ceiling", int, None)
    rate = f.take("rate", str, None)
    f.done()
    try:
        return Limit(key, ceiling, rate)
    except ValueError as exc:
        raise WireError(f"a job's limit: {exc}") from None


_SPEC_KINDS: dict[str, tuple[type, ...]] = {
    "task": (str,), "args": (list,), "kwargs": (dict,), "queue": (str,), "priority": (int,),
    "delay": (float,), "max_attempts": (int,), "timeout": (float,), "backoff_base": (float,),
    "backoff_cap": (float,), "retry_on_timeout": (bool,), "key": (str,),
    "retry_on_lost": (bool,), "expires_in": (float,), "partition_key": (str,),
    "ordered": (bool, str), "group": (str,),
    "affinity": (dict,), "require": (dict,), "cost": (int,),
}  # fmt: skip
_SPEC_UNSET = {"cost": 1}  # spec_out leaves a new field out at this value, or None/False
_SPEC_OPTIONAL = {
    "timeout", "key", "expires_in", "partition_key", "ordered", "group", "affinity", "require"
}  # fmt: skip


def spec_in(data: Any) -> JobSpec:
    f = Fields(data, "a job to enqueue")
    values: dict[str, Any] = {"task": f.take("task", str)}
    for name, kinds in _SPEC_KINDS.items():
        if name in f.data:
            values[name] = f.take(name, kinds, None if name in _SPEC_OPTIONAL else MISSING)
    values["limit"] = _limit_in(f.take("limit", object, None))
    f.done()
    return JobSpec(**values)


# -- workflows (plunder.flows): edges as enqueued, and as read back -------------------------
_ID_LIMIT = 2**63  # a job id is a signed 64-bit integer


def edge_out(edge: Edge) -> dict[str, Any]:
    return {"parent": edge.parent, "child": edge.child, "on_failure": edge.on_failure,
            "new": edge.new}  # fmt: skip


def edge_in(data: Any) -> Edge:
    """An edge of a workflow to enqueue: ``child`` an index in its jobs, ``parent`` one too
    (``new``, the default) or the id of a job enqueued before (``"new": false``)."""
    f = Fields(data, "an edge")
    edge = Edge(
        parent=f.take("parent", int),
        child=f.take("child", int),
        on_failure=f.take("on_failure", str, "skip"),
        new=f.take("new", bool, True),
    )
    f.done()
    if not (0 <= edge.parent < _ID_LIMIT and 0 <= edge.child < _ID_LIMIT):
        raise WireError("an edge: 'parent' and 'child' must be from 0 to 2**63 - 1")
    return edge


def link_out(link: Link) -> dict[str, Any]:
    return {"parent_id": link.parent_id, "child_id": link.child_id, "on_failure": link.on_failure}


def link_in(data: Any) -> Link:
    f = Fields(data, "an edge")
    link = Link(f.take("parent_id", int), f.take("child_id", int), f.take("on_failure", str))
    f.done()
    return link


def workflow_out(state: WorkflowState) -> dict[str, Any]:
    return {
        "id": state.id,
        "jobs": [job_out(job) for job in state.jobs],
        "edges": [link_out(link) for link in state.links],
    }


def workflow_in(data: Any) -> WorkflowState:
    f = Fields(data, "a workflow")
    state = WorkflowState(
        f.take("id", int), tuple(f.items("jobs", job_in)), tuple(f.items("edges", link_in))
    )
    f.done()
    return state
