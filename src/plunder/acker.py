"""The acknowledger: how a worker's results reach the database.

```
 main thread ── results ─▶ Acker.send ──▶ pending ──▶ acker thread ── complete / fail ──▶ db
     │                                                (own connection, a batch at a time)
     └── claims the next jobs at once, on its connection, while the batch before commits
```

With parallel acks (``WorkerOptions(parallel_acks=True)``, PostgreSQL) the results of a
turn are written on their own thread and connection, while the main thread claims and
starts the next jobs: the database runs one worker's acknowledgement and claim side by side
(they write different rows), and the worker's Python runs while the database works instead
of waiting for it. Results that arrive while a batch is on its way go out together in the
next one. By default, and always on SQLite (whose writers take turns on the file, so a
second writer only adds a commit), the worker acknowledges and claims in one transaction,
and the acker sends what is left (no free slot, shutdown, or a failed turn) on the
caller's thread.

Results handed over are *held* until their batch is written or given up: the worker counts
them as its own when the heartbeat asks which running jobs have no task, so a job whose
result is on its way is never given back as abandoned.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from plunder import errors, policy
from plunder.model import AckResult, Completion, ErrorInfo, Failure
from plunder.store import Store

log = logging.getLogger("plunder.worker")
ACK_BATCH = 200


class Acker:
    def __init__(
        self,
        store: Store,
        *,
        threaded: bool,
        stopped: Callable[[], bool],
        counted: Callable[[AckResult, str], None],
    ) -> None:
        """``stopped()``: the session is lost or the worker halts, and the store would
        refuse these results anyway; ``counted(ack, kind)``: a batch was written."""
        self.threaded = threaded
        self._store = store
        self._stopped = stopped
        self._counted = counted
        self._cond = threading.Condition()
        self._completions: list[Completion] = []
        self._failures: list[Failure] = []
        self._in_flight: set[int] = set()  # job ids of the batch being written
        self._dropped = 0  # how many times drop() was called: a batch taken before gives up
        self._closing = False
        self._thread: threading.Thread | None = None

    def send(self, completions: Sequence[Completion], failures: Sequence[Failure]) -> None:
        """Hand results over: written by the acker thread, or here and now when not
        threaded."""
        if not completions and not failures:
            return
        with self._cond:
            self._completions += completions
            self._failures += failures
            if self.threaded:
                self._start()
                self._cond.notify_all()
                return
        while self._write_next():
            pass

    def backlog(self) -> int:
        """Results handed over and not yet written."""
        with self._cond:
            return self._count()

    def held(self) -> set[int]:
        """The jobs whose results are handed over and not yet written or given up."""
        with self._cond:
            held = set(self._in_flight)
            held.update(c.claim.job_id for c in self._completions)
            held.update(f.claim.job_id for f in self._failures)
            return held

    def flush(self, timeout: float | None = None, *, below: int = 1) -> bool:
        """Wait until fewer than ``below`` results (by default none) are handed over and
        not yet written or given up; False on timeout."""
        with self._cond:
            return self._cond.wait_for(lambda: self._count() < below, timeout)

    def drop(self) -> int:
        """The session is lost: forget the results not yet written (the store would refuse
        them), and stop retrying the batch on its way; return how many."""
        with self._cond:
            dropped = self._count()
            self._completions.clear()
            self._failures.clear()
            self._dropped += 1
            return dropped

    def close(self, timeout: float | None = None) -> bool:
        """Write what is left and stop the thread; False when ``timeout`` passed first (a
        database out of reach), with results still unwritten."""
        with self._cond:
            self._closing = True
            self._cond.notify_all()
            thread = self._thread
        if thread is not None:
            thread.join(timeout)
        with self._cond:
            return self._idle()

    # -- the thread -----------------------------------------------------------------------
    def _count(self) -> int:
        return len(self._completions) + len(self._failures) + len(self._in_flight)

    def _idle(self) -> bool:
        return not (self._completions or self._failures or self._in_flight)

    def _start(self) -> None:
        """Under the lock."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name="plunder-acker", daemon=True)
            self._thread.start()

    def _loop(self) -> None:
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._closing or not self._idle())
                if self._closing and self._idle():
                    return
            try:
                self._write_next()
            except Exception:  # a bug: its jobs stay running until the heartbeat sees
                log.exception("acknowledging a batch failed")  # no task hold them

    def _write_next(self) -> bool:
        """Write the next batch of each kind, so that neither waits behind a stream of the
        other; False when there was none."""
        with self._cond:
            done = self._completions[:ACK_BATCH]
            del self._completions[:ACK_BATCH]
            failed = self._failures[:ACK_BATCH]
            del self._failures[:ACK_BATCH]
            self._in_flight = {c.claim.job_id for c in done} | {f.claim.job_id for f in failed}
            generation = self._dropped
        try:
            if done:
                self._write(self._store.job_complete_many, done, "succeeded", generation)
            if failed and not self._given_up(generation):
                self._write(self._store.job_fail_many, failed, "failed", generation)
        finally:
            with self._cond:
                self._in_flight = set()
                self._cond.notify_all()
        return bool(done or failed)

    def _given_up(self, generation: int) -> bool:
        """The session of a batch taken at ``generation`` is gone (see ``drop``), or the
        worker halts: the store would refuse the batch anyway."""
        return self._stopped() or self._dropped != generation

    def _write(
        self, call: Callable[[Any], AckResult], batch: Sequence[Any], kind: str, generation: int
    ) -> None:
        """Write one batch. A busy or unreachable database is retried (bounded by the
        session: once it is lost, the results would be refused anyway); any other store
        error is not going to pass on a retry, so completions become failures that say
        why, and failures that cannot be written stay running under the session until the
        heartbeat finds no task holding them and they are given back."""
        backoff = 0.05
        while True:
            try:
                ack = call(batch)
                break
            except (errors.StoreBusy, errors.StoreUnavailable, errors.StoreFull) as exc:
                if self._given_up(generation):
                    return  # the store will refuse them anyway
                log.warning("acknowledgement failed (%s); retrying in %.2fs", exc, backoff)
                time.sleep(backoff)
                backoff = min(backoff * 2, policy.RECONNECT_CAP)
            except errors.PlunderError as exc:
                log.error("could not write %d %s results: %s", len(batch), kind, exc)
                if kind == "succeeded":
                    info = ErrorInfo.from_exception(exc)
                    with self._cond:
                        self._failures += [
                            Failure(item.claim, info, retry_delay=0.0, logs=item.logs)
                            for item in batch
                        ]
                return
        self._counted(ack, kind)
