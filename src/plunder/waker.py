"""Wake-ups for a worker whose link long-polls (a gateway's), while some of its jobs run.

An idle remote worker's exchange waits at the gateway for work itself. A worker with jobs
running must not: the results of those jobs would wait with it. So it exchanges without
waiting, and this thread asks the gateway to tell it when work may have arrived in its
queues (``WorkerProtocol.watch``, which claims nothing), waking the main loop as the hub
wakes a worker on the database. A wake-up missed between two watches is made up by the
loop's poll interval, as a lost notification is.

It also wakes the loop when the next delayed job is due (``WorkerProtocol.next_due``,
read before each watch, which then waits no longer): the loop itself never waits on that
read, which would hold up the results of jobs that finished meanwhile by a round trip.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from plunder import errors
from plunder.model import Session
from plunder.protocol import ClaimRequest, WorkerProtocol
from plunder.slots import Slots, Wake

log = logging.getLogger("plunder.worker")
WATCH = 2.0  # seconds one watch may wait at the gateway (a stop waits for it)
IDLE_CHECK = 0.05  # seconds between looks at the slots while no watch is needed
RETRY = 1.0  # seconds after a watch failed
MIN_WAIT = 0.05  # a due job not claimed (locked, or left to other workers): look again


def watch_loop(
    link: WorkerProtocol,
    slots: Slots,
    queues: list[str],
    session: Callable[[], Session | None],
    stop: threading.Event,
    *,
    due_request: Callable[[], ClaimRequest],
) -> None:
    """Until ``stop``: while jobs run and slots are free, watch the queues and wake the
    main loop (``Wake`` on the slots' outcome queue) when work may have arrived, or when
    the next delayed job of ``due_request()`` (a claim of nothing) is due."""
    looked_again = False
    while not stop.is_set():
        current = session()
        running = slots.busy()
        if current is None or not running or running >= slots.concurrency:
            stop.wait(IDLE_CHECK)  # idle (the exchange waits itself) or full
            continue
        try:
            due = link.next_due(due_request())
            if due is not None and due <= 0 and not looked_again:
                # due now, though the last claim took nothing: it may have come due in
                # between, so the loop claims once more at once
                looked_again = True
                slots.outcomes.put(Wake())
                continue
            looked_again = due is not None and due <= 0
            wait = WATCH if due is None else min(WATCH, max(due, MIN_WAIT))
            # a watch that ends without work at the due time: the delayed job is due now
            if link.watch(current.id, queues, wait) or wait < WATCH:
                slots.outcomes.put(Wake())
        except errors.SessionGone:
            stop.wait(RETRY)  # the heartbeat says so too, and a new session is opened
        except errors.StoreError as exc:
            log.debug("watching for work failed: %s", exc)
            stop.wait(RETRY)
