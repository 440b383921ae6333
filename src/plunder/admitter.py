"""A worker's admissions of the limit keys whose jobs it finished (see plunder.store.limits):
on a thread of their own, so that the worker's turns never wait for a key's lock.

```
 main thread ── results written (Worker._count) ── keys of limited jobs ──▶ add()
 admitter    ── waits for keys ─▶ store.limit_admit_many(keys) ─▶ waits again
```

Keys that come in while an admission runs are admitted together by the next one. An
admission that fails is tried again with the next (the janitor's pass admits them too).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable

from plunder import errors
from plunder.model import AckResult
from plunder.store.base import Store

log = logging.getLogger("plunder.admitter")
RETRY = 0.5  # seconds before an admission that failed is tried again


class Admitter:
    """``store``: None where the worker speaks to a gateway (whose janitor admits); the
    thread starts with the first keys, and ends once ``stop`` is set and it is woken."""

    def __init__(self, store: Store | None, stop: threading.Event) -> None:
        self.store = store
        self.stop = stop
        self._keys: set[str] = set()
        self._ready = threading.Condition()
        self._thread: threading.Thread | None = None
        self.admitted = 0  # jobs admitted so far

    def ended(self, limited: dict[int, str], ack: AckResult) -> None:
        """The results of ``ack`` were written: the keys of those jobs among ``limited``
        (job id: key, taken out) have a place free for their next jobs."""
        if limited:
            keys = {limited.pop(c.job_id, "") for c in (*ack.accepted, *ack.stale)} - {""}
            if keys:
                self.add(keys)

    def add(self, keys: Iterable[str]) -> None:
        """Keys whose jobs ended here (their results committed): admit their next jobs."""
        if self.store is None:
            return
        with self._ready:
            before = len(self._keys)
            self._keys.update(keys)
            if len(self._keys) > before:
                self._ready.notify()
            if self._thread is None and not self.stop.is_set():
                self._thread = threading.Thread(
                    target=self.run, args=(self.stop,), name="plunder-admitter", daemon=True
                )
                self._thread.start()

    def run_once(self, timeout: float) -> int:
        """Wait up to ``timeout`` for keys, then admit them all; how many jobs."""
        with self._ready:
            if not self._keys:
                self._ready.wait(timeout)
            keys, self._keys = self._keys, set()
        if not keys or self.store is None:
            return 0
        try:
            admitted = self.store.limit_admit_many(keys)
        except errors.StoreError as exc:
            log.warning("admission of limit keys %s failed (%s); trying again", sorted(keys), exc)
            self.add(keys)
            return 0
        self.admitted += admitted
        return admitted

    def run(self, stop: threading.Event) -> None:
        """Admissions until ``stop`` is set; an error that is not the store's is logged,
        and the thread goes on (the keys are left to the janitor's pass)."""
        while not stop.is_set():
            try:
                self.run_once(RETRY)
            except Exception:  # a bug: say so, and keep admitting
                log.exception("admission failed unexpectedly")
                stop.wait(RETRY)

    def wake(self) -> None:
        """End the wait in progress (the worker stops)."""
        with self._ready:
            self._ready.notify()
