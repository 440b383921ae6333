"""A worker's session, kept alive and watched.

```
 hub thread ── every heartbeat_interval: beat() ── session_heartbeat ──▶ database
                 │  renewed: trusted until session_expiry after it was *sent*;
                 │  claims to stop (cancelled, timed out, superseded); claims unknown
                 └─ gone (the database clock says so) ──────────────────────▶ lost()
 watchdog    ── watch(): no renewal for session_expiry by this process's
                 monotonic clock, however long a heartbeat call hangs ──────▶ lost()
```

The worker answers each finding through the callables it gives: it stops the claims the
database says are no longer current, and on a lost session stops every task and cuts every
call in flight. Claims the database has running under the session but the worker did not
report are kept here until the worker's main thread looks at them (``give_back``).
Every interval and deadline named here is the worker's ``config.WorkerDeadlines``.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from plunder import errors, policy
from plunder.config import WorkerDeadlines
from plunder.model import Claim, Heartbeat, Partitioning, Session
from plunder.protocol import Beat, Release, WorkerProtocol

log = logging.getLogger("plunder.worker")


class Liveness:
    def __init__(
        self,
        link: WorkerProtocol,
        deadlines: WorkerDeadlines,
        *,
        session: Callable[[], Session | None],
        quiet: Callable[[], bool],
        claims: Callable[[], list[Claim]],
        stop: Callable[[Sequence[Claim]], None],
        lost: Callable[[], None],
        free: Callable[[], int] | None = None,
        queues: Callable[[tuple[str, ...], float], None] | None = None,
        partitions: Callable[[Sequence[Partitioning]], None] | None = None,
        labels: Callable[[], tuple[str, ...]] | None = None,
    ) -> None:
        """``session()``: the session to keep (None while there is none); ``quiet()``: no
        heartbeat now (the session is lost already, or being closed); ``claims()``: the
        claims the worker holds; ``free()``: its free slots, recorded with each heartbeat;
        ``queues(queues, sent)``: the session's queues, as a heartbeat sent then had them;
        ``partitions(found)``: its partitioned queues and the partitions it owns.
        ``stop`` and ``lost`` are called with what a heartbeat or the watchdog found;
        ``deadlines`` say when (see WorkerDeadlines)."""
        self.link = link
        self.deadlines = deadlines
        self._session = session
        self._quiet = quiet
        self._claims = claims
        self._stop = stop
        self._lost = lost
        self._free = free
        self._queues = queues
        self._partitions = partitions
        self._labels = labels  # the worker's labels, sent with each heartbeat
        self._lock = threading.Lock()
        self._unknown: set[Claim] = set()  # reported, not yet looked at
        self._unknown_at = 0.0  # when a report last came in (time.monotonic())
        # when the last renewal that succeeded was sent (time.monotonic()); a new session
        # sets it before the watchdog sees the session
        self.last_beat = time.monotonic()

    def beat(self, connection: Any) -> None:
        """One heartbeat, on the hub thread, over the hub's dedicated connection."""
        session = self._session()
        if session is None or self._quiet():
            return
        try:
            beat, started = self.renew(session.id, self._claims(), connection)
        except errors.StoreError as exc:
            if self._session() is not session:  # renewed meanwhile: not about this one
                return
            silent = time.monotonic() - self.last_beat
            log.warning("heartbeat failed (%s); last renewed %.1fs ago", exc, silent)
            if silent > self.deadlines.session_expiry:
                log.error(
                    "session %s could not be renewed for longer than its expiry: "
                    "assuming it is gone",
                    session.id,
                )
                self._lost()
            return
        if self._session() is not session:  # lost and renewed while the beat was on its way
            return
        if not beat.alive:
            if self._quiet():  # closed by the worker while the beat was on its way
                return
            log.error("session %s is gone (expired or closed by the database clock)", session.id)
            self._lost()
            return
        self._renewed(beat, started)

    def _renewed(self, beat: Heartbeat, started: float) -> None:
        """What a heartbeat that renewed the session (sent at ``started``) says."""
        # trust starts from when the renewal was sent, never from when a slow one returned
        self.last_beat = started
        if beat.stop:
            self._stop(beat.stop)
        if beat.unknown:
            self.report_unknown(beat.unknown)
        if beat.queues is not None and self._queues is not None:
            self._queues(beat.queues, started)
        if beat.partitions is not None and self._partitions is not None:
            self._partitions(beat.partitions)

    def report_unknown(self, claims: Sequence[Claim]) -> None:
        """Claims the database has running under the session that the worker did not
        report, for ``give_back``."""
        with self._lock:
            self._unknown.update(claims)
            self._unknown_at = time.monotonic()

    def give_back(self, held: Callable[[], set[int]], in_flight_since: float | None) -> None:
        """On the thread that claims and acknowledges: the reported claims whose jobs are
        not ``held()`` by the worker go back to the queue at once, the attempt not counted.

        Most were claimed, finished or acknowledged while the report was on its way, and
        here that shows: they are running, or their results wait to be sent, or their
        claim is already spent (and the release, fenced by the claim, changes nothing). The
        rest were claimed by a transaction whose answer never arrived (the connection died
        after the commit): no task runs them, and without this they would stay running for
        as long as the worker lives. A claim still on its way may be committed already, and
        seen by a report, before the worker has read it: while a turn sent at
        ``in_flight_since`` is unread, a report that came in after it waits."""
        session = self._session()
        with self._lock:
            if in_flight_since is not None and in_flight_since <= self._unknown_at:
                return  # the report may have seen the claims of the turn in flight: later
            unknown, self._unknown = self._unknown, set()
        if not unknown or session is None:
            return
        kept = held()
        orphans = [c for c in unknown if c.job_id not in kept and c.session_id == session.id]
        if not orphans:
            return
        try:
            reply = self.link.exchange(session.id, [Release(c) for c in orphans], None)
            released = reply.released.accepted
        except errors.StoreError as exc:
            log.warning("could not give back %d unstarted claims: %s", len(orphans), exc)
            return  # the next heartbeat reports them again
        for claim in released:
            log.warning(
                "job %d attempt %d: claimed by this worker but never started (the claim's "
                "answer was lost); given back to the queue",
                claim.job_id,
                claim.attempt,
            )

    def renew(
        self, session_id: str, claims: list[Claim], connection: Any
    ) -> tuple[Heartbeat, float]:
        """Send one heartbeat; return it and when the renewal that succeeded was sent.

        A busy answer (a serialization failure, which CockroachDB raises at COMMIT, or a
        deadlock) is sent again as a whole after the fixed busy interval, until the next
        heartbeat would be due: a few busy answers in a row must not cost a healthy worker
        its session. A lost connection is not retried here; the hub reconnects first."""
        deadline = time.monotonic() + self.deadlines.renewal_window
        backoff = policy.BusyBackoff()
        while True:
            sent = time.monotonic()
            try:
                free = None if self._free is None else self._free()
                labels = None if self._labels is None else self._labels()
                beat = self.link.heartbeat(
                    Beat(session_id, tuple(claims), free, labels), via=connection
                )
                return beat, sent
            except errors.StoreBusy:
                wait = backoff.next_wait()
                lost = getattr(connection, "closed", False) or getattr(connection, "broken", False)
                if wait is None or lost or time.monotonic() + wait >= deadline:
                    raise
                time.sleep(wait)

    def watch(self, stop: threading.Event) -> None:
        """The watchdog's loop, until ``stop``: trust in the session ends
        ``session_expiry`` after the last renewal was sent, by this process's monotonic
        clock, even if the heartbeat call itself hangs.

        Two heartbeat intervals without a renewal are already news, said once: a database
        that hangs gives no error to log, and its calls are only cut at their deadlines."""
        deadlines = self.deadlines
        interval, expiry = deadlines.heartbeat_interval, deadlines.session_expiry
        warned = None  # the renewal after which we said so
        while not stop.wait(deadlines.watch_period):
            # the session first: a new one sets last_beat before it is seen, so the pair
            # read in this order is never a new session with the old one's last renewal
            trusted = self._session() is not None and not self._quiet()
            last = self.last_beat
            silent = time.monotonic() - last
            if trusted and warned != last and deadlines.slow_after < silent <= expiry:
                warned = last
                log.warning(
                    "database slow or unreachable: no heartbeat renewal for %.1fs "
                    "(one is due every %.1fs)",
                    silent,
                    interval,
                )
            if trusted and silent > expiry:
                log.error(
                    "no heartbeat renewal for %.1fs (expiry %.1fs): assuming the session is gone",
                    silent,
                    expiry,
                )
                self._lost()
