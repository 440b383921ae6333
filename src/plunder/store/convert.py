"""Validation of inputs and the small row helpers the store's SQL operations share."""

from __future__ import annotations

import math
import operator
from collections.abc import Container, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from plunder import errors, payload
from plunder.model import Claim, Completion, ErrorInfo, JobSpec, SweepResult
from plunder.states import Outcome, Status

Row = Mapping[str, Any]
MAX_LOG_LINES = 200
MAX_LOG_LINE_CHARS = 2_000
MAX_LOG_BYTES = payload.MAX_PAYLOAD_BYTES // 2
INT32 = 2**31 - 1
INT64 = 2**63 - 1


MAX_SECONDS = 10 * 365 * 24 * 3600.0  # keeps now + interval inside every database's range


def finite(what: str, value: object) -> float:
    """A number of seconds, finite and at most ten years (larger intervals overflow
    PostgreSQL's timestamps and would break every claim of that queue)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"{what} must be a number of seconds, not {value!r}")
    number = float(value)
    if not math.isfinite(number):
        raise ValueError(f"{what} must be finite, not {value!r}")
    if abs(number) > MAX_SECONDS:
        raise ValueError(f"{what} must be at most {MAX_SECONDS:.0f} seconds (ten years)")
    return number


def positive(what: str, value: object) -> float:
    number = finite(what, value)
    if number <= 0:
        raise ValueError(f"{what} must be positive, not {value!r}")
    return number


def non_negative(what: str, value: object) -> float:
    number = finite(what, value)
    if number < 0:
        raise ValueError(f"{what} must not be negative, not {value!r}")
    return number


def integer(what: str, value: object, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise ValueError(f"{what} must be an integer from {low} to {high}, not {value!r}")
    return value


def job_id(value: object) -> int:
    return integer("job id", value, 1, INT64)


def status_name(value: str) -> str:
    try:
        return Status(value).value
    except ValueError:
        names = ", ".join(s.value for s in Status)
        raise errors.InvalidName(f"unknown job status {value!r}; one of: {names}") from None


_settings: dict[tuple[Any, ...], dict[str, Any]] = {}  # validated spec options, see below


def spec_settings(spec: JobSpec) -> dict[str, Any]:
    """The validated options of one spec (everything but its arguments and key). Jobs
    enqueued together mostly share them, so each combination is checked once; the cache key
    holds the types too, because ``True == 1`` and ``1 == 1.0``."""
    values = (
        spec.queue,
        spec.task,
        spec.priority,
        spec.max_attempts,
        spec.timeout,
        spec.backoff_base,
        spec.backoff_cap,
        spec.retry_on_timeout,
        spec.delay,
        spec.retry_on_lost,
        spec.expires_in,
    )
    kinds = tuple(map(type, values))
    cacheable = True
    try:
        found = _settings.get((values, kinds))
    except TypeError:  # an unhashable value, certainly invalid: let the checks say why
        found, cacheable = None, False
    if found is None:
        found = {
            "queue": payload.check_queue(spec.queue),
            "task": payload.check_task(spec.task),
            "priority": integer("priority", spec.priority, -INT32, INT32),
            "max_attempts": integer("max_attempts", spec.max_attempts, 1, 1000),
            "timeout": None if spec.timeout is None else positive("timeout", spec.timeout),
            "backoff_base": non_negative("backoff_base", spec.backoff_base),
            "backoff_cap": non_negative("backoff_cap", spec.backoff_cap),
            "retry_on_timeout": bool(spec.retry_on_timeout),
            "delay": non_negative("delay", spec.delay),
            "retry_on_lost": bool(spec.retry_on_lost),
            "expires_in": _expires_in(spec.expires_in, spec.delay),
        }
        if cacheable:
            if len(_settings) >= 1024:
                _settings.clear()
            _settings[values, kinds] = found
    return found


def _expires_in(value: object, delay: object) -> float | None:
    """A start-by deadline (seconds after the enqueue) that leaves the job time to start."""
    if value is None:
        return None
    seconds = positive("expires_in", value)
    if seconds <= non_negative("delay", delay):
        raise ValueError(
            f"expires_in ({value!r}s) must be longer than delay ({delay!r}s): "
            "the job would expire before it is due"
        )
    return seconds


_options_of = operator.attrgetter(
    "queue", "task", "priority", "max_attempts", "timeout",
    "backoff_base", "backoff_cap", "retry_on_timeout", "delay", "retry_on_lost", "expires_in",
)  # fmt: skip


@dataclass(slots=True)
class Inserts:
    """Specs validated and encoded for ``job_insert``: for each, its options (the dict
    ``spec_settings`` shares between specs that have the same ones) and its own values
    (args, kwargs, key). Ids must follow input order, so each run of specs with the same
    options inserts in one statement that binds them once; a batch with more runs than
    the store allows (``Engine.insert_runs``) inserts in one ``job_insert_mixed`` that binds
    each row's own."""

    settings: list[dict[str, Any]]
    rows: list[dict[str, Any]]
    runs: list[list[int]]
    query: str

    def statements(
        self, done: Container[int]
    ) -> Iterator[tuple[list[int], list[dict[str, Any]], dict[str, Any]]]:
        """For each run with inputs not yet done: those inputs, their rows, and the values
        the statement binds once."""
        for run in self.runs:
            todo = [i for i in run if i not in done]
            if todo:
                common = self.settings[todo[0]] if self.query == "job_insert" else {}
                yield todo, [self.rows[i] for i in todo], common


def inserts(specs: Sequence[JobSpec], runs_allowed: int) -> Inserts:
    """Validate and encode specs (see Inserts); raise before anything is written. Specs made
    from one task's options hold the very same option objects, so a spec like the one
    before it is not looked up again."""
    settings: list[dict[str, Any]] = []
    rows: list[dict[str, Any]] = []
    runs: list[list[int]] = []
    before: tuple[Any, ...] = ()
    options: dict[str, Any] = {}
    for i, spec in enumerate(specs):
        values = _options_of(spec)
        if not (before and all(map(operator.is_, values, before))):
            found = spec_settings(spec)
            if found is not options:
                runs.append([])
            options = found
        before = values
        settings.append(options)
        row = _own_values(spec)
        row["seq"] = i  # orders the insert: ids follow the input
        rows.append(row)
        runs[-1].append(i)
    if len(runs) <= runs_allowed:
        return Inserts(settings, rows, runs, "job_insert")
    merged = [{**options, **row} for options, row in zip(settings, rows, strict=True)]
    return Inserts(settings, merged, [list(range(len(rows)))], "job_insert_mixed")


def _own_values(spec: JobSpec) -> dict[str, Any]:
    args, kwargs = spec.args, spec.kwargs
    if type(args) is not list:
        if not isinstance(args, list | tuple):
            raise errors.PayloadError(
                f"args of {spec.task!r} must be a list, not {type(args).__name__}"
            )
        args = list(args)
    if not isinstance(kwargs, dict) or (kwargs and not all(isinstance(k, str) for k in kwargs)):
        raise errors.PayloadError(f"kwargs of {spec.task!r} must be a dict with string keys")
    key = spec.key
    return {
        "args": payload.encode(args, what="arguments", of=spec.task) if args else "[]",
        "kwargs": payload.encode(kwargs, what="keyword arguments", of=spec.task)
        if kwargs
        else "{}",
        "key": None if key is None else payload.check_key(key),
    }


def claims_of(rows: list[Row]) -> set[Claim]:
    """The claims a fenced batch update matched (it returns id, attempt, session_id)."""
    return {Claim(int(r["id"]), int(r["attempt"]), str(r["session_id"])) for r in rows}


def claim_row(claim: Claim) -> dict[str, Any]:
    return {"job_id": claim.job_id, "attempt": claim.attempt, "session_id": claim.session_id}


def completion_columns(items: Sequence[tuple[Completion, str]]) -> dict[str, list[Any]]:
    """job_complete's parameters, column by column, for completions with their results
    encoded."""
    return {
        "job_id": [c.claim.job_id for c, _ in items],
        "attempt": [c.claim.attempt for c, _ in items],
        "claim_session": [c.claim.session_id for c, _ in items],
        "result": [text for _, text in items],
        "logs": [logs_text(c.logs) for c, _ in items],
    }


def logs_text(lines: Sequence[str]) -> str:
    """Captured log lines, bounded: the last MAX_LOG_LINES lines, each cut to a length, with
    lone surrogates written as escapes, and earlier lines dropped until the JSON fits well
    inside the payload limit (a control character takes six bytes of JSON). Whatever a task
    logs, its run can be recorded."""
    if not lines:  # most runs log nothing
        return "[]"
    kept = [
        str(line)[:MAX_LOG_LINE_CHARS].encode("utf-8", "backslashreplace").decode("utf-8")
        for line in lines[-MAX_LOG_LINES:]
    ]
    dropped = len(lines) - len(kept)
    sizes = [len(payload.encode(line).encode("utf-8")) + 1 for line in kept]
    total = sum(sizes)
    while total > MAX_LOG_BYTES:
        total -= sizes.pop(0)
        kept.pop(0)
        dropped += 1
    if dropped:
        kept.insert(0, f"[{dropped} earlier lines dropped]")
    return payload.encode(kept, what="logs")


def run_end(
    job_id: int,
    attempt: int,
    session_id: str | None,
    *,
    outcome: Outcome,
    error: ErrorInfo | None,
    logs: Sequence[str] = (),
) -> dict[str, Any]:
    """The parameters of run_close: the history row of an attempt that ended (a job that
    never ran has no session, and gets no row)."""
    return {
        "job_id": int(job_id),
        "attempt": int(attempt),
        "session_id": session_id,
        "outcome": outcome.value,
        "error": None if error is None else payload.encode(error.as_dict(), what="error"),
        "logs": logs_text(logs),
    }


def sweep(rows: list[Row], sessions: Sequence[str] = ()) -> SweepResult:
    retried = tuple(int(r["id"]) for r in rows if r["status"] == Status.PENDING)
    finished = tuple(int(r["id"]) for r in rows if r["status"] != Status.PENDING)
    return SweepResult(retried=retried, finished=finished, sessions=tuple(sessions))
