"""The store seam implemented once over a dialect's named queries: cancel and retry,
claims, worker turns, session close and streams. (Enqueues are in ``enqueue.py``, fenced
acknowledgements in ``acks.py``, leases and sweeps in ``maintenance.py``, reads in
``reads.py``, opening sessions and heartbeats in ``sessions.py``, the transaction runner and
schema in ``engine.py``, the job's options and columns in ``columns.py``.)

A worker's turn, in one transaction (or its acknowledgements beside its claim, see
plunder.acker): job_complete ─▶ job_fail ─▶ run_close ─▶ job_claim_many. Every write names
(job id, attempt, session id); refused claims are reported stale. A run that succeeds is
kept on its job row, written by job_complete; the run history table gets a row only for a
run that ends otherwise, written once, as it ends (run_close).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from typing import Any

from plunder import errors, payload
from plunder.model import (
    AckResult,
    Claim,
    Completion,
    ErrorInfo,
    Exchange,
    Failure,
    JobRecord,
)
from plunder.states import Outcome
from plunder.store import convert
from plunder.store.acks import Acks
from plunder.store.engine import (
    CHANNEL_STREAM,
    MAX_BATCH,
    Now,
    Row,
    Tx,
)
from plunder.store.enqueue import Enqueue
from plunder.store.maintenance import Maintenance
from plunder.store.reads import Reads
from plunder.store.sessions import Sessions

__all__ = ["Row", "SQLStore"]

Claimed = tuple[list[str], list[Sequence[Any]]]  # a claim's column names and rows
# Priority levels of a queue that a claim reads one by one (see job_claim_many): a queue
# with more, a priority used as a score, would cost an index probe per level.
CLAIM_LEVELS = 16


class SQLStore(Acks, Enqueue, Maintenance, Reads, Sessions):
    """Every operation of :class:`plunder.store.base.Store`, over named queries."""

    def job_cancel(self, job_id: int, *, now: Now = None) -> JobRecord:
        def op(tx: Tx) -> Row:
            clock = tx.clock(now)
            row = tx.one("job_cancel", job_id=convert.job_id(job_id), now=clock)
            self._announce(tx, [row] if row else [])
            if row is None:
                self._refuse(tx, job_id, "cancel", "only pending or running jobs can be cancelled")
            assert row is not None
            tx.batch(  # a job cancelled before it ran has no session, and no run
                "run_close",
                [
                    convert.run_end(
                        row["id"],
                        row["attempt"],
                        row["session_id"],
                        outcome=Outcome.CANCELLED,
                        error=ErrorInfo("plunder.Cancelled", "cancelled"),
                    )
                ],
                now=clock,
            )
            return row

        return self._job(self._run(op))

    def job_retry(self, job_id: int, *, now: Now = None) -> JobRecord:
        def op(tx: Tx) -> Row:
            row = tx.one("job_retry", job_id=convert.job_id(job_id), now=tx.clock(now))
            self._announce(tx, [row] if row else [])
            if row is None:
                self._refuse(
                    tx, job_id, "retry", "only jobs that ended without success can be retried"
                )
            assert row is not None
            return row

        return self._job(self._run(op))

    def _refuse(self, tx: Tx, job_id: int, action: str, rule: str) -> None:
        current = tx.one("job_get", job_id=job_id)
        if current is None:
            raise errors.JobNotFound(f"no job {job_id}")
        raise errors.InvalidTransition(
            f"cannot {action} job {job_id}: it is {current['status']}; {rule}"
        )

    # -- sessions (opening and heartbeats: see sessions.py) ------------------------------
    def session_close(
        self,
        session_id: str,
        *,
        lost: bool = False,
        started: Sequence[Claim] = (),
        now: Now = None,
    ) -> list[int]:
        """Delete the session and give its running jobs back at once. A graceful close
        releases them without counting the attempt, but for ``started`` claims (tasks the
        worker started and stopped unfinished) whose job's retry_on_lost is off: those end
        timed_out (plunder.WorkerLost), not run again. ``lost=True`` (the worker lost its
        session and stopped its tasks) counts every attempt, as the reaper would, so a job
        that keeps costing its worker the session still ends after max_attempts."""

        def op(tx: Tx) -> list[int]:
            clock = tx.clock(now)
            if lost:
                gone = self._lose(tx, [session_id], clock)
                tx.one("session_delete", session_id=session_id)
                return [int(r["id"]) for r in gone]
            running = [
                Claim(int(r["id"]), int(r["attempt"]), session_id)
                for r in tx.all("job_running_of_session", session_id=session_id)
            ]
            stopped = set(started)
            ended = self._abandon(tx, [c for c in running if c in stopped], clock)
            released = self._release(tx, [c for c in running if c not in ended], clock)
            tx.one("session_delete", session_id=session_id)
            return [claim.job_id for claim in (*ended, *released)]

        return self._run(op)

    # -- claim and acknowledge ------------------------------------------------------------
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
        self._check_claim(queues, limit)
        claimed = self._run(
            lambda tx: self._claim(
                tx,
                session_id,
                queues=queues,
                tasks=tasks,
                limit=limit,
                take_suspect=take_suspect,
                clock=tx.clock(now),
            ),
            single=True,  # one statement: the claim writes nothing else
        )
        return self._claimed(claimed)

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
        where the dialect has it: ``_turn_at_once``). ``limit=0`` only acknowledges.
        Completions here may not carry ``effects`` (those need a transaction each)."""
        if any(c.effects is not None for c in completions):
            raise ValueError("completions with effects go through job_complete_many")
        if limit:
            self._check_claim(queues, limit)
        plain = self._encode_results(completions)
        if plain and limit and queues and tasks and not failures:
            at_once = self._turn_at_once(
                plain, session_id, queues=queues, tasks=tasks, limit=limit,
                take_suspect=take_suspect, now=now,
            )  # fmt: skip
            if at_once is not None:
                return at_once
        fail_rows = self._failure_rows(failures)

        def op(tx: Tx) -> tuple[AckResult, AckResult, Claimed]:
            clock = tx.clock(now)
            ok, refused = self._complete(tx, plain, now) if plain else ([], [])
            failed = self._fail(tx, failures, fail_rows, clock) if failures else AckResult((), ())
            claimed = self._claim(
                tx, session_id, queues=queues, tasks=tasks, limit=limit,
                take_suspect=take_suspect, clock=clock,
            ) if limit else ([], [])  # fmt: skip
            return AckResult(tuple(ok), tuple(refused)), failed, claimed

        completed, failed, claimed = self._run(op)
        return Exchange(completed, failed, tuple(self._claimed(claimed)))

    def _check_claim(self, queues: Sequence[str], limit: int) -> None:
        for queue in queues:
            payload.check_queue(queue)
        if not 1 <= int(limit) <= MAX_BATCH:
            raise ValueError(f"claim limit must be between 1 and {MAX_BATCH}, got {limit}")

    # The claim itself, in tx, by each dialect (its job_claim_many): (tx, session_id, *,
    # queues, tasks, limit, take_suspect, clock) -> the claimed rows.
    _claim_rows: Callable[..., Claimed]

    def _claim(
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
        :meth:`_claimed` after the transaction (SQLite holds its write lock until then)."""
        if not (queues and tasks):
            names: list[str] = []
            rows: list[Sequence[Any]] = []
        else:
            names, rows = self._claim_rows(
                tx,
                session_id,
                queues=list(dict.fromkeys(queues)),  # a queue named twice is read once
                tasks=list(tasks),
                limit=int(limit),
                take_suspect=bool(take_suspect),
                clock=clock,
            )
        if not rows and tx.one("session_alive", session_id=session_id, now=clock) is None:
            raise errors.SessionGone(f"session {session_id} has expired or was closed")
        return names, rows

    @contextmanager
    def transaction(self) -> Iterator[Any]:
        """A write transaction on one of this store's connections, committed when the block
        ends without an exception. For a task's own writes (see ``Context.transaction``);
        not retried, because the block's code cannot be replayed.

        An exception from the block passes through unchanged. A failure to begin or to
        commit is a plunder error like any other store call's: a serialization failure
        raised at COMMIT (CockroachDB does this; so does a deferred constraint) or a lost
        connection is :class:`StoreBusy`, which the caller may answer by running the
        whole block again."""
        from_block = False
        try:
            with self._task_transaction() as tx:
                try:
                    yield tx.conn
                except BaseException:
                    from_block = True
                    raise
        except Exception as exc:
            if from_block or isinstance(exc, errors.PlunderError):
                raise
            translated = self._translate(exc)
            if translated is None:
                raise
            raise translated from exc

    def _task_transaction(self) -> AbstractContextManager[Tx]:
        """The transaction under :meth:`transaction`; a driver may bound it differently
        from its own calls."""
        return self._transaction(write=True)

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
            self._notify(tx, CHANNEL_STREAM, [str(claim.job_id)])
            return ids

        return self._run(op, conn=conn) if rows else []
