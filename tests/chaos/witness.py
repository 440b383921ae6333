"""The witness task of the chaos suite (``-A tests.chaos.witness:app``).

Every execution leaves evidence that no fault can take back: an ``exec`` line appended to
``$CHAOS_DIR/exec-<pid>.jsonl`` before anything else (a SIGKILL cannot lose it; it is in
the page cache once ``write`` returns), and — only if its acknowledgement commits — one row
in ``chaos_effects``, written inside ``ctx.transaction()``. That table deliberately has no
unique constraint, so a second commit of the same job would show up as a second row.
"""

from __future__ import annotations

import json
import math
import os
import re
import signal
import time
from typing import Any

import plunder

app = plunder.App()  # PLUNDER_URL, set by the harness that starts the worker

EFFECTS_DDL = (
    "CREATE TABLE IF NOT EXISTS chaos_effects (uid TEXT NOT NULL, job_id BIGINT NOT NULL, "
    "attempt INTEGER NOT NULL, session_id TEXT NOT NULL, pid INTEGER NOT NULL)"
)
KILL_POINTS = ("before_effects", "after_effects_before_return", "after_commit")


def record(event: str, ctx: plunder.Context | None = None, **fields: Any) -> None:
    line: dict[str, Any] = {"ev": event, "pid": os.getpid(), "wall": time.time()}
    if ctx is not None:
        line |= {"job": ctx.job_id, "attempt": ctx.attempt, "session": ctx.claim.session_id}
    line |= fields
    folder = os.environ.get("CHAOS_DIR", ".")
    fd = os.open(
        os.path.join(folder, f"exec-{os.getpid()}.jsonl"),
        os.O_WRONLY | os.O_APPEND | os.O_CREAT,
        0o644,
    )
    try:
        os.write(fd, (json.dumps(line) + "\n").encode())
    finally:
        os.close(fd)


def _die(ctx: plunder.Context, point: str) -> None:
    record("kill", ctx, point=point)
    os.kill(os.getpid(), signal.SIGKILL)


@app.task(name="witness")
def witness(
    ctx: plunder.Context,
    uid: str,
    sleep_ms: int = 0,
    fail_times: int = 0,
    kill_point: str | None = None,
    poison: bool = False,
    tx_sleep_ms: int = 0,
    hog_ms: int = 0,
    sleep_until: float = 0.0,
    pad: str = "",  # ballast, to fill a disk
    lock_job: bool = False,  # hold the job's row lock for the whole transaction
    first_sleep_ms: int = 0,  # on the first attempt only: outlive a worker, rerun at once
) -> dict[str, Any]:
    record("exec", ctx, uid=uid)
    if poison:
        os._exit(137)
    first = ctx.attempt == 1
    if hog_ms and first:  # starves every other thread of this worker, heartbeats included
        record("hog", ctx, uid=uid, held=hog(hog_ms))
    time.sleep(max(0.0, sleep_until - time.time()))  # a common moment (wall clock) for all
    if kill_point == "before_effects" and first:
        _die(ctx, kill_point)
    pause = sleep_ms + (first_sleep_ms if first else 0)
    time.sleep(pause / 1000)  # deliberately deaf to cancellation: a zombie must try
    if ctx.attempt <= fail_times:
        raise RuntimeError(f"witness {uid} fails attempt {ctx.attempt} on purpose")
    result = {"uid": uid, "attempt": ctx.attempt, "session": ctx.claim.session_id}
    record("commit_try", ctx, uid=uid)
    try:
        with ctx.transaction(result=result) as conn:
            _effects(ctx, conn, uid, lock_job)
            if tx_sleep_ms:
                time.sleep(tx_sleep_ms / 1000)
            if kill_point == "after_effects_before_return" and first:
                _die(ctx, kill_point)
    except plunder.StaleClaim:
        record("commit_stale", ctx, uid=uid)
        raise
    except Exception as exc:
        record("commit_error", ctx, uid=uid, error=f"{type(exc).__name__}: {exc}")
        raise
    record("commit_ok", ctx, uid=uid)
    if kill_point == "after_commit" and first:
        _die(ctx, kill_point)
    return result


def _effects(ctx: plunder.Context, conn: Any, uid: str, lock_job: bool) -> None:
    """The task's own writes in its completion transaction: the effects row and, when
    asked (PostgreSQL), a lock on the job's own row, as a task's write to it would take."""
    mark = "?" if app.url.startswith("sqlite") else "%s"
    sql = f"INSERT INTO chaos_effects VALUES ({mark}, {mark}, {mark}, {mark}, {mark})"
    conn.execute(sql, (uid, ctx.job_id, ctx.attempt, ctx.claim.session_id, os.getpid()))
    if lock_job:
        conn.execute(f"SELECT id FROM plunder_jobs WHERE id = {mark} FOR UPDATE", (ctx.job_id,))
        record("tx_locked", ctx, uid=uid)


def hog(ms: int) -> float:
    """Hold the GIL for at least ``ms`` milliseconds in one C call (a backtracking regex
    never lets go of it), so no other thread of the process runs meanwhile; return the
    seconds it really held it."""
    pattern = re.compile(r"(a+)+$")
    size, took = 12, 0.0
    while took < 0.02:  # each extra character doubles the time: find a short one
        size += 1
        started = time.thread_time()  # CPU time: not the wait for another thread's GIL
        pattern.fullmatch("a" * size + "b")
        took = time.thread_time() - started
    size += math.ceil(math.log2(ms / 1000 / took))
    started = time.monotonic()
    pattern.fullmatch("a" * size + "b")
    return time.monotonic() - started


@app.task(name="hog")
def hog_task(ms: int) -> float:
    """A GIL hog without a context: it can run in a worker's process pool."""
    return hog(ms)
