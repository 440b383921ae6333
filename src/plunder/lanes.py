"""Lanes: one worker process, several claim loops.

A worker's turn (acknowledge what finished, claim the next jobs) is one round trip. While
it is at the database the worker's Python waits for it, and while the worker starts the
jobs it claimed and collects their results the database waits for the worker. With short
jobs that is the whole of the time: one worker process drains about as fast as the two
take in turn. ``Lanes`` splits a process's slots among several workers, each a worker in
its own right, so that one lane's turn is at the database while another's Python runs:

```
 worker process ─┬─ lane 1: session, slots, claim ⇄ run ⇄ acknowledge ── the app's store
                 ├─ lane 2: session, slots, claim ⇄ run ⇄ acknowledge ── a store of its own
                 └─ shared: the hub (wake-ups; every lane's heartbeat, one after another, on
                    its connection), the janitor (run by lane 1), the signals, and the
                    suspect slot (one suspect at a time in the process)
```

- **Every lane is a whole worker:** its own session (named ``<name>/<k>``), its own claims,
  fenced by that session, its own heartbeat, and its own store and connections. A lane
  whose session is lost stops its tasks, cuts its own calls in flight and opens a new
  session, like any worker, while the other lanes go on. Lane 1 uses the app's store,
  which the hub and the process's producers (a task's ``enqueue``, ``job.result()``) share:
  its lost session cuts their calls in flight too, as a worker of one lane does (a
  heartbeat cut so is sent again at the next interval).
- **The slots are shared out:** ``concurrency`` is the process's, and each lane claims for
  its share (``concurrency // lanes``, the first ``concurrency % lanes`` lanes one more),
  so the claim batch of a lane is its share, or half of it with turns sent ahead (the
  default on PostgreSQL). Short jobs want batches of about 100 each.
- **Connections:** two per lane (one with ``turns_ahead=False``), plus the hub's, plus the
  janitor's while it holds the lease.
- **Suspects** (jobs lost with a dead worker, any of which may have killed it) run one at a
  time in the whole process, as in a worker of one lane: whatever runs beside a poison job
  dies with it, whichever lane runs it.
- **Stopping:** a first SIGTERM or SIGINT (or Ctrl-C) lets every lane finish its running
  jobs, a second stops them all at once; ``stop()`` does the same from code. A lane that
  fails stops its tasks and closes its session, which releases their jobs at once; the
  others are told to stop as soon as it fails, and ``run()`` raises its error once they
  have.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import signal
import socket
import threading
from types import FrameType

from plunder import errors
from plunder.app import App
from plunder.config import worker_deadlines
from plunder.execution import SuspectSlot
from plunder.store import Store
from plunder.worker import Worker, WorkerOptions

log = logging.getLogger("plunder.worker")
JOIN_INTERVAL = 0.1  # how often run() looks at the lanes and at stop requests


class Lanes:
    def __init__(self, app: App, options: WorkerOptions | None = None, *, lanes: int = 2) -> None:
        options = options or WorkerOptions()
        if lanes < 1:
            raise errors.ConfigError(f"lanes must be at least 1, not {lanes}")
        if options.concurrency < lanes:
            raise errors.ConfigError(
                f"{lanes} lanes need a concurrency of at least {lanes} (one slot each), "
                f"not {options.concurrency}"
            )
        self.app = app
        self.options = options
        self.name = options.name or f"{socket.gethostname()}:{os.getpid()}"
        suspects = SuspectSlot()
        share, more = divmod(options.concurrency, lanes)
        self.lanes: list[Worker] = []
        self._stores: list[Store] = []  # the lanes' own, closed for good when run() ends
        try:
            for k in range(lanes):
                name = f"{self.name}/{k + 1}"
                store = None
                if k:  # the first lane's is the app's, which it sizes itself
                    store = app.another_store(
                        pool_size=options.connections,
                        application_name=f"plunder:worker:{name}"[:60],
                        **worker_deadlines(app.settings),
                    )
                    self._stores.append(store)
                lane = dataclasses.replace(
                    options,
                    concurrency=share + (k < more),
                    name=name,
                    janitor=options.janitor and k == 0,
                )
                self.lanes.append(Worker(app, lane, store=store, suspects=suspects))
        except BaseException:
            self._close_stores()
            raise
        # 1: stop gracefully, 2: at once; a plain attribute, which a signal handler can
        # set without taking a lock the interrupted thread may hold
        self._requested = 0
        self._failures: list[BaseException] = []

    @property
    def stats(self) -> dict[str, int]:
        """The lanes' counts, summed."""
        total: dict[str, int] = {}
        for lane in self.lanes:
            for key, value in lane.stats.items():
                total[key] = total.get(key, 0) + value
        return total

    def run(self, *, install_signals: bool = True) -> None:
        """Run every lane until asked to stop (SIGTERM/SIGINT, or ``stop()``), or until one
        fails; raise the first lane's error, if any, once all of them have stopped."""
        if install_signals:
            signal.signal(signal.SIGTERM, self._signalled)
            signal.signal(signal.SIGINT, self._signalled)
        threads = [
            threading.Thread(target=self._serve, args=(lane,), name=f"plunder-lane-{k + 1}")
            for k, lane in enumerate(self.lanes)
        ]
        started: list[threading.Thread] = []
        try:
            for thread in threads:
                thread.start()
                started.append(thread)
        except BaseException:  # out of threads: the lanes already running stop too
            self.stop()
            raise
        finally:
            try:
                self._wait(started)
            finally:
                self._close_stores()
        if self._failures:
            raise self._failures[0]

    def stop(self, *, graceful: bool = True) -> None:
        """From any thread: like a first signal, or with ``graceful=False`` a second."""
        self._requested = max(self._requested, 1 if graceful else 2)

    def _wait(self, threads: list[threading.Thread]) -> None:
        """Until every lane has stopped, passing on stop requests and a lane's failure."""
        while any(thread.is_alive() for thread in threads):
            try:
                if self._requested or self._failures or any(lane.error for lane in self.lanes):
                    self._forward()
                for thread in threads:
                    thread.join(JOIN_INTERVAL / len(threads))
            except KeyboardInterrupt:  # without our handlers: as a signal would
                self._signalled(signal.SIGINT, None)

    def _forward(self) -> None:
        for lane in self.lanes:
            lane.stop(graceful=self._requested < 2)

    def _serve(self, lane: Worker) -> None:
        try:
            lane.run(install_signals=False)
        except BaseException as exc:  # raised by run() once every lane has stopped
            log.error("lane %s failed; the others stop", lane.name, exc_info=exc)
            self._failures.append(exc)

    def _close_stores(self) -> None:
        for store in self._stores:  # for good: a late call (a task that outlived its
            store.retire()  # lane) must not open a pool that nobody would close

    def _signalled(self, signum: int, frame: FrameType | None) -> None:
        if self._requested:
            log.warning(
                "second signal: stopping every lane at once; running jobs will be rescued "
                "when their sessions expire"
            )
        else:
            log.info(
                "signal %d: every lane finishes its running jobs (grace %.0fs), claiming no more",
                signum,
                self.options.grace,
            )
        self._requested = 2 if self._requested else 1
