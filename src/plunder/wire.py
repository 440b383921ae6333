"""The worker protocol's values and the producer's records as JSON, for the gateway
(plunder.gateway) and its clients (plunder.store.http).

Every reader is strict: a field of the wrong type, a field missing, or one it does not
know is a ``WireError`` naming it, so that a bad request is refused whole before anything
is written. Times are ISO 8601 text with their offset (the database's clock).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from typing import Any, TypeVar

from plunder import errors
from plunder.graph import ParentResult
from plunder.model import (
    Claim,
    Completion,
    ErrorInfo,
    Failure,
    Heartbeat,
    JobRecord,
    Partitioning,
    Run,
    Session,
    StreamEvent,
    TaskInfo,
)
from plunder.protocol import Beat, ClaimRequest, Hello, Outcome, Release
from plunder.states import Outcome as RunOutcome
from plunder.states import Status

T = TypeVar("T")
MISSING: Any = object()
MAX_LIST = 100_000  # items in one list of a request


class WireError(errors.PlunderError, ValueError):
    """A value that does not follow the wire format."""


class Fields:
    """A JSON object read field by field; ``done()`` refuses the fields left unread."""

    def __init__(self, data: Any, what: str) -> None:
        if not isinstance(data, dict):
            raise WireError(f"{what} must be a JSON object, not {_kind(data)}")
        self.data: dict[str, Any] = dict(data)
        self.what = what

    def take(self, name: str, kinds: type | tuple[type, ...], default: Any = MISSING) -> Any:
        if name not in self.data:
            if default is MISSING:
                raise WireError(f"{self.what}: the field {name!r} is missing")
            return default
        value = self.data.pop(name)
        if value is None and default is None:
            return None
        if kinds is object:  # any JSON value (a result, a stream event's data)
            return value
        if isinstance(value, bool) and bool not in _tuple(kinds):
            raise WireError(f"{self.what}: {name!r} must be {_names(kinds)}, not a boolean")
        if int in _tuple(kinds) and float not in _tuple(kinds) and isinstance(value, float):
            raise WireError(f"{self.what}: {name!r} must be an integer")
        if float in _tuple(kinds) and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
        if not isinstance(value, kinds):
            raise WireError(f"{self.what}: {name!r} must be {_names(kinds)}, not {_kind(value)}")
        if isinstance(value, float) and not math.isfinite(value):
            raise WireError(f"{self.what}: {name!r} must be a finite number")
        return value

    def strings(self, name: str, default: Any = MISSING) -> tuple[str, ...]:
        values = self.take(name, list, default)
        if values is None or values is default:
            return values  # type: ignore[return-value]
        return tuple(_each(values, lambda v: _string(v, f"{self.what}: {name!r}"), self.what))

    def items(self, name: str, read: Callable[[Any], T], default: Any = MISSING) -> list[T]:
        values = self.take(name, list, default)
        if values is default:
            return values  # type: ignore[no-any-return]
        return _each(values, read, self.what)

    def time(self, name: str) -> datetime | None:
        text = self.take(name, str, None)
        return None if text is None else time_in(text, f"{self.what}: {name!r}")

    def done(self) -> None:
        if self.data:
            names = ", ".join(repr(n) for n in sorted(self.data))
            raise WireError(f"{self.what}: unknown field {names}")


def _tuple(kinds: type | tuple[type, ...]) -> tuple[type, ...]:
    return kinds if isinstance(kinds, tuple) else (kinds,)


def _names(kinds: type | tuple[type, ...]) -> str:
    words = {str: "a string", int: "an integer", float: "a number", bool: "a boolean",
             list: "a list", dict: "an object"}  # fmt: skip
    return " or ".join(words.get(k, k.__name__) for k in _tuple(kinds))


_KINDS = {type(None): "null", bool: "a boolean", int: "an integer", float: "a number",
          str: "a string", list: "a list", dict: "an object"}  # fmt: skip


def _kind(value: Any) -> str:
    return _KINDS.get(type(value), "a value")


def _string(value: Any, what: str) -> str:
    if not isinstance(value, str):
        raise WireError(f"{what} must hold strings, not {_kind(value)}")
    return value


def _each(values: list[Any], read: Callable[[Any], T], what: str) -> list[T]:
    if len(values) > MAX_LIST:
        raise WireError(f"{what}: at most {MAX_LIST} items in a list")
    return [read(v) for v in values]


def time_out(value: datetime | None) -> str | None:
    return None if value is None else value.isoformat()


def time_in(text: str, what: str = "a time") -> datetime:
    try:
        value = datetime.fromisoformat(text)
    except ValueError:
        raise WireError(f"{what} is not an ISO 8601 time: {text[:40]!r}") from None
    if value.tzinfo is None:
        raise WireError(f"{what} must name its offset from UTC")
    return value


# -- the worker protocol ---------------------------------------------------------------------
def claim_out(claim: Claim) -> dict[str, Any]:
    return {"job_id": claim.job_id, "attempt": claim.attempt, "session_id": claim.session_id}


def claim_in(data: Any) -> Claim:
    f = Fields(data, "a claim")
    claim = Claim(f.take("job_id", int), f.take("attempt", int), f.take("session_id", str))
    f.done()
    return claim


def parents_out(parents: Sequence[ParentResult]) -> dict[str, Any]:
    return {"parents": [{"job_id": p.job_id, "status": p.status, "result": p.result}
                        for p in parents]}  # fmt: skip


def parents_in(data: Any) -> tuple[ParentResult, ...]:
    return tuple(Fields(data, "parents' results").items("parents", _parent_in))


def _parent_in(data: Any) -> ParentResult:
    f = Fields(data, "a parent's result")
    parent = ParentResult(f.take("job_id", int), f.take("status", str), f.take("result", object))
    f.done()
    return parent


def task_info_out(info: TaskInfo) -> dict[str, Any]:
    return {"name": info.name, "queue": info.queue, "pool": info.pool, "options": info.options}


def task_info_in(data: Any) -> TaskInfo:
    f = Fields(data, "a task")
    name, queue, pool = f.take("name", str), f.take("queue", str), f.take("pool", str)
    options = f.take("options", dict)
    session_id = f.take("session_id", str, None)
    published_at = f.time("published_at")
    f.done()
    return TaskInfo(name, queue, pool, options, session_id, published_at)


def hello_out(hello: Hello) -> dict[str, Any]:
    return {
        "name": hello.name,
        "host": hello.host,
        "pid": hello.pid,
        "queues": list(hello.queues),
        "tasks": [task_info_out(t) for t in hello.tasks],
        "expiry": hello.expiry,
        "free_slots": hello.free_slots,
        **({"labels": list(hello.labels)} if hello.labels else {}),  # an older gateway refuses it
        **({"slots": hello.slots} if hello.slots is not None else {}),
    }


def hello_in(data: Any) -> Hello:
    f = Fields(data, "a session")
    hello = Hello(
        name=f.take("name", str),
        host=f.take("host", str),
        pid=f.take("pid", int),
        queues=f.strings("queues"),
        tasks=tuple(f.items("tasks", task_info_in)),
        expiry=f.take("expiry", float),
        free_slots=f.take("free_slots", int, 0),
        labels=f.strings("labels", ()),
        slots=f.take("slots", int, None),
    )
    f.done()
    return hello


def session_out(session: Session) -> dict[str, Any]:
    return {
        "id": session.id,
        "name": session.name,
        "host": session.host,
        "pid": session.pid,
        "queues": list(session.queues),
        "expiry": session.expiry,
        "started_at": time_out(session.started_at),
        "heartbeat_at": time_out(session.heartbeat_at),
        "expires_at": time_out(session.expires_at),
        "tasks": list(session.tasks),
        "free_slots": session.free_slots,
    }


def session_in(data: Any) -> Session:
    f = Fields(data, "a session")
    session = Session(
        id=f.take("id", str),
        name=f.take("name", str),
        host=f.take("host", str),
        pid=f.take("pid", int),
        queues=f.strings("queues"),
        expiry=f.take("expiry", float),
        started_at=_required(f.time("started_at"), "started_at"),
        heartbeat_at=_required(f.time("heartbeat_at"), "heartbeat_at"),
        expires_at=_required(f.time("expires_at"), "expires_at"),
        tasks=f.strings("tasks", ()),
        free_slots=f.take("free_slots", int, 0),
    )
    f.done()
    return session


def _required(value: T | None, name: str) -> T:
    if value is None:
        raise WireError(f"the field {name!r} is missing")
    return value


def beat_out(beat: Beat) -> dict[str, Any]:
    labels = {} if beat.labels is None else {"labels": list(beat.labels)}  # older: refused
    return {"running": [claim_out(c) for c in beat.running], "free_slots": beat.free_slots} | labels


def beat_in(data: Any, session_id: str) -> Beat:
    f = Fields(data, "a heartbeat")
    running = tuple(f.items("running", claim_in, []))
    beat = Beat(session_id, running, f.take("free_slots", int, None), f.strings("labels", None))
    f.done()
    return beat


def heartbeat_out(beat: Heartbeat) -> dict[str, Any]:
    """``queues`` only where the answer has them: a worker older than the field refuses
    it (the gateway gives them to a worker that asks)."""
    data: dict[str, Any] = {
        "alive": beat.alive,
        "expires_at": time_out(beat.expires_at),
        "stop": [claim_out(c) for c in beat.stop],
        "unknown": [claim_out(c) for c in beat.unknown],
    }
    if beat.queues is not None:
        data["queues"] = list(beat.queues)
    if beat.partitions:  # only where a queue is partitioned: older workers refuse the field
        data["partitions"] = [
            {"queue": p.queue, "partitions": p.partitions, "generation": p.generation,
             "owned": list(p.owned)}
            for p in beat.partitions
        ]  # fmt: skip
    return data


def partitioning_in(data: Any) -> Partitioning:
    f = Fields(data, "a partitioned queue")
    found = Partitioning(
        queue=f.take("queue", str),
        partitions=f.take("partitions", int),
        generation=f.take("generation", int),
        owned=tuple(f.take("owned", list)),
    )
    f.done()
    if not all(isinstance(p, int) for p in found.owned):
        raise WireError("a partitioned queue: its owned partitions are integers")
    return found


def heartbeat_in(data: Any) -> Heartbeat:
    f = Fields(data, "a heartbeat's answer")
    queues = f.strings("queues", None)  # None from a gateway older than the field
    beat = Heartbeat(
        alive=f.take("alive", bool),
        expires_at=f.time("expires_at"),
        stop=tuple(f.items("stop", claim_in)),
        unknown=tuple(f.items("unknown", claim_in)),
        queues=None if queues is None else tuple(queues),
        partitions=tuple(f.items("partitions", partitioning_in, ())) or None,
    )
    f.done()
    return beat


def request_out(request: ClaimRequest | None) -> dict[str, Any] | None:
    if request is None:
        return None
    return {
        "queues": list(request.queues),
        "tasks": list(request.tasks),
        "limit": request.limit,
        "take_suspect": request.take_suspect,
        "wait": request.wait,
    }


def request_in(data: Any) -> ClaimRequest | None:
    if data is None:
        return None
    f = Fields(data, "a claim request")
    queues, tasks = f.strings("queues"), f.strings("tasks")
    limit, suspect = f.take("limit", int), f.take("take_suspect", bool, True)
    wait = f.take("wait", float, 0.0)
    f.done()
    try:
        return ClaimRequest(queues, tasks, limit, suspect, wait)
    except ValueError as exc:
        raise WireError(str(exc)) from None


def outcome_out(outcome: Outcome) -> dict[str, Any]:
    if isinstance(outcome, Completion):
        if outcome.effects is not None:
            raise WireError("a completion with effects cannot cross the wire")
        return {
            "kind": "completion",
            "claim": claim_out(outcome.claim),
            "result": outcome.result,
            "logs": list(outcome.logs),
        }
    if isinstance(outcome, Failure):
        return {
            "kind": "failure",
            "claim": claim_out(outcome.claim),
            "error": outcome.error.as_dict(),
            "retry_delay": outcome.retry_delay,
            "logs": list(outcome.logs),
            "outcome": outcome.outcome.value,
        }
    return {"kind": "release", "claim": claim_out(outcome.claim)}


def outcome_in(data: Any) -> Outcome:
    f = Fields(data, "an outcome")
    kind = f.take("kind", str)
    claim = claim_in(f.take("claim", dict))
    result: Outcome
    if kind == "completion":
        result = Completion(claim, f.take("result", object, None), f.strings("logs", ()))
    elif kind == "failure":
        error = Fields(f.take("error", dict), "an error")
        info = ErrorInfo(error.take("type", str), error.take("message", str),
                         error.take("traceback", str, ""))  # fmt: skip
        error.done()
        delay = f.take("retry_delay", float, None)
        if delay is not None and delay < 0:
            raise WireError("an outcome: 'retry_delay' must not be negative")
        outcome = _enum(RunOutcome, f.take("outcome", str, "failed"), "an outcome's 'outcome'")
        result = Failure(claim, info, delay, f.strings("logs", ()), outcome)
    elif kind == "release":
        result = Release(claim)
    else:
        raise WireError(f"an outcome's kind must be completion, failure or release, not {kind!r}")
    f.done()
    return result


def _enum(kind: Callable[[str], T], value: str, what: str) -> T:
    try:
        return kind(value)
    except ValueError:
        raise WireError(f"{what}: unknown value {value!r}") from None


# -- the producer's records --------------------------------------------------------------------
_JOB_TIMES = ("run_at", "created_at", "started_at", "finished_at", "deadline_at", "expires_at")


def job_out(job: JobRecord) -> dict[str, Any]:
    data: dict[str, Any] = {name: getattr(job, name) for name in JobRecord.__slots__}
    data["status"] = job.status.value
    data["failed_sessions"] = list(job.failed_sessions)
    for name in _JOB_TIMES:
        data[name] = time_out(data[name])
    return data


def job_in(data: Any) -> JobRecord:
    if not isinstance(data, Mapping):
        raise WireError(f"a job must be a JSON object, not {_kind(data)}")
    values = dict(data)
    missing = set(JobRecord.__slots__) - values.keys()
    extra = values.keys() - set(JobRecord.__slots__)
    if missing or extra:
        raise WireError(f"a job: fields missing {sorted(missing)} or unknown {sorted(extra)}")
    values["status"] = _enum(Status, values["status"], "a job's status")
    values["failed_sessions"] = tuple(values["failed_sessions"] or ())
    for name in _JOB_TIMES:
        if values[name] is not None:
            values[name] = time_in(values[name], f"a job's {name}")
    return JobRecord(**values)


def run_out(run: Run) -> dict[str, Any]:
    data: dict[str, Any] = {name: getattr(run, name) for name in Run.__slots__}
    data["started_at"] = time_out(run.started_at)
    data["finished_at"] = time_out(run.finished_at)
    data["outcome"] = run.outcome.value if run.outcome else None
    data["logs"] = list(run.logs)
    return data


def run_in(data: Any) -> Run:
    values = dict(Fields(data, "a run").data)
    if set(values) != set(Run.__slots__):
        raise WireError("a run: its fields differ from a run's")
    values["started_at"] = time_in(values["started_at"])
    values["finished_at"] = (
        None if values["finished_at"] is None else time_in(values["finished_at"])
    )
    outcome = values["outcome"]
    values["outcome"] = None if outcome is None else _enum(RunOutcome, outcome, "a run's outcome")
    values["logs"] = tuple(values["logs"])
    return Run(**values)


def event_out(event: StreamEvent) -> dict[str, Any]:
    return {
        "job_id": event.job_id,
        "attempt": event.attempt,
        "seq": event.seq,
        "kind": event.kind,
        "data": event.data,
        "created_at": time_out(event.created_at),
    }


def event_in(data: Any) -> StreamEvent:
    f = Fields(data, "a stream event")
    event = StreamEvent(
        job_id=f.take("job_id", int),
        attempt=f.take("attempt", int),
        seq=f.take("seq", int),
        kind=f.take("kind", str),
        data=f.take("data", object, None),
        created_at=_required(f.time("created_at"), "created_at"),
    )
    f.done()
    return event
