"""How a fair claim shares its jobs among groups (plunder.store.fairness.shares): the
earliest of each group's virtual finishing times, weighted."""

from __future__ import annotations

from plunder.store.fairness import check_weights, shares
from plunder.store.fairqueues import FairGroup


def group(name: str, vtime: float = 0.0, weight: float = 1.0) -> FairGroup:
    return FairGroup("q", name, vtime, weight)


def test_equal_groups_share_evenly_and_ties_go_to_the_first_read() -> None:
    assert shares([group("a"), group("b"), group("c")], 7) == [3, 2, 2]


def test_weights_share_in_proportion() -> None:
    assert shares([group("a", weight=3), group("b")], 8) == [6, 2]


def test_a_group_behind_in_virtual_time_catches_up_first() -> None:
    # b is 4 jobs behind a: it takes the first four, then they alternate
    assert shares([group("a", vtime=4.0), group("b")], 6) == [1, 5]


def test_no_group_no_share() -> None:
    assert shares([], 5) == []


def test_weights_are_checked() -> None:
    assert check_weights({"a": 2}) == {"a": 2.0}
    for bad in ({"a": 0}, {"a": -1}, {"a": float("inf")}, {"a": True}, {"a": "2"}):
        try:
            check_weights(bad)  # type: ignore[arg-type]
        except ValueError:
            continue
        raise AssertionError(f"{bad} was accepted")
