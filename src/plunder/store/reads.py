"""Reads for people and for waiters: jobs, runs, streams, sessions, published tasks, queue
stats."""

from __future__ import annotations

from plunder import errors, payload
from plunder.model import (
    JobPage,
    JobRecord,
    QueueStats,
    Run,
    Session,
    StreamEvent,
    TaskInfo,
    Unrunnable,
)
from plunder.states import Status
from plunder.store import convert
from plunder.store.driver import Now, Row, Tx
from plunder.store.engine import Engine

MAX_EVENTS = 10_000


def _could_name_a_job(queue: str | None, task: str | None) -> bool:
    """Whether these filters are names a job can have (enqueue refuses any other)."""
    try:
        if queue is not None:
            payload.check_stored_queue(queue)  # a partition's queue lists that partition
        if task is not None:
            payload.check_task(task)
    except errors.InvalidName:
        return False
    return True


class Reads:
    """What people and waiters read: jobs, runs, streams, sessions, tasks, queue stats."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    def job_get(self, job_id: int) -> JobRecord:
        row = self.engine.run(
            lambda tx: tx.one("job_get", job_id=convert.job_id(job_id)), write=False
        )
        if row is None:
            raise errors.JobNotFound(f"no job {job_id}")
        return self.engine.job(row)

    def session_list(self, *, now: Now = None) -> list[Session]:
        rows = self.engine.run(lambda tx: tx.all("session_list", now=tx.clock(now)), write=False)
        return [self.engine.session(row) for row in rows]

    def session_get(self, session_id: str) -> Session | None:
        """A session by id, live or not (None: never opened, or reaped)."""
        row = self.engine.run(
            lambda tx: tx.one("session_get", session_id=str(session_id)), write=False
        )
        return None if row is None else self.engine.session(row)

    def task_get(self, name: str) -> TaskInfo | None:
        """The task as the last worker serving it published it; None if none ever did."""
        try:
            name = payload.check_task(name)
        except errors.InvalidName:
            return None  # no worker could have published it (see _could_name_a_job)
        row = self.engine.run(lambda tx: tx.one("task_get", name=name), write=False)
        return None if row is None else self._task(row)

    def task_list(self) -> list[TaskInfo]:
        """Every task a worker ever published, by name."""
        return [
            self._task(row) for row in self.engine.run(lambda tx: tx.all("task_list"), write=False)
        ]

    def _task(self, row: Row) -> TaskInfo:
        return TaskInfo(
            name=str(row["name"]),
            queue=str(row["queue"]),
            pool=str(row["pool"]),
            options=dict(payload.decode(row["options"])),
            session_id=str(row["session_id"]),
            published_at=self.engine.time(row["published_at"]),
        )

    def job_unrunnable(self, *, now: Now = None) -> list[Unrunnable]:
        """Pending jobs that no live session can run (none lists both their queue and their
        task, holds the labels they require, or has as many slots as they cost), counted by
        task, queue, requirement and cost."""
        rows = self.engine.run(lambda tx: tx.all("job_unrunnable", now=tx.clock(now)), write=False)
        return [
            Unrunnable(str(r["task"]), str(r["queue"]), int(r["n"]), r["require"], int(r["cost"]))
            for r in rows
        ]

    def stream_read(self, job_id: int, *, after: int = 0, limit: int = 1000) -> list[StreamEvent]:
        job_id = convert.job_id(job_id)
        after = convert.integer("after", after, 0, convert.INT64)
        limit = convert.integer("limit", limit, 1, MAX_EVENTS)
        rows = self.engine.run(
            lambda tx: tx.all("event_list", job_id=job_id, after=after, limit=limit),
            write=False,
        )
        return [
            StreamEvent(
                job_id=int(r["job_id"]),
                attempt=int(r["attempt"]),
                seq=int(r["id"]),
                kind=str(r["kind"]),
                data=payload.decode(r["data"]),
                created_at=self.engine.time(r["created_at"]),
            )
            for r in rows
        ]

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
            status = convert.status_name(status)
        limit = convert.integer("limit", limit, 1, 1000)
        after = None if after is None else convert.job_id(after)
        if not _could_name_a_job(queue, task):
            # Nothing to look up, and the database may not even take the value: PostgreSQL
            # refuses NUL in text where SQLite compares it, and no driver sends a lone
            # surrogate. Answered here, the same on every backend.
            return JobPage((), None)
        rows = self.engine.run(
            lambda tx: tx.all(
                "job_list",
                queue=queue,
                status=status,
                task=task,
                after=after,
                limit=limit,
            ),
            write=False,
        )
        jobs = tuple(self.engine.job(row) for row in rows)
        next_after = jobs[-1].id if len(jobs) == limit else None
        return JobPage(jobs, next_after)

    def job_runs(self, job_id: int) -> list[Run]:
        rows = self.engine.run(
            lambda tx: tx.all("job_runs", job_id=convert.job_id(job_id)), write=False
        )
        return [self.engine.run_record(row) for row in rows]

    def queue_stats(self, *, now: Now = None) -> list[QueueStats]:
        def op(tx: Tx) -> tuple[list[Row], list[Row]]:
            clock = tx.clock(now)
            return tx.all("queue_counts"), tx.all("queue_oldest_pending", now=clock)

        counts, oldest = self.engine.run(op, write=False)
        # a partitioned queue's partitions ("q~3") count as the queue
        by_queue: dict[str, dict[str, int]] = {}
        for row in counts:
            found = by_queue.setdefault(
                payload.base_queue(str(row["queue"])), {s.value: 0 for s in Status}
            )
            found[str(row["status"])] += int(row["n"])
        ages: dict[str, float] = {}
        for row in oldest:
            queue = payload.base_queue(str(row["queue"]))
            ages[queue] = max(ages.get(queue, 0.0), float(row["age"]))
        return [QueueStats(queue, by_queue[queue], ages.get(queue)) for queue in sorted(by_queue)]

    def queue_active(self, *, now: Now = None) -> list[QueueStats]:
        rows = self.engine.run(
            lambda tx: tx.all("queue_active_counts", now=tx.clock(now)), write=False
        )
        # a partitioned queue's partitions ("q~3") count as the queue
        by_queue: dict[str, dict[str, int]] = {}
        ages: dict[str, float] = {}
        for row in rows:
            queue = payload.base_queue(str(row["queue"]))
            found = by_queue.setdefault(queue, {"pending": 0, "running": 0})
            found[str(row["status"])] += int(row["n"])
            if row["age"] is not None:
                ages[queue] = max(ages.get(queue, 0.0), float(row["age"]))
        return [QueueStats(queue, by_queue[queue], ages.get(queue)) for queue in sorted(by_queue)]
