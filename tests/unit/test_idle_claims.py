"""IdleClaims (plunder.idle): who claims, and whether the main loop is woken."""

from __future__ import annotations

import threading

from plunder.idle import Idle, IdleClaims


class Claimer:
    def __init__(self, then: Idle, due: float = float("inf")) -> None:
        self.then, self.due, self.calls = then, due, 0

    def claim(self) -> Idle:
        self.calls += 1
        return self.then


def parked(claimer: Claimer, wait: float = 60.0) -> IdleClaims:
    idle = IdleClaims(claimer.claim, lambda: claimer.due)
    with idle.step():
        idle.park(wait)
    return idle


def test_a_loop_not_parked_is_woken_to_claim_itself() -> None:
    claimer = Claimer(Idle.SETTLED)
    idle = IdleClaims(claimer.claim, lambda: claimer.due)
    assert idle.woken() and claimer.calls == 0


def test_a_settled_claim_lets_the_loop_sleep_on() -> None:
    claimer = Claimer(Idle.SETTLED)
    idle = parked(claimer)
    assert not idle.woken()
    assert claimer.calls == 1 and idle.claims == 1 and idle.settled == 1
    assert idle.woken() and claimer.calls == 1  # no longer parked: the loop claims
    with idle.step() as claimed:
        assert not claimed  # woken by an outcome later, it claims as usual


def test_an_empty_answer_wakes_the_loop_to_look_at_what_is_due_only() -> None:
    claimer = Claimer(Idle.EMPTY)
    idle = parked(claimer)
    assert idle.woken() and claimer.calls == 1 and idle.settled == 0
    with idle.step() as claimed:
        assert claimed  # answered already: no claim in this step
    with idle.step() as claimed:
        assert not claimed


def test_a_claim_not_settled_wakes_the_loop_to_claim() -> None:
    claimer = Claimer(Idle.CLAIM)
    idle = parked(claimer)
    assert idle.woken() and claimer.calls == 1
    with idle.step() as claimed:
        assert not claimed


def test_a_deadline_before_the_loops_own_wake_up_wakes_it() -> None:
    claimer = Claimer(Idle.SETTLED, due=0.0)  # a task deadline long past
    idle = parked(claimer)
    assert idle.woken() and claimer.calls == 1
    with idle.step() as claimed:
        assert claimed  # it took all there was: the loop woken need not claim again


def test_no_claim_while_the_loop_makes_a_step() -> None:
    claimer = Claimer(Idle.SETTLED)
    idle = IdleClaims(claimer.claim, lambda: claimer.due)
    woken: list[bool] = []
    with idle.step():
        idle.park(60.0)  # parked at the end of the step, but the step still holds the lock
        thread = threading.Thread(target=lambda: woken.append(idle.woken()))
        thread.start()
        thread.join()
    assert woken == [True] and claimer.calls == 0


def test_a_closed_loop_is_claimed_for_no_more() -> None:
    claimer = Claimer(Idle.SETTLED)
    idle = parked(claimer)
    idle.close()
    assert idle.woken()
    with idle.step():
        idle.park(60.0)
    assert idle.woken() and claimer.calls == 0
