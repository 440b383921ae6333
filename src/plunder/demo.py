"""``plunder demo``: three worker processes steal a few hundred jobs from one database;
one of them is killed with SIGKILL mid-run and the others rescue its jobs.

The tasks live here so that worker processes can import them (``-A plunder.demo:app``).
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.live import Live
from rich.table import Table

from plunder.app import App
from plunder.context import Context
from plunder.model import JobRecord
from plunder.states import Outcome, Status, is_terminal
from plunder.store import Store, open_store

app = App()  # the URL comes from PLUNDER_URL, which the demo sets for its workers

WORDS = [
    "idle",
    "workers",
    "steal",
    "work",
    "from",
    "the",
    "database",
    "and",
    "nobody",
    "pushes",
    "anything",
]


@app.task(name="demo.quick")
def quick(n: int) -> int:
    time.sleep(random.uniform(0.01, 0.05))
    return n * n


@app.task(name="demo.long")
def long(ctx: Context, n: int) -> int:
    for step in range(10):
        ctx.progress(step + 1, 10)
        if ctx.wait_cancelled(0.25):
            return -1
    return n


@app.task(name="demo.stream")
def stream(ctx: Context, sentence: str) -> str:
    for word in sentence.split():
        ctx.stream(word + " ")
        time.sleep(0.08)
    return sentence.upper()


@app.task(name="demo.flaky", retries=3, backoff_base=0.2, backoff_cap=1.0)
def flaky(ctx: Context, n: int) -> int:
    if ctx.attempt == 1:
        raise ConnectionError(f"upstream hiccup on item {n}")
    return n


@app.task(name="demo.broken", retries=1, backoff_base=0.2)
def broken(n: int) -> None:
    raise ValueError(f"item {n} is malformed")


@app.task(name="demo.too_slow", timeout=1.0, retry_on_timeout=False)
def too_slow(ctx: Context) -> str:
    ctx.wait_cancelled(10)
    return "finished late"


def _enqueue(total: int) -> None:
    longs, streams, flakies, broken_ = total // 8, total // 15, total // 10, 3
    quicks = total - longs - streams - flakies - broken_ - 1
    long.enqueue_many([(i,) for i in range(longs)])
    stream.enqueue_many([(" ".join(random.sample(WORDS, 6)),) for _ in range(streams)])
    flaky.enqueue_many([(i,) for i in range(flakies)])
    broken.enqueue_many([(i,) for i in range(broken_)])
    too_slow.enqueue()
    quick.enqueue_many([(i,) for i in range(quicks)])


def _start_workers(url: str, count: int, logs: Path) -> list[subprocess.Popen[bytes]]:
    env = {**os.environ, "PLUNDER_URL": url}
    workers = []
    for i in range(count):
        with (logs / f"worker-{i}.log").open("wb") as log:
            workers.append(
                subprocess.Popen(
                    [
                        sys.executable,
                        "-m",
                        "plunder",
                        "--log-level",
                        "WARNING",
                        "worker",
                        "-A",
                        "plunder.demo:app",
                        "-c",
                        "8",
                        "--name",
                        f"demo-worker-{i}",
                    ],
                    env=env,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                )
            )
    return workers


def _dashboard(url: str, logs: Path) -> tuple[subprocess.Popen[bytes] | None, str]:
    """``plunder dashboard`` on the demo's database, where the gateway's extra is here."""
    import importlib.util
    import socket

    if importlib.util.find_spec("jinja2") is None or importlib.util.find_spec("uvicorn") is None:
        return None, ""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = int(sock.getsockname()[1])
    argv = [sys.executable, "-m", "plunder", "--db", url, "dashboard", "--port", str(port)]
    with (logs / "dashboard.log").open("wb") as output:
        proc = subprocess.Popen(argv, stdout=output, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL)  # fmt: skip
    return proc, f"http://127.0.0.1:{port}/"


def _table(store: Store, note: str, elapsed: float) -> Table:
    counts: Counter[str] = Counter()
    for stats in store.queue_stats():
        counts.update(stats.counts)
    table = Table(title=f"plunder demo — {elapsed:4.1f}s — {note}")
    for status in Status:
        table.add_column(status.value, justify="right")
    table.add_row(*(str(counts[s.value]) for s in Status))
    return table


def _running_of(store: Store, session_id: str) -> list[JobRecord]:
    running = store.job_list(status=Status.RUNNING.value, limit=1000).jobs
    return [j for j in running if j.session_id == session_id]


def _all_jobs(store: Store) -> list[JobRecord]:
    jobs: list[JobRecord] = []
    after = None
    while True:
        page = store.job_list(limit=1000, after=after)
        jobs += page.jobs
        if page.next_after is None:
            return jobs
        after = page.next_after


def _summary(
    store: Store, killed: list[int], killed_at: float | None, elapsed: float
) -> dict[str, Any]:
    jobs = _all_jobs(store)
    statuses = Counter(j.status.value for j in jobs)
    rescue_times = []
    interrupted = spent = 0  # spent: lost on their last allowed attempt, so timed_out
    for job_id in killed:  # jobs the victim held a moment before SIGKILL
        runs = store.job_runs(job_id)
        lost = [r for r in runs if r.outcome == Outcome.LOST]
        if not lost:
            continue  # it finished between our look and the kill
        interrupted += 1
        later = [r for r in runs if r.attempt > lost[0].attempt]
        if later and killed_at is not None:
            rescue_times.append(later[0].started_at.timestamp() - killed_at)
        else:
            spent += 1
    return {
        "jobs": len(jobs),
        "statuses": dict(statuses),
        "attempts": sum(j.attempt for j in jobs),
        "retried": sum(1 for j in jobs if j.attempt > 1),
        "rescued": len(rescue_times),
        "lost_on_last_attempt": spent,
        "killed_worker_jobs": interrupted,
        "rescue_seconds_max": round(max(rescue_times), 2) if rescue_times else None,
        "elapsed_seconds": round(elapsed, 1),
    }


def _print_summary(console: Console, summary: dict[str, Any]) -> None:
    console.print()
    table = Table(title="summary")
    table.add_column("what")
    table.add_column("count", justify="right")
    for status, count in sorted(summary["statuses"].items()):
        table.add_row(f"jobs {status}", str(count))
    table.add_row("attempts in all", str(summary["attempts"]))
    table.add_row("jobs retried (attempt > 1)", str(summary["retried"]))
    table.add_row("jobs of the killed worker", str(summary["killed_worker_jobs"]))
    table.add_row("…rescued by the others", str(summary["rescued"]))
    table.add_row("…lost on their last allowed attempt", str(summary["lost_on_last_attempt"]))
    table.add_row("slowest rescue after SIGKILL", f"{summary['rescue_seconds_max']}s")
    table.add_row("elapsed", f"{summary['elapsed_seconds']}s")
    console.print(table)


def run(
    url: str | None,
    *,
    workers: int = 3,
    jobs: int = 300,
    console: Console | None = None,
    quiet: bool = False,
    deadline: float = 90.0,
) -> dict[str, Any]:
    console = console or Console()
    folder = Path(tempfile.mkdtemp(prefix="plunder-demo-"))
    url = url or f"sqlite:///{folder / 'demo.db'}"
    store = open_store(url)
    store.migrate()
    app.configure(url=url)
    if not quiet:
        console.print(f"database: {store.url}\nworker logs: {folder}")
    procs = _start_workers(url, workers, folder)
    board, address = _dashboard(url, folder)
    if address and not quiet:
        console.print(f"dashboard: {address} (while the demo runs)")
    procs += [board] if board is not None else []
    started = time.monotonic()
    killed: list[int] = []
    killed_at: float | None = None
    try:
        _enqueue(jobs)
        note = f"{workers} workers stealing"
        with Live(
            _table(store, note, 0), console=console, refresh_per_second=8, transient=quiet
        ) as live:
            while time.monotonic() - started < deadline:
                if not killed:
                    killed, killed_at, note = _maybe_kill(store, procs, note)
                live.update(_table(store, note, time.monotonic() - started))
                if all(is_terminal(s.status) for s in _all_jobs(store)):
                    break
                time.sleep(0.25)
        summary = _summary(store, killed, killed_at, time.monotonic() - started)
    finally:
        _stop(procs)
        app.close()
        store.close()
    if not quiet:
        _print_summary(console, summary)
    return summary


def _maybe_kill(
    store: Store, procs: list[subprocess.Popen[bytes]], note: str
) -> tuple[list[int], float | None, str]:
    """SIGKILL the worker holding the most work, once one holds a long job or three jobs
    (whichever worker started first may have taken everything)."""
    by_pid = {p.pid: p for p in procs}
    best: tuple[int, list[JobRecord]] | None = None
    for session in store.session_list():
        if session.pid in by_pid:
            held = _running_of(store, session.id)
            if best is None or len(held) > len(best[1]):
                best = (session.pid, held)
    if best is None:
        return [], None, note
    pid, held = best
    if len(held) < 3 and not any(j.task == "demo.long" for j in held):
        return [], None, note
    victim = by_pid[pid]
    victim.send_signal(signal.SIGKILL)
    victim.wait()
    return (
        [j.id for j in held],
        time.time(),
        f"SIGKILLed worker pid {victim.pid} holding {len(held)} jobs; waiting for rescue",
    )


def _stop(procs: list[subprocess.Popen[bytes]]) -> None:
    for proc in procs:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
    for proc in procs:
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
