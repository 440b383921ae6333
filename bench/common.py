"""Helpers shared by every system adapter: worker processes, readiness, timing.

This module must import nothing beyond the standard library: it runs both under the main
interpreter (plunder and the raw bounds) and under the benchmark's own virtualenv (the
peers), where plunder is not installed.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
RESULT_PREFIX = "BENCH-RESULT "
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


class BenchError(RuntimeError):
    """A scenario could not produce a number (and says why)."""


@dataclass
class Params:
    """What one scenario run needs, passed from the harness to the runner as JSON."""

    url: str
    workdir: str
    jobs: int = 20_000
    workers: int = 1
    rate: float = 50.0
    seconds: float = 10.0
    deep: int = 0
    hold_jobs: int = 4
    rescue_cap: float = 90.0
    timeout: float = 600.0
    batch: int = 0  # jobs per enqueue call where a scenario enqueues in batches
    idle: float = 0.0  # seconds over which idle workers' CPU is read
    extra: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_json(cls, text: str) -> Params:
        return cls(**json.loads(text))


def percentiles(values: Sequence[float]) -> dict[str, float]:
    """p50 / p95 / p99 in milliseconds of values in seconds (nearest rank)."""
    if not values:
        raise BenchError("no samples")
    ordered = sorted(values)

    def pick(q: float) -> float:
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000

    return {"p50": pick(0.50), "p95": pick(0.95), "p99": pick(0.99), "samples": len(ordered)}


def emit(result: dict[str, Any]) -> None:
    print(RESULT_PREFIX + json.dumps(result), flush=True)


# -- worker processes ---------------------------------------------------------------------
def spawn(argv: Sequence[str], *, env: dict[str, str] | None = None, log: Path | None = None):
    """Start a worker process in its own process group, output to a log file."""
    out = open(log, "ab") if log else subprocess.DEVNULL  # noqa: SIM115
    return subprocess.Popen(
        list(argv),
        cwd=ROOT,
        # the runner's own path (the harness gives plunder's runs this checkout's src/)
        env={**os.environ, "PYTHONPATH": os.environ.get("PYTHONPATH", str(ROOT)), **(env or {})},
        stdin=subprocess.DEVNULL,
        stdout=out,
        stderr=out,
        start_new_session=True,
    )


def cpu_ticks(pid: int) -> int:
    """utime + stime of a process and its reaped children, in clock ticks."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    # after the command name: state is fields[0]; utime, stime, cutime, cstime are 11..14
    return sum(int(x) for x in fields[11:15])


def wait_idle(
    procs: Sequence[subprocess.Popen[bytes]],
    *,
    check: Callable[[], bool] | None = None,
    timeout: float = 60.0,
    window: float = 0.3,
) -> None:
    """Wait until every process has started up and gone idle (uses under ~10 % of a core
    over ``window``), and ``check()`` (a system's own readiness test) holds."""
    deadline = time.monotonic() + timeout
    time.sleep(0.3)
    before = {p.pid: cpu_ticks(p.pid) for p in procs}
    while time.monotonic() < deadline:
        for p in procs:
            if p.poll() is not None:
                raise BenchError(f"worker {p.args!r} exited with {p.returncode} while starting")
        time.sleep(window)
        after = {p.pid: cpu_ticks(p.pid) for p in procs}
        idle = all(after[pid] - before[pid] <= window * CLOCK_TICKS * 0.1 for pid in after)
        before = after
        if idle and (check is None or check()):
            return
    raise BenchError(f"workers did not become ready within {timeout:.0f}s")


def signal_all(procs: Sequence[subprocess.Popen[bytes]], sig: int) -> None:
    for p in procs:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(p.pid, sig)


def stop_all(procs: Sequence[subprocess.Popen[bytes]], grace: float = 5.0) -> None:
    """SIGCONT (in case they are stopped), SIGTERM, then SIGKILL whatever is left."""
    signal_all(procs, signal.SIGCONT)
    signal_all(procs, signal.SIGTERM)
    deadline = time.monotonic() + grace
    for p in procs:
        with contextlib.suppress(subprocess.TimeoutExpired):
            p.wait(timeout=max(0.0, deadline - time.monotonic()))
    signal_all(procs, signal.SIGKILL)
    for p in procs:
        with contextlib.suppress(subprocess.TimeoutExpired):
            p.wait(timeout=5)


def wait_until(
    done: Callable[[], bool], *, timeout: float, interval: float = 0.05, what: str = "condition"
) -> float:
    """Poll ``done()`` until it holds; return the wall-clock time (time.time()) it did."""
    deadline = time.monotonic() + timeout
    while True:
        if done():
            return time.time()
        if time.monotonic() > deadline:
            raise BenchError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(interval)


def gated_drain(
    start_workers: Callable[[], list[subprocess.Popen[bytes]]],
    enqueue: Callable[[], None],
    remaining: Callable[[], int],
    *,
    jobs: int,
    timeout: float,
    ready: Callable[[], bool] | None = None,
    last_finish: Callable[[], float | None] | None = None,
    unlocked: Callable[[], bool] | None = None,
) -> dict[str, Any]:
    """The drain measurement, the same for every system.

    Workers start against an empty queue and are left to go idle (imports, connections,
    LISTEN). Then they are frozen with SIGSTOP, the jobs are enqueued, and the clock starts
    when SIGCONT lets them go: process start-up is not measured, and no worker sees the
    jobs before the clock runs. The clock stops when the database shows every job
    finished: at the system's own last finish timestamp where it records one (database
    clock, same machine), else when a poll saw none left.

    ``unlocked``: whether the frozen workers left free what the enqueue needs. An idle
    worker may be frozen inside a write transaction (a poll, a heartbeat), and on SQLite
    the enqueue would then wait for a lock that nobody releases; such workers are let go
    and frozen again until they hold none.
    """
    procs = start_workers()
    try:
        wait_idle(procs, check=ready)
        freeze(procs, unlocked)
        enqueue()
        started = time.time()
        signal_all(procs, signal.SIGCONT)
        polled = wait_until(
            lambda: remaining() == 0, timeout=timeout, interval=0.1, what="the drain"
        )
        for p in procs:
            if p.poll() is not None:
                raise BenchError(f"worker exited with {p.returncode} during the drain")
    finally:
        stop_all(procs)
    finished = last_finish() if last_finish else None
    end = finished if finished is not None else polled
    return {"rate": jobs / (end - started), "seconds": end - started, "jobs": jobs}


def freeze(procs: Sequence[subprocess.Popen[bytes]], unlocked: Callable[[], bool] | None) -> None:
    """SIGSTOP every worker, at a moment when ``unlocked()`` says they hold no lock. A
    signal is delivered when its target next runs, so this waits until every process of
    each worker's group is stopped before it looks."""
    for _ in range(200):
        signal_all(procs, signal.SIGSTOP)
        wait_until(
            lambda: all(_group_stopped(p.pid) for p in procs),
            timeout=10,
            interval=0.001,
            what="the workers to stop",
        )
        if unlocked is None or unlocked():
            return
        signal_all(procs, signal.SIGCONT)
        time.sleep(0.01)
    raise BenchError("the idle workers kept the database locked")


def _group_stopped(pgid: int) -> bool:
    """Whether every process in process group ``pgid`` is stopped (or gone)."""
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rpartition(")")[2].split()
        except OSError:
            continue  # exited meanwhile
        state, group = fields[0], int(fields[2])
        if group == pgid and state not in "TtZX":
            return False
    return True


def sqlite_unlocked(path: str) -> bool:
    """Whether a write transaction on the SQLite file ``path`` can begin right now."""
    import sqlite3

    conn = sqlite3.connect(path, timeout=0, isolation_level=None)
    try:
        conn.execute("BEGIN IMMEDIATE")
        conn.execute("ROLLBACK")
        return True
    except sqlite3.OperationalError as exc:
        if "locked" in str(exc) or "busy" in str(exc):
            return False
        raise
    finally:
        conn.close()


def python_for(venv: bool) -> str:
    return str(ROOT / "bench" / ".venv" / "bin" / "python") if venv else sys.executable
