"""Screenshots of the dashboard's pages for the docs (docs/images/dashboard-*.png).

    PYTHONPATH=src python3 scripts/screenshots.py [--out docs/images]

A SQLite farm in a temporary folder runs the demo's tasks (plunder.demo) in three queues
on two worker processes; one worker is SIGKILLed mid-run so that the workers page has a
rescue to show, one queue is paused, and ``plunder dashboard`` serves the pages that
Debian's headless chromium (driven by Playwright) photographs, desktop and phone sized.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
from playwright.sync_api import sync_playwright

from plunder import demo
from plunder.model import JobSpec
from plunder.store import observing, open_store, pauses

ROOT = Path(__file__).resolve().parents[1]
QUEUES = "default,images,reports"


def _port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _plunder(url: str, *argv: str, log: Path) -> subprocess.Popen[bytes]:
    env = {**os.environ, "PLUNDER_URL": url}
    with log.open("wb") as output:
        return subprocess.Popen(
            [sys.executable, "-m", "plunder", "--log-level", "WARNING", *argv],
            env=env, stdout=output, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
        )  # fmt: skip


def farm(folder: Path) -> tuple[str, list[subprocess.Popen[bytes]]]:
    """A database with work in three queues, two workers on it (one killed), a pause."""
    url = f"sqlite:///{folder / 'farm.db'}"
    store = open_store(url)
    store.migrate()
    demo.app.configure(url=url)
    demo._enqueue(400)
    store.job_enqueue_many(
        [JobSpec("demo.quick", [i], queue="images") for i in range(600)]
        + [JobSpec("demo.quick", [i], queue="reports") for i in range(40)]
        # first of all: a stream and a failure for the job pages
        + [JobSpec("demo.stream", [" ".join(demo.WORDS)], priority=10)]
        + [JobSpec("demo.broken", [7], priority=10, max_attempts=2, backoff_base=0.1)]
    )
    argv = ["worker", "-A", "plunder.demo:app", "-q", QUEUES, "-c", "8"]
    procs = [
        _plunder(url, *argv, "--name", f"farm-worker-{i}", log=folder / f"worker-{i}.log")
        for i in range(2)
    ]
    victim = procs[0].pid
    for _ in range(300):  # until the worker to kill runs jobs
        sessions = {s.id for s in store.session_list() if s.pid == victim}
        running = observing.of(store).running()
        if any(running.get(s, 0) for s in sessions):
            break
        time.sleep(0.05)
    time.sleep(1.0)
    procs[0].send_signal(signal.SIGKILL)  # its running jobs are rescued by the janitor
    procs[0].wait()
    pauses.of(store).queue_pause("reports", reason="the report service is down")
    time.sleep(7)  # past the session expiry: the janitor has reaped the dead session
    store.job_enqueue_many([JobSpec("demo.quick", [i], queue="reports") for i in range(25)])
    store.close()
    return url, procs[1:]


def shoot(base: str, out: Path, url: str) -> None:
    store = open_store(url)
    streamed = store.job_list(task="demo.stream", status="succeeded", limit=1).jobs
    failed = store.job_list(task="demo.broken", limit=1).jobs
    store.close()
    executable = shutil.which("chromium") or "/usr/bin/chromium"
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=executable, args=["--no-sandbox"])
        page = browser.new_page(viewport={"width": 1280, "height": 800})
        pages = [("overview", "/"), ("workers", "/workers"), ("jobs", "/jobs")]
        if streamed:
            pages.append(("job", f"/jobs/{streamed[0].id}"))
        if failed:
            pages.append(("job-failed", f"/jobs/{failed[0].id}"))
        for name, path in pages:
            page.goto(base + path)
            page.wait_for_timeout(1500)  # the live updates and a job's stream have come in
            page.screenshot(path=str(out / f"dashboard-{name}.png"), full_page=name != "jobs")
        phone = browser.new_page(viewport={"width": 390, "height": 844}, is_mobile=True)
        phone.goto(base + "/")
        phone.wait_for_timeout(1500)
        phone.screenshot(path=str(out / "dashboard-phone.png"))
        browser.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "images")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    folder = Path(tempfile.mkdtemp(prefix="plunder-screens-"))
    url, workers = farm(folder)
    port = _port()
    board = _plunder(url, "dashboard", "--port", str(port), log=folder / "dashboard.log")
    base = f"http://127.0.0.1:{port}"
    try:
        for _ in range(100):
            try:
                httpx.get(base + "/static/live.js", timeout=1)
                break
            except httpx.TransportError:
                time.sleep(0.1)
        shoot(base, args.out, url)
    finally:
        for proc in [*workers, board]:
            proc.terminate()
            proc.wait(timeout=20)
    print(f"screenshots in {args.out}")


if __name__ == "__main__":
    main()
