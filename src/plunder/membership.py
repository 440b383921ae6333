"""A worker's queues, joined and left while it runs.

```
 worker.join(q) / leave(q) ─── change_queues ──▶ the session's row: its queues (the truth)
 plunder worker-queues SESSION --add q ────────▶ the same row, from any process
 each heartbeat ◀──────────── Heartbeat.queues ─ the row's queues, heard by the worker
 main thread: follow() ── the next claim names the new queues; hub wake-ups follow them
   a left queue's running jobs ── finish within the grace period ──▶ acknowledged
                                └─ still running after it: stopped ──▶ given back (Release,
                                   the attempt not counted); a started job whose
                                   retry_on_lost is off ends as lost (timed_out, WorkerLost)
```

The session row is changed in one guarded update (plunder.store.sessions), so changes made
at once from several processes all count; the worker takes the row's queues as each
heartbeat answers them, except an answer to a heartbeat sent before a change this worker
made itself (it would undo that change until the next beat). Jobs a turn in flight claims
from a queue just left arrive after the change: for a while after each change, every step
looks for running jobs of queues the worker no longer has.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence

from plunder import errors, payload
from plunder.model import Claim, ErrorInfo, Failure, Session
from plunder.protocol import Outcome, Release, WorkerProtocol
from plunder.slots import Slots, Wake
from plunder.states import Outcome as RunOutcome

log = logging.getLogger("plunder.worker")
SETTLE = 30.0  # seconds after a change during which jobs of left queues are looked for


class Membership:
    """The queues of a worker (``queues``, its list, changed in place by the main thread
    alone) as its session's row has them, and the jobs of the queues it left."""

    def __init__(
        self, queues: list[str], slots: Slots, *, grace: float, defaults: Sequence[str] = ()
    ) -> None:
        """``grace``: seconds the running jobs of a left queue have to finish;
        ``defaults``: the queues the app's tasks name (another is likely a typo)."""
        self.queues = queues
        self.defaults = frozenset(defaults)
        self.slots = slots
        self.grace = grace
        self._on_work: Callable[[list[str]], Callable[[], None]] | None = None
        self._unwatch: Callable[[], None] = lambda: None
        self._lock = threading.Lock()
        self._heard: tuple[str, ...] | None = None  # the row's queues, not applied yet
        self._changed_at = float("-inf")  # when a change of this worker's was sent
        self._settle_until = float("-inf")  # look for jobs of left queues until then
        self._leaving: dict[int, tuple[Claim, float]] = {}  # job id: claim, deadline
        self._unsent: list[Outcome] = []  # given back, not written yet

    # -- from any thread -----------------------------------------------------------------
    def change(
        self,
        link: WorkerProtocol,
        session: Session | None,
        *,
        add: Sequence[str] = (),
        remove: Sequence[str] = (),
    ) -> tuple[str, ...]:
        """Join ``add`` and leave ``remove`` now (one call to the session's store); the
        session's queues after. The main loop follows at once."""
        for queue in (*add, *remove):
            payload.check_queue(queue)
        if session is None:
            raise errors.SessionGone("the worker has no session now: no queues to change")
        sent = time.monotonic()
        queues = link.change_queues(session.id, add=add, remove=remove)
        with self._lock:
            self._changed_at = max(self._changed_at, sent)
        self.heard(queues, sent)
        return queues

    def heard(self, queues: Sequence[str], sent: float) -> None:
        """The session's queues, as an answer to a call sent at ``sent`` (time.monotonic())
        has them: the main loop takes them at its next step, woken if they differ."""
        with self._lock:
            if sent < self._changed_at:
                return  # older than a change made here since: the next beat says
            self._heard = tuple(queues)
        if list(queues) != self.queues:
            self.slots.outcomes.put(Wake())

    def watch(self, on_work: Callable[[list[str]], Callable[[], None]]) -> None:
        """Wake-ups for the queues, now and as they change: ``on_work(queues)`` registers
        them and returns the function that unregisters them."""
        self._on_work = on_work
        self._unwatch = on_work(list(self.queues))

    def unwatch(self) -> None:
        self._unwatch()

    # -- the main thread -----------------------------------------------------------------
    def follow(self, link: WorkerProtocol, session: Session | None) -> None:
        """Take the queues heard, and give back the jobs of left queues whose grace ran
        out."""
        with self._lock:
            heard, self._heard = self._heard, None
        now = time.monotonic()
        if heard is not None and list(heard) != self.queues:
            self._apply(heard, now)
        if now < self._settle_until:
            self._look_for_leavers(now)
        if self._leaving:
            self._unsent += self._overdue(now)
        if self._unsent and session is not None:
            self._give_back(link, session.id)

    def next_due(self) -> float:
        """When the grace of a job of a left queue runs out (time.monotonic())."""
        deadlines = [deadline for _, deadline in self._leaving.values()]
        return min(deadlines, default=float("inf"))

    def _apply(self, queues: tuple[str, ...], now: float) -> None:
        left = [q for q in self.queues if q not in queues]
        joined = [q for q in queues if q not in self.queues]
        self.queues[:] = queues
        if self._on_work is not None:  # the hub wakes the worker for these from now on
            old, self._unwatch = self._unwatch, self._on_work(list(queues))
            old()
        self._settle_until = now + max(SETTLE, self.grace)
        # a queue joined again: its jobs are no longer leaving
        running = {h.job.id: payload.base_queue(h.job.queue) for h in self.slots.handles()}
        for job_id in [j for j in self._leaving if running.get(j) in queues]:
            del self._leaving[job_id]
        log.info(
            "queues now %s (joined: %s; left: %s)",
            ",".join(queues) or "none",
            ",".join(joined) or "none",
            ",".join(left) or "none",
        )
        unknown = [q for q in joined if q not in self.defaults]
        if unknown and self.defaults:  # as -q allows: jobs enqueued there with queue=...
            log.warning(
                "joined queue(s) %s, which no task of this app names: only jobs enqueued "
                "there with queue=... run here",
                ",".join(unknown),
            )

    def _look_for_leavers(self, now: float) -> None:
        """Running jobs of queues the worker left get the grace period, from now."""
        for handle in self.slots.handles():
            job = handle.job
            left = payload.base_queue(job.queue) not in self.queues  # "q~3" is of q
            if left and job.id not in self._leaving:
                self._leaving[job.id] = (handle.ctx.claim, now + self.grace)

    def _overdue(self, now: float) -> list[Outcome]:
        """Stop the jobs of left queues past their grace: each given back, or ended as lost
        where its retry_on_lost is off (a started job that must not run twice)."""
        running = {h.job.id: h for h in self.slots.handles()}
        outcomes: list[Outcome] = []
        for job_id, (claim, deadline) in list(self._leaving.items()):
            handle = running.get(job_id)
            if handle is None or handle.job.attempt != claim.attempt:
                del self._leaving[job_id]  # it finished (or was stopped) meanwhile
                continue
            if deadline > now:
                continue
            del self._leaving[job_id]
            self.slots.forget(job_id)  # its slot stays taken until the task returns
            self.slots.stop(handle, "its worker left the queue")
            job = handle.job
            log.warning(
                "job %d (%s): still running %.0fs after its worker left queue %s; stopped",
                job.id,
                job.task,
                self.grace,
                job.queue,
            )
            if job.retry_on_lost:
                outcomes.append(Release(claim))
            else:
                info = ErrorInfo(
                    "plunder.WorkerLost",
                    f"its worker left queue {job.queue} and stopped this attempt unfinished "
                    "after the grace period; not run again (retry_on_lost=False)",
                )
                logs = tuple(handle.ctx.log_lines)
                outcomes.append(Failure(claim, info, None, logs, RunOutcome.LOST))
        return outcomes

    def _give_back(self, link: WorkerProtocol, session_id: str) -> None:
        outcomes, self._unsent = self._unsent, []
        try:
            link.exchange(session_id, outcomes, None)
        except errors.SessionGone:
            return  # the session's jobs are lost with it; the heartbeat says so too
        except errors.StoreError as exc:
            log.warning("could not give back %d jobs of left queues: %s", len(outcomes), exc)
            self._unsent = outcomes + self._unsent  # again at the next step
