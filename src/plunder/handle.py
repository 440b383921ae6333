"""``Job``: a handle on one job that reads through the store, waits for its result and
follows its stream (``App.enqueue`` and ``App.job`` make them)."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import AsyncIterator, Callable, Generator
from typing import TYPE_CHECKING, Any, Protocol

from plunder import errors
from plunder.model import JobRecord, Run, StreamEvent
from plunder.states import Status, is_terminal
from plunder.store import Store
from plunder.streaming import StreamReader

if TYPE_CHECKING:
    from plunder.config import Settings
    from plunder.hub import Hub
    from plunder.store.http import HttpStore


class Producer(Protocol):
    """What a job's handle needs of its App."""

    settings: Settings

    @property
    def store(self) -> Store: ...

    @property
    def hub(self) -> Hub: ...


class Job:
    """A handle on one job. Attributes read the latest state from the store."""

    __slots__ = ("_record", "app", "id")  # an enqueue_many makes one per job

    def __init__(self, app: Producer, job_id: int, record: JobRecord | None = None) -> None:
        self.app = app
        self.id = job_id
        self._record = record

    def __repr__(self) -> str:
        if self._record is None:  # not read yet
            return f"<Job {self.id}>"
        return f"<Job {self.id} {self._record.status.value}>"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Job) and other.id == self.id and other.app is self.app

    def __hash__(self) -> int:
        return hash(self.id)

    def refresh(self) -> JobRecord:
        self._record = self.app.store.job_get(self.id)
        return self._record

    @property
    def record(self) -> JobRecord:
        return self.refresh()

    @property
    def status(self) -> Status:
        return self.refresh().status

    @property
    def runs(self) -> list[Run]:
        return self.app.store.job_runs(self.id)

    def cancel(self) -> JobRecord:
        self._record = self.app.store.job_cancel(self.id)
        return self._record

    def retry(self) -> JobRecord:
        self._record = self.app.store.job_retry(self.id)
        return self._record

    def wait(self, timeout: float | None = None) -> JobRecord:
        """Wait until the job is terminal; TimeoutError when ``timeout`` passes first (the
        job keeps running). Woken by the hub; re-checks at least every poll interval."""
        store = _remote(self.app.store)
        if store is not None:  # the gateway waits for it
            self._record = store.job_wait(self.id, timeout)
            return self._record
        deadline = None if timeout is None else time.monotonic() + timeout
        woken = threading.Event()
        unwatch = self.app.hub.watch("done", self.id, woken.set)
        try:
            while True:
                record = self.refresh()
                if is_terminal(record.status):
                    return record
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    raise TimeoutError(f"job {self.id} is still {record.status} after {timeout}s")
                poll = self.app.settings.poll_interval
                woken.wait(poll if left is None else min(poll, left))
                woken.clear()
        finally:
            unwatch()

    async def result_async(self, timeout: float | None = None) -> Any:
        """``await job.result_async()``: :meth:`result` without blocking the event loop."""
        return await asyncio.to_thread(self.result, timeout)

    def result(self, timeout: float | None = None) -> Any:
        """The job's result once it succeeded; :class:`JobFailed` (with the error type,
        message and traceback of the last run) if it ended otherwise."""
        record = self.wait(timeout)
        if record.status == Status.SUCCEEDED:
            return record.result
        error = record.error or {}
        detail = f": {error.get('type')}: {error.get('message')}" if error else ""
        raise errors.JobFailed(
            f"job {self.id} {record.status.value}{detail}",
            job_id=self.id,
            status=record.status.value,
            error=error,
        )

    async def stream_async(self, *, timeout: float | None = None) -> AsyncIterator[StreamEvent]:
        """``async for event in job.stream_async()``: :meth:`stream` for an event loop.
        Each read is a short call on a thread and each wait an asyncio wait, so that the
        loop runs on meanwhile, and cancelling the consumer (or leaving the loop early)
        ends it at once, with no thread left waiting."""
        store = _remote(self.app.store)
        if store is not None:  # the gateway follows it; each read on a thread
            remote = store.job_stream(self.id, timeout=timeout)
            try:
                while (event := await asyncio.to_thread(next, remote, None)) is not None:
                    yield event
            finally:
                await asyncio.to_thread(remote.close)
            return
        loop = asyncio.get_running_loop()
        woken = asyncio.Event()

        def wake() -> None:  # on the hub's thread
            try:
                loop.call_soon_threadsafe(woken.set)
            except RuntimeError:
                if not loop.is_closed():
                    raise
                # closed: the consumer is gone, and unwatches in its finally

        reader = StreamReader(self)
        unwatch = await asyncio.to_thread(self.watch, wake)
        try:
            while True:
                events = await asyncio.to_thread(reader.read)
                if events is None:
                    return
                for event in events:
                    yield event
                if not events:
                    wait = reader.wait_time(timeout)
                    with contextlib.suppress(TimeoutError):  # a poll, not an error
                        await asyncio.wait_for(woken.wait(), wait)
                    woken.clear()
        finally:
            unwatch()

    def stream(self, *, timeout: float | None = None) -> Generator[StreamEvent, None, None]:
        """Yield the job's stream events in order — what is stored first, then new ones as
        they are written — until the job is terminal. Woken by the hub. Each event names
        its attempt; when a retry's events follow an earlier attempt's, an event of kind
        ``"attempt"`` comes first (see :class:`plunder.StreamEvent`): what was streamed
        before it belongs to an attempt that did not succeed. A stream that ends with
        events of an attempt other than the job's last (which streamed nothing) ends with
        that mark too."""
        store = _remote(self.app.store)
        if store is not None:  # the gateway follows it
            yield from store.job_stream(self.id, timeout=timeout)
            return
        reader = StreamReader(self)
        woken = threading.Event()
        unwatch = self.watch(woken.set)
        try:
            while True:
                events = reader.read()
                if events is None:
                    return
                yield from events
                if not events:
                    woken.wait(reader.wait_time(timeout))
                    woken.clear()
        finally:
            unwatch()

    def watch(self, callback: Callable[[], None]) -> Callable[[], None]:
        """Call ``callback`` when the job writes stream events or finishes; returns the
        function that stops it."""
        unwatch_stream = self.app.hub.watch("stream", self.id, callback)
        unwatch_done = self.app.hub.watch("done", self.id, callback)

        def unwatch() -> None:
            unwatch_stream()
            unwatch_done()

        return unwatch


def _remote(store: Store) -> HttpStore | None:
    """The store, if it is a gateway's (imported only then: httpx is not needed else)."""
    if store.dialect != "http":
        return None
    from plunder.store.http import HttpStore

    assert isinstance(store, HttpStore)
    return store
