"""Jobs to enqueue as JSON, for the gateway's producers (plunder.wire has the rest)."""

from __future__ import annotations

from typing import Any

from plunder.model import JobSpec, Limit
from plunder.wire import MISSING, Fields, WireError


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
