"""A PostgreSQL deployment in miniature: N ``plunder worker`` processes against
``PLUNDER_URL``, a batch of jobs enqueued, every result waited for, and the workers stopped
with SIGTERM (they finish what they run, then close their sessions).

    export PLUNDER_URL=postgresql://user:pass@host/db
    python pg_workers.py 3 300                   # 3 workers, 300 jobs

In production each worker is a service of its own (systemd, a container), started with the
same command line; see the connection budget in docs/deployment.md.
"""

from __future__ import annotations

import collections
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import plunder

HERE = Path(__file__).resolve().parent
app = plunder.App()  # PLUNDER_URL
WORKER = [sys.executable, "-m", "plunder", "worker", "-A", "pg_workers:app", "-c", "8"]


@app.task(name="pg_workers.square", retries=2, timeout=30)
def square(x: int) -> int:
    return x * x


def start_workers(count: int) -> list[subprocess.Popen[bytes]]:
    return [
        subprocess.Popen(
            [*WORKER, "--name", f"worker-{index}"],
            cwd=HERE,
        )
        for index in range(1, count + 1)
    ]


def wait_live(workers: list[subprocess.Popen[bytes]], timeout: float = 60) -> None:
    """Until every worker has opened its session (it handles SIGTERM from then on)."""
    deadline = time.monotonic() + timeout
    mine = {(socket.gethostname(), proc.pid) for proc in workers}
    while not mine <= {(s.host, s.pid) for s in app.store.session_list()}:
        exited = [f"worker-{n}" for n, proc in enumerate(workers, 1) if proc.poll() is not None]
        if exited or time.monotonic() > deadline:
            sys.exit(f"the workers are not all live after {timeout:.0f}s (exited: {exited})")
        time.sleep(0.1)


def stop_workers(workers: list[subprocess.Popen[bytes]]) -> list[int]:
    """SIGTERM each (a graceful stop), then their exit codes."""
    for proc in workers:
        proc.send_signal(signal.SIGTERM)
    return [proc.wait(timeout=60) for proc in workers]


def main(count: int, jobs: int) -> None:
    if not app.url.startswith("postgresql"):
        sys.exit("set PLUNDER_URL=postgresql://... (this example is for PostgreSQL)")
    workers = start_workers(count)
    try:
        wait_live(workers)
        handles = square.enqueue_many([(n,) for n in range(jobs)])  # one transaction
        results = [job.result(timeout=120) for job in handles]
        assert results == [n * n for n in range(jobs)], "a result is wrong"
        ran = collections.Counter(run.worker for job in handles for run in job.runs)
    finally:
        codes = stop_workers(workers)
    print(f"{jobs} jobs done by {len(ran)} workers:", dict(sorted(ran.items())))
    print("workers exited with", codes)


if __name__ == "__main__":
    main(
        int(sys.argv[1]) if len(sys.argv) > 1 else 3,
        int(sys.argv[2]) if len(sys.argv) > 2 else 300,
    )
