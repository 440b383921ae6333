"""The store seam implemented once over a dialect's named queries: producers, sessions,
claims and fenced acknowledgements. (Leases and sweeps are in ``maintenance.py``, reads in
``reads.py``, the transaction runner and schema in ``engine.py``.)

A worker's turn, in one transaction (or its acknowledgements beside its claim, see
plunder.acker): job_complete ─▶ job_fail ─▶ run_close ─▶ job_claim_many. Every write names
(job id, attempt, session id); refused claims are reported stale. A run that succeeds is
kept on its job row, written by job_complete; the run history table gets a row only for a
run that ends otherwise, written once, as it ends (run_close).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from datetime import datetime
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
    JobSpec,
    build_job,
)
from plunder.states import Outcome, Status
from plunder.store import convert
from plunder.store.engine import (
    CHANNEL_STREAM,
    MAX_BATCH,
    MAX_ENQUEUE,
    Now,
    Row,
    Tx,
    _EffectsFailed,
    insert_mismatch,
)
from plunder.store.maintenance import Maintenance
from plunder.store.reads import Reads
from plunder.store.sessions import Sessions

__all__ = ["Row", "SQLStore"]

# The row _fresh reads for a job a numbered insert stored (see _match_numbered).
_NUMBERED = {"id": 0, "run_at": 1, "created_at": 2, "expires_at": 3}

Claimed = tuple[list[str], list[Sequence[Any]]]  # a claim's column names and rows
# Priority levels of a queue that a claim reads one by one (see job_claim_many): a queue
# with more, a priority used as a score, would cost an index probe per level.
CLAIM_LEVELS = 16


class SQLStore(Maintenance, Reads, Sessions):
    """Every operation of :class:`plunder.store.base.Store`, over named queries."""

    # -- producers ------------------------------------------------------------------------
    def job_enqueue_many(
        self, specs: Sequence[JobSpec], *, conn: Any = None, now: Now = None
    ) -> list[JobRecord]:
        return self._enqueue(specs, conn=conn, now=now, records=True)

    def job_enqueue_ids(
        self, specs: Sequence[JobSpec], *, conn: Any = None, now: Now = None
    ) -> list[int]:
        return self._enqueue(specs, conn=conn, now=now, records=False)

    def _enqueue(
        self, specs: Sequence[JobSpec], *, conn: Any, now: Now, records: bool
    ) -> list[Any]:
        if len(specs) > MAX_ENQUEUE:
            raise errors.PayloadError(f"at most {MAX_ENQUEUE} jobs per enqueue, got {len(specs)}")
        batch = convert.inserts(specs, self.insert_runs)
        settings, rows = batch.settings, batch.rows
        if not rows:
            return []
        # where the database delivers NOTIFY, the insert statement sends the wake-up itself
        insert = batch.query + ("_notify" if self.notifies else "")

        def op(tx: Tx) -> list[Any]:
            clock = tx.clock(now)
            fresh: dict[int, Sequence[Any]] = {}  # inputs inserted now: the row returned
            active: dict[int, Row] = {}  # inputs whose key names an active job: that job
            at = _NUMBERED
            if self.numbers_jobs:
                self._number(tx, rows)
            for _ in range(5):  # a keyed job can finish between our insert and our read
                left = list(batch.statements(fresh.keys() | active.keys()))
                for todo, values, common in left:
                    at = self._insert(
                        tx, batch, todo, query=insert, values=values, common=common,
                        clock=clock, fresh=fresh, active=active,
                    )  # fmt: skip
                if not left:
                    break
            else:
                if len(fresh) + len(active) < len(rows):
                    raise errors.StoreBusy("idempotency keys kept changing state during enqueue")
            if not records:
                return [
                    int(fresh[i][at["id"]]) if i in fresh else int(active[i]["id"])
                    for i in range(len(rows))
                ]
            times: dict[Any, datetime | None] = {}  # shared: created_at and most run_at
            return [
                self._fresh((settings[i], rows[i]), specs[i], fresh[i], at, times)
                if i in fresh
                else self._job(active[i])
                for i in range(len(rows))
            ]

        # a keyed job inserts once however often this runs; one without keys may commit alone
        keyed = [bool(row["key"]) for row in rows]
        single = not (self.numbers_jobs or any(keyed)) and len(batch.runs) == 1
        return self._run(op, conn=conn, repeatable=all(keyed), single=single)

    def _number(self, tx: Tx, rows: list[dict[str, Any]]) -> None:
        """Give each row the id it will have (see Engine.numbers_jobs) as its seq: ids
        follow the input order, from the next id of the table."""
        found = tx.one("job_id_next")
        first = 1 if found is None else int(found["id"])
        for i, row in enumerate(rows):
            row["seq"] = first + i

    def _insert(
        self,
        tx: Tx,
        batch: convert.Inserts,
        todo: list[int],
        *,
        query: str,
        values: list[dict[str, Any]],
        common: dict[str, Any],
        clock: Any,
        fresh: dict[int, Sequence[Any]],
        active: dict[int, Row],
    ) -> dict[str, int]:
        """Insert the ``todo`` inputs (their ``values``) with one statement; note each
        input's stored row in ``fresh`` or, where its key was taken, the job holding that
        key in ``active``. Returns where _fresh finds id and times in a stored row."""
        if self.numbers_jobs:
            count = tx.batch_count(query, values, now=clock, **common)
            self._match_numbered(tx, batch, todo, count, clock, fresh=fresh, active=active)
            return _NUMBERED
        names, inserted = tx.batch_table(query, values, now=clock, **common)
        at = {name: i for i, name in enumerate(names)}
        self._match_inserted(
            tx, batch.rows, batch.settings, todo, (at, inserted), fresh=fresh, active=active
        )
        return at

    def _fresh(
        self,
        encoded: tuple[dict[str, Any], dict[str, Any]],
        spec: JobSpec,
        inserted: Sequence[Any],
        at: dict[str, int],
        times: dict[Any, datetime | None],
    ) -> JobRecord:
        """The record of a job just inserted, from what we inserted (what the stored JSON
        text decodes to) and what the database assigned (id and times)."""
        options, row = encoded
        run_at, created_at = inserted[at["run_at"]], inserted[at["created_at"]]
        expires_at = inserted[at["expires_at"]]
        for moment in (run_at, created_at, expires_at):
            if moment not in times:
                times[moment] = self._opt_time(moment)
        return build_job(
            int(inserted[at["id"]]),
            options["queue"],
            options["task"],
            payload.copy_or_decode(spec.args, row["args"]),
            payload.copy_or_decode(spec.kwargs, row["kwargs"]),
            options["priority"],
            Status.PENDING,
            0,  # attempt
            options["max_attempts"],
            options["timeout"],
            options["backoff_base"],
            options["backoff_cap"],
            options["retry_on_timeout"],
            row["key"],
            times[run_at],
            times[created_at],
            None,  # started_at
            None,  # finished_at
            None,  # deadline_at
            None,  # session_id
            None,  # result
            None,  # error
            (),  # failed_sessions
            0,  # losses
            options["retry_on_lost"],
            times[expires_at],
        )

    def _match_inserted(
        self,
        tx: Tx,
        rows: list[dict[str, Any]],
        settings: list[dict[str, Any]],
        todo: list[int],
        returned: tuple[dict[str, int], list[Sequence[Any]]],
        *,
        fresh: dict[int, Sequence[Any]],
        active: dict[int, Row],
    ) -> None:
        """Pair returned rows with inputs: ids follow input order, and an input was inserted
        unless its key was taken (by an active job, or by an earlier input)."""
        at, inserted = returned
        i_id, i_key, i_task = at["id"], at["key"], at["task"]
        by_id = sorted(inserted, key=lambda r: int(r[i_id]))
        new_keys = {r[i_key] for r in by_id if r[i_key] is not None}
        taken: set[str] = set()
        keyed = []
        position = 0
        for i in todo:
            key = rows[i]["key"]
            if key is None or (key in new_keys and key not in taken):
                if position == len(by_id):
                    insert_mismatch(tx, "enqueue returned fewer rows than it inserted")
                row = by_id[position]
                position += 1
                if row[i_key] != key or row[i_task] != settings[i]["task"]:
                    insert_mismatch(tx, "enqueue returned rows out of input order")
                fresh[i] = row
                if key is not None:
                    taken.add(key)
            else:
                keyed.append(i)
        self._holders(tx, rows, keyed, active)

    def _match_numbered(
        self,
        tx: Tx,
        batch: convert.Inserts,
        todo: list[int],
        count: int,
        clock: Any,
        *,
        fresh: dict[int, Sequence[Any]],
        active: dict[int, Row],
    ) -> None:
        """Which of ``todo`` a numbered insert (see Engine.numbers_jobs) stored: all when it
        inserted as many rows as it was given, else those whose id is now in the table (the
        others' keys were taken). A fresh job's row, for ``_fresh``, is made here: its id,
        run_at and created_at, as the statement computed them."""
        rows = batch.rows
        stored: set[int] | None = None
        if count != len(todo):
            found = tx.all("job_claim_state", job_ids=self._list_in([rows[i]["seq"] for i in todo]))
            stored = {int(r["id"]) for r in found}
        keyed = []
        for i in todo:
            seq = rows[i]["seq"]
            if stored is None or seq in stored:
                options = batch.settings[i]
                expires_in = options["expires_in"]
                expires = None if expires_in is None else clock + expires_in
                fresh[i] = (seq, clock + options["delay"], clock, expires)
            elif rows[i]["key"] is None:
                raise errors.StoreError(f"enqueue did not store job {seq}, which has no key")
            else:
                keyed.append(i)
        self._holders(tx, rows, keyed, active)

    def _holders(
        self, tx: Tx, rows: list[dict[str, Any]], keyed: list[int], active: dict[int, Row]
    ) -> None:
        """The active job holding each key of ``keyed`` inputs (none when it finished
        meanwhile: the caller inserts those again)."""
        if not keyed:
            return
        keys = sorted({rows[i]["key"] for i in keyed})
        found = {r["key"]: r for r in tx.all("job_get_active_by_keys", keys=self._list_in(keys))}
        for i in keyed:
            if rows[i]["key"] in found:
                active[i] = found[rows[i]["key"]]

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
            claimed = (
                self._claim(
                    tx,
                    session_id,
                    queues=queues,
                    tasks=tasks,
                    limit=limit,
                    take_suspect=take_suspect,
                    clock=clock,
                )
                if limit
                else ([], [])
            )
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

    def job_complete_many(
        self, completions: Sequence[Completion], *, now: Now = None, conn: Any = None
    ) -> AckResult:
        encoded = self._encode_results(completions)
        plain = [(c, text) for c, text in encoded if c.effects is None]
        accepted: list[Claim] = []
        stale: list[Claim] = []
        failed: list[tuple[Claim, BaseException]] = []
        if plain:
            # one statement (more only for refused claims); a retry is safe (_succeeded)
            ok, refused = self._run(
                lambda tx: self._complete(tx, plain, now), conn=conn, single=True
            )
            accepted += ok
            stale += refused
        for item in [(c, text) for c, text in encoded if c.effects is not None]:
            single = [item]  # its own transaction: the task's writes commit with this ack
            try:
                ok, refused = self._run(functools.partial(self._complete, items=single, now=now))
            except _EffectsFailed as exc:
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

    def _encode_results(self, completions: Sequence[Completion]) -> list[tuple[Completion, str]]:
        def text(c: Completion) -> str:
            what = f"result of job {c.claim.job_id}"
            return c.encoded if c.encoded is not None else payload.encode(c.result, what=what)

        return [(c, text(c)) for c in completions]

    def _complete(
        self, tx: Tx, items: list[tuple[Completion, str]], now: Now
    ) -> tuple[list[Claim], list[Claim]]:
        clock = tx.clock(now)
        # completes the jobs, and tells their result waiters (those that had succeeded
        # before were told then); the run that succeeded is kept on each (see job_complete)
        query = "job_complete_notify" if self.notifies else "job_complete"
        changed = tx.columns_count(query, convert.completion_columns(items), now=clock)
        if changed != len(items):
            return self._settle(tx, items, clock)
        # Effects run only where this statement did the update (a completion with effects
        # has a transaction of its own): a retried acknowledgement of one that already
        # committed is accepted again, but its effects were written by that commit.
        for completion, _ in items:
            if completion.effects is not None:
                try:
                    completion.effects(tx.conn)
                except Exception as exc:
                    raise _EffectsFailed(exc) from exc
        return [c.claim for c, _ in items], []

    def _settle(
        self, tx: Tx, items: list[tuple[Completion, str]], clock: Any
    ) -> tuple[list[Claim], list[Claim]]:
        """After job_complete changed fewer jobs than it was given (some refused, repeated,
        or succeeded before), which were accepted; the stale ones get their history rows."""
        done = self._succeeded(tx, [c.claim for c, _ in items])
        refused = [c for c, _ in items if c.claim not in done]
        self._mark_stale(tx, refused, clock)
        return [c.claim for c, _ in items if c.claim in done], [c.claim for c in refused]

    def _succeeded(self, tx: Tx, claims: list[Claim]) -> set[Claim]:
        """Claims whose job is now succeeded under that very claim — by this statement or
        by an earlier one: a retried acknowledgement after an ambiguous commit is accepted
        again instead of being reported stale."""
        if not claims:
            return set()
        states = {
            int(r["id"]): r
            for r in tx.all("job_claim_state", job_ids=self._list_in([c.job_id for c in claims]))
        }
        return {
            c
            for c in claims
            if (s := states.get(c.job_id)) is not None
            and s["status"] == Status.SUCCEEDED
            and s["attempt"] == c.attempt
            and s["session_id"] == c.session_id
        }

    def _mark_stale(self, tx: Tx, items: Sequence[Completion | Failure], clock: Any) -> None:
        tx.batch(
            "run_mark_stale",
            [
                {**convert.claim_row(item.claim), "logs": convert.logs_text(item.logs)}
                for item in items
            ],
            now=clock,
        )

    def job_fail_many(self, failures: Sequence[Failure], *, now: Now = None) -> AckResult:
        rows = self._failure_rows(failures)
        if not failures:
            return AckResult((), ())
        return self._run(lambda tx: self._fail(tx, failures, rows, tx.clock(now)))

    def _failure_rows(self, failures: Sequence[Failure]) -> list[dict[str, Any]]:
        return [
            {
                **convert.claim_row(f.claim),
                "error": payload.encode(f.error.as_dict(), what="error"),
                "retry": f.retry_delay is not None,
                "delay": convert.non_negative("retry delay", f.retry_delay or 0.0),
                "final_status": (
                    Status.TIMED_OUT if f.outcome == Outcome.TIMED_OUT else Status.FAILED
                ).value,
            }
            for f in failures
        ]

    def _fail(
        self, tx: Tx, failures: Sequence[Failure], rows: list[dict[str, Any]], clock: Any
    ) -> AckResult:
        returned = tx.batch("job_fail", rows, now=clock)
        self._announce(tx, returned)
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
        self._mark_stale(tx, refused, clock)
        return AckResult(tuple(f.claim for f in ok), tuple(f.claim for f in refused))

    def job_release_many(self, claims: Sequence[Claim], *, now: Now = None) -> AckResult:
        def op(tx: Tx) -> AckResult:
            released = self._release(tx, list(claims), tx.clock(now))
            return AckResult(tuple(released), tuple(c for c in claims if c not in released))

        return self._run(op) if claims else AckResult((), ())

    def _release(self, tx: Tx, claims: list[Claim], clock: Any) -> list[Claim]:
        return self._end_attempts(tx, "job_release", claims, clock, outcome=Outcome.RELEASED)

    def _abandon(self, tx: Tx, claims: list[Claim], clock: Any) -> list[Claim]:
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
        self._announce(tx, returned)
        done = convert.claims_of(returned)
        ended = [c for c in claims if c in done]
        ends = [
            convert.run_end(c.job_id, c.attempt, c.session_id, outcome=outcome, error=error)
            for c in ended
        ]
        tx.batch("run_close", ends, now=clock)
        return ended

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
