"""An idle remote worker's exchange that waits at the gateway for work (a long-poll), and
the claim that a wake-up starts straight from the hub's thread.

```
 exchange ─▶ claim (a worker thread) ─▶ nothing: wait ───────────────┐
                                                                   │ wake-up (hub thread)
 answer ◀── the claimed jobs (the event loop) ◀── claim (a claim thread) ◀┘
```

The wake-up (the gateway's own LISTEN, or SQLite's data_version) starts the claim on a
claim thread at once; the event loop only takes the answer. A wake-up that comes while
no wait is armed (the exchange's own claim is running) makes the loop claim again itself
as soon as that claim found nothing, so none falls between. At most one claim of a
long-poll runs at a time, and a claim started is always awaited: the jobs it claims
are answered, never dropped.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import threading
import weakref
from concurrent.futures import ThreadPoolExecutor

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request

from plunder import errors
from plunder.gateway.server import Gateway
from plunder.protocol import ClaimRequest, Outcome, Reply

CLAIM_THREADS = 8  # a gateway's woken claims at once: its pooled connections (POOL_SIZE)
_EXECUTORS: weakref.WeakKeyDictionary[Gateway, ThreadPoolExecutor] = weakref.WeakKeyDictionary()
_EXECUTORS_LOCK = threading.Lock()


def exchange(
    gateway: Gateway, session_id: str, outcomes: list[Outcome], claim: ClaimRequest | None
) -> Reply:
    """The exchange, on a worker thread. A claim alone (an idle worker's, or a long-poll's
    after a wake-up) is the store's claim: one statement that commits on its own where the
    database allows, not a transaction of three round trips."""
    if outcomes or claim is None or not claim.limit:
        return gateway.link.exchange(session_id, outcomes, claim)
    jobs = gateway.store.job_claim_many(
        session_id,
        queues=claim.queues,
        tasks=claim.tasks,
        limit=claim.limit,
        take_suspect=claim.take_suspect,
    )
    return Reply(claimed=tuple(jobs))


async def long_poll(
    gateway: Gateway,
    request: Request,
    *,
    session_id: str,
    outcomes: list[Outcome],
    claim: ClaimRequest,
    wait: float,
) -> Reply:
    """The exchange, then, while it claimed nothing, a wait for a wake-up on the claim's
    queues (the poll interval at most) and the claim again, until ``wait`` passes. The
    wake-up is registered before the first claim, so none falls between."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + wait
    poll = _Poll(gateway, loop, session_id, claim)
    unregister = gateway.app.hub.on_work(list(claim.queues), poll.wake)
    try:
        reply = await run_in_threadpool(exchange, gateway, session_id, outcomes, claim)
        while not reply.claimed:
            left = deadline - loop.time()
            if left <= 0 or await request.is_disconnected():
                return reply
            if reply.children:  # children of its completions may be pending now
                again = await run_in_threadpool(exchange, gateway, session_id, [], claim)
            else:
                again = await poll.next(min(left, gateway.app.settings.poll_interval))
            reply = dataclasses.replace(reply, claimed=again.claimed, children=again.children)
        return reply
    finally:
        unregister()


class _Poll:
    """One long-poll's wake-ups: a claim started on a claim thread by the hub's thread
    while the loop waits for it (armed), else a mark that the loop claims again itself."""

    def __init__(
        self,
        gateway: Gateway,
        loop: asyncio.AbstractEventLoop,
        session_id: str,
        claim: ClaimRequest,
    ) -> None:
        self.gateway = gateway
        self.loop = loop
        self.session_id = session_id
        self.claim = claim
        self._lock = threading.Lock()
        self._armed: asyncio.Future[Reply] | None = None  # the wait a wake-up answers
        self._woken = False  # a wake-up came while none was armed

    def wake(self) -> None:
        """On the hub's thread: claim now for the armed wait, else mark it woken."""
        with self._lock:
            future, self._armed = self._armed, None
            if future is None:
                self._woken = True
                return
        try:
            _executor(self.gateway).submit(self._claim, future)
        except RuntimeError:  # the interpreter is shutting down: the wait must still end
            gone = errors.StoreUnavailable("the gateway is shutting down")
            with contextlib.suppress(RuntimeError):  # the loop is closed: nobody waits
                self.loop.call_soon_threadsafe(_settle, future, None, gone)

    def _claim(self, future: asyncio.Future[Reply]) -> None:
        """On a claim thread: the claim, its answer (or its error) handed to the loop."""
        reply: Reply | None = None
        failure: Exception | None = None
        try:
            reply = exchange(self.gateway, self.session_id, [], self.claim)
        except Exception as exc:
            failure = exc
        finally:
            if reply is None and failure is None:  # interrupted: the wait must still end
                failure = errors.StoreUnavailable("the gateway's claim was interrupted")
            with contextlib.suppress(RuntimeError):  # the loop is closed: nobody waits
                self.loop.call_soon_threadsafe(_settle, future, reply, failure)

    async def next(self, timeout: float) -> Reply:
        """The next claim: started by a wake-up within ``timeout`` seconds, else (the
        poll: a wake-up may be lost) by this loop when they pass."""
        with self._lock:
            woken, self._woken = self._woken, False
            future: asyncio.Future[Reply] | None = None
            if not woken:
                future = self._armed = self.loop.create_future()
        if future is not None:
            with contextlib.suppress(TimeoutError):
                return await asyncio.wait_for(asyncio.shield(future), timeout)
            with self._lock:
                started = self._armed is not future  # a wake-up took it meanwhile
                self._armed = None
            if started:
                return await future  # its claim runs: its jobs are this long-poll's
        return await run_in_threadpool(exchange, self.gateway, self.session_id, [], self.claim)


def _settle(future: asyncio.Future[Reply], reply: Reply | None, exc: Exception | None) -> None:
    """On the loop: a woken claim's answer to its wait (unless the request is gone)."""
    if future.done():
        return
    if exc is not None:
        future.set_exception(exc)
    else:
        assert reply is not None
        future.set_result(reply)


def _executor(gateway: Gateway) -> ThreadPoolExecutor:
    """The gateway's claim threads, as many as its pooled connections at most."""
    with _EXECUTORS_LOCK:
        executor = _EXECUTORS.get(gateway)
        if executor is None:
            executor = ThreadPoolExecutor(CLAIM_THREADS, thread_name_prefix="plunder-claim")
            _EXECUTORS[gateway] = executor
        return executor
