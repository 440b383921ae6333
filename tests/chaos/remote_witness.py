"""The witness task for remote workers (``-A tests.chaos.remote_witness:app``), whose jobs
come through a gateway: no ``ctx.transaction()`` (a remote worker holds no database
connection), so the only effect a run can have is its acknowledged result, and that is
what the checker's I4 reads (``{"uid", "attempt", "session"}`` of the final claim).

Like :mod:`tests.chaos.witness` it writes an ``exec`` line to ``$CHAOS_DIR`` before
anything else, and a ``return`` line when it hands its result to the worker: a result
returned but never acknowledged (a partitioned worker's) is in the exec log, not on the job.
"""

from __future__ import annotations

import os
import time
from typing import Any

import plunder
from tests.chaos.witness import record

app = plunder.App()  # PLUNDER_URL (a gateway's) and PLUNDER_KEY, set by the test
GO_WAIT = 60.0  # seconds a job waits for its go file at most


@app.task(name="witness")
def witness(ctx: plunder.Context, uid: str, sleep_ms: int = 0, go: str = "") -> dict[str, Any]:
    """Sleep ``sleep_ms`` (deaf to cancellation: a zombie must try to complete) after the
    file ``go`` exists, if one is named (the test makes it once its fault is in place)."""
    record("exec", ctx, uid=uid)
    deadline = time.monotonic() + GO_WAIT
    while go and not os.path.exists(go) and time.monotonic() < deadline:
        time.sleep(0.02)
    time.sleep(sleep_ms / 1000)
    record("return", ctx, uid=uid)
    return {"uid": uid, "attempt": ctx.attempt, "session": ctx.claim.session_id}
