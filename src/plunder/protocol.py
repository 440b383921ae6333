"""The worker protocol: the only thing a worker needs from wherever its jobs live.

```
 worker                                         where the jobs live (the SQL store, a gateway)
   open(Hello) ──────────────────────────────▶  a session: name, host, queues, tasks, slots
   heartbeat(Beat) ──────────────────────────▶  running claims in; claims to stop, alive out
   exchange(session, outcomes, ClaimRequest) ▶  results of finished attempts in (each fenced
                                                by its claim); at most N new jobs out
   append(claim, events) ────────────────────▶  stream events and progress, fenced
   change_queues(session, add, remove) ──────▶  queues joined and left; the session's now
   pause_limit(claim, key, seconds) ─────────▶  a limit key paused, the job given back
   parent_results(claim) ────────────────────▶  a workflow child's parents' results, fenced
   next_due(ClaimRequest) ───────────────────▶  seconds until the next delayed job is due
   close(session, started) ──────────────────▶  its unfinished jobs given back at once
```

Every call is one request and one answer, with values only, so that it can be spoken over
HTTP unchanged; the exceptions: a heartbeat may name a connection of its own to go ``via``
(the SQL store's link: the hub's), and ``pipe()`` gives turns sent ahead. A worker's loop
is written against this protocol alone; ``plunder.store.link.StoreLink`` speaks it to the
SQL store, ``plunder.store.http.HttpLink`` to a gateway, and a test double lets the loop
be tested without a database.

Some transports can keep several exchanges in flight (PostgreSQL's pipeline mode, on one
held connection; a gateway's link, each on an HTTP connection of its own): ``pipe()``
gives a ``plunder.store.base.TurnPipe``, or None (SQLite), and the worker then makes one
exchange at a time (depth 1).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol

from plunder.graph import ParentResult
from plunder.model import (
    AckResult,
    Claim,
    Completion,
    Failure,
    Heartbeat,
    JobRecord,
    Session,
    TaskInfo,
)

MAX_CLAIM = 10_000  # the most jobs one exchange may claim
MAX_WAIT = 60.0  # the longest a claim may wait for work where the link long-polls


@dataclass(frozen=True, slots=True)
class Hello:
    """A worker opening a session: who it is, what it serves, how many slots are free."""

    name: str
    host: str
    pid: int
    queues: tuple[str, ...]
    tasks: tuple[TaskInfo, ...]
    expiry: float  # seconds without a heartbeat after which the session is gone
    free_slots: int = 0
    labels: tuple[str, ...] = ()  # key=value (plunder.affinity)
    slots: int | None = None  # its slots in all (-c): a job costing more is left to others


@dataclass(frozen=True, slots=True)
class ClaimRequest:
    """At most ``limit`` pending jobs of these queues and tasks, best first; a suspect (a
    job whose workers kept dying) only if ``take_suspect``."""

    queues: tuple[str, ...]
    tasks: tuple[str, ...]
    limit: int
    take_suspect: bool = True
    # seconds a link that long-polls (a gateway's) may hold the exchange while nothing is
    # there to claim; others ignore it (their worker is woken otherwise)
    wait: float = 0.0

    def __post_init__(self) -> None:
        if isinstance(self.limit, bool) or not 0 <= self.limit <= MAX_CLAIM:
            raise ValueError(f"a claim's limit must be from 0 to {MAX_CLAIM}, not {self.limit!r}")
        if not 0 <= self.wait <= MAX_WAIT:
            raise ValueError(f"a claim's wait must be from 0 to {MAX_WAIT}s, not {self.wait!r}")
        if self.limit and not (self.queues and self.tasks):
            raise ValueError("a claim names at least one queue and one task")


@dataclass(frozen=True, slots=True)
class Release:
    """An attempt given back unstarted (its claim's answer was lost, or the worker never
    ran it): the job goes back to the queue, the attempt not counted."""

    claim: Claim


# One type per kind of outcome of an attempt: it succeeded, it failed (or timed out, or
# was stopped: ``Failure.outcome``), or it was given back.
Outcome = Completion | Failure | Release


@dataclass(frozen=True, slots=True)
class Beat:
    """A heartbeat: the claims whose tasks the worker runs, and its free slots."""

    session_id: str
    running: tuple[Claim, ...] = ()
    free_slots: int | None = None
    labels: tuple[str, ...] | None = None  # the worker's labels now (None: unchanged)


NONE = AckResult((), ())


@dataclass(frozen=True, slots=True)
class Reply:
    """What one exchange did: the outcomes written (each accepted, or refused as stale by
    its claim's fence), and the jobs it claimed, best first. ``children``: a job it
    completed had children, pending now perhaps, which its claim could not see: the
    worker claims again at once."""

    completed: AckResult = NONE
    failed: AckResult = NONE
    released: AckResult = NONE
    claimed: tuple[JobRecord, ...] = ()
    children: bool = False


class WorkerProtocol(Protocol):
    """The operations a worker needs (see the module docstring). Each raises plunder's
    store errors: ``SessionGone`` when the session is no more, ``StoreBusy`` /
    ``StoreUnavailable`` for what may pass on a retry.

    ``long_polls``: an exchange that claims nothing waits at the far end until work
    arrives (a gateway), so an idle worker claims again at once instead of waiting for a
    wake-up of its own; a worker with jobs running watches for work instead
    (plunder.waker)."""

    long_polls: bool

    def open(self, hello: Hello) -> Session: ...

    def heartbeat(self, beat: Beat, *, via: Any = None) -> Heartbeat:
        """``via``: a connection of the transport's own to use (the hub's), if any."""
        ...

    def exchange(
        self, session_id: str, outcomes: Sequence[Outcome], claim: ClaimRequest | None
    ) -> Reply: ...

    def append(self, claim: Claim, events: Sequence[tuple[str, Any]]) -> None: ...

    def change_queues(
        self, session_id: str, *, add: Sequence[str] = (), remove: Sequence[str] = ()
    ) -> tuple[str, ...]:
        """The session joins ``add`` and leaves ``remove`` (one guarded update where the
        session lives); its queues now. Each heartbeat answers with them too
        (``Heartbeat.queues``), so a change made elsewhere reaches the worker."""
        ...

    def pause_limit(self, claim: Claim, key: str, seconds: float) -> datetime:
        """Start none of limit ``key``'s jobs for ``seconds``, and give the claimed job
        back to wait with them without spending an attempt (fenced: StaleClaim if the
        claim is not current); when the pause ends. Through a gateway, only the claimed
        job's own limit key may be paused."""
        ...

    def parent_results(self, claim: Claim) -> tuple[ParentResult, ...]:
        """What the parents of the claimed job (a workflow's child) ended with, in id
        order: only while the claim is current (StaleClaim otherwise, as for a job not
        known; through a gateway, also for a job of another group)."""
        ...

    def watch(self, session_id: str, queues: Sequence[str], wait: float) -> bool:
        """Where ``long_polls``: wait up to ``wait`` seconds for work to arrive in
        ``queues``; True when it may have (claims nothing). Elsewhere: True at once."""
        ...

    def next_due(self, request: ClaimRequest) -> float | None: ...

    def close(
        self, session_id: str, *, started: Sequence[Claim] = (), lost: bool = False
    ) -> list[int]: ...

    def cut(self, reason: str, *, final: bool = False) -> int:
        """Give up every call in flight (a lost session: each would be refused, and one
        stuck on a hung peer would never come back); how many. ``final``: none is tried
        again (a worker that halts)."""
        ...

    def pipe(self) -> Any:
        """Exchanges sent ahead (a ``plunder.store.base.TurnPipe``), or None where this
        transport makes one at a time."""
        ...
