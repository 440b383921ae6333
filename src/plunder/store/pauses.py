"""Paused queues (migration 17): a claim takes no job of a paused queue, nor of its
partitions; the jobs running there run on to their end.

```
 plunder queues pause q ─▶ plunder_queue_pauses ◀── read at most once per PAUSE_TTL
 (or the dashboard)                                   by each store that claims
 claim / exchange / turn sent ahead / next due ──▶ the queues asked for, less the paused
```

The claim statements stay as they are: each store leaves the paused queues out of the
queues a claim names, as last read. A pause holds within PAUSE_TTL (plus a turn already
in flight) on every store, direct or behind a gateway; see docs/decisions/0017.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from plunder import errors, payload
from plunder.model import Completion
from plunder.store.driver import Now
from plunder.store.engine import Engine
from plunder.store.turnpipe import TurnAnswer, TurnPipe

PAUSE_TTL = 1.0  # seconds a store trusts the paused queues it read
MAX_REASON = 500


@dataclass(frozen=True, slots=True)
class QueuePause:
    queue: str
    paused_at: datetime
    reason: str


class Pauses:
    """queue_pause, queue_resume, queue_pause_list, and the paused queues a claim leaves
    out (``unpaused``)."""

    def __init__(self, engine: Engine, *, ttl: float = PAUSE_TTL) -> None:
        self.engine = engine
        self.ttl = ttl
        self._lock = threading.Lock()
        self._known: tuple[frozenset[str], float] | None = None  # and when read

    def queue_pause(self, queue: str, *, reason: str = "", now: Now = None) -> bool:
        """Pause ``queue`` (claims take none of its jobs); False if it was paused."""
        queue = payload.check_queue(queue)
        reason = str(reason)[:MAX_REASON]
        row = self.engine.run(
            lambda tx: tx.one("queue_pause", queue=queue, reason=reason, now=tx.clock(now))
        )
        self.forget()
        return row is not None

    def queue_resume(self, queue: str) -> bool:
        """Let claims take ``queue``'s jobs again; False if it was not paused."""
        queue = payload.check_queue(queue)
        row = self.engine.run(lambda tx: tx.one("queue_resume", queue=queue))
        self.forget()
        return row is not None

    def queue_pause_list(self) -> list[QueuePause]:
        rows = self.engine.run(lambda tx: tx.all("queue_pause_list"), write=False)
        return [
            QueuePause(str(r["queue"]), self.engine.time(r["paused_at"]), str(r["reason"]))
            for r in rows
        ]

    def forget(self) -> None:
        """Read the paused queues again at the next claim (this store changed them)."""
        with self._lock:
            self._known = None

    def paused(self) -> frozenset[str]:
        """The paused queues, read at most once per ``ttl``."""
        with self._lock:
            known = self._known
        if known is not None and time.monotonic() - known[1] < self.ttl:
            return known[0]
        read_at = time.monotonic()
        found = frozenset(p.queue for p in self.queue_pause_list())
        with self._lock:
            self._known = (found, read_at)
        return found

    def unpaused(self, queues: Sequence[str]) -> Sequence[str]:
        """``queues`` but the paused ones (a partition "q~3" is paused with "q")."""
        if not queues:
            return queues
        paused = self.paused()
        if not paused:
            return queues
        return [q for q in queues if payload.base_queue(q) not in paused]


class PausedPipe:
    """A store's turn pipe whose claims leave the paused queues out (see Pauses)."""

    def __init__(self, pipe: TurnPipe, pauses: Pauses) -> None:
        self.pipe = pipe
        self.pauses = pauses

    @property
    def sent_at(self) -> float | None:
        return self.pipe.sent_at

    @property
    def in_flight(self) -> int:
        return self.pipe.in_flight

    @property
    def depth(self) -> int:
        return self.pipe.depth

    @property
    def claiming(self) -> int:
        return self.pipe.claiming

    @property
    def suspect(self) -> bool:
        return self.pipe.suspect

    def completions(self) -> list[Completion]:
        return self.pipe.completions()

    def answered(self, timeout: float = 0.0) -> bool:
        return self.pipe.answered(timeout)

    def rest(self) -> None:
        self.pipe.rest()

    def ready(self, *, queues: Sequence[str], tasks: Sequence[str]) -> int:
        return self.pipe.ready(queues=queues, tasks=tasks)

    def send(
        self,
        completions: Sequence[Completion],
        *,
        session_id: str,
        queues: Sequence[str],
        tasks: Sequence[str],
        limit: int,
        take_suspect: bool,
        wait: float = 0.0,
    ) -> bool:
        return self.pipe.send(
            completions, session_id=session_id, queues=self.pauses.unpaused(queues),
            tasks=tasks, limit=limit, take_suspect=take_suspect, wait=wait,
        )  # fmt: skip

    def receive(self) -> TurnAnswer:
        return self.pipe.receive()

    def close(self, **options: Any) -> list[Completion]:
        closing: Any = self.pipe  # a pipe's own options (PostgreSQL's: discard=)
        found: list[Completion] = closing.close(**options)
        return found

    def __getattr__(self, name: str) -> Any:  # what a pipe has beyond the protocol
        return getattr(self.pipe, name)


def of(store: object) -> Pauses:
    """The paused queues of a store on the database itself; ConfigError for another (a
    gateway's: pause through its dashboard)."""
    pauses = getattr(store, "pauses", None)
    if not isinstance(pauses, Pauses):
        raise errors.ConfigError("pausing a queue needs the database's URL, not a gateway's")
    return pauses
