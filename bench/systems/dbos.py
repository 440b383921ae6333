"""DBOS Transact durable queues, on PostgreSQL or SQLite (the URL decides).

* Worker: one process = one DBOS executor (``DBOS(config=…)``, ``DBOS.launch()``) with a
  no-op ``@DBOS.workflow`` and one queue registered with ``DBOS.register_queue`` and
  ``polling_interval_sec=POLL`` (default 1.0 s; the queue is found by polling only, so a
  shorter interval is its fastest setting). On PostgreSQL no concurrency limit, so each
  poll claims every runnable workflow. On SQLite ``worker_concurrency=100`` (the claim
  batch plunder's workers and PgQueuer use here): with no limit, an executor starts a
  thread for every workflow it dequeues, and a 20,000-job drain ran for more than 13
  minutes at a load average of about 15,000 without finishing; with the limit it drains
  at a few hundred jobs/s. A per-executor limit counts by executor ID, so each process
  then gets its own (``executor_id``).
* Enqueue: DBOS has no batch enqueue; ``DBOSClient.enqueue`` (the documented way for a
  process that is not itself a worker) once per job, from one thread.

Crash recovery: a DBOS executor recovers the PENDING workflows of its own executor ID
when it (re)starts; running executors do not take over a dead one's workflows (DBOS
Conductor does that, outside this library). The rescue scenario measures what happens
with a second executor running: expect no rescue.

``workflow_status`` keeps ``created_at``, ``started_at_epoch_ms`` and ``updated_at`` in
epoch milliseconds (this machine's clock, written by the DBOS processes).
"""

from __future__ import annotations

import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

from bench.common import (
    BenchError,
    Params,
    gated_drain,
    percentiles,
    spawn,
    stop_all,
    wait_idle,
    wait_until,
)

POLL = float(os.environ.get("BENCH_DBOS_POLL", "0.1"))
SQLITE_WORKER_CONCURRENCY = int(os.environ.get("BENCH_DBOS_SQLITE_WORKER_CONCURRENCY", "100"))
SETTINGS = {
    "polling_interval_sec": POLL,
    "worker_concurrency": f"none on PostgreSQL, {SQLITE_WORKER_CONCURRENCY} on SQLite",
    "enqueue": "DBOSClient.enqueue, one per job",
}
QUEUE = "bench"
HOLD_SECONDS = 120.0


def _sys_url(url: str) -> str:
    if url.startswith("postgresql://"):
        return "postgresql+psycopg://" + url.removeprefix("postgresql://")
    return url


def worker(url: str) -> None:
    from dbos import DBOS

    limit = (SQLITE_WORKER_CONCURRENCY or None) if url.startswith("sqlite:") else None
    config: dict[str, Any] = {
        "name": "bench",
        "system_database_url": _sys_url(url),
        "log_level": "WARNING",
    }
    if limit is not None:
        config["executor_id"] = f"bench-{os.getpid()}"
    DBOS(config=config)  # type: ignore[arg-type]

    @DBOS.workflow(name="noop")
    def noop(i: int) -> int:
        return i

    @DBOS.workflow(name="hold")
    def hold(i: int) -> None:
        time.sleep(HOLD_SECONDS)

    DBOS.launch()
    DBOS.register_queue(QUEUE, polling_interval_sec=POLL, worker_concurrency=limit)
    threading.Event().wait()


class Probe:
    def __init__(self, url: str) -> None:
        if url.startswith("sqlite:"):
            import sqlite3

            self.conn: Any = sqlite3.connect(url.removeprefix("sqlite:///"), isolation_level=None)
            self.table = "workflow_status"
        else:
            import psycopg

            self.conn = psycopg.connect(url, autocommit=True)
            self.table = "dbos.workflow_status"

    def scalar(self, sql: str) -> Any:
        return self.conn.execute(sql.format(t=self.table)).fetchone()[0]

    def rows(self, sql: str) -> list[Any]:
        return list(self.conn.execute(sql.format(t=self.table)).fetchall())


def _client(url: str) -> Any:
    from dbos import DBOSClient

    return DBOSClient(system_database_url=_sys_url(url), application_name="bench")


def _enqueue(client: Any, count: int, workflow: str = "noop") -> None:
    options = {"workflow_name": workflow, "queue_name": QUEUE}
    for i in range(count):
        client.enqueue(options, i)


def _workers(p: Params, count: int) -> list[Any]:
    argv = [sys.executable, "-m", "bench.systems.dbos", "worker", p.url]
    return [spawn(argv, log=Path(p.workdir) / "worker.log") for _ in range(count)]


def _install(p: Params) -> None:
    """Let one executor create the system database and register the queue, then stop."""
    procs = _workers(p, 1)
    try:
        wait_idle(procs, timeout=120)
    finally:
        stop_all(procs)


def enqueue(p: Params) -> dict[str, Any]:
    _install(p)
    client = _client(p.url)
    started = time.perf_counter()
    _enqueue(client, p.jobs)
    elapsed = time.perf_counter() - started
    return {"rate": p.jobs / elapsed, "seconds": elapsed, "jobs": p.jobs}


def drain(p: Params) -> dict[str, Any]:
    _install(p)
    client = _client(p.url)
    probe = Probe(p.url)
    return gated_drain(
        lambda: _workers(p, p.workers),
        lambda: _enqueue(client, p.jobs),
        lambda: probe.scalar(
            "SELECT count(*) FROM {t} WHERE name = 'noop' AND status <> 'SUCCESS'"
        ),
        jobs=p.jobs,
        timeout=p.timeout,
        last_finish=lambda: (
            probe.scalar("SELECT max(updated_at) FROM {t} WHERE name = 'noop'") / 1000
        ),
    ) | {"polling_interval_sec": POLL}


def latency(p: Params) -> dict[str, Any]:
    _install(p)
    client = _client(p.url)
    probe = Probe(p.url)
    procs = _workers(p, 1)
    count = int(p.rate * p.seconds)
    options = {"workflow_name": "noop", "queue_name": QUEUE}
    try:
        wait_idle(procs, timeout=120)
        time.sleep(0.5)
        start = time.monotonic()
        for i in range(count):
            time.sleep(max(0.0, start + i / p.rate - time.monotonic()))
            client.enqueue(options, i)
        wait_until(
            lambda: (
                probe.scalar("SELECT count(*) FROM {t} WHERE name = 'noop' AND status = 'SUCCESS'")
                == count
            ),
            timeout=p.timeout,
            what="the latency jobs",
        )
        rows = probe.rows("SELECT started_at_epoch_ms - created_at FROM {t} WHERE name = 'noop'")
    finally:
        stop_all(procs)
    return percentiles([r[0] / 1000 for r in rows])


def rescue(p: Params) -> dict[str, Any]:
    _install(p)
    client = _client(p.url)
    probe = Probe(p.url)
    victim = _workers(p, 1)
    rescuers: list[Any] = []
    try:
        wait_idle(victim, timeout=120)
        _enqueue(client, p.hold_jobs, "hold")
        wait_until(
            lambda: (
                probe.scalar("SELECT count(*) FROM {t} WHERE name = 'hold' AND status = 'PENDING'")
                == p.hold_jobs
            ),
            timeout=30,
            what="the victim to hold its jobs",
        )
        rescuers = _workers(p, 1)
        wait_idle(rescuers, timeout=120)
        killed_ms = time.time() * 1000
        victim[0].kill()
        victim[0].wait()
        wait_until(
            lambda: (
                probe.scalar(
                    "SELECT count(*) FROM {t} WHERE name = 'hold' "
                    f"AND started_at_epoch_ms > {killed_ms:.0f}"
                )
                == p.hold_jobs
            ),
            timeout=p.rescue_cap,
            interval=0.2,
            what="the rescue (none happens while the dead executor's ID does not restart)",
        )
        restarted = probe.scalar("SELECT max(started_at_epoch_ms) FROM {t} WHERE name = 'hold'")
    except BenchError:
        raise
    finally:
        stop_all(victim + rescuers, grace=0.0)
    return {"seconds": (restarted - killed_ms) / 1000, "jobs": p.hold_jobs}


SCENARIOS = {"enqueue": enqueue, "drain": drain, "latency": latency, "rescue": rescue}

if __name__ == "__main__":
    if sys.argv[1] == "worker":
        worker(sys.argv[2])
