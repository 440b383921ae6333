"""Backoff never grows without bound: retry delays are capped and jittered in the upper
half; the busy backoff is a fixed jittered interval with a bounded total."""

from __future__ import annotations

import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from plunder import policy


def ceiling(attempt: int, base: float, cap: float) -> float:
    return min(cap, base * 2.0 ** min(attempt - 1, 1000))


@given(
    attempt=st.integers(1, 10_000),
    base=st.floats(0.001, 10_000),
    cap=st.floats(0, 1_000_000),
    seed=st.integers(0, 2**32),
)
def test_retry_delay_is_in_the_upper_half_below_the_ceiling(
    attempt: int, base: float, cap: float, seed: int
) -> None:
    top = ceiling(attempt, base, cap)
    delay = policy.retry_delay(attempt, base, cap, random.Random(seed))
    assert top / 2 <= delay <= top <= cap


@pytest.mark.parametrize("draw", [0.0, 0.999999999])
def test_retry_delay_reaches_both_ends_of_its_range(draw: float) -> None:
    class Fixed(random.Random):
        def random(self) -> float:
            return draw

    delay = policy.retry_delay(4, 1.0, 300.0, Fixed())
    assert delay == pytest.approx(4.0 + draw * 4.0)


def test_retry_delay_doubles_then_stops_at_the_cap() -> None:
    class Top(random.Random):
        def random(self) -> float:
            return 1.0

    tops = [policy.retry_delay(a, 1.0, 60.0, Top()) for a in range(1, 12)]
    assert tops == [1, 2, 4, 8, 16, 32, 60, 60, 60, 60, 60]


@pytest.mark.parametrize("attempt", [63, 64, 1000, 10_000, 10**9])
def test_retry_delay_never_exceeds_the_cap_for_huge_attempts(attempt: int) -> None:
    for seed in range(20):
        delay = policy.retry_delay(attempt, 1.0, 300.0, random.Random(seed))
        assert 150.0 <= delay <= 300.0


def test_retry_delay_uses_the_module_random_without_an_rng() -> None:
    assert 0.5 <= policy.retry_delay(1, 1.0, 10.0) <= 1.0


@pytest.mark.parametrize("attempt", [0, -1])
def test_retry_delay_rejects_attempts_below_one(attempt: int) -> None:
    with pytest.raises(ValueError, match="attempt"):
        policy.retry_delay(attempt, 1.0, 10.0)


@pytest.mark.parametrize(("base", "cap"), [(-1.0, 10.0), (1.0, -0.5)])
def test_retry_delay_rejects_negative_base_or_cap(base: float, cap: float) -> None:
    with pytest.raises(ValueError, match="non-negative"):
        policy.retry_delay(1, base, cap)


def test_retry_delay_is_zero_with_a_zero_base_or_cap() -> None:
    assert policy.retry_delay(5, 0.0, 10.0) == 0.0
    assert policy.retry_delay(5, 1.0, 0.0) == 0.0


# -- busy backoff -------------------------------------------------------------------------------
class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def drain(backoff: policy.BusyBackoff, clock: FakeClock, limit: int = 100_000) -> list[float]:
    """Sleep (on the fake clock) for every wait until the backoff gives up."""
    waits = []
    for _ in range(limit):
        wait = backoff.next_wait()
        if wait is None:
            return waits
        waits.append(wait)
        clock.now += wait
    raise AssertionError("the busy backoff never gave up")


@given(
    interval=st.floats(0.01, 1.0),
    jitter=st.floats(0.0, 1.0),
    total=st.floats(0.0, 5.0),
    seed=st.integers(0, 2**32),
)
def test_busy_waits_never_grow_and_stop_once_the_total_is_spent(
    interval: float, jitter: float, total: float, seed: int
) -> None:
    clock = FakeClock()
    backoff = policy.BusyBackoff(
        interval=interval, jitter=jitter, total=total, clock=clock, rng=random.Random(seed)
    )
    waits = drain(backoff, clock)
    low, high = interval * (1 - jitter / 2), interval * (1 + jitter / 2)
    assert all(0 < w <= high * (1 + 1e-9) for w in waits)
    assert all(w >= low * (1 - 1e-9) for w in waits[:-1])  # only the last may be cut short
    assert sum(waits) == pytest.approx(total, abs=1e-9) or not waits
    assert backoff.next_wait() is None  # and stays spent


def test_busy_backoff_defaults_are_short_and_bounded() -> None:
    clock = FakeClock()
    backoff = policy.BusyBackoff(clock=clock, rng=random.Random(7))
    waits = drain(backoff, clock)
    assert len(waits) > 100
    assert max(waits) <= policy.BUSY_INTERVAL * (1 + policy.BUSY_JITTER / 2)
    assert min(waits[:-1]) >= policy.BUSY_INTERVAL * (1 - policy.BUSY_JITTER / 2)
    assert sum(waits) == pytest.approx(policy.BUSY_TOTAL)


def test_busy_backoff_counts_time_spent_outside_it() -> None:
    """The total is wall time since the first wait, including the work between waits."""
    clock = FakeClock()
    backoff = policy.BusyBackoff(interval=0.1, jitter=0.0, total=1.0, clock=clock)
    assert backoff.next_wait() == pytest.approx(0.1)
    clock.now += 0.95  # a slow try
    assert backoff.next_wait() == pytest.approx(0.05)
    clock.now += 0.05
    assert backoff.next_wait() is None


def test_a_zero_total_gives_up_at_once() -> None:
    assert policy.BusyBackoff(total=0.0, clock=FakeClock()).next_wait() is None
