"""Fenced acknowledgements: completions, failures and releases of claimed attempts.

Every write names (job id, attempt, session id) and changes a job only while that claim is
current; a refused claim is reported stale and gets its history row (run_mark_stale). A
completion with ``effects`` commits in a transaction of its own, together with the task's
writes. An attempt that ends other than in success closes its history row (run_close).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

from plunder import errors, payload
from plunder.model import AckResult, Claim, Completion, ErrorInfo, Failure, JobRecord
from plunder.states import Outcome, Status
from plunder.store import convert, limits
from plunder.store.driver import Now, Row, Tx
from plunder.store.engine import EffectsFailed, Engine


class Acks:
    """job_complete_many, job_fail_many, job_release_many, job_cancel and job_retry, and
    the steps a turn and a session's close share with them."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.limits = limits.Limits(engine)

    def job_complete_many(
        self, completions: Sequence[Completion], *, now: Now = None, conn: Any = None
    ) -> AckResult:
        encoded = self.encode_results(completions)
        plain = [(c, text) for c, text in encoded if c.effects is None]
        accepted: list[Claim] = []
        stale: list[Claim] = []
        failed: list[tuple[Claim, BaseException]] = []
        if plain:
            # one statement (more only for refused claims); a retry is safe (_succeeded)
            ok, refused = self.engine.run(
                lambda tx: self.complete(tx, plain, now), conn=conn, single=True
            )
            accepted += ok
            stale += refused
        for item in [(c, text) for c, text in encoded if c.effects is not None]:
            single = [item]  # its own transaction: the task's writes commit with this ack
            try:
                ok, refused = self.engine.run(
                    functools.partial(self.complete, items=single, now=now)
                )
            except EffectsFailed as exc:
                failed.append((item[0].claim, exc.original))
                continue
            except (errors.StoreBusy, errors.StoreUnavailable):
                raise
            except errors.StoreError as exc:  # e.g. the task's writes broke a deferred
                failed.append((item[0].claim, exc))  # constraint at COMMIT
                continue
            accepted += ok
            stale += refused
        return AckResult(tuple(accepted), tuple(stale), tuple(failed))

    def encode_results(self, completions: Sequence[Completion]) -> list[tuple[Completion, str]]:
        def text(c: Completion) -> str:
            what = f"result of job {c.claim.job_id}"
            return c.encoded if c.encoded is not None else payload.encode(c.result, what=what)

        return [(c, text(c)) for c in completions]

    def complete(
        self, tx: Tx, items: list[tuple[Completion, str]], now: Now
    ) -> tuple[list[Claim], list[Claim]]:
        clock = tx.clock(now)
        # completes the jobs, and tells their result waiters (those that had succeeded
        # before were told then); the run that succeeded is kept on each (see job_complete)
        query = "job_complete_notify" if self.engine.driver.notifies else "job_complete"
        changed = tx.columns_count(query, convert.completion_columns(items), now=clock)
        if changed != len(items):
            return self.settle(tx, items, clock)
        # Effects run only where this statement did the update (a completion with effects
        # has a transaction of its own): a retried acknowledgement of one that already
        # committed is accepted again, but its effects were written by that commit.
        for completion, _ in items:
            if completion.effects is not None:
                try:
                    completion.effects(tx.conn)
                except Exception as exc:
                    raise EffectsFailed(exc) from exc
        return [c.claim for c, _ in items], []

    def settle(
        self, tx: Tx, items: list[tuple[Completion, str]], clock: Any
    ) -> tuple[list[Claim], list[Claim]]:
        """After job_complete changed fewer jobs than it was given (some refused, repeated,
        or succeeded before), which were accepted; the stale ones get their history rows."""
        done = self._succeeded(tx, [c.claim for c, _ in items])
        refused = [c for c, _ in items if c.claim not in done]
        self.mark_stale(tx, refused, clock)
        return [c.claim for c, _ in items if c.claim in done], [c.claim for c in refused]

    def _succeeded(self, tx: Tx, claims: list[Claim]) -> set[Claim]:
        """Claims whose job is now succeeded under that very claim — by this statement or
        by an earlier one: a retried acknowledgement after an ambiguous commit is accepted
        again instead of being reported stale."""
        if not claims:
            return set()
        states = {
            int(r["id"]): r
            for r in tx.all(
                "job_claim_state", job_ids=self.engine.list_in([c.job_id for c in claims])
            )
        }
        return {
            c
            for c in claims
            if (s := states.get(c.job_id)) is not None
            and s["status"] == Status.SUCCEEDED
            and s["attempt"] == c.attempt
            and s["session_id"] == c.session_id
        }

    def mark_stale(self, tx: Tx, items: Sequence[Completion | Failure], clock: Any) -> None:
        tx.batch(
            "run_mark_stale",
            [
                {**convert.claim_row(item.claim), "logs": convert.logs_text(item.logs)}
                for item in items
            ],
            now=clock,
        )

    def job_fail_many(self, failures: Sequence[Failure], *, now: Now = None) -> AckResult:
        rows = self.failure_rows(failures)
        if not failures:
            return AckResult((), ())
        return self.engine.run(lambda tx: self.fail(tx, failures, rows, tx.clock(now)))

    def failure_rows(self, failures: Sequence[Failure]) -> list[dict[str, Any]]:
        return [
            {
                **convert.claim_row(f.claim),
                "error": payload.encode(f.error.as_dict(), what="error"),
                "retry": f.retry_delay is not None,
                "delay": convert.non_negative("retry delay", f.retry_delay or 0.0),
                # a lost run ends as the reaper ends one (its worker gave it up unfinished)
                "final_status": (
                    Status.TIMED_OUT
                    if f.outcome in (Outcome.TIMED_OUT, Outcome.LOST)
                    else Status.FAILED
                ).value,
            }
            for f in failures
        ]

    def fail(
        self, tx: Tx, failures: Sequence[Failure], rows: list[dict[str, Any]], clock: Any
    ) -> AckResult:
        returned = tx.batch("job_fail", rows, now=clock)
        self.engine.announce(tx, returned)
        done = convert.claims_of(returned)
        ok = [f for f in failures if f.claim in done]
        tx.batch(
            "run_close",
            [
                convert.run_end(
                    f.claim.job_id,
                    f.claim.attempt,
                    f.claim.session_id,
                    outcome=f.outcome,
                    error=f.error,
                    logs=f.logs,
                )
                for f in ok
            ],
            now=clock,
        )
        refused = [f for f in failures if f.claim not in done]
        self.mark_stale(tx, refused, clock)
        return AckResult(tuple(f.claim for f in ok), tuple(f.claim for f in refused))

    def job_release_many(self, claims: Sequence[Claim], *, now: Now = None) -> AckResult:
        def op(tx: Tx) -> AckResult:
            released = self.release(tx, list(claims), tx.clock(now))
            return AckResult(tuple(released), tuple(c for c in claims if c not in released))

        return self.engine.run(op) if claims else AckResult((), ())

    def release(self, tx: Tx, claims: list[Claim], clock: Any) -> list[Claim]:
        return self._end_attempts(tx, "job_release", claims, clock, outcome=Outcome.RELEASED)

    def abandon(self, tx: Tx, claims: list[Claim], clock: Any) -> list[Claim]:
        """End the started attempts among ``claims`` whose job's retry_on_lost is off, as
        lost runs (job_abandon); return them."""
        if not claims:
            return []
        error = ErrorInfo(
            "plunder.WorkerLost",
            f"the worker of session {claims[0].session_id} shut down and stopped this "
            "attempt unfinished; not run again (retry_on_lost=False)",
        )
        return self._end_attempts(
            tx, "job_abandon", claims, clock, outcome=Outcome.LOST, error=error
        )

    def _end_attempts(
        self,
        tx: Tx,
        query: str,
        claims: list[Claim],
        clock: Any,
        *,
        outcome: Outcome,
        error: ErrorInfo | None = None,
    ) -> list[Claim]:
        """Run the fenced batch ``query`` over ``claims`` (with ``error``, encoded, as its
        :error), then close the history row of each attempt it ended with ``outcome``;
        return the claims it ended."""
        if not claims:
            return []
        extra = {} if error is None else {"error": payload.encode(error.as_dict())}
        returned = tx.batch(query, [convert.claim_row(c) for c in claims], now=clock, **extra)
        self.engine.announce(tx, returned)
        done = convert.claims_of(returned)
        ended = [c for c in claims if c in done]
        ends = [
            convert.run_end(c.job_id, c.attempt, c.session_id, outcome=outcome, error=error)
            for c in ended
        ]
        tx.batch("run_close", ends, now=clock)
        return ended

    def job_cancel(self, job_id: int, *, now: Now = None) -> JobRecord:
        def op(tx: Tx) -> Row:
            clock = tx.clock(now)
            row = tx.one("job_cancel", job_id=convert.job_id(job_id), now=clock)
            self.engine.announce(tx, [row] if row else [])
            if row is None:
                _refuse(tx, job_id, "cancel", "only pending or running jobs can be cancelled")
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
            if row["limit_key"] is not None:  # a running job's place is free
                self.limits.admit(tx, [row["limit_key"]], clock)
            return row

        return self.engine.job(self.engine.run(op))

    def job_retry(self, job_id: int, *, now: Now = None) -> JobRecord:
        def op(tx: Tx) -> Row:
            clock = tx.clock(now)
            row = tx.one("job_retry", job_id=convert.job_id(job_id), now=clock)
            self.engine.announce(tx, [row] if row else [])
            if row is None:
                _refuse(tx, job_id, "retry", "only jobs that ended without success can be retried")
            assert row is not None
            if row["limit_key"] is None:
                return row
            self.limits.admit(tx, [row["limit_key"]], clock)  # it went back held
            return tx.one("job_get", job_id=row["id"]) or row

        return self.engine.job(self.engine.run(op))


def _refuse(tx: Tx, job_id: int, action: str, rule: str) -> None:
    current = tx.one("job_get", job_id=job_id)
    if current is None:
        raise errors.JobNotFound(f"no job {job_id}")
    raise errors.InvalidTransition(
        f"cannot {action} job {job_id}: it is {current['status']}; {rule}"
    )
