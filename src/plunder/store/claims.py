"""Claims, worker turns and streams, over a dialect's named queries.

A worker's turn, in one transaction (plunder.turns; the results no turn carries go alone,
see plunder.acker): job_complete ─▶ job_fail ─▶ run_close ─▶ job_claim_many. Every write names
(job id, attempt, session id); refused claims are reported stale. A run that succeeds is
kept on its job row, written by job_complete; the run history table gets a row only for a
run that ends otherwise, written once, as it ends (run_close).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from plunder import errors, payload
from plunder.model import AckResult, Claim, Completion, Exchange, Failure, JobRecord
from plunder.store import convert
from plunder.store.acks import Acks
from plunder.store.driver import Claimed, Now, Tx
from plunder.store.engine import CHANNEL_STREAM, MAX_BATCH, Engine
from plunder.store.fairness import Fairness


class TurnAtOnce(Protocol):
    """A worker's turn of completions (their results encoded) and a claim, validated, as
    one statement where the dialect has one (PostgreSQL's job_exchange); None: it is the
    transaction of several statements that ``Claims.job_exchange_many`` runs."""

    def __call__(
        self,
        plain: list[tuple[Completion, str]],
        session_id: str,
        *,
        queues: Sequence[str],
        tasks: Sequence[str],
        limit: int,
        take_suspect: bool,
        now: Now,
    ) -> Exchange | None: ...


def check_claim(queues: Sequence[str], limit: int) -> None:
    """Raise on a queue name no job can have, or a limit out of range."""
    for queue in queues:
        payload.check_stored_queue(queue)  # a partition's own queue, too
    if not 1 <= int(limit) <= MAX_BATCH:
        raise ValueError(f"claim limit must be between 1 and {MAX_BATCH}, got {limit}")


class Claims:
    """job_claim_many, job_exchange_many (acknowledging with ``acks``; in one statement
    with ``at_once`` where the dialect has it) and stream_append."""

    def __init__(
        self,
        engine: Engine,
        acks: Acks,
        at_once: TurnAtOnce | None = None,
        fairness: Fairness | None = None,
    ) -> None:
        self.engine = engine
        self.acks = acks
        self.at_once = at_once
        self.fairness = fairness

    def fair(self, queues: Sequence[str], *, read: bool = True) -> bool:
        """Whether a claim of ``queues`` names a fair queue (plunder.store.fairness);
        ``read=False``: as last read, inside a transaction."""
        return self.fairness is not None and bool(self.fairness.among(queues, read=read))

    def job_claim_many(
        self,
        session_id: str,
        *,
        queues: Sequence[str],
        tasks: Sequence[str],
        limit: int,
        take_suspect: bool = True,
        now: Now = None,
    ) -> list[JobRecord]:
        check_claim(queues, limit)
        claimed = self.engine.run(
            lambda tx: self.claim(
                tx,
                session_id,
                queues=queues,
                tasks=tasks,
                limit=limit,
                take_suspect=take_suspect,
                clock=tx.clock(now),
            ),
            single=not self.fair(queues),  # one statement: the claim writes nothing else
        )
        return self.engine.claimed(claimed)

    def job_exchange_many(
        self,
        completions: Sequence[Completion],
        failures: Sequence[Failure],
        *,
        session_id: str,
        queues: Sequence[str],
        tasks: Sequence[str],
        limit: int,
        take_suspect: bool = True,
        now: Now = None,
    ) -> Exchange:
        """Acknowledge finished attempts and claim new jobs in ONE commit (one statement
        where the dialect has it: ``at_once``). ``limit=0`` only acknowledges.
        Completions here may not carry ``effects`` (those need a transaction each)."""
        if any(c.effects is not None for c in completions):
            raise ValueError("completions with effects go through job_complete_many")
        if limit:
            check_claim(queues, limit)
        plain = self.acks.encode_results(completions)
        fair = bool(limit) and self.fair(queues)  # read here, not in the transaction
        at_once = self.at_once is not None and not fair
        if plain and limit and queues and tasks and not failures and at_once:
            assert self.at_once is not None
            exchange = self.at_once(
                plain, session_id, queues=queues, tasks=tasks, limit=limit,
                take_suspect=take_suspect, now=now,
            )  # fmt: skip
            if exchange is not None:
                return exchange
        fail_rows = self.acks.failure_rows(failures)

        def op(tx: Tx) -> tuple[AckResult, AckResult, Claimed]:
            clock = tx.clock(now)
            ok, refused = self.acks.complete(tx, plain, now) if plain else ([], [])
            failed = (
                self.acks.fail(tx, failures, fail_rows, clock) if failures else AckResult((), ())
            )
            claimed = self.claim(
                tx, session_id, queues=queues, tasks=tasks, limit=limit,
                take_suspect=take_suspect, clock=clock,
            ) if limit else ([], [])  # fmt: skip
            return AckResult(tuple(ok), tuple(refused)), failed, claimed

        completed, failed, claimed = self.engine.run(op)
        return Exchange(completed, failed, tuple(self.engine.claimed(claimed)))

    def claim(
        self,
        tx: Tx,
        session_id: str,
        *,
        queues: Sequence[str],
        tasks: Sequence[str],
        limit: int,
        take_suspect: bool,
        clock: Any,
    ) -> Claimed:
        """Claim in ``tx``: the column names and the claimed rows, made into records by
        ``Engine.claimed`` after the transaction (SQLite holds its write lock until then)."""
        if not (queues and tasks):
            names: list[str] = []
            rows: list[Sequence[Any]] = []
        else:

            def plain(named: list[str], most: int) -> Claimed:
                return self.engine.driver.claim_rows(
                    tx, session_id, queues=named, tasks=list(tasks), limit=most,
                    take_suspect=bool(take_suspect), clock=clock,
                )  # fmt: skip

            named = list(dict.fromkeys(queues))  # a queue named twice is read once
            if self.fair(named, read=False):  # read before the transaction began
                assert self.fairness is not None
                names, rows = self.fairness.claim(
                    tx, session_id, queues=named, tasks=list(tasks), limit=int(limit),
                    take_suspect=bool(take_suspect), clock=clock, plain=plain,
                )  # fmt: skip
            else:
                names, rows = plain(named, int(limit))
        if not rows and tx.one("session_alive", session_id=session_id, now=clock) is None:
            raise errors.SessionGone(f"session {session_id} has expired or was closed")
        return names, rows

    # -- streams --------------------------------------------------------------------------
    def stream_append(
        self,
        claim: Claim,
        events: Sequence[tuple[str, Any]],
        *,
        now: Now = None,
        conn: Any = None,
    ) -> list[int]:
        rows = []
        for kind, data in events:
            if kind not in ("chunk", "progress"):
                raise ValueError(f"stream event kind must be 'chunk' or 'progress', not {kind!r}")
            rows.append(
                {
                    "job_id": claim.job_id,
                    "attempt": claim.attempt,
                    "kind": kind,
                    "data": payload.encode(data, what=f"stream data of job {claim.job_id}"),
                }
            )

        def op(tx: Tx) -> list[int]:
            clock = tx.clock(now)
            if tx.one("job_check_claim", **convert.claim_row(claim), now=clock) is None:
                raise errors.StaleClaim(
                    f"job {claim.job_id} attempt {claim.attempt} is no longer claimed by "
                    f"this session; its stream events were discarded",
                    job_id=claim.job_id,
                    attempt=claim.attempt,
                    session_id=claim.session_id,
                )
            ids = [int(r["id"]) for r in tx.batch("event_append", rows, now=clock)]
            self.engine.notify(tx, CHANNEL_STREAM, [str(claim.job_id)])
            return ids

        return self.engine.run(op, conn=conn) if rows else []
