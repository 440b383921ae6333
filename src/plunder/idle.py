"""Claims made by the thread that hears of work, while the worker's main loop waits idle.

An idle worker's main loop waits on its outcome queue; the hub thread hears the enqueue's
notification first. Woken, the main loop would take a step (collect, look at deadlines
and claims to give back) and send its claim: CPU that, on a machine of few cores, the
database's claim and the task's first line wait for
(docs/decisions/0031-the-hub-claims-for-an-idle-worker.md). So while the main loop is
*parked* — every slot free, nothing to send, no turn in flight — the hub thread sends the
claim on the turns' pipe itself, reads the answer and starts the jobs, and the main loop
sleeps on until an outcome comes.

```
 main loop   step (lock held) ── park ── wait on outcomes ················· outcome ── step
 hub thread                              NOTIFY ── lock? ── send ── read ── start
 database                                                     └ claim ┘
```

The two never make a turn at once: the main loop holds a lock for each step and parks only
at its end; the hub thread takes the lock without waiting, and claims only for a parked
loop. It waits for the answer a short while only (turns.IDLE_ANSWER), as it carries the
heartbeat: a later answer is left to the main loop, woken to read it. The main loop is
woken too where the claim came back full (more may wait) or failed, or started a job whose
deadline falls before the loop's own wake-up; and where it took nothing (another worker
was first, or the job is due later), to read when the next job is due, without claiming
again.
"""

from __future__ import annotations

import enum
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager


class Idle(enum.Enum):
    """What the main loop is to do after a claim made for it."""

    SETTLED = "settled"  # it took jobs, all there were: sleep on
    EMPTY = "empty"  # it was answered, with nothing: look at what is due, claim nothing
    CLAIM = "claim"  # claim as usual (not made, not read, full, or stealing next)


class IdleClaims:
    """``claim()``: one claim for the parked main loop, and what the loop is to do then
    (see Turns.claim_idle). ``due()``: when the jobs running next need the loop (the next
    task deadline, time.monotonic())."""

    def __init__(self, claim: Callable[[], Idle], due: Callable[[], float]) -> None:
        self._claim, self._due = claim, due
        self._lock = threading.Lock()
        self._parked = self._closed = False
        self._until = 0.0  # when the parked loop wakes by itself
        self._claimed = False  # a claim for the loop was answered: it need not claim now
        self.claims = self.settled = 0  # made for the parked loop; settled there (tests)

    @contextmanager
    def step(self) -> Iterator[bool]:
        """Held by the main loop for a step: it is not parked then. Yields whether a claim
        made for it since its last step was answered (it need not claim in this step)."""
        with self._lock:
            self._parked = False
            claimed, self._claimed = self._claimed, False
            yield claimed

    def park(self, wait: float) -> None:
        """Within ``step()``: the main loop waits idle for ``wait`` seconds at most once
        the step ends."""
        self._parked, self._until = not self._closed, time.monotonic() + wait

    def close(self) -> None:
        """The main loop has ended (it may not have stepped since it parked): no more
        claims for it."""
        with self._lock:
            self._parked, self._closed = False, True

    def woken(self) -> bool:
        """From the thread that heard of work: claim now if the main loop is parked.
        Whether to wake the main loop (as for any wake-up where it was not parked)."""
        if not self._parked or not self._lock.acquire(blocking=False):
            return True
        try:
            if not self._parked:
                return True
            self._parked = False
            self.claims += 1
            then = self._claim()
            self.settled += then is Idle.SETTLED
            if then is Idle.SETTLED and self._due() >= self._until:
                return False
            self._claimed = then is not Idle.CLAIM
            return True
        finally:
            self._lock.release()
