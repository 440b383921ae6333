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
woken too where the claim came back full (more may wait), took nothing, or started a job
whose deadline falls before the loop's own wake-up.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager


class IdleClaims:
    """``claim()``: one claim for the parked main loop; True where the loop need not be
    woken for it (see Turns.claim_idle). ``due()``: when the jobs running next need the
    loop (the next task deadline, time.monotonic())."""

    def __init__(self, claim: Callable[[], bool], due: Callable[[], float]) -> None:
        self._claim, self._due = claim, due
        self._lock = threading.Lock()
        self._parked = self._closed = False
        self._until = 0.0  # when the parked loop wakes by itself
        self.claims = self.settled = 0  # made for the parked loop; settled there (tests)

    @contextmanager
    def step(self) -> Iterator[None]:
        """Held by the main loop for a step: it is not parked then."""
        with self._lock:
            self._parked = False
            yield

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
            settled = self._claim()
            self.settled += settled
            return not settled or self._due() < self._until
        finally:
            self._lock.release()
