"""IdleClaims (plunder.idle): who claims, and whether the main loop is woken."""

from __future__ import annotations

import threading

from plunder.idle import IdleClaims


class Claimer:
    def __init__(self, settled: bool, due: float = float("inf")) -> None:
        self.settled, self.due, self.calls = settled, due, 0

    def claim(self) -> bool:
        self.calls += 1
        return self.settled


def parked(claimer: Claimer, wait: float = 60.0) -> IdleClaims:
    idle = IdleClaims(claimer.claim, lambda: claimer.due)
    with idle.step():
        idle.park(wait)
    return idle


def test_a_loop_not_parked_is_woken_to_claim_itself() -> None:
    claimer = Claimer(True)
    idle = IdleClaims(claimer.claim, lambda: claimer.due)
    assert idle.woken() and claimer.calls == 0


def test_a_settled_claim_lets_the_loop_sleep_on() -> None:
    claimer = Claimer(True)
    idle = parked(claimer)
    assert not idle.woken()
    assert claimer.calls == 1 and idle.claims == 1
    assert idle.woken() and claimer.calls == 1  # no longer parked: the loop claims


def test_a_claim_not_settled_wakes_the_loop() -> None:
    claimer = Claimer(False)
    idle = parked(claimer)
    assert idle.woken() and claimer.calls == 1


def test_a_deadline_before_the_loops_own_wake_up_wakes_it() -> None:
    claimer = Claimer(True, due=0.0)  # a task deadline long past
    idle = parked(claimer)
    assert idle.woken() and claimer.calls == 1


def test_no_claim_while_the_loop_makes_a_step() -> None:
    claimer = Claimer(True)
    idle = IdleClaims(claimer.claim, lambda: claimer.due)
    woken: list[bool] = []
    with idle.step():
        idle.park(60.0)  # parked at the end of the step, but the step still holds the lock
        thread = threading.Thread(target=lambda: woken.append(idle.woken()))
        thread.start()
        thread.join()
    assert woken == [True] and claimer.calls == 0


def test_a_closed_loop_is_claimed_for_no_more() -> None:
    claimer = Claimer(True)
    idle = parked(claimer)
    idle.close()
    assert idle.woken()
    with idle.step():
        idle.park(60.0)
    assert idle.woken() and claimer.calls == 0
