"""A test double of the worker protocol (plunder.protocol): jobs, sessions and fences in
memory, so that a worker's loop can be tested without a database.

It keeps the protocol's promises and nothing more: a session is alive until closed or
``expire()``d; every outcome is fenced by its claim (the job running under that session
and attempt); claims are taken best first (priority, then id) up to the limit; a job a
heartbeat reports is told to stop once ``cancel()``ed. Retries, backoff and the janitor
are the store's business and are not imitated.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from typing import Any

from plunder import errors
from plunder.graph import ParentResult
from plunder.model import AckResult, Claim, Completion, Failure, Heartbeat, JobRecord, Session
from plunder.protocol import Beat, ClaimRequest, Hello, Outcome, Release, Reply
from plunder.states import Status


def _now() -> datetime:
    return datetime.now(UTC)


def new_job(job_id: int, task: str, args: Sequence[Any], **options: Any) -> JobRecord:
    """A pending job as the store would read it back."""
    now = _now()
    values: dict[str, Any] = {
        "id": job_id, "queue": "default", "task": task, "args": list(args), "kwargs": {},
        "priority": 0, "status": Status.PENDING, "attempt": 0, "max_attempts": 1,
        "timeout": None, "backoff_base": 1.0, "backoff_cap": 300.0, "retry_on_timeout": True,
        "key": None, "run_at": now, "created_at": now, "started_at": None,
        "finished_at": None, "deadline_at": None, "session_id": None, "result": None,
        "error": None, "failed_sessions": (), "losses": 0, "retry_on_lost": True,
        "expires_at": None, "limit_key": None, "affinity": None, "require": None, "cost": 1,
    }  # fmt: skip
    values.update(options)
    return JobRecord(**values)


@dataclass
class MemoryLink:
    """The worker protocol over a dict of jobs. Thread-safe (the worker calls it from its
    main thread, its heartbeat thread and its streamer)."""

    long_polls = False

    jobs: dict[int, JobRecord] = field(default_factory=dict)
    sessions: dict[str, Session] = field(default_factory=dict)
    events: list[tuple[Claim, str, Any]] = field(default_factory=list)
    calls: list[str] = field(default_factory=list)  # the operations, in order
    claims: list[int] = field(default_factory=list)  # each exchange's claim limit
    cancelled: set[int] = field(default_factory=set)
    _ids: Iterator[int] = field(default_factory=lambda: itertools.count(1))
    _lock: threading.Lock = field(default_factory=threading.Lock)

    # -- the test's side ------------------------------------------------------------------
    def enqueue(self, task: str, *args: Any, **options: Any) -> int:
        with self._lock:
            job_id: int = next(self._ids)
            self.jobs[job_id] = new_job(job_id, task, args, **options)
            return job_id

    def status(self, job_id: int) -> Status:
        with self._lock:
            return self.jobs[job_id].status

    def statuses(self) -> dict[Status, int]:
        with self._lock:
            counts: dict[Status, int] = {}
            for job in self.jobs.values():
                counts[job.status] = counts.get(job.status, 0) + 1
            return counts

    def expire(self, session_id: str) -> None:
        """The session is gone (as if its heartbeats had stopped past its expiry): its
        running jobs go back to the queue, their attempt spent."""
        with self._lock:
            self.sessions.pop(session_id, None)
            self._release(session_id)

    def cancel(self, job_id: int) -> None:
        """Cancel a running job: its claim is no longer current; the next heartbeat that
        reports it says to stop it."""
        with self._lock:
            self.cancelled.add(job_id)
            job = self.jobs[job_id]
            self.jobs[job_id] = replace(job, status=Status.CANCELLED, session_id=None)

    # -- the protocol ---------------------------------------------------------------------
    def open(self, hello: Hello) -> Session:
        with self._lock:
            self.calls.append("open")
            now = _now()
            session = Session(
                id=f"s{len(self.sessions) + len(self.calls)}",
                name=hello.name,
                host=hello.host,
                pid=hello.pid,
                queues=hello.queues,
                expiry=hello.expiry,
                started_at=now,
                heartbeat_at=now,
                expires_at=now + timedelta(seconds=hello.expiry),
                tasks=tuple(t.name for t in hello.tasks),
                free_slots=hello.free_slots,
            )
            self.sessions[session.id] = session
            return session

    def heartbeat(self, beat: Beat, *, via: Any = None) -> Heartbeat:
        with self._lock:
            self.calls.append("heartbeat")
            if beat.session_id not in self.sessions:
                return Heartbeat(False, None)
            stop = tuple(c for c in beat.running if not self._current(c))
            queues = self.sessions[beat.session_id].queues
            return Heartbeat(True, _now() + timedelta(seconds=5), stop=stop, queues=queues)

    def exchange(
        self, session_id: str, outcomes: Sequence[Outcome], claim: ClaimRequest | None
    ) -> Reply:
        with self._lock:
            self.calls.append("exchange")
            if session_id not in self.sessions:
                raise errors.SessionGone(f"session {session_id} has expired or was closed")
            done, failed, released = self._write(outcomes)
            claimed = self._claim(session_id, claim) if claim is not None else ()
            return Reply(done, failed, released, claimed)

    def append(self, claim: Claim, events: Sequence[tuple[str, Any]]) -> None:
        with self._lock:
            if not self._current(claim):
                raise errors.StaleClaim(f"job {claim.job_id}: the claim is no longer current")
            self.events += [(claim, kind, data) for kind, data in events]

    def change_queues(
        self, session_id: str, *, add: Sequence[str] = (), remove: Sequence[str] = ()
    ) -> tuple[str, ...]:
        with self._lock:
            self.calls.append("change_queues")
            session = self.sessions.get(session_id)
            if session is None:
                raise errors.SessionGone(f"session {session_id} has expired or was closed")
            joined = dict.fromkeys([*session.queues, *add])
            queues = tuple(q for q in joined if q not in remove)
            self.sessions[session_id] = replace(session, queues=queues)
            return queues

    def pause_limit(self, claim: Claim, key: str, seconds: float) -> datetime:
        """The job given back (no pause is kept here: this double has no limits)."""
        with self._lock:
            self.calls.append("pause_limit")
            self._write([Release(claim)])
            return _now() + timedelta(seconds=seconds)

    def parent_results(self, claim: Claim) -> tuple[ParentResult, ...]:
        """None (this double has no workflows), while the claim is current."""
        with self._lock:
            if not self._current(claim):
                raise errors.StaleClaim(f"job {claim.job_id}: the claim is no longer current")
            return ()

    def watch(self, session_id: str, queues: Sequence[str], wait: float) -> bool:
        return True  # never asked: it does not long-poll

    def next_due(self, request: ClaimRequest) -> float | None:
        with self._lock:
            pending = [j for j in self.jobs.values() if self._claimable(j, request)]
            return 0.0 if pending else None

    def close(
        self, session_id: str, *, started: Sequence[Claim] = (), lost: bool = False
    ) -> list[int]:
        with self._lock:
            self.calls.append("close")
            self.sessions.pop(session_id, None)
            return self._release(session_id)

    def cut(self, reason: str, *, final: bool = False) -> int:
        return 0

    def pipe(self) -> None:
        return None

    # -- under the lock -------------------------------------------------------------------
    def _current(self, claim: Claim) -> bool:
        job = self.jobs.get(claim.job_id)
        return (
            job is not None
            and job.status == Status.RUNNING
            and job.session_id == claim.session_id
            and job.attempt == claim.attempt
        )

    def _write(self, outcomes: Sequence[Outcome]) -> tuple[AckResult, AckResult, AckResult]:
        kinds: dict[type, tuple[list[Claim], list[Claim]]] = {
            Completion: ([], []), Failure: ([], []), Release: ([], []),
        }  # fmt: skip
        for outcome in outcomes:
            accepted, stale = kinds[type(outcome)]
            claim = outcome.claim
            if not self._current(claim):
                stale.append(claim)
                continue
            accepted.append(claim)
            job = self.jobs[claim.job_id]
            if isinstance(outcome, Completion):
                job = replace(job, status=Status.SUCCEEDED, result=outcome.result)
            elif isinstance(outcome, Failure):
                job = replace(job, status=Status.FAILED, error={"type": outcome.error.type})
            else:
                job = replace(job, status=Status.PENDING, attempt=job.attempt - 1)
            self.jobs[claim.job_id] = replace(job, session_id=None, finished_at=_now())
        done, failed, released = (AckResult(tuple(a), tuple(s)) for a, s in kinds.values())
        return done, failed, released

    def _claimable(self, job: JobRecord, request: ClaimRequest) -> bool:
        return (
            job.status == Status.PENDING
            and job.queue in request.queues
            and job.task in request.tasks
        )

    def _claim(self, session_id: str, request: ClaimRequest) -> tuple[JobRecord, ...]:
        self.claims.append(request.limit)
        pending = sorted(
            (j for j in self.jobs.values() if self._claimable(j, request)),
            key=lambda j: (-j.priority, j.id),
        )[: request.limit]
        claimed = []
        for waiting in pending:
            job = replace(
                waiting, status=Status.RUNNING, attempt=waiting.attempt + 1,
                session_id=session_id, started_at=_now(),
            )  # fmt: skip
            self.jobs[job.id] = job
            claimed.append(job)
        return tuple(claimed)

    def _release(self, session_id: str) -> list[int]:
        ids = [j.id for j in self.jobs.values() if j.session_id == session_id]
        for job_id in ids:
            job = self.jobs[job_id]
            self.jobs[job_id] = replace(job, status=Status.PENDING, session_id=None)
        return ids
