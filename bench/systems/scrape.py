"""System plunder_pg_metrics: plunder_pg's workers with ``--metrics-port``, each scraped
once a second while it lives, as a Prometheus server would; the scrapes that answered are
counted in ``scrapes.txt`` of the run's folder."""

from __future__ import annotations

import socket
import subprocess
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

INTERVAL = 1.0  # seconds between two scrapes of a worker


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def worker_args(p: Any) -> tuple[list[str], int | None]:
    """The worker's extra arguments and its metrics port (none without ``metrics``)."""
    if not p.extra.get("metrics"):
        return [], None
    port = free_port()
    return ["--metrics-port", str(port)], port


def follow(procs: list[subprocess.Popen[bytes]], ports: list[int], folder: str) -> None:
    """Scrape each of ``ports`` every INTERVAL from a daemon thread until every worker
    exits. A frozen worker (SIGSTOP, before the clock starts) does not answer: skipped."""
    if not ports:
        return
    counts = {"answered": 0, "missed": 0}

    def loop() -> None:
        while any(proc.poll() is None for proc in procs):
            began = time.monotonic()
            for port in ports:
                try:
                    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=0.5):
                        counts["answered"] += 1
                except OSError:
                    counts["missed"] += 1
            Path(folder, "scrapes.txt").write_text(f"{counts}\n")
            time.sleep(max(0.0, INTERVAL - (time.monotonic() - began)))

    threading.Thread(target=loop, name="scraper", daemon=True).start()
