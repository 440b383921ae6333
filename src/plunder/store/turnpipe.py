"""The seam of a worker's turns sent ahead (``Store.turn_pipe()``): a pipe, and the answer
of each turn, as a PostgreSQL store and a gateway's client implement them."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from plunder.model import AckResult, Completion, JobRecord
from plunder.store.limiting import Now


class TurnAnswer(Protocol):
    """A turn sent ahead, committed, as its rows came back."""

    @property
    def claimed(self) -> int:
        """How many jobs it claimed (read before the rows are)."""
        ...

    @property
    def limit(self) -> int:
        """How many it asked for."""
        ...

    @property
    def take_suspect(self) -> bool:
        """Whether it could bring a suspect."""
        ...

    @property
    def completions(self) -> list[Completion]:
        """The completions it carried."""
        ...

    def jobs(self) -> list[JobRecord]:
        """The jobs it claimed, in claim order."""
        ...

    @property
    def children(self) -> bool:
        """Whether a job it completed had children: pending now perhaps, but not seen by
        its claim (one statement's snapshot)."""
        ...

    def settle(self, now: Now = None) -> AckResult:
        """What became of its completions; SessionGone (as from ``job_exchange_many``) if
        it neither completed nor claimed anything and the session is gone."""
        ...


class TurnPipe(Protocol):
    """A worker's turns sent ahead (PostgreSQL: plunder.store.postgres.turns; a gateway:
    plunder.store.http.pipe): each is sent before the answer to the one before is read,
    so that the database runs it while the worker starts that one's jobs. Up to ``depth``
    in flight, answered in the order they were sent; one thread uses it."""

    @property
    def sent_at(self) -> float | None:
        """When the oldest turn in flight was sent (``time.monotonic()``); None: none is."""
        ...

    @property
    def in_flight(self) -> int:
        """How many turns are in flight."""
        ...

    @property
    def depth(self) -> int:
        """How many turns may be in flight at once."""
        ...

    @property
    def claiming(self) -> int:
        """The slots the turns in flight may fill: the sum of their claim limits."""
        ...

    @property
    def suspect(self) -> bool:
        """Whether a turn in flight may bring a suspect."""
        ...

    def completions(self) -> list[Completion]:
        """The completions of the turns in flight, oldest first."""
        ...

    def answered(self, timeout: float = 0.0) -> bool:
        """Whether the oldest turn's answer has come back (``receive`` would not wait),
        waiting ``timeout`` seconds at most."""
        ...

    def ready(self, *, queues: Sequence[str], tasks: Sequence[str]) -> int:
        """Make the turns' statement ready on each connection the pipe may hold, before
        the first turn needs it; how many connections it made ready. Claims and
        acknowledges nothing."""
        ...

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
        """Send a turn as ``job_exchange_many`` would run it (completions without
        effects, no failures). ``wait``: as ClaimRequest.wait, for a gateway, and only
        with no turn in flight and no completions. False: none sent, none can be here.
        After an error, whether it reached the database is unknown, and no turn is in
        flight: the turns that were are never read (their completions are the caller's
        to send again)."""
        ...

    def receive(self) -> TurnAnswer:
        """The answer to the oldest turn in flight, once it committed. After an error,
        whether it committed is unknown, and no turn is in flight (as after ``send``)."""
        ...

    def rest(self) -> None:
        """No turn is in flight, and the worker may wait a while: let go of what should not
        be held meanwhile. Its connection is kept for the next claim."""
        ...

    def close(self) -> list[Completion]:
        """Give its connection back; the turns still in flight are never read, and their
        completions are returned, to be sent again."""
        ...
