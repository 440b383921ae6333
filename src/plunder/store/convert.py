"""Validation of inputs and the small row helpers the store's SQL operations share."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from plunder import errors, payload
from plunder.model import Claim, Completion, ErrorInfo, SweepResult
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
