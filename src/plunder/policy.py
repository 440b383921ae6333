"""Backoff policies.

Two kinds, and neither can grow without bound:

* **retry backoff** for a failed job: ``min(cap, base * 2**(attempt-1))``, with "equal
  jitter" (the delay is drawn uniformly from the upper half), so retries of jobs that failed
  together spread out instead of arriving as one herd;
* **busy backoff** for a busy target (a locked database, a serialization failure, a lost
  connection): a fixed short interval with jitter, retried until a bounded total.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from plunder import tally

BUSY_INTERVAL = 0.150
BUSY_JITTER = 0.5
BUSY_TOTAL = 30.0
RECONNECT_CAP = 5.0  # the longest a worker waits between tries at an unreachable database


def retry_delay(attempt: int, base: float, cap: float, rng: random.Random | None = None) -> float:
    """Seconds to wait before attempt ``attempt + 1``, after attempt ``attempt`` failed."""
    if attempt < 1:
        raise ValueError("attempt starts at 1")
    if base < 0 or cap < 0:
        raise ValueError("backoff base and cap must be non-negative")
    exponent = min(attempt - 1, 62)  # 2**62 seconds is already far past any cap
    ceiling = min(cap, base * (2.0**exponent))
    draw = (rng or random).random()
    return ceiling / 2 + draw * ceiling / 2


@dataclass(slots=True)
class BusyBackoff:
    """A fixed-interval, jittered, bounded wait for one busy target.

    ``next_wait()`` returns how long to sleep before the next try, or None once the total
    budget is spent; the interval never grows.
    """

    interval: float = BUSY_INTERVAL
    jitter: float = BUSY_JITTER
    total: float = BUSY_TOTAL
    clock: Callable[[], float] = time.monotonic
    rng: random.Random = field(default_factory=random.Random)
    _started: float | None = None

    def next_wait(self) -> float | None:
        now = self.clock()
        if self._started is None:
            self._started = now
        spent = now - self._started
        if spent >= self.total:
            return None
        wait = self.interval * (1 - self.jitter / 2 + self.rng.random() * self.jitter)
        tally.event("busy_retries")
        return min(wait, self.total - spent)
