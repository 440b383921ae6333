"""Cron expressions in a time zone (plunder.cron): clear errors, daylight-saving changes in
Europe/Paris, and which ticks each catch-up policy enqueues."""

from __future__ import annotations

import itertools
from datetime import UTC, datetime, timedelta

import pytest

from plunder import errors
from plunder.cron import Cron, ScheduleSpec, plan

T0 = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)


@pytest.mark.parametrize(
    ("expression", "timezone", "message"),
    [
        ("* * * *", "UTC", "it has 4 fields; use 5"),
        ("* * * * * * *", "UTC", "it has 7 fields"),
        ("61 * * * *", "UTC", "invalid cron expression '61 * * * *'"),
        ("*/0 * * * *", "UTC", "invalid cron expression"),
        ("* * * * mon-xyz", "UTC", "invalid cron expression"),
        ("0 0 31 2 *", "UTC", "invalid cron expression '0 0 31 2 *'"),
        ("* * * * *", "Mars/Olympus", "unknown time zone 'Mars/Olympus'"),
        ("* * * * *", "", "invalid time zone ''"),
    ],
)
def test_a_bad_cron_or_zone_is_named(expression: str, timezone: str, message: str) -> None:
    with pytest.raises(errors.InvalidSchedule) as raised:
        Cron(expression, timezone)
    assert message in str(raised.value)


def test_a_bad_spec_is_named() -> None:
    good = {"name": "n", "task": "t", "cron": "* * * * *"}
    with pytest.raises(errors.InvalidSchedule, match="catch_up must be one of all, latest, none"):
        ScheduleSpec(**good, catch_up="some").checked()  # type: ignore[arg-type]
    with pytest.raises(errors.InvalidSchedule, match="invalid schedule name 'a b'"):
        ScheduleSpec(**{**good, "name": "a b"}).checked()  # type: ignore[arg-type]
    with pytest.raises(errors.InvalidSchedule, match="args must be a list, not dict"):
        ScheduleSpec(**good, args={"a": 1}).checked()  # type: ignore[arg-type]
    with pytest.raises(errors.PayloadError):
        ScheduleSpec(**good, args=[object()]).checked()  # type: ignore[arg-type]


def paris(*fields: int) -> datetime:
    from zoneinfo import ZoneInfo

    return datetime(*fields, tzinfo=ZoneInfo("Europe/Paris")).astimezone(UTC)


def ticks(cron: Cron, start: datetime, n: int) -> list[datetime]:
    out: list[datetime] = []
    at: datetime | None = start
    for _ in range(n):
        assert at is not None
        at = cron.after(at)
        assert at is not None
        out.append(at)
    return out


def test_a_daily_tick_in_the_skipped_hour_runs_at_three() -> None:
    """29 March 2026, 02:00 Paris does not exist: the 02:30 job runs at 03:00 that day."""
    cron = Cron("30 2 * * *", "Europe/Paris")
    got = ticks(cron, paris(2026, 3, 28, 12), 3)
    assert got == [paris(2026, 3, 29, 3, 0), paris(2026, 3, 30, 2, 30), paris(2026, 3, 31, 2, 30)]
    assert got[0] - paris(2026, 3, 28, 2, 30) == timedelta(hours=23, minutes=30)


def test_a_daily_tick_in_the_repeated_hour_runs_once() -> None:
    """25 October 2026, 02:30 Paris happens twice: the daily job runs at the first only."""
    cron = Cron("30 2 * * *", "Europe/Paris")
    got = ticks(cron, paris(2026, 10, 24, 12), 2)
    assert got[0] == datetime(2026, 10, 25, 0, 30, tzinfo=UTC)  # 02:30 CEST (+02:00)
    assert got[1] - got[0] == timedelta(hours=25)


def test_an_hourly_tick_follows_real_hours_across_both_changes() -> None:
    """'0 * * * *' ticks every real hour: 23 ticks on the short day, 25 on the long one."""
    cron = Cron("0 * * * *", "Europe/Paris")
    spring = ticks(cron, paris(2026, 3, 29, 0) - timedelta(seconds=1), 30)
    assert len([t for t in spring if t < paris(2026, 3, 30, 0)]) == 23
    autumn = ticks(cron, paris(2026, 10, 25, 0) - timedelta(seconds=1), 30)
    assert len([t for t in autumn if t < paris(2026, 10, 26, 0)]) == 25
    assert all(b - a == timedelta(hours=1) for a, b in itertools.pairwise(autumn))


def test_at_or_before_includes_the_instant() -> None:
    cron = Cron("* * * * * *")
    assert cron.at_or_before(T0) == T0
    assert cron.at_or_before(T0 + timedelta(microseconds=500)) == T0
    assert cron.after(T0) == T0 + timedelta(seconds=1)
    assert cron.after(T0 + timedelta(microseconds=500)) == T0 + timedelta(seconds=1)


EVERY_MINUTE = Cron("* * * * *")


@pytest.mark.parametrize(
    ("catch_up", "expected"),
    [
        # down from 12:01 to 13:00:30: 60 ticks due, of which 12:00:... within the minute
        ("all", [T0 + timedelta(minutes=m) for m in range(1, 61)]),
        ("latest", [T0 + timedelta(minutes=59), T0 + timedelta(minutes=60)]),
        ("none", [T0 + timedelta(minutes=60)]),
    ],
)
def test_catch_up_policies(catch_up: str, expected: list[datetime]) -> None:
    now = T0 + timedelta(minutes=60, seconds=30)
    got, after = plan(EVERY_MINUTE, catch_up, T0 + timedelta(minutes=1), now, grace=60)
    assert got == expected
    assert after == T0 + timedelta(minutes=61)


@pytest.mark.parametrize("catch_up", ["all", "latest", "none"])
def test_late_within_grace_is_not_missed(catch_up: str) -> None:
    """A takeover that delays ticks by less than the grace enqueues every one of them."""
    every_second = Cron("* * * * * *")
    now = T0 + timedelta(seconds=9.5)
    got, after = plan(every_second, catch_up, T0 + timedelta(seconds=1), now, grace=10)
    assert got == [T0 + timedelta(seconds=s) for s in range(1, 10)]
    assert after == T0 + timedelta(seconds=10)


def test_all_is_bounded_per_pass_and_resumes() -> None:
    now = T0 + timedelta(minutes=100)
    got, after = plan(EVERY_MINUTE, "all", T0, now, limit=30)
    assert got == [T0 + timedelta(minutes=m) for m in range(30)]
    assert after == T0 + timedelta(minutes=30)


def test_nothing_due_before_next() -> None:
    assert plan(EVERY_MINUTE, "all", T0, T0 - timedelta(seconds=1)) == ([], T0)
