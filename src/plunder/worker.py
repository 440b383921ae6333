"""The worker: one process, one session, N slots.

```
 main thread   ── turn: results out, up to the free slots in (plunder.turns) ─▶ start ─┐
                 ▲                                                                      │
                 └──── outcomes (plunder.slots), or a wake-up, or the poll interval ◀───┘
 heartbeat     ── every heartbeat_interval: extend the session, learn which claims to
                  stop and whether the session is gone (plunder.liveness); a watchdog
                  judges it lost once not renewed for the session expiry
 streamer      ── every 50 ms while jobs run: write buffered stream events and progress,
                  fenced
 janitor       ── every janitor_interval: maintenance while holding the lease
```

Everything the worker asks of wherever its jobs live goes through the worker protocol
(plunder.protocol): by default the app's database (plunder.store.link), where the
heartbeat runs on the app's hub, wake-ups come from it, and one process of the fleet takes
janitor duty.

The worker never goes on working under a dead session: when the heartbeat learns the
session is gone — or cannot renew it for longer than the session expiry, by the local
monotonic clock — every running task is stopped, their results are discarded (the store
would refuse them anyway), and a new session is opened.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import socket
import threading
import time
from collections.abc import Callable, Mapping

from plunder import errors, halting, policy, stopping, tally, tracing
from plunder.admitter import Admitter
from plunder.app import App
from plunder.config import WorkerDeadlines
from plunder.context import LinkSink, Sink
from plunder.execution import stream_loop
from plunder.idle import IdleClaims
from plunder.janitor import Janitor, own_store
from plunder.labels import Labels
from plunder.liveness import Liveness
from plunder.membership import Membership
from plunder.model import AckResult, Claim, Session
from plunder.options import WorkerOptions
from plunder.ownership import Ownership
from plunder.protocol import Hello, WorkerProtocol
from plunder.slots import Slots, Wake
from plunder.store.base import Store
from plunder.store.link import StoreLink
from plunder.turns import Turns
from plunder.waker import watch_loop

log = logging.getLogger("plunder.worker")
RECONNECT_CAP = policy.RECONNECT_CAP
MIN_WAIT = 0.05  # a due job we could not claim (locked, or left to other workers): look again


class Worker:
    """A worker for ``app``'s tasks. Its jobs come through ``link`` (the worker protocol:
    plunder.protocol), by default the app's database: its store is opened with the
    worker's connection budget (``options.connections``) and deadlines (``deadlines``, see
    WorkerDeadlines): the app's own store, if that is not open yet; else (the process
    enqueued or read before, as a web app that also runs a worker does) a store of the
    worker's own on the same database, closed when ``run()`` returns. With another link
    there is no janitor and no wake-ups (the worker polls), and ``ctx.transaction()`` is
    refused (no database connection to give the task)."""

    def __init__(
        self,
        app: App,
        options: WorkerOptions | None = None,
        *,
        link: WorkerProtocol | None = None,
        labels: Mapping[str, str] | None = None,
    ) -> None:
        """``labels``: the worker's (docs/guide/affinity.md), instead of options.labels."""
        self.app = app
        options = options or WorkerOptions()
        if labels is not None:
            options = dataclasses.replace(options, labels=labels)
        self.options = options = options.checked(app)
        self.settings = app.settings
        self.name = options.name or f"{socket.gethostname()}:{os.getpid()}"
        self._app_name = f"plunder:worker:{self.name}"[:60]
        self.deadlines = WorkerDeadlines.of(self.settings)
        self.queues = list(options.queues or app.registry.queues())
        self.tasks = app.registry.names()
        self.link, self.store, self._owns_store = self._connect(link)
        self.session: Session | None = None
        self.error: BaseException | None = None  # what ended run(), raised from a turn
        self.stats = {"claimed": 0, "succeeded": 0, "failed": 0, "stale": 0, "sessions": 0}
        self._stop = threading.Event()  # stop claiming, drain, exit
        self._halt = halting.Halt(lambda why: self.link.cut(why, final=True))  # at once
        self._session_lost = threading.Event()
        # the session is being closed: gone to the heartbeat, and nothing to cut (a lost
        # session cuts the store's calls, and the store may serve other workers too)
        self._closing = False
        self._stream_wake = threading.Event()
        sink: Sink = self.store if self.store is not None else LinkSink(self.link)
        get, wake = app.registry.get, self._stream_wake.set
        self._slots = Slots(
            options.concurrency, pool=options.pool, task=get, sink=sink, on_stream=wake
        )
        self.labels = self._slots.labels = Labels(options.labels)
        self._membership = Membership(
            self.queues, self._slots, grace=options.grace, defaults=app.registry.queues()
        )
        self._turns = self._make_turns()
        self._liveness = self._make_liveness()
        self._services_stop = threading.Event()
        self._admitter = Admitter(self.store, self._services_stop)  # see plunder.admitter
        self._slots.on_acknowledged = self._admitter.add
        self._services: list[threading.Thread] = []
        self._unregister: list[Callable[[], None]] = []  # the heartbeat and wake-up, at the hub

    def _connect(self, link: WorkerProtocol | None) -> tuple[WorkerProtocol, Store | None, bool]:
        """The link, and the store behind it where it is the app's database (the app's
        own, or one of the worker's: owned)."""
        if link is not None:
            return link, None, False
        # the connection budget: one for work (+1 for turns sent ahead, see plunder.turns),
        # one for the hub (the janitor works on these, see janitor.own_store)
        store, owned = self.app.store_for(
            pool_size=self.options.connections,
            application_name=self._app_name,
            **self.deadlines.store_options(),
        )
        return StoreLink(store), store, owned

    def _make_turns(self) -> Turns:
        self._ownership = Ownership()  # the partitions the session owns, as beats hear
        turns = Turns(
            self.link,
            self._slots,
            depth=self.options.depth,
            queues=self.queues,
            tasks=self.tasks,
            session=lambda: self.session,
            stopping=self._stop.is_set,
            given_up=lambda: self._session_lost.is_set() or self._halt.is_set() or self._closing,
            lost=self._session_lost.set,
            counted=self._count,
            stats=self.stats,
            pause=lambda: self._stop.wait(min(self.settings.poll_interval, RECONNECT_CAP)),
            ownership=self._ownership,
        )
        # claims for the idle main loop, by the thread that hears of work (plunder.idle)
        self._idle = IdleClaims(lambda: turns.claim_idle(self._free_slots()), self._slots.next_due)
        return turns

    def _make_liveness(self) -> Liveness:
        return Liveness(
            self.link,
            self.deadlines,
            session=lambda: self.session,
            quiet=lambda: self._session_lost.is_set() or self._closing,
            claims=self._slots.claims,
            stop=lambda claims: self._slots.stop_claims(
                claims, "cancelled, timed out or re-claimed elsewhere"
            ),
            lost=self._lose_session,
            free=self._free_slots,
            queues=self._membership.heard,
            partitions=self._ownership.heard,
            labels=self.labels.held,
        )

    # -- lifecycle ------------------------------------------------------------------------
    def run(self, *, install_signals: bool = True) -> None:
        """Work until asked to stop (SIGTERM/SIGINT, or ``stop()``)."""
        if install_signals:
            stopping.install_signals(self._stop, self._halt, self.options.grace)
        self._halt.watch(self._stop, self.deadlines.call_timeout, self._slots.handles)
        self._open_session()
        self._start_services()  # heartbeats first: ready() may wait for connections
        if not self._halt.is_set():
            self._turns.ready()
        log.info(
            "worker %s: queues %s, tasks %s, concurrency %d",
            self.name,
            ",".join(self.queues),
            ",".join(self.tasks),
            self.options.concurrency,
        )
        try:
            while not self._stop.is_set():
                self.step()
            self._drain()
        except BaseException as exc:  # raised, once the worker has closed
            self.error = exc
            raise
        finally:
            try:
                self._close()
            finally:
                self._halt.ended(self.store if self._owns_store else None)

    def join(self, *queues: str) -> tuple[str, ...]:
        """Claim from ``queues`` too, from now on (from any thread, while ``run()`` has a
        session); the session's queues after. See plunder.membership."""
        return self._membership.change(self.link, self.session, add=queues)

    def leave(self, *queues: str) -> tuple[str, ...]:
        """Claim no more from ``queues``: their running jobs have the grace period to
        finish, then go back to the queue. The session's queues after."""
        return self._membership.change(self.link, self.session, remove=queues)

    def stop(self, *, graceful: bool = True) -> None:
        self._stop.set()
        if not graceful:
            self._halt.set()

    def _free_slots(self) -> int:
        """The slots free for new jobs (none once stopping), as the session records them
        at each heartbeat: from any thread."""
        return 0 if self._stop.is_set() else self._slots.free()

    def _open_session(self) -> None:
        backoff = 0.1
        while not self._halt.is_set():
            try:
                if self.store is not None:  # claimed from at once, before a heartbeat
                    self.app.declare_partitions()
                    self.app.declare_schedules()
                    self._ownership.declared(self.store.partition_counts())
                session = self.link.open(self._hello())
            except errors.StoreError as exc:
                log.warning("cannot open a session (%s); retrying in %.1fs", exc, backoff)
                self._halt.wait(backoff)
                backoff = min(backoff * 2, RECONNECT_CAP)
                continue
            self._liveness.last_beat = time.monotonic()  # before the watchdog sees it
            self.session = session
            self.stats["sessions"] += 1
            tally.event("sessions_opened")
            log.info("session %s opened", session.id)
            return

    def _hello(self) -> Hello:
        return Hello(
            name=self.name,
            host=socket.gethostname(),
            pid=os.getpid(),
            queues=tuple(self.queues),
            tasks=tuple(self.app.registry.infos()),
            expiry=self.deadlines.session_expiry,
            free_slots=self._free_slots(),
            labels=self.labels.held(),
            slots=self.options.concurrency,
        )

    def _start_services(self) -> None:
        self._unregister = self._beat_and_wake()
        self._services = [
            self._thread(
                "streamer",
                lambda: stream_loop(self._slots.handles, self._stream_wake, self._services_stop),
            ),
            self._thread("watchdog", lambda: self._liveness.watch(self._services_stop)),
        ]
        if self.store is None:  # heartbeats on a thread of their own, not the hub's
            self._services.append(self._thread("heartbeat", self._beat_loop))
        elif self.options.janitor:
            janitor = Janitor(
                self.store,
                self.settings,
                holder=f"{self.name}:{id(self):x}",
                own_store=own_store(self.store, self.settings, f"{self._app_name}:janitor"),
            )
            self._services.append(self._thread("janitor", lambda: janitor.run(self._services_stop)))
        if self.link.long_polls:  # wake-ups from the gateway while jobs run
            watch = (self.link, self._slots, self.queues, lambda: self.session)
            due = self._turns.due_request
            self._services.append(
                self._thread(
                    "waker", lambda: watch_loop(*watch, self._services_stop, due_request=due)
                )
            )
        for thread in self._services:
            thread.start()

    @staticmethod
    def _thread(name: str, target: Callable[[], object]) -> threading.Thread:
        return threading.Thread(target=target, name=f"plunder-{name}", daemon=True)

    def _beat_and_wake(self) -> list[Callable[[], None]]:
        """Heartbeats and wake-ups at the app's hub, when the jobs are in its database."""
        if self.store is None:
            return []
        hub = self.app.hub
        self._membership.watch(lambda queues: hub.on_work(queues, self._wake))
        return [
            hub.every(
                self.deadlines.heartbeat_interval,
                self._liveness.beat,
                deadline=self.deadlines.heartbeat_timeout,
            ),
            self._membership.unwatch,
        ]

    def _beat_loop(self) -> None:
        """Heartbeats over another link (no hub): every heartbeat_interval."""
        while not self._services_stop.wait(self.deadlines.heartbeat_interval):
            try:
                self._liveness.beat(None)
            except Exception:  # a bug: logged, and the watchdog still guards the session
                log.exception("heartbeat failed")

    def _wake(self) -> None:
        """From the hub thread: work may have appeared in one of our queues."""
        if self._services_stop.is_set():  # a stopped worker's queue is read no more
            return
        wake = True
        try:  # an idle main loop is claimed for, and sleeps on (plunder.idle)
            wake = self._idle.woken()
        finally:  # woken also if that raised (the hub logs it)
            if wake:
                self._slots.outcomes.put(Wake())

    # -- one turn of the loop -------------------------------------------------------------
    def step(self) -> None:
        """Take in what finished, stop what ran past its deadline, then one turn: the
        results out, as many jobs in as slots are free. Wait only with nothing to do."""
        with self._idle.step() as claimed:
            wait = self._step(claimed)
        if wait is not None:
            self._slots.collect(block=True, timeout=wait)

    def _step(self, claimed: bool) -> float | None:
        """A step but its wait (None: step again at once). ``claimed``: see IdleClaims.step."""
        if self._session_lost.is_set():
            self._abandon_session("Opening a new session.")
            self._open_session()
        self._membership.follow(self.link, self.session)
        slots, turns = self._slots, self._turns
        slots.collect(block=False)
        if not turns.in_flight():
            turns.linger()
        slots.enforce_deadlines()
        self._give_back_unknown()
        free = 0 if self._stop.is_set() or not self.queues or claimed else slots.free()
        if turns.turn(free) and turns.more:
            return None  # the claim came back full: more work may wait right now
        if turns.children and free:
            return None  # it completed parents: their children may be pending now
        if turns.in_flight() or slots.outbox:
            return None  # the next turn is on its way, or results came in after this one
        wait = self._wait_time()
        if wait > 0 and self.store is not None and not slots.busy() and not self._stop.is_set():
            self._idle.park(wait)  # the hub thread claims, hearing of work (plunder.idle)
        return wait

    def _wait_time(self) -> float:
        """Until an outcome or a wake-up arrives, but no longer than the poll interval, the
        next due delayed job (database clock) or the next task deadline."""
        if not self._slots.outcomes.empty():  # a wake-up came during the turn (a child its
            return 0.0  # results released): claim now, without reading the next due job
        wait = self.settings.poll_interval
        free = self._slots.busy() < self.options.concurrency and not self._stop.is_set()
        free = free and bool(self.queues)  # none left: nothing to claim
        if free and self.link.long_polls and not self._slots.busy():
            return 0.0  # the exchange itself waits for work, at the far end
        if free and not self.link.long_polls:  # else the waker reads it (plunder.waker)
            due = self._turns.next_due()
            if due is not None:  # 0.0: claim again at once; else a delayed job or retry
                wait = 0.0 if due == 0.0 else min(wait, max(due, MIN_WAIT))
        due = min(self._slots.next_due(), self._membership.next_due())
        return min(wait, max(0.0, due - time.monotonic()))

    def _give_back_unknown(self) -> None:
        """Claims the heartbeat reported that no task runs (see Liveness.give_back)."""
        slots, turns = self._slots, self._turns
        self._liveness.give_back(lambda: turns.held() | slots.running_ids(), turns.sent_at())

    def _count(self, ack: AckResult, kind: str) -> None:
        self.stats[kind] += len(ack.accepted)
        tally.acknowledged(ack, kind)
        tracing.acknowledged(ack, kind)
        self.stats["stale"] += len(ack.stale)
        self._admitter.ended(self._slots.limited, ack)  # admissions of their limit keys
        for claim in ack.stale:
            log.warning(
                "job %d attempt %d: result refused, the claim is no longer current "
                "(cancelled, timed out or rescued elsewhere)",
                claim.job_id,
                claim.attempt,
            )

    # -- session loss (see plunder.liveness) ----------------------------------------------
    def _lose_session(self) -> None:
        """From the heartbeat thread: stop every task now, give up every call in flight
        (the main loop's, the tasks' own transactions: all of them would be refused now,
        and one stuck on a hung peer would never come back), then wake the main loop."""
        if self._closing or self._halt.is_set():  # closed, or left to expire, on purpose
            return
        self._session_lost.set()
        self._slots.stop_all("the worker's session was lost", forget=False)
        cut = self.link.cut("the worker's session was lost")
        if cut:
            log.warning("gave up %d database calls in flight", cut)
        self._slots.outcomes.put(Wake())

    def _abandon_session(self, then: str) -> None:
        """The session is lost: stop its tasks, drop its results (the store would refuse
        them), and close it if the database still thinks it lives."""
        handles = self._slots.stop_all("the worker's session was lost", forget=True)
        dropped = self._turns.drop()
        log.error(
            "SESSION LOST: stopped %d running tasks and discarded %d unacknowledged "
            "results; their jobs will run again elsewhere. %s",
            len(handles),
            dropped,
            then,
        )
        # no session until a new one is open: the heartbeat and the watchdog leave a
        # worker alone while it reconnects, or a slow reconnect (a database still out of
        # reach) would be judged a second loss and the fresh session thrown away at once
        lost, self.session = self.session, None
        self._session_lost.clear()
        if lost is not None:
            try:  # if the database still thinks it lives, release its claims at once
                self.link.close(lost.id, lost=True)
            except errors.StoreError as exc:
                log.warning("could not close the lost session (it will expire): %s", exc)

    # -- shutdown -------------------------------------------------------------------------
    def _drain(self) -> None:
        """Graceful: let running tasks finish within the grace period, then release."""
        slots, turns = self._slots, self._turns
        while turns.in_flight() and not self._halt.is_set():
            turns.read()  # their jobs are ours: they run, within the grace period
        deadline = time.monotonic() + self.options.grace
        while slots.handles() and not self._halt.is_set() and time.monotonic() < deadline:
            if self._session_lost.is_set():  # stopping: no new session to stop in
                self._abandon_session("Stopping.")
                break
            slots.collect(block=True, timeout=min(0.1, max(0.0, deadline - time.monotonic())))
            slots.enforce_deadlines()
            turns.acknowledge()
        if self._halt.is_set():
            return
        slots.collect(block=False)  # what finished meanwhile is acknowledged, not released
        turns.acknowledge()

    def _close(self) -> None:
        """Stop what still runs (past the grace period, or a turn raised), write the
        results on their way, and close the session, which releases its jobs at once."""
        self._idle.close()  # before the turns: the hub thread sends none now
        self._services_stop.set()
        self._stream_wake.set()  # the streamer may sleep, with nothing running
        self._admitter.wake()
        for unregister in self._unregister:  # the hub outlives the worker (it is the app's)
            unregister()
        left = self._slots.stop_all("the worker is shutting down", forget=True)
        self._slots.close(timeout=halting.RECUT if self._halt.is_set() else 5)
        self._turns.close()
        if not self._halt.is_set():
            self._close_gracefully([handle.job.claim for handle in left])
        if self._halt.is_set():  # at once, or while closing: its last call has ended
            self._closing = halting.stopped(self.session.id if self.session else "?")

    def _close_gracefully(self, started: list[Claim]) -> None:
        for thread in self._services:
            self._halt.join(thread, timeout=5)
        # results on their way are written before the session closes: closing releases
        # the session's running jobs, and those would run again. Results still unwritten
        # (a database out of reach) leave the session to expire instead.
        outbox = self._slots.outbox
        written = self._turns.acker.write(  # not sent if a turn raised
            outbox.completions, outbox.failures, deadline=time.monotonic() + self.options.grace
        )
        self._closing = True  # closed below, or left to expire: no more heartbeats
        if self._halt.is_set():
            return
        if not written:
            log.warning(
                "results still unwritten after %.0fs; session %s will expire and the "
                "janitor will judge its jobs",
                self.options.grace,
                self.session.id if self.session else "?",
            )
            return
        if self.session is not None:
            # a stopped task may still run (a thread cannot be killed): its job is
            # released, or ended where its retry_on_lost forbids another run
            self._close_session(started)

    def _close_session(self, started: list[Claim]) -> None:
        assert self.session is not None
        try:
            released = self.link.close(self.session.id, started=started)
        except errors.StoreError as exc:
            log.warning("could not close session (it will expire): %s", exc)
            return
        log.info("session %s closed; %d unfinished jobs released", self.session.id, len(released))
