"""An exchange over the wire (plunder.wire for the rest): the hot path of a remote
worker, hundreds of outcomes in and jobs out per request, so written as rows, not objects.

```
 request  {"done": [[job_id, attempt, result, logs], …],      completions (this session's)
           "failed": [failure, …], "released": [[job_id, attempt], …],
           "claim": {queues, tasks, limit, take_suspect, wait} | null}
 answer   {"completed" | "failed" | "released": {"accepted": [[job_id, attempt], …],
                                                 "stale": […]},
           "jobs": {"columns": [JobRecord's fields], "rows": [[…], …]}}
```

Every claim in an exchange is the session's own (the gateway refuses others), so rows
leave the session id out. The jobs of one claim mostly share their times (enqueued
together, claimed in one statement): each distinct time is written, and read, once per
answer. Readers are as strict as plunder.wire's: a row of the wrong shape is a WireError
naming it.
"""

from __future__ import annotations

import operator
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from plunder import wire
from plunder.model import (
    AckResult,
    Claim,
    Completion,
    Failure,
    JobRecord,
    build_claim,
    build_completion,
    build_job,
)
from plunder.protocol import ClaimRequest, Outcome, Release, Reply
from plunder.states import Status
from plunder.wire import MAX_LIST, Fields, WireError

COLUMNS = JobRecord.__slots__
_values = operator.attrgetter(*COLUMNS)
_TIMES = tuple(
    i
    for i, name in enumerate(COLUMNS)
    if name in ("run_at", "created_at", "started_at", "finished_at", "deadline_at", "expires_at")
)
_STATUS = COLUMNS.index("status")
_FAILED_SESSIONS = COLUMNS.index("failed_sessions")
_STATUSES = {s.value: s for s in Status}


# -- the request -------------------------------------------------------------------------
def exchange_out(outcomes: Sequence[Outcome], claim: ClaimRequest | None) -> dict[str, Any]:
    done: list[list[Any]] = []
    failed: list[dict[str, Any]] = []
    released: list[list[int]] = []
    for outcome in outcomes:
        if isinstance(outcome, Completion):
            if outcome.effects is not None:
                raise WireError("a completion with effects cannot cross the wire")
            c = outcome.claim
            done.append([c.job_id, c.attempt, outcome.result, list(outcome.logs)])
        elif isinstance(outcome, Failure):
            failed.append(wire.outcome_out(outcome))
        else:
            released.append([outcome.claim.job_id, outcome.claim.attempt])
    claim_data = wire.request_out(claim)
    return {"done": done, "failed": failed, "released": released, "claim": claim_data}


def exchange_in(data: Any, session_id: str) -> tuple[list[Outcome], ClaimRequest | None]:
    """An exchange's outcomes (their claims all of ``session_id``) and its claim."""
    fields = Fields(data, "an exchange")
    done = fields.take("done", list, [])
    failed = fields.items("failed", wire.outcome_in, [])
    released = fields.take("released", list, [])
    claim = wire.request_in(fields.take("claim", dict, None))
    fields.done()
    if len(done) + len(released) > MAX_LIST:
        raise WireError(f"an exchange: at most {MAX_LIST} outcomes")
    outcomes: list[Outcome] = [_completion(row, session_id) for row in done]
    for failure in failed:
        if failure.claim.session_id != session_id:
            raise WireError(f"job {failure.claim.job_id}'s claim names another session")
    outcomes += failed
    outcomes += [Release(_claim(row, session_id, 2, "a release")) for row in released]
    return outcomes, claim


def _claim(row: Any, session_id: str, width: int, what: str) -> Claim:
    if type(row) is not list or len(row) != width:
        raise WireError(f"{what} must be a list of {width}, not {row!r:.60}")
    job_id, attempt = row[0], row[1]
    if type(job_id) is not int or type(attempt) is not int:
        raise WireError(f"{what}: job id and attempt must be integers, not {row[:2]!r:.60}")
    return build_claim(job_id, attempt, session_id)


def _completion(row: Any, session_id: str) -> Completion:
    claim = _claim(row, session_id, 4, "a completion")
    logs = row[3]
    if type(logs) is not list or not all(type(line) is str for line in logs):
        raise WireError(f"job {claim.job_id}'s logs must be a list of strings")
    return build_completion(claim, row[2], tuple(logs), None, None)


# -- the answer --------------------------------------------------------------------------
def reply_out(reply: Reply) -> dict[str, Any]:
    rows = []
    # each distinct time written once (an equal time of another offset: again, as it is)
    times: dict[datetime, tuple[datetime, str]] = {}
    for job in reply.claimed:
        row = list(_values(job))
        for i in _TIMES:
            value = row[i]
            if value is None:
                continue
            seen = times.get(value)
            if seen is None or seen[0].tzinfo is not value.tzinfo:
                seen = times[value] = (value, value.isoformat())
            row[i] = seen[1]
        rows.append(row)  # its status (a StrEnum) and failed sessions (a tuple) JSON as they are
    return {
        "completed": _ack_out(reply.completed),
        "failed": _ack_out(reply.failed),
        "released": _ack_out(reply.released),
        "jobs": {"columns": list(COLUMNS), "rows": rows},
        "children": reply.children,
    }


def reply_in(data: Any, session_id: str) -> Reply:
    fields = Fields(data, "an exchange's answer")
    completed = _ack_in(fields.take("completed", dict), session_id)
    failed = _ack_in(fields.take("failed", dict), session_id)
    released = _ack_in(fields.take("released", dict), session_id)
    children = fields.take("children", bool, False)  # absent from an older gateway's
    jobs = Fields(fields.take("jobs", dict), "an exchange's jobs")
    columns, rows = jobs.strings("columns"), jobs.take("rows", list)
    jobs.done()
    fields.done()
    if columns != COLUMNS:
        raise WireError("an exchange's jobs come in columns this plunder does not know")
    times: dict[str, datetime] = {}  # each distinct time read once
    claimed = tuple(_job(row, times) for row in rows)
    return Reply(completed, failed, released, claimed, children)


def _job(row: Any, times: dict[str, datetime]) -> JobRecord:
    if type(row) is not list or len(row) != len(COLUMNS):
        raise WireError(f"a job row must be a list of {len(COLUMNS)} values")
    for i in _TIMES:
        text = row[i]
        if text is None:
            continue
        if type(text) is not str:
            raise WireError(f"a job's {COLUMNS[i]} must be a string, not {text!r:.40}")
        value = times.get(text)
        if value is None:
            value = times[text] = wire.time_in(text, f"a job's {COLUMNS[i]}")
        row[i] = value
    status = _STATUSES.get(row[_STATUS])
    if status is None:
        raise WireError(f"a job's status: unknown value {row[_STATUS]!r:.40}")
    row[_STATUS] = status
    row[_FAILED_SESSIONS] = tuple(row[_FAILED_SESSIONS] or ())
    return build_job(*row)


def _ack_out(ack: AckResult) -> dict[str, Any]:
    return {
        "accepted": [[c.job_id, c.attempt] for c in ack.accepted],
        "stale": [[c.job_id, c.attempt] for c in ack.stale],
    }


def _ack_in(data: Any, session_id: str) -> AckResult:
    fields = Fields(data, "an acknowledgement")
    accepted = fields.take("accepted", list)
    stale = fields.take("stale", list)
    fields.done()
    return AckResult(
        tuple(_claim(row, session_id, 2, "an accepted claim") for row in accepted),
        tuple(_claim(row, session_id, 2, "a stale claim") for row in stale),
    )
