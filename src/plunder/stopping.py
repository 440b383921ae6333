"""Jobs stopped but still running: a worker's slot stays taken until the job's function
has really returned, so a worker with ``-c 1`` never runs a second job beside a stopped
one that runs on.

```
 stopped (timed out, cancelled, session lost) ──▶ outcome written at once (fenced)
        │                                          slot still taken ─┐
        ▼                                                            │
 its function returns (thread), its coroutine ends (event loop),     │
 its child is dead (process) ──▶ its outcome arrives ──▶ slot free ◀─┘
```

A thread cannot be killed: a plain-function task stops when it looks at ``ctx.cancelled``
or ``ctx.wait_cancelled``. One still running STOP_GRACE seconds after its stop is reported
in the worker log, once, with a WARNING naming the job (its run was written as it was
stopped, so the report goes to the log only). A process-pool child is killed at once (see
plunder.pool): its slot frees when it is dead.
"""

from __future__ import annotations

import logging
import signal
import threading
import time
from dataclasses import dataclass
from types import FrameType

from plunder.execution import Handle
from plunder.halting import EXIT_AFTER, Halt

log = logging.getLogger("plunder.worker")

# seconds a stopped task has to return before it is reported (and a child killed); a
# cooperative task returns at its next look at ctx.cancelled, well within this
STOP_GRACE = 5.0


@dataclass(slots=True)
class _Stopped:
    handle: Handle
    since: float  # monotonic
    reported: bool = False


class Stopping:
    """The jobs of a worker that were stopped and have not returned yet, each holding its
    slot. Used by the worker's main thread only; ``count`` may be read from any thread."""

    def __init__(self, grace: float | None = None) -> None:
        self.grace = STOP_GRACE if grace is None else grace
        self._stopped: dict[tuple[int, int], _Stopped] = {}
        self._taken = 0  # the sum of their costs, read from any thread

    @property
    def count(self) -> int:
        """The slots they take (a job takes its cost)."""
        return self._taken

    def add(self, handle: Handle, now: float | None = None) -> None:
        """``handle``'s job was stopped and taken out of the running ones: its slot stays
        taken until its outcome arrives (``returned``)."""
        at = time.monotonic() if now is None else now
        key = (handle.job.id, handle.job.attempt)
        if key not in self._stopped:
            self._taken += handle.job.cost
        self._stopped[key] = _Stopped(handle, at)

    def returned(self, job_id: int, attempt: int) -> bool:
        """The outcome of a stopped job arrived (it returned, raised, or its child died):
        its slot is free. False: it was not one of them."""
        stopped = self._stopped.pop((job_id, attempt), None)
        if stopped is None:
            return False
        self._taken -= stopped.handle.job.cost
        if stopped.reported:
            log.warning(
                "job %d attempt %d (%s) returned %.1fs after it was stopped; its slot is free",
                job_id,
                attempt,
                stopped.handle.job.task,
                time.monotonic() - stopped.since,
            )
        return True

    def overdue(self, now: float | None = None) -> None:
        """Report, once each, the stopped jobs still running past the grace period."""
        at = time.monotonic() if now is None else now
        for stopped in self._stopped.values():
            if stopped.reported or at - stopped.since < self.grace:
                continue
            stopped.reported = True
            job, handle = stopped.handle.job, stopped.handle
            log.warning(
                "job %d attempt %d (%s) still runs %.1fs after it was stopped (%s): its task "
                "ignores ctx.cancelled; its slot stays taken until it returns",
                job.id,
                job.attempt,
                job.task,
                at - stopped.since,
                handle.ctx.cancel_reason or "stopped",
            )

    def next_due(self) -> float | None:
        """The monotonic time of the next report, if any is still to come."""
        due = [s.since + self.grace for s in self._stopped.values() if not s.reported]
        return min(due) if due else None


def install_signals(stop: threading.Event, halt: Halt, grace: float) -> None:
    """SIGTERM or SIGINT sets ``stop`` (a graceful stop: running jobs get ``grace``
    seconds); a second one sets ``halt`` too (at once). A stop a signal began may end
    the process once halted (plunder.halting), as the signal's default action would; one
    that ``stop()`` began never does."""

    def handler(signum: int, frame: FrameType | None) -> None:
        halt.exit_after = EXIT_AFTER
        if stop.is_set():
            log.warning(
                "second signal: stopping at once; running jobs will be rescued "
                "when this session expires"
            )
            halt.set()
        else:
            log.info(
                "signal %d: finishing running jobs (grace %.0fs), claiming no more",
                signum,
                grace,
            )
            stop.set()

    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGINT, handler)
