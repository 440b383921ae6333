"""Worker sessions: opening one (and publishing the tasks its worker serves, in the same
transaction) and heartbeats, which also renew the session's count of free slots.

A session names its queues, its tasks and its free slots: a job that a session failed is
left to another live session that runs its queue and task and has a free slot, and taken
at once by the one that failed it when there is none (see job_claim_walk). The free slots
are the worker's count at its last heartbeat, so at most one heartbeat interval old.
"""

from __future__ import annotations

import secrets
from collections.abc import Sequence
from typing import Any

from plunder import affinity, errors, payload
from plunder.model import Claim, Heartbeat, Session, TaskInfo
from plunder.states import Status
from plunder.store import convert
from plunder.store.acks import Acks
from plunder.store.driver import Now, Tx
from plunder.store.engine import Engine
from plunder.store.maintenance import Maintenance
from plunder.store.partitions import Partitions

MAX_SLOTS = 1_000_000  # free slots a session may report (the column is an INTEGER)
MAX_QUEUES = 1_000  # queues one change may name


def check_queues(queues: Sequence[str], what: str) -> list[str]:
    """Queue names, each checked, each once, in order; at most MAX_QUEUES."""
    if isinstance(queues, str):
        raise errors.InvalidName(f"{what}: a list of queue names, not one string")
    names = list(dict.fromkeys(payload.check_queue(q) for q in queues))
    if len(names) > MAX_QUEUES:
        raise errors.InvalidName(f"{what}: at most {MAX_QUEUES} queues, not {len(names)}")
    return names


def _publish_rows(tasks: Sequence[TaskInfo]) -> list[dict[str, Any]]:
    """task_publish's rows, one per task name (the last of a name wins), sorted by name
    so that concurrent publishers lock the rows in one order."""
    by_name = {payload.check_task(t.name): t for t in tasks}
    return [
        {
            "name": name,
            "queue": payload.check_queue(t.queue),
            "pool": str(t.pool),
            "options": payload.encode(dict(t.options), what="options", of=name),
        }
        for name, t in sorted(by_name.items())
    ]


class Sessions:
    """A worker's session: opened, kept alive by heartbeats, closed; a close gives the
    session's jobs back (with ``acks``) or ends them as lost (with ``maintenance``)."""

    def __init__(
        self,
        engine: Engine,
        acks: Acks,
        maintenance: Maintenance,
        partitions: Partitions | None = None,
    ) -> None:
        """``partitions``: a heartbeat's answer says what the session owns of them."""
        self.engine = engine
        self.acks = acks
        self.maintenance = maintenance
        self.partitions = partitions

    def session_open(
        self,
        *,
        name: str,
        host: str,
        pid: int,
        queues: Sequence[str],
        expiry: float,
        tasks: Sequence[TaskInfo] = (),
        free_slots: int = 0,
        key_id: str | None = None,
        labels: Sequence[str] = (),
        now: Now = None,
        slots: int | None = None,
    ) -> Session:
        """Open a session; its ``tasks`` published (``task_get``) in the same transaction,
        each replacing what an earlier session published. ``key_id``: the API key that
        opened it through the gateway (only that key may speak for it); ``slots``: see Store."""
        for queue in queues:
            payload.check_queue(queue)
        convert.positive("session expiry", expiry)
        free_slots, capacity = _free(free_slots), affinity.capacity(slots)
        rows, held = _publish_rows(tasks), affinity.labels(labels)
        session_id = _new_id()

        def op(tx: Tx) -> Any:
            clock = tx.clock(now)
            row = tx.one(
                "session_insert",
                session_id=session_id,
                name=str(name)[:200],
                host=str(host)[:200],
                pid=int(pid),
                queues=self.engine.list_in(list(queues)),
                expiry=float(expiry),
                tasks=self.engine.list_in([r["name"] for r in rows]),
                free_slots=free_slots,
                key_id=key_id,
                labels=self.engine.list_in(list(held)),
                slots=capacity,
                now=clock,
            )
            tx.batch("task_publish", rows, session_id=session_id, now=clock)
            return row

        row = self.engine.run(op)
        assert row is not None
        return self.engine.session(row)

    def session_heartbeat(
        self,
        session_id: str,
        running: Sequence[Claim] = (),
        *,
        free_slots: int | None = None,
        labels: Sequence[str] | None = None,
        now: Now = None,
        conn: Any = None,
    ) -> Heartbeat:
        """Extend the session by its expiry (database clock); record its ``free_slots``
        and ``labels`` (None: unchanged). With ``conn`` (the dedicated connection of
        :meth:`notifications`, in autocommit mode) it runs there, statement by statement,
        so heartbeats need no connection of their own."""
        free_slots = free_slots if free_slots is None else _free(free_slots)
        given = None if labels is None else self.engine.list_in(list(affinity.labels(labels)))

        def op(tx: Tx) -> Heartbeat:
            row = tx.one(
                "session_heartbeat",
                session_id=session_id,
                free_slots=free_slots,
                labels=given,
                now=tx.clock(now),
            )
            if row is None:
                return Heartbeat(alive=False, expires_at=None, stop=tuple(running))
            stop = self._not_current(tx, running) if running else ()
            reported = {(c.job_id, c.attempt) for c in running}
            held = convert.claims_of(tx.all("session_running", session_id=session_id))
            unknown = sorted(
                (c for c in held if (c.job_id, c.attempt) not in reported),
                key=lambda c: c.job_id,
            )
            queues = tuple(self.engine.list_out(row["queues"]))
            mine = self.partitions
            owned = None if mine is None else mine.owned(tx, session_id, queues)
            return Heartbeat(
                alive=True,
                expires_at=self.engine.time(row["expires_at"]),
                stop=stop,
                unknown=tuple(unknown),
                queues=queues,
                partitions=owned,
            )

        if conn is not None:
            return self.engine.run_on(op, conn)
        return self.engine.run(op)

    def session_queues(
        self,
        session_id: str,
        *,
        add: Sequence[str] = (),
        remove: Sequence[str] = (),
        now: Now = None,
    ) -> Session:
        """The live session joins the queues ``add`` and leaves ``remove``, in one guarded
        update (see session_queues in queries.sql): changes made at once from several
        processes all count. The session as it is now; SessionGone if it is not live."""
        add, remove = check_queues(add, "add"), check_queues(remove, "remove")
        both = sorted(set(add) & set(remove))
        if both:
            raise errors.InvalidName(f"a queue both added and removed: {', '.join(both)}")

        def op(tx: Tx) -> Any:
            return tx.one(
                "session_queues",
                session_id=session_id,
                add=self.engine.list_in(add),
                remove=self.engine.list_in(remove),
                now=tx.clock(now),
            )

        row = self.engine.run(op)
        if row is None:
            raise errors.SessionGone(f"no live session {session_id[:40]!r}")
        return self.engine.session(row)

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
                gone = self.maintenance.lose(tx, [session_id], clock)
                tx.one("session_delete", session_id=session_id)
                return [int(r["id"]) for r in gone]
            running = [
                Claim(int(r["id"]), int(r["attempt"]), session_id)
                for r in tx.all("job_running_of_session", session_id=session_id)
            ]
            stopped = set(started)
            ended = self.acks.abandon(tx, [c for c in running if c in stopped], clock)
            released = self.acks.release(tx, [c for c in running if c not in ended], clock)
            tx.one("session_delete", session_id=session_id)
            return [claim.job_id for claim in (*ended, *released)]

        return self.engine.run(op)

    def _not_current(self, tx: Tx, claims: Sequence[Claim]) -> tuple[Claim, ...]:
        states = {
            int(r["id"]): r
            for r in tx.all(
                "job_claim_state", job_ids=self.engine.list_in([c.job_id for c in claims])
            )
        }
        stale = []
        for claim in claims:
            state = states.get(claim.job_id)
            # succeeded under this very claim: acknowledged by the task's own transaction
            # (ctx.transaction) while the task still runs; not a reason to stop it
            if not (
                state
                and state["status"] in (Status.RUNNING, Status.SUCCEEDED)
                and state["attempt"] == claim.attempt
                and state["session_id"] == claim.session_id
            ):
                stale.append(claim)
        return tuple(stale)


def _new_id() -> str:
    """192 random bits, never a host name; never with a leading "-", which a command line
    would take for an option (plunder worker-queues SESSION)."""
    while (session_id := secrets.token_urlsafe(24)).startswith("-"):
        pass
    return session_id


def _free(free_slots: int) -> int:
    return convert.integer("free slots", free_slots, 0, MAX_SLOTS)
