"""Real worker processes for the worker tests."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from plunder.store import Store
from plunder.worker import Worker, WorkerOptions

ROOT = Path(__file__).resolve().parents[2]
FAST = [
    "--heartbeat-interval",
    "0.2",
    "--session-expiry",
    "1.0",
    "--janitor-interval",
    "0.2",
    "--poll-interval",
    "0.1",
]
EXPIRY, JANITOR = 1.0, 0.2


class Workers:
    """Starts ``plunder worker`` processes and cleans them up."""

    def __init__(self, url: str, tmp: Path) -> None:
        self.url = url
        self.tmp = tmp
        self.procs: list[subprocess.Popen[bytes]] = []

    def start(
        self, *extra: str, name: str | None = None, command: str = "worker"
    ) -> subprocess.Popen[bytes]:
        index = len(self.procs)
        args = [sys.executable, "-m", "plunder", "--db", self.url, command]
        if command == "worker":
            args += ["-A", "tests.worker.tasks:app", "--name", name or f"w{index}"]
        with self.path(index, command).open("wb") as log:
            proc = subprocess.Popen(
                [*args, *FAST, *extra],
                cwd=ROOT,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env={**os.environ, "PLUNDER_URL": self.url},
            )
        self.procs.append(proc)
        return proc

    def path(self, index: int, command: str = "worker") -> Path:
        return self.tmp / f"{command}-{index}.log"

    def log(self, index: int, command: str = "worker") -> str:
        return self.path(index, command).read_text(errors="replace")

    def stop_all(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGCONT)
                proc.kill()
        for proc in self.procs:
            proc.wait(timeout=10)


@pytest.fixture
def workers(store_url: str, tmp_path: Path) -> Iterator[Workers]:
    group = Workers(store_url, tmp_path)
    try:
        yield group
    finally:
        group.stop_all()


def wait_for(
    condition: Callable[[], object], timeout: float = 15.0, what: str = "condition"
) -> object:
    """Poll observed state (not a fixed sleep) until ``condition()`` is truthy."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.02)


def session_of(store: Store, pid: int) -> str | None:
    for session in store.session_list():
        if session.pid == pid:
            return session.id
    return None


@contextmanager
def worker_in_thread(
    url: str, concurrency: int = 4, *, poll_interval: float = 0.05
) -> Iterator[Worker]:
    """A worker for tests.worker.tasks on a thread of this process, with fast intervals."""
    from tests.worker import tasks

    tasks.app.configure(
        url=url,
        heartbeat_interval=0.1,
        session_expiry=1.0,
        poll_interval=poll_interval,
        janitor_interval=0.1,
    )
    running = Worker(tasks.app, WorkerOptions(concurrency=concurrency))
    thread = threading.Thread(target=running.run, kwargs={"install_signals": False}, daemon=True)
    thread.start()
    try:
        # started: its session is open and its tasks published (enqueues by name need them)
        wait_for(lambda: running.session is not None or not thread.is_alive(), what="a session")
        yield running
    finally:
        running.stop()
        thread.join(timeout=15)
        tasks.app.close()
        assert not thread.is_alive()
