"""The worker: one process, one session, N slots.

```
 main thread   ── claim (free slots, one batch) ─▶ start ─▶ outcomes ─▶ acknowledge (batch) ─┐
                 ▲                                                                            │
                 └──────────────── wait for an outcome or the poll interval ◀─────────────────┘
 turns         ── acknowledge and claim in one statement; on PostgreSQL a busy worker
                  keeps the next one or two on their way while it starts the last one's
                  jobs (plunder.turns); results no turn carries are written by
                  plunder.acker
 heartbeat     ── on the hub, every heartbeat_interval: extend the session, learn which
                  claims to stop and whether the session is gone (plunder.liveness); a
                  watchdog judges it lost once not renewed for the session expiry
 streamer      ── every 50 ms: write buffered stream events and progress, fenced
 janitor       ── every janitor_interval: maintenance while holding the lease
```

The worker never goes on working under a dead session: when the heartbeat learns the
session is gone — or cannot renew it for longer than the session expiry, by the local
monotonic clock — every running task is stopped, their results are discarded (the store
would refuse them anyway), and a new session is opened.
"""

from __future__ import annotations

import contextlib
import logging
import os
import queue
import signal
import socket
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from types import FrameType
from typing import Any

from plunder import errors, payload, policy, protocol
from plunder.acker import ACK_BATCH, Acker
from plunder.app import App
from plunder.config import WorkerDeadlines
from plunder.context import Context, LinkSink, Sink
from plunder.execution import (
    AsyncRunner,
    Handle,
    Outcome,
    ThreadRunner,
    after_acknowledged,
    failure,
    failure_of,
    stream_loop,
)
from plunder.janitor import Janitor, own_store
from plunder.liveness import Liveness
from plunder.model import (
    AckResult,
    Claim,
    Completion,
    ErrorInfo,
    Failure,
    JobRecord,
    Session,
    build_completion,
)
from plunder.pool import ProcessRunner
from plunder.protocol import ClaimRequest, Hello, WorkerProtocol
from plunder.states import Outcome as RunOutcome
from plunder.stopping import Stopping
from plunder.store.base import Store, TurnPipe
from plunder.store.link import StoreLink
from plunder.turns import TurnsAhead

log = logging.getLogger("plunder.worker")
ACK_LINGER = 0.002  # seconds a turn may wait for more results to send with it
RECONNECT_CAP = policy.RECONNECT_CAP
MIN_WAIT = 0.05  # a due job we could not claim (locked, or left to other workers): look again


@dataclass(frozen=True)
class _Stop:
    """Posted by the heartbeat thread to wake the main loop: forget these claims (their
    tasks were already told to stop), or look at a lost session."""

    claims: tuple[Claim, ...] = ()


@dataclass(frozen=True)
class WorkerOptions:
    queues: tuple[str, ...] | None = None  # None: every queue the app's tasks use
    concurrency: int = 4
    name: str | None = None
    janitor: bool = True
    grace: float = 30.0
    pool: str | None = None  # "process" runs every plain-function task in a process
    # PostgreSQL: a busy worker sends its next turns before it starts the jobs of the last
    # (plunder.turns), on a connection it holds while busy; off, one connection less
    turns_ahead: bool = True

    @property
    def connections(self) -> int:
        """The pooled connections the worker's own calls need (the hub's is the app's)."""
        return 2 if self.turns_ahead else 1


class Worker(TurnsAhead):
    def __init__(
        self,
        app: App,
        options: WorkerOptions | None = None,
        *,
        link: WorkerProtocol | None = None,
    ) -> None:
        """A worker for ``app``'s tasks. Its jobs come through ``link`` (the worker
        protocol: plunder.protocol), by default the app's database: its store is opened
        with the worker's connection budget (``options.connections``) and deadlines
        (``deadlines``, see WorkerDeadlines): the app's own store, if that is not open yet;
        else (the process enqueued or read before, as a web app that also runs a worker
        does) a store of the worker's own on the same database, closed when ``run()``
        returns. With another link there is no janitor and no wake-ups (the worker polls),
        and ``ctx.transaction()`` is refused (no database connection to give the task)."""
        self.app = app
        self.options = options or WorkerOptions()
        if self.options.concurrency < 1:
            raise errors.ConfigError("concurrency must be at least 1")
        if not len(app.registry):
            raise errors.ConfigError("the app has no tasks: nothing to work on")
        self.settings = app.settings
        self.name = self.options.name or f"{socket.gethostname()}:{os.getpid()}"
        self._app_name = f"plunder:worker:{self.name}"[:60]
        self.deadlines = WorkerDeadlines.of(self.settings)
        self.queues = list(self.options.queues or app.registry.queues())
        self.tasks = app.registry.names()
        self._sql = link is None  # the app's database: hub, janitor, transactions
        self.store: Store | None = None
        self._owns_store = False
        if link is None:
            # the connection budget: one for work (+1 for turns sent ahead, see
            # plunder.turns), one for the hub (+1 janitor, see there)
            self.store, self._owns_store = app.store_for(
                pool_size=self.options.connections,
                application_name=self._app_name,
                **self.deadlines.store_options(),
            )
            link = StoreLink(self.store)
        self.link: WorkerProtocol = link
        # where tasks' stream events and transactions go (see plunder.context)
        self._sink: Sink = self.store if self.store is not None else LinkSink(link)
        self._suspects_running = 0  # among self._running; the main thread counts them
        self.session: Session | None = None
        self.error: BaseException | None = None  # what ended run(), raised from a turn
        self._outcomes: queue.SimpleQueue[Outcome | _Stop] = queue.SimpleQueue()
        self._threads = ThreadRunner(self._outcomes)
        self._async = AsyncRunner(self._outcomes)
        self._processes = ProcessRunner(self._outcomes, size=self.options.concurrency)
        self._running: dict[int, Handle] = {}
        self._stopping = Stopping()  # stopped, not returned yet: each holds its slot
        self._deadlines: dict[int, float] = {}
        # a job was due now but our claim just before took nothing: looked again once
        self._looked_again = False
        self._lock = threading.Lock()
        self._completions: list[Completion] = []
        self._failures: list[Failure] = []
        # the results a turn carries at most, so that the acknowledgements keep up with
        # the claims whatever the concurrency: between two turns sent, the jobs running or
        # claimed at the first finish (one per slot), and those that finished just before
        # it, recorded once it went out (see _read_turn; one per slot again)
        self._ack_batch = max(ACK_BATCH, 2 * self.options.concurrency)
        self._acker = Acker(
            self.link,
            session=lambda: self.session.id if self.session is not None else None,
            stopped=lambda: self._session_lost.is_set() or self._halt.is_set() or self._closing,
            counted=self._count,
        )
        # turns sent ahead (PostgreSQL): the pipe keeps what each turn in flight carries
        self._pipe: TurnPipe | None = self.link.pipe() if self.options.turns_ahead else None
        self._more = False
        self._stop = threading.Event()  # stop claiming, drain, exit
        self._halt = threading.Event()  # second signal: exit at once
        self._session_lost = threading.Event()
        # the session is being closed: gone to the heartbeat, and nothing to cut (a lost
        # session cuts the store's calls, and the store may serve other workers too)
        self._closing = False
        self._stream_wake = threading.Event()
        self._liveness = Liveness(
            self.link,
            self.deadlines,
            session=lambda: self.session,
            quiet=lambda: self._session_lost.is_set() or self._closing,
            claims=self._held_claims,
            stop=lambda claims: self.stop_claims(
                claims, "cancelled, timed out or re-claimed elsewhere"
            ),
            lost=self._lose_session,
            free=self._free_slots,
        )
        self._services_stop = threading.Event()
        self._services: list[threading.Thread] = []
        self._unregister: list[Callable[[], None]] = []  # the heartbeat and wake-up, at the hub
        self.stats = {"claimed": 0, "succeeded": 0, "failed": 0, "stale": 0, "sessions": 0}

    # -- lifecycle ------------------------------------------------------------------------
    def run(self, *, install_signals: bool = True) -> None:
        """Work until asked to stop (SIGTERM/SIGINT, or ``stop()``)."""
        if install_signals:
            self._install_signals()
        self._open_session()
        self._ready_turns()
        self._start_services()
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
                if self._owns_store and self.store is not None:
                    self.store.close()

    def _free_slots(self) -> int:
        """The slots free for new jobs (none once stopping), as the session records them
        at each heartbeat: from any thread."""
        if self._stop.is_set():
            return 0
        return max(0, self.options.concurrency - self._busy())

    def _busy(self) -> int:
        """The slots taken: by running jobs, and by stopped ones not returned yet."""
        return len(self._running) + self._stopping.count

    def _ready_turns(self) -> None:
        """The turns' statement prepared on the connections the pipe will hold, before the
        first burst of work needs it (see TurnPipe.ready); without it, the first turns
        prepare it as they go."""
        if self._pipe is None or self._halt.is_set():
            return
        try:
            self._pipe.ready(queues=self.queues, tasks=self.tasks)
        except errors.StoreError as exc:
            log.warning("could not prepare the turns' statement ahead (%s); turns will", exc)

    def stop(self, *, graceful: bool = True) -> None:
        if not graceful:
            self._halt.set()
        self._stop.set()

    def _install_signals(self) -> None:
        def handler(signum: int, frame: FrameType | None) -> None:
            if self._stop.is_set():
                log.warning(
                    "second signal: stopping at once; running jobs will be rescued "
                    "when this session expires"
                )
                self._halt.set()
            else:
                log.info(
                    "signal %d: finishing running jobs (grace %.0fs), claiming no more",
                    signum,
                    self.options.grace,
                )
                self._stop.set()

        signal.signal(signal.SIGTERM, handler)
        signal.signal(signal.SIGINT, handler)

    def _open_session(self) -> None:
        backoff = 0.1
        while not self._halt.is_set():
            try:
                session = self.link.open(
                    Hello(
                        name=self.name,
                        host=socket.gethostname(),
                        pid=os.getpid(),
                        queues=tuple(self.queues),
                        tasks=tuple(self.app.registry.infos()),
                        expiry=self.deadlines.session_expiry,
                        free_slots=self._free_slots(),
                    )
                )
                self._liveness.last_beat = time.monotonic()  # before the watchdog sees it
                self.session = session
                self.stats["sessions"] += 1
                log.info("session %s opened", session.id)
                return
            except errors.StoreError as exc:
                log.warning("cannot open a session (%s); retrying in %.1fs", exc, backoff)
                self._halt.wait(backoff)
                backoff = min(backoff * 2, RECONNECT_CAP)

    def _start_services(self) -> None:
        self._unregister = self._beat_and_wake()
        self._services = [
            threading.Thread(
                target=stream_loop,
                args=(self._running_handles, self._stream_wake, self._services_stop),
                name="plunder-streamer",
                daemon=True,
            ),
            threading.Thread(
                target=self._liveness.watch,
                args=(self._services_stop,),
                name="plunder-watchdog",
                daemon=True,
            ),
        ]
        if not self._sql:  # heartbeats on a thread of their own, not the hub's
            self._services.append(
                threading.Thread(target=self._beat_loop, name="plunder-heartbeat", daemon=True)
            )
        if self.options.janitor and self.store is not None:
            janitor = Janitor(
                self.store,
                self.settings,
                holder=f"{self.name}:{id(self):x}",
                own_store=own_store(self.settings, f"{self._app_name}:janitor"),
            )
            self._services.append(
                threading.Thread(
                    target=janitor.run,
                    args=(self._services_stop,),
                    name="plunder-janitor",
                    daemon=True,
                )
            )
        for thread in self._services:
            thread.start()

    def _beat_and_wake(self) -> list[Callable[[], None]]:
        """Heartbeats and wake-ups at the app's hub, when the jobs are in its database."""
        if not self._sql:
            return []
        hub = self.app.hub
        return [
            hub.every(
                self.deadlines.heartbeat_interval,
                self._liveness.beat,
                deadline=self.deadlines.heartbeat_timeout,
            ),
            hub.on_work(self.queues, self._wake),
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
        if not self._services_stop.is_set():  # a stopped worker's queue is read no more
            self._outcomes.put(_Stop())

    # -- one turn of the loop -------------------------------------------------------------
    def step(self) -> None:
        if self._session_lost.is_set():
            self._renew_session()
        self._collect(block=False)
        if not self._in_flight():
            self._linger()
        self._enforce_deadlines()
        self._give_back_unknown()
        free = 0 if self._stop.is_set() else self.options.concurrency - self._busy()
        claimed = self._turn(free)
        if claimed:
            self._looked_again = False
        if claimed and claimed == free:
            return  # full: go straight to waiting for outcomes on the next turn
        if claimed:
            return  # there may be more work right now
        if self._in_flight() or self._completions or self._failures:
            return  # the next turn is on its way, or results came in after this one
        self._collect(block=True, timeout=self._wait_time())

    def _linger(self) -> None:
        """With results to send but most slots still busy, wait a moment (ACK_LINGER at
        most) for more to finish, so that they share one transaction: a turn costs about
        the same for one job as for fifty, and short jobs otherwise come back a few at a
        time, each few paying for a whole turn."""
        if not (self._completions or self._failures) or self._stop.is_set():
            return
        enough = self.options.concurrency // 2
        deadline = time.monotonic() + ACK_LINGER
        while self.options.concurrency - self._busy() < enough:
            left = deadline - time.monotonic()
            if left <= 0:
                return
            self._collect(block=True, timeout=left)

    def _wait_time(self) -> float:
        """Until an outcome or a wake-up arrives, but no longer than the poll interval, the
        next due delayed job (database clock) or the next task deadline."""
        wait = self.settings.poll_interval
        if self._busy() < self.options.concurrency and not self._stop.is_set():
            try:
                due = self.link.next_due(self._request(0))
            except errors.StoreError as exc:
                log.warning("could not read the next due job: %s", exc)
                due = None
            if due is not None and due <= 0 and not self._looked_again:
                # due now, though the claim just before took nothing: it may have come due
                # in between, so claim once more at once
                self._looked_again = True
                return 0.0
            self._looked_again = due is not None and due <= 0
            if due is not None and due > 0:  # a delayed job or retry: wake when it is due
                wait = min(wait, max(due, MIN_WAIT))
            # still due now and not claimed: locked by another worker or left to the others
            # that did not fail it yet; a wake-up or the poll interval brings us back
        due_at = [*self._deadlines.values(), self._stopping.next_due() or float("inf")]
        wait = min(wait, max(0.0, min(due_at) - time.monotonic()))
        return wait

    def _turn(self, free: int) -> int:
        """Acknowledge what finished and claim up to ``free`` jobs, in one transaction."""
        if self._in_flight() or (not self._failures and self._send_turn(free)):
            return self._read_turn()
        done = self._completions[: self._ack_batch]
        failed = self._failures[: self._ack_batch]
        if not done and not failed:
            return self._claim(free) if free > 0 else 0
        if free <= 0:
            self._acknowledge()
            return 0
        return self._exchange(done, failed, free)

    def _claim(self, free: int) -> int:
        return self._exchange([], [], free)

    def _request(self, limit: int) -> ClaimRequest:
        """A claim of up to ``limit`` jobs of this worker's queues and tasks."""
        return ClaimRequest(
            tuple(self.queues), tuple(self.tasks), limit, take_suspect=self._may_take_suspect()
        )

    def _exchange(self, done: list[Completion], failed: list[Failure], free: int) -> int:
        """One exchange, the ordinary way: the first results waiting (``done`` and
        ``failed``), and a claim of up to ``free`` jobs; how many it claimed. Results it
        could not send are written one by one."""
        assert self.session is not None
        outcomes: list[protocol.Outcome] = [*done, *failed]
        try:
            reply = self.link.exchange(self.session.id, outcomes, self._request(free))
        except errors.SessionGone:
            self._session_lost.set()
            return 0
        except errors.StoreError as exc:
            if not outcomes:
                log.warning("claim failed: %s", exc)
                self._stop.wait(min(self.settings.poll_interval, RECONNECT_CAP))
                return 0
            log.warning("acknowledge-and-claim failed (%s); doing them one by one", exc)
            self._acknowledge()
            return self._claim(free)
        del self._completions[: len(done)]
        del self._failures[: len(failed)]
        self._count(reply.completed, "succeeded")
        self._count(reply.failed, "failed")
        self._start(reply.claimed)
        self.stats["claimed"] += len(reply.claimed)
        return len(reply.claimed)

    def _may_take_suspect(self) -> bool:
        """At most one suspect at a time in the process: a suspect may be the job that
        killed its last worker, and whatever runs beside it dies with it if so."""
        return not self._suspects_running

    def _start(self, jobs: Sequence[JobRecord]) -> None:
        """Start claimed jobs, each on its task's runner: those of the thread pool are
        handed to it together (one look at its lock, one thread called for them all)."""
        get, sink, wake = self.app.registry.get, self._sink, self._stream_wake.set
        handles = [
            Handle(job=job, task=get(job.task), ctx=Context(job, sink, on_flush_needed=wake))
            for job in jobs
        ]
        with self._lock:
            for handle in handles:
                self._running[handle.job.id] = handle
        now = time.monotonic()
        pooled = []
        for handle in handles:
            job = handle.job
            if job.suspect:
                self._suspects_running += 1
            if job.timeout is not None:
                self._deadlines[job.id] = now + job.timeout
            runner = self._runner(handle.task)
            if runner is self._threads:
                pooled.append(handle)
                continue
            try:
                runner.start(handle)
            except Exception as exc:  # could not even start: the job fails with why
                self._outcomes.put(Outcome(job, False, error=exc))
        for handle, why in self._threads.start_many(pooled):
            self._outcomes.put(Outcome(handle.job, False, error=why))

    def _runner(self, task: Any) -> ThreadRunner | AsyncRunner | ProcessRunner:
        if task.is_async:
            return self._async
        if task.pool == "process" or self.options.pool == "process":
            return self._processes
        return self._threads

    # -- outcomes -------------------------------------------------------------------------
    def _collect(self, *, block: bool, timeout: float = 0.0) -> None:
        try:
            first = self._outcomes.get(block=block, timeout=timeout if block else None)
        except queue.Empty:
            return
        outcomes = [first]
        take = self._outcomes.get_nowait
        with contextlib.suppress(queue.Empty):
            while True:  # everything else that is ready: it goes out in the same batch
                outcomes.append(take())
        self._record(outcomes)

    def _record(self, outcomes: Sequence[Outcome | _Stop]) -> None:
        """Take in outcomes, in order: the results to send, the failures to report; the
        slots of the jobs they end are freed together (one look at the lock)."""
        ended: list[tuple[Handle, Outcome]] = []
        for outcome in outcomes:
            if isinstance(outcome, _Stop):
                self._end(ended)  # those before it first, as they came
                ended = []
                for claim in outcome.claims:
                    handle = self._running.get(claim.job_id)
                    if handle is not None and handle.job.attempt == claim.attempt:
                        self._forget(claim.job_id)
                continue
            handle = self._current(outcome)
            if handle is not None:
                ended.append((handle, outcome))
            else:  # stopped earlier (cancelled, timed out, session lost): its slot frees
                self._stopping.returned(outcome.job.id, outcome.job.attempt)
        self._end(ended)

    def _end(self, ended: list[tuple[Handle, Outcome]]) -> None:
        """The jobs of these outcomes no longer run (each unless ended already, by an
        earlier outcome): their results or failures go out with the next turn."""
        with self._lock:
            running = self._running
            ended = [(h, o) for h, o in ended if running.get(h.job.id) is h]
            for handle, _ in ended:
                del running[handle.job.id]
        for handle, outcome in ended:
            self._forgotten(handle)
            handle.flush_stream()
            if handle.ctx.acknowledged:  # its result committed with its acknowledgement
                after_acknowledged(handle, outcome)
            elif outcome.ok:
                self._succeeded(handle, outcome.result)
            else:
                self._failures.append(failure_of(handle, outcome))

    def _current(self, outcome: Outcome | _Stop) -> Handle | None:
        """The running job an outcome is of, unless stopped since (or a _Stop)."""
        if isinstance(outcome, _Stop):
            return None
        handle = self._running.get(outcome.job.id)
        return handle if handle is not None and handle.job.attempt == outcome.job.attempt else None

    def _succeeded(self, handle: Handle, result: Any) -> None:
        try:
            text = payload.encode(result, what="result", of=handle.task.name)
        except errors.PayloadError as exc:
            self._failures.append(failure(handle, ErrorInfo.from_exception(exc), None))
            return
        self._completions.append(
            build_completion(handle.ctx.claim, result, tuple(handle.ctx.log_lines), None, text)
        )

    def _acknowledge(self) -> None:
        """Send every result now and wait until they are written or given up."""
        self._acker.write(self._completions, self._failures)
        self._completions.clear()
        self._failures.clear()

    def _count(self, ack: AckResult, kind: str) -> None:
        self.stats[kind] += len(ack.accepted)
        self.stats["stale"] += len(ack.stale)
        for claim in ack.stale:
            log.warning(
                "job %d attempt %d: result refused, the claim is no longer current "
                "(cancelled, timed out or rescued elsewhere)",
                claim.job_id,
                claim.attempt,
            )

    # -- stopping jobs --------------------------------------------------------------------
    def _forget(self, job_id: int) -> Handle | None:
        with self._lock:
            handle = self._running.pop(job_id, None)
        if handle is None:
            self._deadlines.pop(job_id, None)
        else:
            self._forgotten(handle)
            self._stopping.add(handle)  # its slot is free once it returns
        return handle

    def _forgotten(self, handle: Handle) -> None:
        """A job no longer running (out of ``_running``): its deadline and suspect count."""
        self._deadlines.pop(handle.job.id, None)
        if handle.job.suspect:
            self._suspects_running -= 1

    def _stop_job(self, handle: Handle, reason: str) -> None:
        self._runner(handle.task).stop(handle, reason)

    def _enforce_deadlines(self) -> None:
        now = time.monotonic()
        self._stopping.overdue(now)
        for job_id in [j for j, deadline in self._deadlines.items() if deadline <= now]:
            handle = self._forget(job_id)
            if handle is None:
                continue
            self._stop_job(handle, "timed out")
            job = handle.job
            info = ErrorInfo(
                "plunder.JobTimeout",
                f"the job ran past its timeout of {job.timeout}s and was stopped",
            )
            delay = 0.0 if job.retry_on_timeout else None
            self._failures.append(failure(handle, info, delay, RunOutcome.TIMED_OUT))
            log.warning("job %d (%s) timed out after %ss", job.id, job.task, job.timeout)

    def stop_claims(self, claims: Sequence[Claim], reason: str) -> None:
        """Stop the tasks of claims the store says are no longer current (from any thread:
        stopping is thread-safe; the main loop forgets them when it wakes)."""
        for claim in claims:
            handle = self._running.get(claim.job_id)
            if handle is not None and handle.job.attempt == claim.attempt:
                self._stop_job(handle, reason)
                log.warning("job %d attempt %d: stopped (%s)", claim.job_id, claim.attempt, reason)
        self._outcomes.put(_Stop(tuple(claims)))

    # -- heartbeat and session loss (see plunder.liveness) --------------------------------
    def _running_handles(self) -> list[Handle]:
        with self._lock:
            return list(self._running.values())

    def _held_claims(self) -> list[Claim]:
        return [h.ctx.claim for h in self._running_handles()]

    def _give_back_unknown(self) -> None:
        """Claims the heartbeat reported that no task runs (see Liveness.give_back)."""

        def held() -> set[int]:
            with self._lock:
                ids = set(self._running)
            ids.update(c.claim.job_id for c in self._completions)
            if self._pipe is not None:
                ids.update(c.claim.job_id for c in self._pipe.completions())
            ids.update(f.claim.job_id for f in self._failures)
            return ids

        self._liveness.give_back(held, self._pipe.sent_at if self._pipe is not None else None)

    def _lose_session(self) -> None:
        """From the heartbeat thread: stop every task now, give up every database call in
        flight (the main loop's, the tasks' own transactions: all of them would be refused
        now, and one stuck on a hung peer would never come back), then wake the main loop."""
        if self._closing:  # the session is closed, or left to expire, on purpose
            return
        self._session_lost.set()
        with self._lock:
            handles = list(self._running.values())
        for handle in handles:
            self._stop_job(handle, "the worker's session was lost")
        cut = self.link.cut("the worker's session was lost")
        if cut:
            log.warning("gave up %d database calls in flight", cut)
        self._outcomes.put(_Stop())

    def _renew_session(self) -> None:
        with self._lock:
            handles = list(self._running.values())
            self._running.clear()
        self._deadlines.clear()
        for handle in handles:
            self._stop_job(handle, "the worker's session was lost")
            self._stopping.add(handle)
        self._suspects_running = 0
        # the turns in flight are never read: their claims are lost too
        unread: list[Completion] = self._pipe.close() if self._pipe is not None else []
        dropped = len(self._completions + unread) + len(self._failures)
        self._completions.clear()
        self._failures.clear()
        log.error(
            "SESSION LOST: stopped %d running tasks and discarded %d unacknowledged "
            "results; their jobs will run again elsewhere. Opening a new session.",
            len(handles),
            dropped,
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
        self._open_session()

    # -- shutdown -------------------------------------------------------------------------
    def _drain(self) -> None:
        """Graceful: let running tasks finish within the grace period, then release."""
        while self._in_flight() and not self._halt.is_set():
            self._read_turn()  # their jobs are ours: they run, within the grace period
        deadline = time.monotonic() + self.options.grace
        while self._running and not self._halt.is_set() and time.monotonic() < deadline:
            if self._session_lost.is_set():
                self._renew_session()
                break
            self._collect(block=True, timeout=min(0.1, max(0.0, deadline - time.monotonic())))
            self._enforce_deadlines()
            self._acknowledge()
        if self._halt.is_set():
            return
        self._collect(block=False)  # what finished meanwhile is acknowledged, not released
        self._acknowledge()

    def _close(self) -> None:
        """Stop what still runs (past the grace period, or a turn raised), write the
        results on their way, and close the session, which releases its jobs at once."""
        self._services_stop.set()
        for unregister in self._unregister:  # the hub outlives the worker (it is the app's)
            unregister()
        with self._lock:
            left, self._running = list(self._running.values()), {}
        for handle in left:
            self._stop_job(handle, "the worker is shutting down")
        self._async.close()
        self._processes.close()
        self._deadlines.clear()
        self._suspects_running = 0
        if self._pipe is not None:  # turns in flight (a turn raised) are never read: their
            self._completions[:0] = self._pipe.close()  # results are written below, again
        if self._halt.is_set():
            self._closing = True  # left to expire: no more heartbeats
            log.warning(
                "stopped at once; session %s will expire and its jobs be rescued",
                self.session.id if self.session else "?",
            )
            return
        for thread in self._services:
            thread.join(timeout=5)
        # results on their way are written before the session closes: closing releases
        # the session's running jobs, and those would run again. Results still unwritten
        # (a database out of reach) leave the session to expire instead.
        written = self._acker.write(  # not sent if a turn raised
            self._completions, self._failures, deadline=time.monotonic() + self.options.grace
        )
        self._closing = True  # closed below, or left to expire: no more heartbeats
        if not written:
            log.warning(
                "results still unwritten after %.0fs; session %s will expire and the "
                "janitor will judge its jobs",
                self.options.grace,
                self.session.id if self.session else "?",
            )
            return
        if self.session is not None:
            try:
                # a stopped task may still run (a thread cannot be killed): its job is
                # released, or ended where its retry_on_lost forbids another run
                started = [handle.job.claim for handle in left]
                released = self.link.close(self.session.id, started=started)
                log.info(
                    "session %s closed; %d unfinished jobs released", self.session.id, len(released)
                )
            except errors.StoreError as exc:
                log.warning("could not close session (it will expire): %s", exc)
