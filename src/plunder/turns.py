"""A worker's turns: the results of its finished jobs out, new jobs in, over the worker
protocol (plunder.protocol), with up to ``depth`` turns in flight.

```
 depth 1:   exchange(results, claim) ─ start its jobs ─ outcomes ─ exchange(…) ─ …
 depth 3:   worker    read N ─ start N's jobs ─ outcomes ─ send N+3 ─ read N+1 ─ start …
 (a pipe)   database  … runs N+1 ……………………………… runs N+2 (queued already) ……… runs N+3 …
```

One turn at a time, the worker waits for each exchange; that is all a link without a pipe
(SQLite) offers. Where the link has a pipe (PostgreSQL's pipeline mode:
plunder.store.postgres.turns; a gateway's, over HTTP connections: plunder.store.http.pipe),
a busy worker sends its next turn before it waits for the oldest in flight, as soon as the
outcomes of the jobs it started leave slots for a full claim: the database then goes from
turn to turn without waiting for the worker in between. A turn
comes back committed; its jobs start only then. A turn claims at most a share of the slots
(one for each turn that may be in flight), less what the turns in flight may claim, so
that the jobs running and the claims on their way never exceed the slots
(docs/decisions/0004-turns-sent-ahead.md).

A turn sent ahead carries only plain completions: failures, and the results of a turn
that failed, go the ordinary way once none is in flight. A turn that fails — and with it
those after it, on the same connection — has its results sent again (an acknowledgement
that committed already is accepted again); claims that did commit are given back once the
heartbeat reports them (plunder.liveness).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from plunder import affinity, errors, tally, tracing
from plunder.acker import ACK_BATCH, Acker
from plunder.idle import Idle
from plunder.model import AckResult, Completion, Failure, Session
from plunder.ownership import Ownership
from plunder.protocol import ClaimRequest, Outcome, WorkerProtocol
from plunder.slots import Slots

log = logging.getLogger("plunder.worker")
MAX_DEPTH = 3  # turns in flight at most: with three shares the database has two turns to
# run while the worker runs one share's jobs; with two it ran dry whenever the worker,
# sharing the machine's cores with it, was slow to send the next
ACK_LINGER = 0.002  # seconds a turn may wait for more results to send with it
AHEAD_LINGER = 0.002  # seconds the next turn may wait for outcomes to free its slots
AHEAD_POLL = 0.0005  # seconds between looks at the answer, while outcomes are awaited
# How long the thread that sent an idle worker's claim waits for its answer before it
# leaves the answer to the main loop (plunder.idle): that thread carries the heartbeat
IDLE_ANSWER = 0.1
# Where the link long-polls (a gateway): how long an idle worker's exchange that finds
# nothing to claim waits there for work (a SIGTERM waits for it to end: keep it short)
LONG_POLL = 2.0


class Turns:
    read_failed = False  # the last turn read raised: its answer was never seen

    def __init__(
        self,
        link: WorkerProtocol,
        slots: Slots,
        *,
        depth: int,
        queues: list[str],
        tasks: list[str],
        session: Callable[[], Session | None],
        stopping: Callable[[], bool],
        given_up: Callable[[], bool],
        lost: Callable[[], None],
        counted: Callable[[AckResult, str], None],
        stats: dict[str, int],
        pause: Callable[[], object],
        ownership: Ownership | None = None,
    ) -> None:
        """``session()``: the session turns go under (None: none is open); ``stopping()``:
        claim no more; ``given_up()``: results would be refused now (the session is lost,
        the worker halts); ``lost()``: the link says the session is gone; ``counted(ack,
        kind)``: results were written; ``stats["claimed"]`` counts the jobs claimed;
        ``pause()`` waits a while after a claim failed (less if the worker stops);
        ``ownership``: the partitions owned, claimed from first (plunder.ownership)."""
        if not 1 <= depth <= MAX_DEPTH:
            raise errors.ConfigError(f"depth must be from 1 to {MAX_DEPTH}, not {depth!r}")
        self.link, self.slots, self.outbox = link, slots, slots.outbox
        self.queues, self.tasks = queues, tasks
        self._session, self._stopping, self._lost = session, stopping, lost
        self._given_up = given_up
        self._counted, self._stats, self._pause = counted, stats, pause
        self.pipe: Any = link.pipe() if depth > 1 else None
        self.depth = min(depth, self.pipe.depth) if self.pipe is not None else 1
        self.acker = Acker(link, session=self._session_id, stopped=given_up, counted=counted)
        # the results a turn carries at most, so that the acknowledgements keep up with
        # the claims whatever the concurrency: between two turns sent, the jobs running or
        # claimed at the first finish (one per slot), and those that finished just before
        # it, recorded once it went out (see read; one per slot again)
        self.ack_batch = max(ACK_BATCH, 2 * slots.concurrency)
        self.more = False  # the last turn claimed all it asked for: more may wait
        self.looked_again = False  # a job was due now, the claim took nothing: once more
        # the last turn completed a job with children, which its claim could not see
        self.children = False
        # a job due now was left by the last claim (it may cost more than a share: decision
        # 0019): the next turn sent offers every slot free, not a share
        self.wide = False
        self.ownership = ownership
        self.asked_own = False  # the last claim named only the partitions owned
        self.steal = False  # it came back empty: the next claims from every partition

    def _session_id(self) -> str | None:
        session = self._session()
        return session.id if session is not None else None

    # -- what is in flight ------------------------------------------------------------------
    def in_flight(self) -> int:
        return self.pipe.in_flight if self.pipe is not None else 0

    def share(self) -> int:
        """The most a turn claims: the slots shared out among the turns that may be in
        flight (halves where one at a time is sent ahead)."""
        return max(1, self.slots.concurrency // max(2, self.depth))

    def held(self) -> set[int]:
        """The jobs whose results wait to be sent or are on their way."""
        ids = self.outbox.job_ids()
        if self.pipe is not None:
            ids.update(c.claim.job_id for c in self.pipe.completions())
        return ids

    def sent_at(self) -> float | None:
        """When the oldest turn in flight was sent (time.monotonic()); None: none is."""
        return self.pipe.sent_at if self.pipe is not None else None

    def ready(self) -> None:
        """The turns' statement prepared on the connections the pipe will hold, before the
        first burst of work needs it; without it, the first turns prepare it as they go."""
        if self.pipe is None:
            return
        try:
            self.pipe.ready(queues=self.queues, tasks=self.tasks)
        except errors.StoreError as exc:
            log.warning("could not prepare the turns' statement ahead (%s); turns will", exc)

    def drop(self) -> int:
        """The session is lost: the turns in flight are never read (their claims are lost
        too) and the results waiting are forgotten (they would be refused); how many."""
        unread = self.pipe.close() if self.pipe is not None else []
        return len(unread) + self.outbox.clear()

    def close(self) -> None:
        """Turns in flight (a turn raised) are never read: their results go back to the
        outbox, to be written again."""
        if self.pipe is not None:
            self.outbox.completions[:0] = self.pipe.close()

    # -- a turn -----------------------------------------------------------------------------
    def turn(self, free: int) -> int:
        """Send the results waiting and claim up to ``free`` jobs; how many it claimed.
        None once the session is given up: its results would be refused, and a claim
        under it would only be lost again. A claim of the partitions owned that came back
        empty is followed at once by one from every partition (stealing)."""
        claimed = self._turn(free)
        if not claimed and self.steal and free > 0 and not (self.in_flight() or self._stopping()):
            claimed = self._turn(free)
        if claimed:
            self.looked_again = False
        return claimed

    def next_due(self) -> float | None:
        """Seconds until the next delayed job of the worker's queues is due (the database
        clock), read once a claim found nothing more: 0.0 (once) to claim again at once,
        offering every free slot, where one is due now although that claim took nothing
        (it came due in between, or cost more than the share a turn offers); None: none
        is due later, or it could not be read."""
        try:
            due = self.link.next_due(self.request(0))
        except errors.StoreError as exc:
            log.warning("could not read the next due job: %s", exc)
            due = None
        if due is not None and due <= 0 and not self.looked_again:
            self.looked_again = self.wide = True
            return 0.0
        # still due now and not claimed: locked by another worker, or left to those that
        # did not fail it yet; a wake-up or the poll interval brings the loop back
        self.looked_again = self.wide = due is not None and due <= 0
        return due if due is not None and due > 0 else None

    def claim_idle(self, free: int) -> Idle:
        """A claim of up to ``free`` jobs for the parked main loop (plunder.idle), from the
        thread that heard of work, with nothing to send and no turn in flight: sent on
        the pipe, and if its answer comes within IDLE_ANSWER, read and its jobs started
        here. What the loop is to do (plunder.idle.Idle): a claim not made or not read
        (no pipe, a late answer, a failure), one that came back full, or one of the
        partitions owned that came back empty (the next steals) leave it to claim."""
        if self.pipe is None or free <= 0 or self.in_flight() or self.outbox:
            return Idle.CLAIM
        if not self.send(free) or self.pipe is None or not self.pipe.answered(IDLE_ANSWER):
            return Idle.CLAIM
        claimed = self.read()
        if self.read_failed or self.more or self.steal or self.in_flight():
            return Idle.CLAIM
        return Idle.SETTLED if claimed else Idle.EMPTY

    def _turn(self, free: int) -> int:
        self.children = False  # said again by this turn's answer, if it has one
        if self._given_up():
            return 0
        if self.in_flight() or (not self.outbox.failures and self.send(free)):
            return self.read()
        done = self.outbox.completions[: self.ack_batch]
        failed = self.outbox.failures[: self.ack_batch]
        if not done and not failed:
            return self.exchange([], [], free) if free > 0 else 0
        if free <= 0:
            self.acknowledge()
            return 0
        return self.exchange(done, failed, free)

    def request(self, limit: int, *, suspects: bool = True) -> ClaimRequest:
        """A claim of up to ``limit`` jobs of the worker's queues and tasks."""
        take_suspect = suspects and self.slots.may_take_suspect()
        # an idle worker's claim waits at a gateway for work; with jobs running it must
        # not (their results would wait too): plunder.waker watches for work instead
        idle = self.link.long_polls and limit and not self.slots.busy()
        wait = LONG_POLL if idle else 0.0
        queues = self._claimed_queues(limit)
        return ClaimRequest(tuple(queues), tuple(self.tasks), limit, take_suspect, wait)

    def due_request(self) -> ClaimRequest:
        """A claim of nothing, for the next delayed job due (every partition of the
        queues); it changes no state, so any thread may ask for it."""
        ownership = self.ownership
        queues = self.queues
        if ownership is not None and ownership.partitioned:
            queues = ownership.everything(queues)
        return ClaimRequest(tuple(queues), tuple(self.tasks), 0)

    def _claimed_queues(self, limit: int) -> list[str]:
        """The worker's queues; where some are partitioned, those it owns first (none to
        claim: ``limit`` 0 reads every partition)."""
        ownership = self.ownership
        if ownership is None or not ownership.partitioned:
            return self.queues
        mine = ownership.preferred(self.queues) if limit else None
        self.asked_own = bool(mine) and not self.steal
        if limit:
            self.steal = False
        return mine if mine and self.asked_own else ownership.everything(self.queues)

    def _claimed(self, count: int) -> int:
        """A claim of the partitions owned that took nothing: the next steals."""
        if not count and self.asked_own:
            self.steal = True
        return count

    def exchange(self, done: list[Completion], failed: list[Failure], free: int) -> int:
        """One exchange, the ordinary way: the first results waiting (``done`` and
        ``failed``) and a claim of up to ``free`` jobs; how many it claimed."""
        session = self._session()
        assert session is not None
        outcomes: list[Outcome] = [*done, *failed]
        try:
            reply = self.link.exchange(session.id, outcomes, self.request(free))
        except errors.SessionGone:
            self._lost()
            return 0
        except errors.StoreError as exc:
            if not outcomes:
                log.warning("claim failed: %s", exc)
                self._pause()
                return 0
            log.warning("acknowledge-and-claim failed (%s); doing them one by one", exc)
            self.acknowledge()
            return 0 if self._given_up() else self.exchange([], [], free)
        del self.outbox.completions[: len(done)]
        del self.outbox.failures[: len(failed)]
        self._counted(reply.completed, "succeeded")
        self._counted(reply.failed, "failed")
        self.more = free > 0 and affinity.taken(reply.claimed) == free
        self.children = reply.children
        return self._claimed(self._started(reply.claimed))

    def _started(self, jobs: Any) -> int:
        tally.started(jobs)
        tracing.started(jobs, getattr(self.link, "store", None))  # before the tasks run
        self.slots.start(jobs)
        self._stats["claimed"] += len(jobs)
        return len(jobs)

    def acknowledge(self) -> None:
        """Write every result waiting now (or give them up with the session)."""
        self.acker.write(self.outbox.completions, self.outbox.failures)
        self.outbox.clear()

    def linger(self) -> None:
        """With results to send but most slots still busy, wait a moment (ACK_LINGER at
        most) for more to finish, so that they share one turn: a turn costs about the same
        for one job as for fifty, and short jobs otherwise come back a few at a time, each
        few paying for a whole turn."""
        if not self.outbox or self._stopping():
            return
        slots = self.slots
        enough = slots.concurrency // 2
        deadline = time.monotonic() + ACK_LINGER
        while slots.concurrency - slots.busy() < enough:
            left = deadline - time.monotonic()
            if left <= 0:
                return
            slots.collect(block=True, timeout=left)

    # -- turns sent ahead -------------------------------------------------------------------
    def send(self, free: int, *, suspects: bool = True) -> bool:
        """Send a turn on the pipe: the results so far and a claim of up to a share of the
        slots that the turns in flight do not claim already; a suspect only if
        ``suspects`` and none of those may bring one. False: none sent; the turn is made the
        ordinary way."""
        pipe, session = self.pipe, self._session()
        if pipe is None or self._stopping() or self._given_up() or session is None:
            return False
        if not self.queues:  # it left every queue (plunder.membership): nothing to claim
            return False
        room = free - pipe.claiming
        # from idle, every free slot: a share that came back full would send the next turn
        # at once, its Python holding the GIL the first job's thread is waiting for
        idle = not pipe.in_flight and not self.slots.busy()
        limit = room if self.wide or idle else min(room, self.share())
        if limit <= 0:
            return False
        done = self.outbox.completions[: self.ack_batch]
        in_flight = pipe.completions()
        claim = self.request(limit, suspects=suspects and not pipe.suspect)
        try:
            sent = pipe.send(
                done,
                session_id=session.id,
                queues=claim.queues,
                tasks=claim.tasks,
                limit=claim.limit,
                take_suspect=claim.take_suspect,
                wait=claim.wait,  # an idle worker's, where the link long-polls
            )
        except errors.StoreError as exc:  # the turns in flight are never read: sent again
            self.outbox.completions[:0] = in_flight
            log.warning("could not send a turn (%s); making it the ordinary way", exc)
            return False
        if not sent:  # not on this database (a transaction pooler): never again
            self.pipe, self.depth = None, 1
            self.outbox.completions[:0] = pipe.close()
            return False
        del self.outbox.completions[: len(done)]
        self.wide = False
        return True

    def send_ahead(self) -> None:
        """Before waiting for the oldest turn in flight, while the turns come back full,
        send the next if a full claim fits in the slots free of jobs and of the turns in
        flight. Outcomes that free slots are waited for until the oldest turn's answer is
        in, AHEAD_LINGER at most."""
        pipe, slots = self.pipe, self.slots
        if pipe is None or pipe.in_flight >= self.depth or not self.more:
            return
        if self._stopping() or self.outbox.failures:  # those go the ordinary way, once no
            return  # turn is in flight
        full = self.share()
        deadline = time.monotonic() + AHEAD_LINGER
        slots.collect(block=False)
        while slots.concurrency - slots.busy() - pipe.claiming < full:
            if time.monotonic() >= deadline or pipe.answered():
                return
            # a nap, not a wait on the queue: that would wake this thread for each outcome
            time.sleep(AHEAD_POLL)
            slots.collect(block=False)
        if not self.outbox.failures:
            self.send(slots.concurrency - slots.busy())

    def read(self) -> int:
        """Read the oldest turn in flight (once the next is sent, if it can be: see
        send_ahead). If its claim came back full and no other turn is on its way, send
        the next before its rows are read and its jobs started: the database runs it
        meanwhile."""
        self.send_ahead()
        pipe = self.pipe
        if pipe is None or not pipe.in_flight:  # that send failed: none is in flight now
            return 0
        in_flight = pipe.completions()
        self.read_failed = False
        try:
            answer = pipe.receive()
        except errors.StoreError as exc:  # sent again, the ordinary way if need be
            log.warning("a turn failed (%s); its results go out with the next", exc)
            self.outbox.completions[:0] = in_flight
            self.read_failed = True
            return 0
        self.more = answer.claimed == answer.limit
        self.children = answer.children and not pipe.in_flight  # one in flight sees them
        self._claimed(answer.claimed)
        # a worker with nothing running starts its jobs first: they are all it waits for
        first = not self.slots.busy()
        claimed = self._started(answer.jobs()) if first else 0
        if self.more and not pipe.in_flight and not (self._stopping() or self.outbox.failures):
            self._send_next(answer, started=first)
        if not first:
            claimed = self._started(answer.jobs())
        self._settle(answer)
        if self.pipe is not None and not self.pipe.in_flight:  # not busy: its connection
            self.pipe.rest()  # is kept, for the next claim to go out at once
        return claimed

    def _send_next(self, answer: Any, *, started: bool) -> None:
        """The turn just read came back full: send the next, before starting its jobs
        unless they ``started`` already. Jobs that finished meanwhile free their slots now,
        recorded once it is sent."""
        slots = self.slots
        finished = slots.ready()
        try:
            ended = sum(h.job.cost for h in map(slots.current, finished) if h is not None)
            # full: as many jobs as slots asked for, so each costs one and they take as many
            waiting = 0 if started else answer.claimed
            free = slots.concurrency - slots.busy() + ended - waiting
            # a turn that could bring a suspect may have: the next may not, before it runs
            self.send(free, suspects=not answer.take_suspect)
        finally:  # taken off the queue: recorded whatever the send did
            slots.record(finished)

    def _settle(self, answer: Any) -> None:
        try:
            self._counted(answer.settle(), "succeeded")
        except errors.SessionGone:  # nothing completed: dropped with the session
            self.outbox.completions[:0] = answer.completions
            self._lost()
        except errors.StoreError as exc:  # looked at again with the next turn
            log.warning("could not settle a turn's results (%s); sending them again", exc)
            self.outbox.completions[:0] = answer.completions
