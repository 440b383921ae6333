"""Job states, run outcomes and the table of allowed transitions: the whole machine.

```
            claim                 complete (fenced)
 pending ───────────▶ running ───────────────────▶ succeeded
   ▲  ▲                 │ │ │
   │  └── fail / lost / timeout, attempts left ──┘ │ │
   │                    │ └─ fail, no attempts left ─▶ failed
   │                    └─── lost / timeout, none left ▶ timed_out
   └── retry from failed / timed_out / cancelled / expired
 pending or running ── cancel ──▶ cancelled
 pending, not started by its start-by deadline ── expire ──▶ expired
 waiting ── every parent ended ──▶ pending, or skipped / failed by a parent's failure
```

The last transition is not a query: the trigger of migration 19 (plunder_jobs_settle)
makes it when a parent ends, guarded by the child's ``waiting``; see plunder.flows.

A failed, timed-out or lost attempt is retried only if its policy says so (``no_retry``,
``retry_on_timeout``, ``retry_on_lost``; see plunder.task.Options); otherwise it ends at
once as if no attempts were left. A graceful shutdown past its grace period releases the
attempts it stopped (pending, the attempt not counted), but abandons one whose
``retry_on_lost`` is off: timed_out, as if its worker were lost.

Every transition in the store is a guarded update whose ``WHERE`` clause names the source
state (and, for a worker's write, the claim); this table is what those guards encode, and a
test checks the SQL against it.
"""

from __future__ import annotations

from enum import StrEnum


class Status(StrEnum):
    PENDING = "pending"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    TIMED_OUT = "timed_out"
    CANCELLED = "cancelled"
    EXPIRED = "expired"  # no attempt started by its start-by deadline (expires_in); runs no more
    # workflows (plunder.flows): waiting for its parents; skipped by a parent's failure
    WAITING = "waiting"
    SKIPPED = "skipped"


class Outcome(StrEnum):
    """How one run (one attempt) ended."""

    SUCCEEDED = "succeeded"
    FAILED = "failed"
    TIMED_OUT = "timed_out"
    LOST = "lost"  # its session died
    CANCELLED = "cancelled"
    STALE = "stale"  # its completion arrived after the claim had moved on
    RELEASED = "released"  # graceful shutdown gave it back unstarted or unfinished


TERMINAL: frozenset[Status] = frozenset(
    {Status.SUCCEEDED, Status.FAILED, Status.TIMED_OUT, Status.CANCELLED, Status.EXPIRED,
     Status.SKIPPED}
)  # fmt: skip
ACTIVE: frozenset[Status] = frozenset({Status.PENDING, Status.RUNNING, Status.WAITING})

TRANSITIONS: dict[str, tuple[frozenset[Status], Status | None]] = {
    # operation: (states it may start from, state it ends in; None = depends on attempts left)
    "claim": (frozenset({Status.PENDING}), Status.RUNNING),
    "complete": (frozenset({Status.RUNNING}), Status.SUCCEEDED),
    "fail": (frozenset({Status.RUNNING}), None),  # pending (retry) or failed
    "lose": (frozenset({Status.RUNNING}), None),  # pending or timed_out (retry_on_lost)
    "time_out": (frozenset({Status.RUNNING}), None),  # pending or timed_out
    "release": (frozenset({Status.RUNNING}), Status.PENDING),
    "abandon": (frozenset({Status.RUNNING}), Status.TIMED_OUT),  # stopped, retry_on_lost off
    "cancel": (frozenset({Status.PENDING, Status.RUNNING, Status.WAITING}), Status.CANCELLED),
    "expire": (frozenset({Status.PENDING}), Status.EXPIRED),
    "retry": (
        frozenset({Status.FAILED, Status.TIMED_OUT, Status.CANCELLED, Status.EXPIRED}),
        Status.PENDING,
    ),
}


def allowed(operation: str, status: Status | str) -> bool:
    """Whether ``operation`` may start from ``status``."""
    sources, _ = TRANSITIONS[operation]
    return Status(status) in sources


def is_terminal(status: Status | str) -> bool:
    return Status(status) in TERMINAL
