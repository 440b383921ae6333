"""The store seam implemented once over a dialect's named queries.

A driver (``sqlite.py``, ``postgres.py``) supplies connections, a transaction, the value
conversions its database needs and the classification of its errors; everything else —
validation, the order of statements inside each transaction, fencing, matching batch rows
to their inputs — lives here, so both backends behave the same by construction.

Inside one operation::

    _run(op) ── begin ──▶ op(tx): tx.one / tx.all / tx.batch("query_name", ...) ── commit
       ▲                                    │
       └── busy? sleep a fixed, jittered interval, run op again (bounded total) ◀┘
"""

from __future__ import annotations

import functools
import math
import secrets
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager
from datetime import datetime
from typing import Any, Protocol, TypeVar

from plunder import errors, payload, policy
from plunder.model import (
    AckResult,
    Claim,
    Completion,
    ErrorInfo,
    Failure,
    Heartbeat,
    JobPage,
    JobRecord,
    JobSpec,
    Lease,
    QueueStats,
    Run,
    Session,
    StreamEvent,
    SweepResult,
)
from plunder.states import TERMINAL, Outcome, Status
from plunder.store import queries

T = TypeVar("T")
Row = Mapping[str, Any]
Now = datetime | None

MAX_BATCH = 10_000  # claims and acknowledgements per call
MAX_ENQUEUE = 100_000  # jobs per enqueue call
MAX_LOG_LINES = 200
MAX_LOG_LINE_CHARS = 2_000
INT32 = 2**31 - 1

CHANNEL_ENQUEUED = "plunder_enqueued"  # payload: queue names with new or newly due work
CHANNEL_DONE = "plunder_done"  # payload: ids of jobs that reached a terminal state
CHANNEL_STREAM = "plunder_stream"  # payload: ids of jobs with new stream events
NOTIFY_BYTES = 7000

SESSION_LOST = ErrorInfo(
    "plunder.SessionLost",
    "the worker's session expired while this attempt was running (the worker died, "
    "hung or lost the database)",
)
JOB_TIMEOUT = ErrorInfo("plunder.JobTimeout", "the job ran past its timeout")


class Tx(Protocol):
    """One open transaction, as the shared code sees it."""

    conn: Any

    def clock(self, now: Now) -> Any:
        """The value to pass as the ``now`` parameter for this transaction."""
        ...

    def all(self, name: str, /, **params: Any) -> list[Row]: ...

    def one(self, name: str, /, **params: Any) -> Row | None: ...

    def batch(self, name: str, rows: Sequence[Mapping[str, Any]], /, **common: Any) -> list[Row]:
        """Run a batch query over ``rows`` (one statement, or one per row) and return every
        row it returned."""
        ...

    def script(self, sql: str) -> None:
        """Execute one DDL statement."""
        ...


class _EffectsFailed(Exception):
    """Carries an exception raised by a task's own writes out of the transaction."""

    def __init__(self, original: BaseException) -> None:
        super().__init__(str(original))
        self.original = original


class SQLStore(ABC):
    """Every operation of :class:`plunder.store.base.Store`, over named queries."""

    dialect: str
    url: str
    notifies = False  # whether the database delivers NOTIFY to listeners

    def __init__(
        self, *, busy_total: float = policy.BUSY_TOTAL, busy_interval: float = policy.BUSY_INTERVAL
    ) -> None:
        self.busy_total = busy_total
        self.busy_interval = busy_interval
        self.queries = queries.load(self.dialect)

    # -- what a driver provides -----------------------------------------------------------
    @abstractmethod
    def _transaction(self, *, write: bool) -> AbstractContextManager[Tx]:
        """Begin a transaction (SQLite: BEGIN IMMEDIATE for writes), commit on exit."""

    @abstractmethod
    def _joined(self, conn: Any) -> Tx:
        """A Tx over the caller's own open connection and transaction."""

    @abstractmethod
    def _translate(self, exc: Exception) -> Exception | None:
        """Map a driver error to a plunder error: a StoreBusy means "retry the whole
        transaction"; None means "not a driver error, let it through"."""

    @abstractmethod
    def _time(self, value: Any) -> datetime: ...

    @abstractmethod
    def _list_in(self, values: Sequence[Any]) -> Any: ...

    @abstractmethod
    def _list_out(self, value: Any) -> list[str]: ...

    @abstractmethod
    def close(self) -> None:
        """Close every connection this store opened."""

    # -- notifications --------------------------------------------------------------------
    def _notify(self, tx: Tx, channel: str, items: Sequence[str]) -> None:
        """Queue a notification that is delivered when ``tx`` commits: the payload is a
        comma-separated list (queue names and job ids contain no commas), chunked below the
        8000-byte limit. A no-op for databases without NOTIFY."""
        if not self.notifies or not items:
            return
        chunk: list[str] = []
        size = 0
        for item in sorted(set(items)):
            if chunk and size + len(item) + 1 > NOTIFY_BYTES:
                tx.one("notify", channel=channel, payload=",".join(chunk))
                chunk, size = [], 0
            chunk.append(item)
            size += len(item) + 1
        tx.one("notify", channel=channel, payload=",".join(chunk))

    def _announce(self, tx: Tx, rows: Sequence[Row]) -> None:
        """Tell listeners about jobs that changed state: pending again wakes the workers of
        its queue, a terminal state wakes whoever waits for its result."""
        pending = [str(r["queue"]) for r in rows if r["status"] == Status.PENDING]
        finished = [str(r["id"]) for r in rows if r["status"] in TERMINAL]
        self._notify(tx, CHANNEL_ENQUEUED, pending)
        self._notify(tx, CHANNEL_DONE, finished)

    def job_next_due(self, *, queues: Sequence[str], tasks: Sequence[str]) -> float | None:
        """Seconds until the earliest pending job for these queues and tasks is due, by the
        database clock (zero or less: due now; None: no such job)."""
        if not queues or not tasks:
            return None
        row = self._run(
            lambda tx: tx.one(
                "job_next_due",
                queues=self._list_in(list(queues)),
                tasks=self._list_in(list(tasks)),
                now=tx.clock(None),
            ),
            write=False,
        )
        return None if row is None or row["due_in"] is None else float(row["due_in"])

    # -- the transaction runner -----------------------------------------------------------
    def _run(self, op: Callable[[Tx], T], *, write: bool = True, conn: Any = None) -> T:
        if conn is not None:
            return self._once(op, self._joined(conn))
        backoff = policy.BusyBackoff(interval=self.busy_interval, total=self.busy_total)
        while True:
            try:
                with self._transaction(write=write) as tx:
                    return op(tx)
            except errors.StoreBusy as exc:
                # raised by the driver itself (SQLite BUSY while opening a connection) or by
                # op: retried like a busy error from the database
                busy, cause = exc, exc.__cause__
            except (errors.PlunderError, _EffectsFailed):
                raise
            except Exception as exc:
                translated = self._translate(exc)
                if translated is None:
                    raise
                if not isinstance(translated, errors.StoreBusy):
                    raise translated from exc
                busy, cause = translated, exc
            wait = backoff.next_wait()
            if wait is None:
                raise busy from cause
            time.sleep(wait)

    def _once(self, op: Callable[[Tx], T], tx: Tx) -> T:
        try:
            return op(tx)
        except errors.PlunderError:
            raise
        except Exception as exc:
            translated = self._translate(exc)
            if translated is None:
                raise
            raise translated from exc

    # -- schema ---------------------------------------------------------------------------
    @property
    def latest_version(self) -> int:
        return len(queries.migrations(self.dialect))

    def migrate(self, *, fresh_schema: bool = True) -> int:
        """Bring the schema to the latest version. An empty database gets the fresh schema
        in one step (or, with ``fresh_schema=False``, every migration in turn)."""

        def create(tx: Tx) -> None:
            tx.all("schema_table_create")
            tx.all("schema_row_init")

        def apply(tx: Tx) -> int:
            row = tx.one("schema_version_lock")
            current = int(row["version"]) if row else 0
            latest = self.latest_version
            if current > latest:
                raise errors.SchemaError(self._too_new(current))
            if current == 0 and fresh_schema:
                scripts = [queries.schema(self.dialect)]
            else:
                scripts = [
                    sql for version, _, sql in queries.migrations(self.dialect) if version > current
                ]
            for script in scripts:
                for statement in queries.statements(script):
                    tx.script(statement)
            tx.all("schema_version_set", version=latest)
            return latest

        try:
            self._run(create)
        except errors.StoreError:
            # PostgreSQL's CREATE TABLE IF NOT EXISTS is not atomic: when migrators race, the
            # losers fail on the catalog (unique violation on pg_type, "type already
            # exists"). The winner's table exists by now, so once more is enough.
            self._run(create)
        return self._run(apply)

    def schema_check(self) -> int:
        def read(tx: Tx) -> int | None:
            exists = tx.one("schema_table_exists")
            if not exists or not exists["n"]:
                return None
            row = tx.one("schema_version_get")
            return int(row["version"]) if row else None

        version = self._run(read, write=False)
        latest = self.latest_version
        if not version:
            raise errors.SchemaError(
                f"{self.url} has no plunder schema; run `plunder init --db {self.url}`"
            )
        if version > latest:
            raise errors.SchemaError(self._too_new(version))
        if version < latest:
            raise errors.SchemaError(
                f"{self.url} has plunder schema version {version}, this plunder needs "
                f"{latest}; run `plunder init` to migrate"
            )
        return version

    def _too_new(self, version: int) -> str:
        return (
            f"{self.url} has plunder schema version {version}, newer than this plunder "
            f"understands ({self.latest_version}); upgrade plunder"
        )

    def now(self) -> datetime:
        row = self._run(lambda tx: tx.one("clock_now"), write=False)
        assert row is not None
        return self._time(row["now"])

    # -- producers ------------------------------------------------------------------------
    def job_enqueue_many(
        self, specs: Sequence[JobSpec], *, conn: Any = None, now: Now = None
    ) -> list[JobRecord]:
        if len(specs) > MAX_ENQUEUE:
            raise errors.PayloadError(f"at most {MAX_ENQUEUE} jobs per enqueue, got {len(specs)}")
        rows = [_spec_row(spec) for spec in specs]
        if not rows:
            return []

        def op(tx: Tx) -> list[JobRecord]:
            clock = tx.clock(now)
            found: dict[int, Row] = {}
            for _ in range(5):  # a keyed job can finish between our insert and our read
                todo = [i for i in range(len(rows)) if i not in found]
                if not todo:
                    break
                inserted = tx.batch("job_insert", [rows[i] for i in todo], now=clock)
                found.update(self._match_inserted(tx, rows, todo, inserted))
            else:
                raise errors.StoreBusy("idempotency keys kept changing state during enqueue")
            self._notify(tx, CHANNEL_ENQUEUED, [str(found[i]["queue"]) for i in found])
            return [self._job(found[i]) for i in range(len(rows))]

        return self._run(op, conn=conn)

    def _match_inserted(
        self, tx: Tx, rows: list[dict[str, Any]], todo: list[int], inserted: list[Row]
    ) -> dict[int, Row]:
        """Pair returned rows with inputs: ids follow input order, and an input was inserted
        unless its key was taken (by an active job, or by an earlier input)."""
        by_id = sorted(inserted, key=lambda r: int(r["id"]))
        new_keys = {r["key"] for r in by_id if r["key"] is not None}
        matched: dict[int, Row] = {}
        taken: set[str] = set()
        position = 0
        for i in todo:
            key = rows[i]["key"]
            if key is None or (key in new_keys and key not in taken):
                row = by_id[position]
                position += 1
                if row["key"] != key or row["task"] != rows[i]["task"]:
                    raise errors.StoreError("enqueue returned rows out of input order")
                matched[i] = row
                if key is not None:
                    taken.add(key)
        keyed = [i for i in todo if i not in matched]
        if keyed:
            keys = sorted({rows[i]["key"] for i in keyed})
            active = {
                r["key"]: r for r in tx.all("job_get_active_by_keys", keys=self._list_in(keys))
            }
            for i in keyed:
                if rows[i]["key"] in active:
                    matched[i] = active[rows[i]["key"]]
        return matched

    def job_get(self, job_id: int) -> JobRecord:
        row = self._run(lambda tx: tx.one("job_get", job_id=_job_id(job_id)), write=False)
        if row is None:
            raise errors.JobNotFound(f"no job {job_id}")
        return self._job(row)

    def job_cancel(self, job_id: int, *, now: Now = None) -> JobRecord:
        def op(tx: Tx) -> Row:
            clock = tx.clock(now)
            row = tx.one("job_cancel", job_id=_job_id(job_id), now=clock)
            self._announce(tx, [row] if row else [])
            if row is None:
                self._refuse(tx, job_id, "cancel", "only pending or running jobs can be cancelled")
            assert row is not None
            tx.batch(
                "run_finish",
                [
                    _run_end(
                        row["id"],
                        row["attempt"],
                        Outcome.CANCELLED,
                        ErrorInfo("plunder.Cancelled", "cancelled"),
                    )
                ],
                now=clock,
            )
            return row

        return self._job(self._run(op))

    def job_retry(self, job_id: int, *, now: Now = None) -> JobRecord:
        def op(tx: Tx) -> Row:
            row = tx.one("job_retry", job_id=_job_id(job_id), now=tx.clock(now))
            self._announce(tx, [row] if row else [])
            if row is None:
                self._refuse(
                    tx, job_id, "retry", "only failed, timed_out or cancelled jobs can be retried"
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

    # -- sessions -------------------------------------------------------------------------
    def session_open(
        self,
        *,
        name: str,
        host: str,
        pid: int,
        queues: Sequence[str],
        expiry: float,
        now: Now = None,
    ) -> Session:
        for queue in queues:
            payload.check_queue(queue)
        _positive("session expiry", expiry)
        session_id = secrets.token_urlsafe(24)  # 192 random bits, never a host name

        def op(tx: Tx) -> Row | None:
            return tx.one(
                "session_insert",
                session_id=session_id,
                name=str(name)[:200],
                host=str(host)[:200],
                pid=int(pid),
                queues=self._list_in(list(queues)),
                expiry=float(expiry),
                now=tx.clock(now),
            )

        row = self._run(op)
        assert row is not None
        return self._session(row)

    def session_heartbeat(
        self, session_id: str, running: Sequence[Claim] = (), *, now: Now = None, conn: Any = None
    ) -> Heartbeat:
        """Extend the session by its expiry, by the database clock. With ``conn`` (the
        dedicated connection of :meth:`notifications`, in autocommit mode) it runs there,
        statement by statement, so heartbeats need no connection of their own."""

        def op(tx: Tx) -> Heartbeat:
            row = tx.one("session_heartbeat", session_id=session_id, now=tx.clock(now))
            if row is None:
                return Heartbeat(alive=False, expires_at=None, stop=tuple(running))
            stop = self._not_current(tx, running) if running else ()
            return Heartbeat(alive=True, expires_at=self._time(row["expires_at"]), stop=stop)

        return self._run(op, conn=conn)

    def _not_current(self, tx: Tx, claims: Sequence[Claim]) -> tuple[Claim, ...]:
        states = {
            int(r["id"]): r
            for r in tx.all("job_claim_state", job_ids=self._list_in([c.job_id for c in claims]))
        }
        stale = []
        for claim in claims:
            state = states.get(claim.job_id)
            if not (
                state
                and state["status"] == Status.RUNNING
                and state["attempt"] == claim.attempt
                and state["session_id"] == claim.session_id
            ):
                stale.append(claim)
        return tuple(stale)

    def session_close(self, session_id: str, *, now: Now = None) -> list[int]:
        def op(tx: Tx) -> list[int]:
            clock = tx.clock(now)
            running = tx.all("job_running_of_session", session_id=session_id)
            released = self._release(
                tx, [Claim(int(r["id"]), int(r["attempt"]), session_id) for r in running], clock
            )
            tx.one("session_delete", session_id=session_id)
            return [claim.job_id for claim in released]

        return self._run(op)

    def session_list(self, *, now: Now = None) -> list[Session]:
        rows = self._run(lambda tx: tx.all("session_list", now=tx.clock(now)), write=False)
        return [self._session(row) for row in rows]

    # -- claim and acknowledge ------------------------------------------------------------
    def job_claim_many(
        self,
        session_id: str,
        *,
        queues: Sequence[str],
        tasks: Sequence[str],
        limit: int,
        now: Now = None,
    ) -> list[JobRecord]:
        for queue in queues:
            payload.check_queue(queue)
        if not 1 <= int(limit) <= MAX_BATCH:
            raise ValueError(f"claim limit must be between 1 and {MAX_BATCH}, got {limit}")

        def op(tx: Tx) -> list[Row]:
            clock = tx.clock(now)
            rows = (
                tx.all(
                    "job_claim_many",
                    session_id=session_id,
                    queues=self._list_in(list(queues)),
                    tasks=self._list_in(list(tasks)),
                    limit=int(limit),
                    now=clock,
                )
                if queues and tasks
                else []
            )
            if rows:
                tx.batch(
                    "run_open",
                    [
                        {"job_id": r["id"], "attempt": r["attempt"], "session_id": session_id}
                        for r in rows
                    ],
                    now=clock,
                )
            elif tx.one("session_alive", session_id=session_id, now=clock) is None:
                raise errors.SessionGone(f"session {session_id} has expired or was closed")
            return rows

        jobs = [self._job(row) for row in self._run(op)]
        jobs.sort(key=lambda j: (-j.priority, j.run_at, j.id))
        return jobs

    @contextmanager
    def transaction(self) -> Iterator[Any]:
        """A write transaction on one of this store's connections, committed when the block
        ends without an exception. For a task's own writes (see ``Context.transaction``);
        not retried, because the block's code cannot be replayed."""
        with self._transaction(write=True) as tx:
            yield tx.conn

    def job_result_set(self, claim: Claim, result: Any) -> bool:
        """Store the result of a job that its own transaction already acknowledged; fenced
        by the claim that acknowledged it."""
        text = payload.encode(result, what=f"result of job {claim.job_id}")

        def op(tx: Tx) -> Row | None:
            row = tx.one("job_result_set", **_claim_row(claim), result=text)
            if row is not None:
                self._notify(tx, CHANNEL_DONE, [str(claim.job_id)])
            return row

        row = self._run(op)
        return row is not None

    def job_complete_many(
        self, completions: Sequence[Completion], *, now: Now = None, conn: Any = None
    ) -> AckResult:
        encoded = [
            (c, payload.encode(c.result, what=f"result of job {c.claim.job_id}"))
            for c in completions
        ]
        plain = [(c, text) for c, text in encoded if c.effects is None]
        accepted: list[Claim] = []
        stale: list[Claim] = []
        failed: list[tuple[Claim, BaseException]] = []
        if plain:
            ok, refused = self._run(lambda tx: self._complete(tx, plain, now), conn=conn)
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

    def _complete(
        self, tx: Tx, items: list[tuple[Completion, str]], now: Now
    ) -> tuple[list[Claim], list[Claim]]:
        clock = tx.clock(now)
        returned = tx.batch(
            "job_complete",
            [{**_claim_row(c.claim), "result": text} for c, text in items],
            now=clock,
        )
        self._announce(tx, returned)
        done = _claims(returned)
        ok = [c for c, _ in items if c.claim in done]
        tx.batch(
            "run_finish",
            [
                _run_end(c.claim.job_id, c.claim.attempt, Outcome.SUCCEEDED, None, c.logs)
                for c in ok
            ],
            now=clock,
        )
        for completion in ok:
            if completion.effects is not None:
                try:
                    completion.effects(tx.conn)
                except Exception as exc:
                    raise _EffectsFailed(exc) from exc
        refused = [c for c, _ in items if c.claim not in done]
        already = self._already_succeeded(tx, [c.claim for c in refused])
        self._mark_stale(tx, [c for c in refused if c.claim not in already], clock)
        return [c.claim for c in ok] + sorted(already, key=lambda c: c.job_id), [
            c.claim for c in refused if c.claim not in already
        ]

    def _already_succeeded(self, tx: Tx, claims: list[Claim]) -> set[Claim]:
        """Claims whose completion committed earlier: a retried acknowledgement after an
        ambiguous commit is accepted again instead of being reported stale."""
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
            [{**_claim_row(item.claim), "logs": _logs(item.logs)} for item in items],
            now=clock,
        )

    def job_fail_many(self, failures: Sequence[Failure], *, now: Now = None) -> AckResult:
        rows = [
            {
                **_claim_row(f.claim),
                "error": payload.encode(f.error.as_dict(), what="error"),
                "retry": f.retry_delay is not None,
                "delay": _non_negative("retry delay", f.retry_delay or 0.0),
                "final_status": (
                    Status.TIMED_OUT if f.outcome == Outcome.TIMED_OUT else Status.FAILED
                ).value,
            }
            for f in failures
        ]

        def op(tx: Tx) -> AckResult:
            clock = tx.clock(now)
            returned = tx.batch("job_fail", rows, now=clock)
            self._announce(tx, returned)
            done = _claims(returned)
            ok = [f for f in failures if f.claim in done]
            tx.batch(
                "run_finish",
                [_run_end(f.claim.job_id, f.claim.attempt, f.outcome, f.error, f.logs) for f in ok],
                now=clock,
            )
            refused = [f for f in failures if f.claim not in done]
            self._mark_stale(tx, refused, clock)
            return AckResult(tuple(f.claim for f in ok), tuple(f.claim for f in refused))

        return self._run(op) if failures else AckResult((), ())

    def job_release_many(self, claims: Sequence[Claim], *, now: Now = None) -> AckResult:
        def op(tx: Tx) -> AckResult:
            released = self._release(tx, list(claims), tx.clock(now))
            return AckResult(tuple(released), tuple(c for c in claims if c not in released))

        return self._run(op) if claims else AckResult((), ())

    def _release(self, tx: Tx, claims: list[Claim], clock: Any) -> list[Claim]:
        if not claims:
            return []
        returned = tx.batch("job_release", [_claim_row(c) for c in claims], now=clock)
        self._announce(tx, returned)
        done = _claims(returned)
        released = [c for c in claims if c in done]
        tx.batch(
            "run_finish",
            [_run_end(c.job_id, c.attempt, Outcome.RELEASED, None) for c in released],
            now=clock,
        )
        return released

    # -- streams --------------------------------------------------------------------------
    def stream_append(
        self, claim: Claim, events: Sequence[tuple[str, Any]], *, now: Now = None
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
            if tx.one("job_check_claim", **_claim_row(claim), now=clock) is None:
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

        return self._run(op) if rows else []

    def stream_read(self, job_id: int, *, after: int = 0, limit: int = 1000) -> list[StreamEvent]:
        rows = self._run(
            lambda tx: tx.all(
                "event_list", job_id=_job_id(job_id), after=int(after), limit=int(limit)
            ),
            write=False,
        )
        return [
            StreamEvent(
                job_id=int(r["job_id"]),
                attempt=int(r["attempt"]),
                seq=int(r["id"]),
                kind=str(r["kind"]),
                data=payload.decode(r["data"]),
                created_at=self._time(r["created_at"]),
            )
            for r in rows
        ]

    # -- leases and the janitor -----------------------------------------------------------
    def lease_acquire(self, name: str, holder: str, ttl: float, *, now: Now = None) -> Lease | None:
        _positive("lease ttl", ttl)
        row = self._run(
            lambda tx: tx.one(
                "lease_acquire", name=name, holder=holder, ttl=float(ttl), now=tx.clock(now)
            )
        )
        return self._lease(row) if row else None

    def lease_renew(self, lease: Lease, ttl: float, *, now: Now = None) -> Lease:
        _positive("lease ttl", ttl)
        row = self._run(
            lambda tx: tx.one(
                "lease_renew",
                name=lease.name,
                holder=lease.holder,
                term=lease.term,
                ttl=float(ttl),
                now=tx.clock(now),
            )
        )
        if row is None:
            raise errors.StaleLease(
                f"lease {lease.name!r} term {lease.term} is no longer held by {lease.holder}"
            )
        return self._lease(row)

    def lease_release(self, lease: Lease, *, now: Now = None) -> bool:
        row = self._run(
            lambda tx: tx.one(
                "lease_release",
                name=lease.name,
                holder=lease.holder,
                term=lease.term,
                now=tx.clock(now),
            )
        )
        return row is not None

    def lease_get(self, name: str) -> Lease | None:
        row = self._run(lambda tx: tx.one("lease_get", name=name), write=False)
        return self._lease(row) if row else None

    def _fence(self, tx: Tx, lease: Lease, clock: Any) -> None:
        if (
            tx.one("lease_check", name=lease.name, holder=lease.holder, term=lease.term, now=clock)
            is None
        ):
            raise errors.StaleLease(
                f"lease {lease.name!r} term {lease.term} is no longer held "
                f"by {lease.holder}; the janitor write was refused"
            )

    def session_reap_many(self, lease: Lease, *, limit: int = 100, now: Now = None) -> SweepResult:
        error = payload.encode(SESSION_LOST.as_dict())

        def op(tx: Tx) -> SweepResult:
            clock = tx.clock(now)
            self._fence(tx, lease, clock)
            dead = [str(r["id"]) for r in tx.all("session_expired", now=clock, limit=int(limit))]
            if not dead:
                return SweepResult()
            lost = tx.all("job_lose_many", session_ids=self._list_in(dead), error=error, now=clock)
            self._announce(tx, lost)
            tx.batch(
                "run_finish",
                [_run_end(r["id"], r["attempt"], Outcome.LOST, SESSION_LOST) for r in lost],
                now=clock,
            )
            gone = tx.all("session_delete_many", session_ids=self._list_in(dead), now=clock)
            return _sweep(lost, sessions=[str(r["id"]) for r in gone])

        return self._run(op)

    def job_timeout_many(self, lease: Lease, *, limit: int = 500, now: Now = None) -> SweepResult:
        error = payload.encode(JOB_TIMEOUT.as_dict())

        def op(tx: Tx) -> SweepResult:
            clock = tx.clock(now)
            self._fence(tx, lease, clock)
            rows = tx.all("job_timeout_many", error=error, limit=int(limit), now=clock)
            self._announce(tx, rows)
            tx.batch(
                "run_finish",
                [_run_end(r["id"], r["attempt"], Outcome.TIMED_OUT, JOB_TIMEOUT) for r in rows],
                now=clock,
            )
            return _sweep(rows)

        return self._run(op)

    def job_prune_many(
        self, lease: Lease, *, older_than: float, limit: int = 1000, now: Now = None
    ) -> int:
        _non_negative("retention", older_than)

        def op(tx: Tx) -> int:
            clock = tx.clock(now)
            self._fence(tx, lease, clock)
            return len(
                tx.all("job_prune_many", older_than=float(older_than), limit=int(limit), now=clock)
            )

        return self._run(op)

    # -- reads for people -----------------------------------------------------------------
    def job_list(
        self,
        *,
        queue: str | None = None,
        status: str | None = None,
        task: str | None = None,
        after: int | None = None,
        limit: int = 50,
    ) -> JobPage:
        if status is not None:
            status = _status(status)
        if not 1 <= int(limit) <= 1000:
            raise ValueError(f"limit must be between 1 and 1000, got {limit}")
        rows = self._run(
            lambda tx: tx.all(
                "job_list",
                queue=queue,
                status=status,
                task=task,
                after=None if after is None else _job_id(after),
                limit=int(limit),
            ),
            write=False,
        )
        jobs = tuple(self._job(row) for row in rows)
        next_after = jobs[-1].id if len(jobs) == int(limit) else None
        return JobPage(jobs, next_after)

    def job_runs(self, job_id: int) -> list[Run]:
        rows = self._run(lambda tx: tx.all("job_runs", job_id=_job_id(job_id)), write=False)
        return [self._run_record(row) for row in rows]

    def queue_stats(self, *, now: Now = None) -> list[QueueStats]:
        def op(tx: Tx) -> tuple[list[Row], list[Row]]:
            clock = tx.clock(now)
            return tx.all("queue_counts"), tx.all("queue_oldest_pending", now=clock)

        counts, oldest = self._run(op, write=False)
        by_queue: dict[str, dict[str, int]] = {}
        for row in counts:
            by_queue.setdefault(str(row["queue"]), {s.value: 0 for s in Status})[
                str(row["status"])
            ] = int(row["n"])
        ages = {str(r["queue"]): float(r["age"]) for r in oldest}
        return [QueueStats(queue, by_queue[queue], ages.get(queue)) for queue in sorted(by_queue)]

    # -- rows to records ------------------------------------------------------------------
    def _opt_time(self, value: Any) -> datetime | None:
        return None if value is None else self._time(value)

    def _job(self, row: Row) -> JobRecord:
        error = payload.decode(row["error"])
        return JobRecord(
            id=int(row["id"]),
            queue=row["queue"],
            task=row["task"],
            args=payload.decode(row["args"]),
            kwargs=payload.decode(row["kwargs"]),
            priority=int(row["priority"]),
            status=Status(row["status"]),
            attempt=int(row["attempt"]),
            max_attempts=int(row["max_attempts"]),
            timeout=row["timeout"],
            backoff_base=float(row["backoff_base"]),
            backoff_cap=float(row["backoff_cap"]),
            retry_on_timeout=bool(row["retry_on_timeout"]),
            key=row["key"],
            run_at=self._time(row["run_at"]),
            created_at=self._time(row["created_at"]),
            started_at=self._opt_time(row["started_at"]),
            finished_at=self._opt_time(row["finished_at"]),
            deadline_at=self._opt_time(row["deadline_at"]),
            session_id=row["session_id"],
            result=payload.decode(row["result"]),
            error=error,
            failed_sessions=tuple(self._list_out(row["failed_sessions"])),
        )

    def _run_record(self, row: Row) -> Run:
        return Run(
            job_id=int(row["job_id"]),
            attempt=int(row["attempt"]),
            session_id=row["session_id"],
            worker=row["worker"],
            host=row["host"],
            pid=int(row["pid"]),
            started_at=self._time(row["started_at"]),
            finished_at=self._opt_time(row["finished_at"]),
            outcome=Outcome(row["outcome"]) if row["outcome"] else None,
            error=payload.decode(row["error"]),
            logs=tuple(payload.decode(row["logs"]) or ()),
        )

    def _session(self, row: Row) -> Session:
        return Session(
            id=row["id"],
            name=row["name"],
            host=row["host"],
            pid=int(row["pid"]),
            queues=tuple(self._list_out(row["queues"])),
            expiry=float(row["expiry"]),
            started_at=self._time(row["started_at"]),
            heartbeat_at=self._time(row["heartbeat_at"]),
            expires_at=self._time(row["expires_at"]),
        )

    def _lease(self, row: Row) -> Lease:
        return Lease(
            name=row["name"],
            holder=row["holder"],
            term=int(row["term"]),
            acquired_at=self._time(row["acquired_at"]),
            expires_at=self._time(row["expires_at"]),
        )


# -- validation and row helpers -----------------------------------------------------------
def _finite(what: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"{what} must be a number of seconds, not {value!r}")
    number = float(value)
    if not math.isfinite(number):
        raise ValueError(f"{what} must be finite, not {value!r}")
    return number


def _positive(what: str, value: object) -> float:
    number = _finite(what, value)
    if number <= 0:
        raise ValueError(f"{what} must be positive, not {value!r}")
    return number


def _non_negative(what: str, value: object) -> float:
    number = _finite(what, value)
    if number < 0:
        raise ValueError(f"{what} must not be negative, not {value!r}")
    return number


def _int(what: str, value: object, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise ValueError(f"{what} must be an integer from {low} to {high}, not {value!r}")
    return value


def _job_id(value: object) -> int:
    return _int("job id", value, 1, 2**63 - 1)


def _status(value: str) -> str:
    try:
        return Status(value).value
    except ValueError:
        names = ", ".join(s.value for s in Status)
        raise errors.InvalidName(f"unknown job status {value!r}; one of: {names}") from None


def _spec_row(spec: JobSpec) -> dict[str, Any]:
    """Validate and encode one spec; raise before anything is written."""
    if not isinstance(spec.args, list | tuple):
        raise errors.PayloadError(
            f"args of {spec.task!r} must be a list, not {type(spec.args).__name__}"
        )
    if not isinstance(spec.kwargs, dict) or not all(isinstance(k, str) for k in spec.kwargs):
        raise errors.PayloadError(f"kwargs of {spec.task!r} must be a dict with string keys")
    return {
        "queue": payload.check_queue(spec.queue),
        "task": payload.check_task(spec.task),
        "args": payload.encode(list(spec.args), what=f"arguments of {spec.task}"),
        "kwargs": payload.encode(spec.kwargs, what=f"keyword arguments of {spec.task}"),
        "priority": _int("priority", spec.priority, -INT32, INT32),
        "max_attempts": _int("max_attempts", spec.max_attempts, 1, 1000),
        "timeout": None if spec.timeout is None else _positive("timeout", spec.timeout),
        "backoff_base": _non_negative("backoff_base", spec.backoff_base),
        "backoff_cap": _non_negative("backoff_cap", spec.backoff_cap),
        "retry_on_timeout": bool(spec.retry_on_timeout),
        "key": payload.check_key(spec.key),
        "delay": _non_negative("delay", spec.delay),
    }


def _claims(rows: list[Row]) -> set[Claim]:
    """The claims a fenced batch update matched (it returns id, attempt, session_id)."""
    return {Claim(int(r["id"]), int(r["attempt"]), str(r["session_id"])) for r in rows}


def _claim_row(claim: Claim) -> dict[str, Any]:
    return {"job_id": claim.job_id, "attempt": claim.attempt, "session_id": claim.session_id}


def _logs(lines: Sequence[str]) -> str:
    """Captured log lines, bounded: the last MAX_LOG_LINES lines, each cut to a length."""
    kept = [str(line)[:MAX_LOG_LINE_CHARS] for line in lines[-MAX_LOG_LINES:]]
    if len(lines) > MAX_LOG_LINES:
        kept.insert(0, f"[{len(lines) - MAX_LOG_LINES} earlier lines dropped]")
    return payload.encode(kept, what="logs")


def _run_end(
    job_id: int, attempt: int, outcome: Outcome, error: ErrorInfo | None, logs: Sequence[str] = ()
) -> dict[str, Any]:
    return {
        "job_id": int(job_id),
        "attempt": int(attempt),
        "outcome": outcome.value,
        "error": None if error is None else payload.encode(error.as_dict(), what="error"),
        "logs": _logs(logs),
    }


def _sweep(rows: list[Row], sessions: Sequence[str] = ()) -> SweepResult:
    retried = tuple(int(r["id"]) for r in rows if r["status"] == Status.PENDING)
    finished = tuple(int(r["id"]) for r in rows if r["status"] != Status.PENDING)
    return SweepResult(retried=retried, finished=finished, sessions=tuple(sessions))


def iter_chunks(items: Sequence[T], size: int) -> Iterator[Sequence[T]]:
    for start in range(0, len(items), size):
        yield items[start : start + size]
