"""An exchange's answer over the wire (plunder.wire_exchange): the claimed jobs come back
as they went, each distinct time written once, and a malformed row is a WireError."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest

from plunder import wire_exchange
from plunder.model import AckResult, Claim, JobRecord, build_job
from plunder.protocol import Reply
from plunder.states import Status
from plunder.wire import WireError

NOW = datetime(2026, 11, 28, 10, 0, 0, 123456, tzinfo=UTC)


def job(job_id: int, **changes: Any) -> JobRecord:
    values = {
        "id": job_id, "queue": "default", "task": "t.echo", "args": [job_id], "kwargs": {},
        "priority": 0, "status": Status.RUNNING, "attempt": 1, "max_attempts": 3,
        "timeout": None, "backoff_base": 1.0, "backoff_cap": 60.0, "retry_on_timeout": False,
        "key": None, "run_at": NOW - timedelta(seconds=1), "created_at": NOW - timedelta(seconds=1),
        "started_at": NOW, "finished_at": None, "deadline_at": NOW + timedelta(seconds=30),
        "session_id": "s1", "result": None, "error": None, "failed_sessions": (),
        "losses": 0, "retry_on_lost": True, "expires_at": None, "limit_key": "openai",
        "affinity": "{model=m}", "require": None, "cost": 1,
    }  # fmt: skip
    values.update(changes)
    return build_job(*(values[name] for name in wire_exchange.COLUMNS))


def over_the_wire(reply: Reply) -> Reply:
    text = json.dumps(wire_exchange.reply_out(reply), allow_nan=False)
    return wire_exchange.reply_in(json.loads(text), "s1")


def test_claimed_jobs_come_back_as_they_went() -> None:
    elsewhere = timezone(timedelta(hours=-5))
    jobs = (
        job(1),
        job(2, args=["two", {"n": 2}], priority=3, failed_sessions=("s0", "s9")),
        job(3, status=Status.RUNNING, run_at=NOW.astimezone(elsewhere), expires_at=NOW),
    )
    done = AckResult((Claim(7, 1, "s1"),), (Claim(8, 2, "s1"),))
    back = over_the_wire(Reply(completed=done, claimed=jobs))
    assert back.claimed == jobs and back.completed == done
    assert back.claimed[2].run_at.utcoffset() == timedelta(hours=-5)
    assert all(type(j.status) is Status for j in back.claimed)


def test_each_distinct_time_is_written_once_and_read_once() -> None:
    data = json.loads(json.dumps(wire_exchange.reply_out(Reply(claimed=(job(1), job(2))))))
    first = data["jobs"]["rows"][0]
    assert first[wire_exchange.COLUMNS.index("started_at")] == NOW.isoformat()
    back = wire_exchange.reply_in(data, "s1").claimed
    assert back[0].started_at is back[1].started_at  # one object for one time


@pytest.mark.parametrize(
    ("column", "value"),
    [("started_at", 17), ("created_at", "yesterday"), ("run_at", "2026-11-28T10:00:00"),
     ("status", "sleeping"), ("deadline_at", ["2026-11-28T10:00:00+00:00"])],
)  # fmt: skip
def test_a_malformed_job_row_is_a_wire_error(column: str, value: Any) -> None:
    data = json.loads(json.dumps(wire_exchange.reply_out(Reply(claimed=(job(1),)))))
    data["jobs"]["rows"][0][wire_exchange.COLUMNS.index(column)] = value
    with pytest.raises(WireError):
        wire_exchange.reply_in(data, "s1")
