"""A worker's turns sent ahead (PostgreSQL): the part of the worker's loop that keeps its
turns going on the store's TurnPipe (see plunder.store.pgturn), up to three in flight.

```
 worker:    read N ─ start N's jobs ─ their outcomes ─ send N+3 ─ read N+1 ─ start … ─ send N+4
 database:  … runs N+1 …………………………………… runs N+2 (queued already) ……………………… runs N+3 (queued) …
```

While the turns come back full, the worker sends the next one before it waits for the
oldest in flight, as soon as the outcomes of the jobs it started leave slots for a full
claim: the database then has it queued when it finishes the one before, and goes from
turn to turn without waiting for the worker in between. A turn comes back committed; its
jobs start only then. A turn claims at most a third of the slots (a share: one for each turn
the pipe may have in flight), less what the turns in flight may claim, so that the jobs
running and the claims on their way never exceed the slots. With three shares the database
has two turns of this worker's to run while the worker runs one share's jobs; with two
shares it had one, and ran dry whenever the worker, sharing the machine's cores with it,
was slow to finish them and send the next (docs/decisions/0004-turns-sent-ahead.md).
A turn that fails — and with it those after it, on the same connection — has its
results sent again (an acknowledgement that committed already is accepted again); claims
that did commit are given back once the heartbeat reports them (see plunder.liveness).
"""

from __future__ import annotations

import contextlib
import logging
import queue
import threading
import time
from collections.abc import Sequence
from typing import Any, Protocol

from plunder import errors
from plunder.execution import Handle
from plunder.model import AckResult, Completion, Failure, JobRecord, Session
from plunder.store.base import TurnPipe

log = logging.getLogger("plunder.worker")
AHEAD_LINGER = 0.002  # seconds the next turn may wait for outcomes to free its slots
AHEAD_POLL = 0.0005  # seconds between looks at the answer, while outcomes are awaited


def share(slots: int, pipe: TurnPipe) -> int:
    """The most a turn claims: the slots shared out among the turns the pipe may have in
    flight (halves where it carries one turn at a time: one in flight, one running)."""
    return max(1, slots // max(2, pipe.depth))


class _Worker(Protocol):
    """What the turns use of the worker they are mixed into."""

    options: Any
    session: Session | None
    queues: list[str]
    tasks: list[str]
    stats: dict[str, int]
    _pipe: TurnPipe | None
    _more: bool
    _ack_batch: int
    _completions: list[Completion]
    _failures: list[Failure]
    _outcomes: Any  # queue.SimpleQueue of outcomes
    _stop: threading.Event
    _session_lost: threading.Event

    def _in_flight(self) -> bool: ...
    def _busy(self) -> int: ...
    def _send_turn(self, free: int, *, suspects: bool = True) -> bool: ...
    def _send_ahead(self) -> None: ...
    def _collect(self, *, block: bool, timeout: float = 0.0) -> None: ...
    def _current(self, outcome: Any) -> Handle | None: ...
    def _record(self, outcomes: Sequence[Any]) -> None: ...
    def _start(self, jobs: Sequence[JobRecord]) -> None: ...
    def _count(self, ack: AckResult, kind: str) -> None: ...
    def _may_take_suspect(self) -> bool: ...


class TurnsAhead:
    """Mixed into Worker: its turns through the pipe (``_pipe``, or None: no turns go
    ahead, on SQLite or with ``turns_ahead=False``)."""

    _pipe: TurnPipe | None
    _more: bool  # the last turn read claimed all it asked for: more jobs may wait

    def _in_flight(self: _Worker) -> bool:
        return self._pipe is not None and self._pipe.in_flight > 0

    def _send_turn(self: _Worker, free: int, *, suspects: bool = True) -> bool:
        """Send a turn on the pipe: the results so far and a claim of up to a share of the
        slots (see share) that the turns in flight do not claim already; a suspect only if
        ``suspects`` and none of those may bring one. False: none sent; the turn is made the
        ordinary way."""
        pipe = self._pipe
        if pipe is None or self._stop.is_set() or self.session is None:
            return False
        limit = min(free - pipe.claiming, share(self.options.concurrency, pipe))
        if limit <= 0:
            return False
        done = self._completions[: self._ack_batch]
        suspect = suspects and not pipe.suspect and self._may_take_suspect()
        in_flight = pipe.completions()
        try:
            sent = pipe.send(
                done,
                session_id=self.session.id,
                queues=self.queues,
                tasks=self.tasks,
                limit=limit,
                take_suspect=suspect,
            )
        except errors.StoreError as exc:  # the turns in flight are never read: sent again
            self._completions[:0] = in_flight
            log.warning("could not send a turn (%s); making it the ordinary way", exc)
            return False
        if not sent:  # not on this database (a transaction pooler): never again
            self._pipe = None
            pipe.close()
            return False
        del self._completions[: len(done)]
        return True

    def _send_ahead(self: _Worker) -> None:
        """Before waiting for the oldest turn in flight, while the turns come back full,
        send the next if a full claim fits in the slots free of jobs and of the turns in
        flight: the database then goes from one turn to the next without waiting for the
        worker in between. Outcomes that free slots are waited for until the oldest turn's
        answer is in, AHEAD_LINGER at most."""
        pipe = self._pipe
        if pipe is None or pipe.in_flight >= pipe.depth or not self._more:
            return
        if self._stop.is_set() or self._failures:  # those go the ordinary way, once no
            return  # turn is in flight
        slots = self.options.concurrency
        full = share(slots, pipe)
        deadline = time.monotonic() + AHEAD_LINGER
        self._collect(block=False)
        while slots - self._busy() - pipe.claiming < full:
            if time.monotonic() >= deadline or pipe.answered():
                return
            # a nap, not a wait on the queue: that would wake this thread for each outcome
            time.sleep(AHEAD_POLL)
            self._collect(block=False)
        if not self._failures:
            self._send_turn(slots - self._busy())

    def _read_turn(self: _Worker) -> int:
        """Read the oldest turn in flight (once the next is sent, if it can be: see
        _send_ahead). If its claim came back full and no other turn is on its way, send
        the next before its rows are read and its jobs started: the database runs it
        meanwhile."""
        self._send_ahead()
        pipe = self._pipe
        if pipe is None or not pipe.in_flight:  # that send failed: none is in flight now
            return 0
        in_flight = pipe.completions()
        try:
            answer = pipe.receive()
        except errors.StoreError as exc:  # sent again, the ordinary way if need be
            log.warning("a turn failed (%s); its results go out with the next", exc)
            self._completions[:0] = in_flight
            return 0
        self._more = answer.claimed == answer.limit
        if self._more and not pipe.in_flight and not (self._stop.is_set() or self._failures):
            # jobs that finished meanwhile free their slots now, recorded once it is sent
            finished = []
            with contextlib.suppress(queue.Empty):
                while True:
                    finished.append(self._outcomes.get_nowait())
            ended = sum(1 for o in finished if self._current(o) is not None)
            free = self.options.concurrency - self._busy() + ended - answer.claimed
            # a turn that could bring a suspect may have: the next may not, before it runs
            self._send_turn(free, suspects=not answer.take_suspect)
            self._record(finished)
        claimed = answer.jobs()
        self._start(claimed)
        self.stats["claimed"] += len(claimed)
        try:
            self._count(answer.settle(), "succeeded")
        except errors.SessionGone:  # nothing completed: dropped with the session
            self._completions[:0] = answer.completions
            self._session_lost.set()
        except errors.StoreError as exc:  # looked at again with the next turn
            log.warning("could not settle a turn's results (%s); sending them again", exc)
            self._completions[:0] = answer.completions
        if self._pipe is not None and not self._pipe.in_flight:  # not busy: the pipe's
            self._pipe.close()  # connection goes back to the pool
        return len(claimed)
