"""Enqueue→start and result-notification latency with one idle worker process.

Jobs arrive at a steady rate (default 50/s) while one ``plunder worker`` waits. For each
job: enqueue→start is ``started_at - created_at`` (both stamped by the database clock);
result latency is when ``job.result()`` returned in the producer minus ``finished_at``
(the database and the producer share this machine's clock). Beside it, the bound of this
database on this machine: a bare LISTEN/NOTIFY round trip on PostgreSQL.

    python -m bench.latency [--rate 50] [--seconds 10]   # from the checkout's root
"""

from __future__ import annotations

import argparse
import concurrent.futures
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import psycopg
from tests.support import pgcluster

import plunder

ROOT = Path(__file__).resolve().parents[1]


def percentiles(values: list[float]) -> tuple[float, float, float]:
    ordered = sorted(values)
    pick = lambda q: ordered[min(len(ordered) - 1, int(q * len(ordered)))]  # noqa: E731
    return pick(0.50) * 1000, pick(0.95) * 1000, pick(0.99) * 1000


def measure(url: str, rate: float, seconds: float) -> dict[str, tuple[float, float, float]]:
    app = plunder.App(url)
    app.store.migrate()
    env = {**os.environ, "PLUNDER_URL": url}
    worker = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "plunder",
            "--log-level",
            "WARNING",
            "worker",
            "-A",
            "bench.tasks:app",
            "-c",
            "4",
        ],
        cwd=ROOT,
        env=env,
        stdin=subprocess.DEVNULL,
    )
    try:
        while not app.store.session_list():
            time.sleep(0.05)
        time.sleep(1.0)
        returned: dict[int, float] = {}
        lock = threading.Lock()

        def wait(job: plunder.Job) -> None:
            job.result(timeout=30)
            with lock:
                returned[job.id] = time.time()

        jobs = []
        with concurrent.futures.ThreadPoolExecutor(max_workers=32) as pool:
            start = time.monotonic()
            for i in range(int(rate * seconds)):
                target = start + i / rate
                time.sleep(max(0.0, target - time.monotonic()))
                job = app.enqueue("bench.noop", [i])
                jobs.append(job)
                pool.submit(wait, job)
        starts, results = [], []
        for job in jobs:
            record = job.refresh()
            assert record.started_at and record.finished_at
            starts.append((record.started_at - record.created_at).total_seconds())
            results.append(returned[job.id] - record.finished_at.timestamp())
        return {"start": percentiles(starts), "result": percentiles(results)}
    finally:
        worker.terminate()
        worker.wait()
        app.close()


def notify_bound(url: str, count: int = 500) -> tuple[float, float, float]:
    """A bare LISTEN/NOTIFY round trip between two connections."""
    listener = psycopg.connect(url, autocommit=True)
    sender = psycopg.connect(url, autocommit=True)
    listener.execute("LISTEN bench")
    times = []
    try:
        for i in range(count):
            sent = time.perf_counter()
            sender.execute("SELECT pg_notify('bench', %s)", (str(i),))
            next(listener.notifies(stop_after=1))
            times.append(time.perf_counter() - sent)
            time.sleep(0.02)
    finally:
        listener.close()
        sender.close()
    return percentiles(times)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rate", type=float, default=50)
    parser.add_argument("--seconds", type=float, default=10)
    options = parser.parse_args()
    rows = []
    folder = Path(tempfile.mkdtemp(prefix="plunder-latency-"))
    rows.append(
        ("sqlite", measure(f"sqlite:///{folder / 'bench.db'}", options.rate, options.seconds))
    )
    cluster = pgcluster.create()  # fsync on: production-like
    try:
        with psycopg.connect(cluster.url(), autocommit=True) as conn:
            conn.execute("CREATE DATABASE bench")
        rows.append(("postgres", measure(cluster.url("bench"), options.rate, options.seconds)))
        bound = notify_bound(cluster.url("bench"))
    finally:
        cluster.destroy()
    print(
        "| backend | enqueue→start p50 / p95 / p99 (ms) | result notification p50 / p95 / "
        "p99 (ms) |"
    )
    print("|---|---|---|")
    for name, result in rows:
        s, r = result["start"], result["result"]
        print(
            f"| plunder, {name} | {s[0]:.1f} / {s[1]:.1f} / {s[2]:.1f} | "
            f"{r[0]:.1f} / {r[1]:.1f} / {r[2]:.1f} |"
        )
    print(
        f"| bare LISTEN/NOTIFY round trip, postgres | {bound[0]:.1f} / {bound[1]:.1f} / "
        f"{bound[2]:.1f} | |"
    )


if __name__ == "__main__":
    main()
