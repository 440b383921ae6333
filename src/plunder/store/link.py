"""The worker protocol (plunder.protocol) spoken to the SQL store: each call one store
operation, most of them one transaction.

An exchange writes completions with ``effects`` first, each batch in a transaction of its
own (their effects run in it), then the plain completions, the failures and the claim in
one transaction (``job_exchange_many``), then the releases.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from plunder.graph import ParentResult
from plunder.model import (
    AckResult,
    Claim,
    Completion,
    ErrorInfo,
    Exchange,
    Failure,
    Heartbeat,
    Session,
)
from plunder.protocol import NONE, Beat, ClaimRequest, Hello, Outcome, Release, Reply
from plunder.store.base import Store
from plunder.store.turnpipe import TurnPipe


class StoreLink:
    """A worker's protocol over ``store`` (see plunder.protocol.WorkerProtocol)."""

    long_polls = False  # the worker's hub wakes it

    def __init__(self, store: Store) -> None:
        self.store = store

    def open(self, hello: Hello) -> Session:
        return self.store.session_open(
            name=hello.name,
            host=hello.host,
            pid=hello.pid,
            queues=hello.queues,
            expiry=hello.expiry,
            tasks=hello.tasks,
            free_slots=hello.free_slots,
            labels=hello.labels,
            slots=hello.slots,
        )

    def heartbeat(self, beat: Beat, *, via: Any = None) -> Heartbeat:
        return self.store.session_heartbeat(
            beat.session_id,
            beat.running,
            free_slots=beat.free_slots,
            labels=beat.labels,
            conn=via,
        )

    def exchange(
        self, session_id: str, outcomes: Sequence[Outcome], claim: ClaimRequest | None
    ) -> Reply:
        plain, effects, failures, releases = sort_outcomes(outcomes)
        with_effects = self.store.job_complete_many(effects) if effects else NONE
        if effects:  # those whose effects raised fail, in the turn below
            failures += [
                Failure(c, ErrorInfo.from_exception(exc), retry_delay=0.0)
                for c, exc in with_effects.effect_errors
            ]
        request = claim or ClaimRequest((), (), 0)
        turn = Exchange(NONE, NONE, ())  # nothing to write or claim: no transaction
        if plain or failures or request.limit:
            turn = self.store.job_exchange_many(
                plain,
                failures,
                session_id=session_id,
                queues=request.queues,
                tasks=request.tasks,
                limit=request.limit,
                take_suspect=request.take_suspect,
            )
        released = self.store.job_release_many(releases) if releases else NONE
        completed = AckResult(
            with_effects.accepted + turn.completed.accepted,
            with_effects.stale + turn.completed.stale,
        )
        return Reply(completed, turn.failed, released, turn.claimed, turn.children)

    def append(self, claim: Claim, events: Sequence[tuple[str, Any]]) -> None:
        self.store.stream_append(claim, events)

    def change_queues(
        self, session_id: str, *, add: Sequence[str] = (), remove: Sequence[str] = ()
    ) -> tuple[str, ...]:
        return self.store.session_queues(session_id, add=add, remove=remove).queues

    def pause_limit(self, claim: Claim, key: str, seconds: float) -> datetime:
        return self.store.job_pause_limit(claim, key, seconds)

    def parent_results(self, claim: Claim) -> tuple[ParentResult, ...]:
        found = self.store.job_parent_results(claim.job_id, claim=claim)
        return tuple(ParentResult(i, status, result) for i, (status, result) in found.items())

    def watch(self, session_id: str, queues: Sequence[str], wait: float) -> bool:
        return True  # never asked: the worker's hub wakes it

    def next_due(self, request: ClaimRequest) -> float | None:
        return self.store.job_next_due(queues=request.queues, tasks=request.tasks)

    def close(
        self, session_id: str, *, started: Sequence[Claim] = (), lost: bool = False
    ) -> list[int]:
        return self.store.session_close(session_id, started=started, lost=lost)

    def cut(self, reason: str, *, final: bool = False) -> int:
        return self.store.calls_cut(reason, final=final)

    def pipe(self) -> TurnPipe | None:
        return self.store.turn_pipe()


def sort_outcomes(
    outcomes: Sequence[Outcome],
) -> tuple[list[Completion], list[Completion], list[Failure], list[Claim]]:
    """Outcomes by how they are written: plain completions, completions with effects,
    failures, and the claims given back."""
    plain: list[Completion] = []
    effects: list[Completion] = []
    failures: list[Failure] = []
    releases: list[Claim] = []
    for outcome in outcomes:
        if isinstance(outcome, Completion):
            (plain if outcome.effects is None else effects).append(outcome)
        elif isinstance(outcome, Failure):
            failures.append(outcome)
        elif isinstance(outcome, Release):
            releases.append(outcome.claim)
        else:
            raise TypeError(f"not an outcome: {outcome!r}")
    return plain, effects, failures, releases
