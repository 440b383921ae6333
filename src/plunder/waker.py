"""Wake-ups for a worker whose link long-polls (a gateway's), while some of its jobs run.

An idle remote worker's exchange waits at the gateway for work itself. A worker with jobs
running must not: the results of those jobs would wait with it. So it exchanges without
waiting, and this thread asks the gateway to tell it when work may have arrived in its
queues (``WorkerProtocol.watch``, which claims nothing), waking the main loop as the hub
wakes a worker on the database. A wake-up missed between two watches is made up by the
loop's poll interval, as a lost notification is.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from plunder import errors
from plunder.model import Session
from plunder.protocol import WorkerProtocol
from plunder.slots import Slots, Wake

log = logging.getLogger("plunder.worker")
WATCH = 2.0  # seconds one watch may wait at the gateway (a stop waits for it)
IDLE_CHECK = 0.05  # seconds between looks at the slots while no watch is needed
RETRY = 1.0  # seconds after a watch failed


def watch_loop(
    link: WorkerProtocol,
    slots: Slots,
    queues: list[str],
    session: Callable[[], Session | None],
    stop: threading.Event,
) -> None:
    """Until ``stop``: while jobs run and slots are free, watch the queues and wake the
    main loop (``Wake`` on the slots' outcome queue) when work may have arrived."""
    while not stop.is_set():
        current = session()
        running = slots.busy()
        if current is None or not running or running >= slots.concurrency:
            stop.wait(IDLE_CHECK)  # idle (the exchange waits itself) or full
            continue
        try:
            if link.watch(current.id, queues, WATCH):
                slots.outcomes.put(Wake())
        except errors.SessionGone:
            stop.wait(RETRY)  # the heartbeat says so too, and a new session is opened
        except errors.StoreError as exc:
            log.debug("watching for work failed: %s", exc)
            stop.wait(RETRY)
