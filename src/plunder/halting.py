"""A worker told to stop at once (a second SIGTERM or SIGINT, or ``stop(graceful=False)``)
ends within moments, whatever its threads are doing.

```
 set() ── from any thread, a signal handler too ──▶ cutter thread: every call of the
            worker's link in flight is given up (cut, never tried again), and again every
            RECUT seconds until run() has returned (a call begun meanwhile)
 main thread ── its own call ends (cut or answered); it makes no more, joins no thread,
            writes no result, leaves the session to expire ──▶ "stopped at once"
 a stop a signal began ── the process ends as run() returns, waiting for none of its
            threads, or EXIT_AFTER seconds after the halt if run() has not returned by
            then (a call that waits for a pooled connection: no cut ends that)
```

A graceful stop halts too once its calls have outlasted the call timeout, counted from the
stop or from the last job it waited for (``watch``): with the database out of reach,
results cannot be written nor the session closed anyway, and it would expire all the same.

No result is written after the worker said it stopped: the main thread says so once its
last call has ended. The jobs it ran stay claimed by the session, which expires, and the
janitor rescues them. A cut may end other calls on the same store (another thread of the
app in this process): each raises StoreUnavailable.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
from collections.abc import Callable
from typing import Protocol

log = logging.getLogger("plunder.worker")
REASON = "the worker was stopped at once"
RECUT = 0.1  # seconds between two cuts while run() has not returned
CUTTING = 10.0  # seconds at most: a run() that never returns is not cut for ever
EXIT_AFTER = 1.0  # seconds after the halt, where the worker owns the process (see Halt)


class Closable(Protocol):
    def close(self) -> None: ...


class Halt:
    """The halt of one worker: ``cut(reason)`` gives up its calls in flight for good.
    ``exit_after``: set where a signal began the stop; the process then ends as run()
    returns, or this many seconds after the halt if run() has not returned by then."""

    def __init__(self, cut: Callable[[str], int]) -> None:
        self._cut = cut
        self.exit_after: float | None = None
        self._event = threading.Event()
        self._ended = threading.Event()  # run() returned: nothing more to cut
        self._cutter: threading.Thread | None = None

    def set(self) -> None:
        """Halt now. Takes no lock: a signal handler may interrupt the main thread
        anywhere, a call to this included (two cutters would do no harm)."""
        self._event.set()
        if self._cutter is None and not self._ended.is_set():
            self._cutter = threading.Thread(target=self._cutting, name="plunder-halt", daemon=True)
            self._cutter.start()

    def is_set(self) -> bool:
        return self._event.is_set()

    def wait(self, timeout: float | None = None) -> bool:
        return self._event.wait(timeout)

    def ended(self, store: Closable | None) -> None:
        """run() returns: the cutter stops, and the worker's own ``store`` (if any) is
        closed; once halted without waiting (a pool's close waits for its threads, which
        may be connecting), and where a signal began the stop, the process ends now, waiting
        for none of its threads."""
        self._ended.set()
        if self.is_set() and self.exit_after is not None:
            exit_process()
        if store is None:
            return
        if self.is_set():
            threading.Thread(target=store.close, name="plunder-close", daemon=True).start()
        else:
            store.close()

    def watch(self, stop: threading.Event, timeout: float, busy: Callable[[], object]) -> None:
        """Until run() ends, on a thread of its own: once ``stop`` is set and nothing is
        ``busy()`` (jobs running within their grace period), halt ``timeout`` seconds
        later."""
        args = (stop, timeout, busy)
        threading.Thread(
            target=self._watch, args=args, name="plunder-stopping", daemon=True
        ).start()

    def _watch(self, stop: threading.Event, timeout: float, busy: Callable[[], object]) -> None:
        since: float | None = None
        while not self._ended.wait(RECUT if stop.is_set() else 1.0):
            if self.is_set():
                return
            if not stop.is_set():
                continue
            now = time.monotonic()
            if since is None or busy():
                since = now
            elif now - since > timeout - (self.exit_after or 0.0):  # the exit takes that
                log.warning(
                    "still stopping %.1fs after the last job, the database does not answer: "
                    "stopping at once",
                    now - since,
                )
                self.set()
                return

    def join(self, thread: threading.Thread, timeout: float) -> None:
        """Join ``thread`` for ``timeout`` seconds at most, and not at all once halted."""
        deadline = time.monotonic() + timeout
        while thread.is_alive() and not self.is_set():
            left = deadline - time.monotonic()
            if left <= 0:
                return
            thread.join(min(left, RECUT))

    def _cutting(self) -> None:
        started = time.monotonic()
        while True:
            try:
                cut = self._cut(REASON)
            except Exception:  # a bug: said, and the main thread's calls end at deadlines
                log.exception("could not give up the calls in flight")
                return
            if cut:
                log.warning("gave up %d database calls in flight", cut)
            if self._ended.wait(RECUT):
                return
            took = time.monotonic() - started
            if self.exit_after is not None and took >= self.exit_after:
                self._cut(REASON)  # a call begun since the last cut
                log.warning("stopped at once; the process ends %.1fs after the halt", took)
                exit_process()
            if took > CUTTING:
                return


def stopped(session: str) -> bool:
    """Said by the main thread once its last call has ended: no result is written after.
    True: the session is left to expire (no more heartbeats)."""
    log.warning("stopped at once; session %s will expire and its jobs be rescued", session)
    return True


def exit_process() -> None:
    """End the process at once: no thread is waited for (a task's, or a pool's) and no
    atexit handler runs; the log is flushed."""
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
