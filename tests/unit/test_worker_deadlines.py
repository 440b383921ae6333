"""The worker's deadlines, all derived from the settings in one value (config.WorkerDeadlines)."""

from __future__ import annotations

import dataclasses

import pytest

from plunder.config import Settings, WorkerDeadlines


def test_the_default_deadlines_follow_from_a_five_second_expiry() -> None:
    deadlines = WorkerDeadlines.of(Settings())
    assert deadlines == WorkerDeadlines(
        heartbeat_interval=1.0,
        renewal_window=1.0,
        heartbeat_timeout=2.5,
        session_expiry=5.0,
        watch_period=0.5,
        slow_after=2.0,
        call_timeout=10.0,
        idle_timeout=10.0,
        connect_timeout=5.0,
        janitor_timeout=5.0,
    )


def test_a_short_expiry_shortens_every_deadline_but_the_drivers_connect_minimum() -> None:
    settings = Settings(heartbeat_interval=0.2, session_expiry=1.5, janitor_interval=1.0)
    deadlines = WorkerDeadlines.of(settings)
    assert deadlines.heartbeat_interval == deadlines.renewal_window == 0.2
    assert deadlines.watch_period == pytest.approx(0.1)
    assert deadlines.slow_after == pytest.approx(0.4)
    assert deadlines.heartbeat_timeout == 0.75
    assert deadlines.session_expiry == 1.5
    assert deadlines.call_timeout == deadlines.idle_timeout == 3.0
    assert deadlines.connect_timeout == 2.0  # psycopg's connect_timeout is at least 2 s
    assert deadlines.janitor_timeout == settings.lease_ttl == 2.0  # two janitor intervals


def test_the_deadlines_are_ordered_as_the_session_protocol_needs() -> None:
    """A heartbeat is cut with time left to renew before the expiry; the watchdog gives
    up on the session before any other call is cut by its own deadline."""
    for interval, expiry in [(1.0, 5.0), (0.1, 0.3), (2.0, 60.0)]:
        deadlines = WorkerDeadlines.of(Settings(heartbeat_interval=interval, session_expiry=expiry))
        assert deadlines.watch_period < deadlines.heartbeat_interval
        assert deadlines.heartbeat_timeout < deadlines.session_expiry
        assert deadlines.session_expiry < deadlines.call_timeout
        assert deadlines.session_expiry < deadlines.idle_timeout


def test_store_options_carry_the_worker_and_janitor_deadlines() -> None:
    deadlines = WorkerDeadlines.of(Settings(session_expiry=4.0, janitor_interval=3.0))
    assert deadlines.store_options() == {
        "call_timeout": 8.0,
        "connect_timeout": 4.0,
        "idle_timeout": 8.0,
    }
    assert deadlines.janitor_store_options() == {
        "call_timeout": 6.0,
        "connect_timeout": 4.0,
        "idle_timeout": 6.0,
    }


def test_the_deadlines_cannot_be_changed_after_they_are_derived() -> None:
    deadlines = WorkerDeadlines.of(Settings())
    with pytest.raises(dataclasses.FrozenInstanceError):
        deadlines.call_timeout = 1.0  # type: ignore[misc]
