"""Results written outside a turn: those no claim goes out with (no slot free, a turn that
failed, a worker shutting down), written on the caller's thread a batch of each kind at a
time. A turn carries the results of most jobs (see plunder.worker); this is the rest.

A busy or unreachable database is retried, until the caller gives up (its session is lost,
the worker halts, or a deadline passed: the store would refuse the results anyway, or the
session is left to expire). Any other refusal will not pass on a retry: completions become
failures that say why, and failures that cannot be written stay running under the session
until the heartbeat finds no task holding them and they are given back.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from typing import Any

from plunder import errors, policy
from plunder.model import AckResult, Completion, ErrorInfo, Failure
from plunder.protocol import Outcome, WorkerProtocol

log = logging.getLogger("plunder.worker")
ACK_BATCH = 200
RETRIED = (errors.StoreBusy, errors.StoreUnavailable, errors.StoreFull)


class Acker:
    def __init__(
        self,
        link: WorkerProtocol,
        *,
        session: Callable[[], str | None],
        stopped: Callable[[], bool],
        counted: Callable[[AckResult, str], None],
    ) -> None:
        """``stopped()``: the session is lost or the worker halts, and the store would
        refuse these results anyway; ``session()``: the session they are written under;
        ``counted(ack, kind)``: a batch was written."""
        self._link = link
        self._session = session
        self._stopped = stopped
        self._counted = counted

    def write(
        self,
        completions: Sequence[Completion],
        failures: Sequence[Failure],
        *,
        deadline: float | None = None,
    ) -> bool:
        """Write these results, a batch of each kind at a time, so that neither waits
        behind a stream of the other. False: given up (see ``stopped``) or past
        ``deadline`` (``time.monotonic()``) with results still unwritten."""
        done, failed = list(completions), list(failures)
        session = self._session()
        if session is None and (done or failed):
            return False  # the store would refuse them: the session they ran under is gone
        while done or failed:
            ok, done = done[:ACK_BATCH], done[ACK_BATCH:]
            if ok:
                refused = self._write(session, ok, "succeeded", deadline)
                if refused is None:
                    return False
                failed += refused
            bad, failed = failed[:ACK_BATCH], failed[ACK_BATCH:]
            if bad and self._write(session, bad, "failed", deadline) is None:
                return False
        return True

    def _write(
        self, session: Any, batch: Sequence[Outcome], kind: str, deadline: float | None
    ) -> list[Failure] | None:
        """Write one batch; None when given up, else the failures its completions became
        (none but where the store refused them for good)."""
        backoff = 0.05
        while True:
            try:
                reply = self._link.exchange(session, batch, None)
                break
            except RETRIED as exc:
                if self._stopped() or (deadline is not None and time.monotonic() >= deadline):
                    return None
                log.warning("acknowledgement failed (%s); retrying in %.2fs", exc, backoff)
                time.sleep(backoff)
                backoff = min(backoff * 2, policy.RECONNECT_CAP)
            except errors.PlunderError as exc:
                log.error("could not write %d %s results: %s", len(batch), kind, exc)
                if kind != "succeeded":
                    return []
                info = ErrorInfo.from_exception(exc)
                return [
                    Failure(c.claim, info, retry_delay=0.0, logs=c.logs)
                    for c in batch
                    if isinstance(c, Completion)
                ]
        self._counted(reply.completed if kind == "succeeded" else reply.failed, kind)
        return []
