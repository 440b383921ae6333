"""Reading a job's stream without waiting: the reads between the waits of
:meth:`plunder.Job.stream` and :meth:`plunder.Job.stream_async`, and of the gateway's
server-sent events. Where a new attempt begins, a mark (kind "attempt") comes first."""

from __future__ import annotations

import dataclasses
import time
from typing import Any, Protocol

from plunder.model import JobRecord, StreamEvent
from plunder.states import is_terminal


class Followed(Protocol):
    """What a stream reader needs of a job's handle (a :class:`plunder.Job`)."""

    @property
    def id(self) -> int: ...

    @property
    def app(self) -> Any: ...

    def refresh(self) -> JobRecord: ...


class StreamReader:
    """A stream's reads, none of which waits: what :meth:`Job.stream` and
    :meth:`Job.stream_async` yield between their waits (and the gateway's SSE streams,
    which resume ``after`` the last event a client saw)."""

    def __init__(self, job: Followed, *, after: int = 0) -> None:
        self.job = job
        self.started = time.monotonic()
        self.after = after
        self.attempt: int | None = None  # the attempt of the last event yielded
        self.poll: float = job.app.settings.poll_interval

    def read(self) -> list[StreamEvent] | None:
        """The events written since the last read (empty: none yet), or None once the job
        is terminal and every event was read."""
        record = self.job.refresh()
        events = self.job.app.store.stream_read(self.job.id, after=self.after)
        out: list[StreamEvent] = []
        for event in events:
            self.after = event.seq
            if self.attempt is not None and event.attempt != self.attempt:
                out.append(attempt_mark(event, self.attempt))
            self.attempt = event.attempt
            out.append(event)
        if out or not is_terminal(record.status):
            return out
        if self.attempt is None or record.attempt == self.attempt:
            return None
        last = self.attempt  # the job's last attempt streamed nothing: its mark ends it
        self.attempt = record.attempt
        return [end_mark(record, self.after, last)]

    def wait_time(self, timeout: float | None) -> float:
        """How long to wait for a wake-up before reading again; TimeoutError once
        ``timeout`` seconds have passed since the stream began."""
        if timeout is None:
            return self.poll
        left = self.started + timeout - time.monotonic()
        if left <= 0:
            raise TimeoutError(f"job {self.job.id} still running after {timeout}s")
        return min(self.poll, left)


def attempt_mark(event: StreamEvent, previous: int) -> StreamEvent:
    """The mark of a new attempt, just before its first event ``event``."""
    data = {"attempt": event.attempt, "previous": previous}
    return dataclasses.replace(event, kind="attempt", data=data)


def end_mark(record: JobRecord, seq: int, previous: int) -> StreamEvent:
    """The mark of the job's last attempt, which streamed nothing, at the stream's end."""
    data = {"attempt": record.attempt, "previous": previous}
    at = record.finished_at or record.started_at or record.created_at
    return StreamEvent(record.id, record.attempt, seq, "attempt", data, at)
