"""The sample Django project (examples/django_shop) driven as its users run it: manage.py
subprocesses on a real database, and the kill test shared by plunder's backend and the
reference database backend (``python -m tests.integrations.shop URL [reference]`` prints
the figures)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
SHOP = ROOT / "examples" / "django_shop"
REFERENCE_TABLE = "django_tasks_database_dbtaskresult"


def shop_env(url: str, *, reference: bool = False, **extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "src"), str(SHOP), str(ROOT)])
    env["SHOP_DATABASE_URL"] = url
    env["SHOP_TASKS"] = "reference" if reference else "plunder"
    env.update(extra)
    return env


def manage(env: dict[str, str], *args: str, timeout: float = 120) -> str:
    done = subprocess.run(
        [sys.executable, "manage.py", *args],
        cwd=SHOP,
        env=env,
        capture_output=True,
        check=False,
        text=True,
        timeout=timeout,
    )
    if done.returncode != 0:
        raise RuntimeError(f"manage.py {' '.join(args)} failed:\n{done.stdout}\n{done.stderr}")
    return done.stdout


def start(env: dict[str, str], *args: str, log: Path) -> subprocess.Popen[bytes]:
    with log.open("ab") as out:
        return subprocess.Popen(
            [sys.executable, "manage.py", *args], cwd=SHOP, env=env, stdout=out, stderr=out
        )


def wait_for(check: Any, limit: float, what: str, step: float = 0.05) -> float:
    """Seconds until ``check()`` is true (polled), AssertionError after ``limit``."""
    began = time.monotonic()
    while not check():
        if time.monotonic() - began > limit:
            raise AssertionError(f"{what}: not after {limit}s")
        time.sleep(step)
    return time.monotonic() - began


def enqueue(env: dict[str, str], code: str) -> str:
    """Run ``code`` (which sets ``result``) in manage.py shell; the result id."""
    out = manage(env, "shell", "-c", f"{code}\nprint('ID', result.id)")
    return next(line.split()[1] for line in out.splitlines() if line.startswith("ID "))


def job_state(url: str, result_id: str, *, reference: bool) -> tuple[str, int]:
    """(status, how many tasks are running) as the database says, read directly."""
    if reference:
        status_sql = f"SELECT status FROM {REFERENCE_TABLE} WHERE id = %s"
        running_sql = f"SELECT count(*) FROM {REFERENCE_TABLE} WHERE status = 'RUNNING'"
        key: Any = result_id.replace("-", "") if url.startswith("sqlite") else result_id
    else:
        status_sql = "SELECT status FROM plunder_jobs WHERE id = %s"
        running_sql = "SELECT count(*) FROM plunder_jobs WHERE status = 'running'"
        key = int(result_id)
    if url.startswith("sqlite:///"):
        import sqlite3
        from contextlib import closing

        # closing(): sqlite3's own context manager ends the transaction, not the connection
        with closing(sqlite3.connect(url.removeprefix("sqlite:///"))) as conn:
            row = conn.execute(status_sql.replace("%s", "?"), (key,)).fetchone()
            running = conn.execute(running_sql).fetchone()[0]
    else:
        import psycopg

        with psycopg.connect(url) as conn:
            row = conn.execute(status_sql, (key,)).fetchone()
            running = conn.execute(running_sql).fetchone()[0]  # type: ignore[index]
    return (str(row[0]) if row else "missing"), int(running)


@dataclass
class KillResult:
    finished: bool
    status: str
    seconds: float  # from the SIGKILL to the end (or to the give-up)
    running_left: int  # tasks the database still says are running then
    starts: int  # how often the task started (marker files)


def kill_test(
    url: str, workdir: Path, *, reference: bool = False, expiry: float = 2.0, limit: float = 30.0
) -> KillResult:
    """Worker A starts a slow task and is SIGKILLed mid-task; worker B (started before the
    kill) should finish it. Measures the time from the kill to the task's end."""
    env = shop_env(url, reference=reference, PLUNDER_SESSION_EXPIRY=str(expiry))
    manage(env, "migrate", "--verbosity", "0")
    marker = workdir / "pack"
    result_id = enqueue(
        env, f"from orders.tasks import pack\nresult = pack.enqueue(7, marker={str(marker)!r})"
    )
    if reference:
        command = ["db_worker", "--queue-name", "*", "--no-reload", "--no-startup-delay"]
        command += ["--interval", "0.1"]
    else:
        command = ["plunder_worker", "-c", "1"]
    log = workdir / "workers.log"
    a = start({**env, "SHOP_PACK_SECONDS": "300"}, *command, log=log)
    b: subprocess.Popen[bytes] | None = None
    try:
        wait_for(lambda: Path(f"{marker}.{a.pid}").exists(), 60, "worker A started the task")
        b = start({**env, "SHOP_PACK_SECONDS": "0.2"}, *command, log=log)
        ready = "session" if not reference else "Starting worker"
        wait_for(lambda: log.read_text().count(ready) >= 2, 60, "worker B is up")
        a.send_signal(signal.SIGKILL)
        a.wait(30)
        killed = time.monotonic()
        finished = False
        status, running = job_state(url, result_id, reference=reference)
        while time.monotonic() - killed < limit:
            status, running = job_state(url, result_id, reference=reference)
            if status.lower() in ("succeeded", "successful", "failed", "timed_out"):
                finished = True
                break
            time.sleep(0.05)
        seconds = time.monotonic() - killed
        starts = len(list(workdir.glob("pack.*")))
        return KillResult(finished, status, seconds, running, starts)
    finally:
        for process in (a, b):
            if process is not None and process.poll() is None:
                process.send_signal(signal.SIGTERM)
                try:
                    process.wait(30)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait()


def compare(plunder_runs: int, reference_runs: int, limit: float = 60.0) -> None:
    """The kill test, for plunder and the reference backend on SQLite and PostgreSQL (a
    cluster of its own): one JSON line per run."""
    import tempfile

    import psycopg

    from tests.support import pgcluster

    cluster = pgcluster.create(pgcluster.TEST_SETTINGS)
    try:
        for kind, runs in (("plunder", plunder_runs), ("reference", reference_runs)):
            for backend in ("sqlite", "postgres"):
                for run in range(runs):
                    with tempfile.TemporaryDirectory() as tmp:
                        url = f"sqlite:///{tmp}/shop.db"
                        if backend == "postgres":
                            name = f"kill_{kind}_{run}"
                            with psycopg.connect(cluster.url(), autocommit=True) as conn:
                                conn.execute(f'CREATE DATABASE "{name}"')
                            url = cluster.url(name)
                        outcome = kill_test(
                            url, Path(tmp), reference=kind == "reference", limit=limit
                        )
                        line = {"kind": kind, "backend": backend, "run": run, **vars(outcome)}
                        print(json.dumps(line), flush=True)
    finally:
        cluster.destroy()


if __name__ == "__main__":  # python3 -m tests.integrations.shop PLUNDER_RUNS REFERENCE_RUNS
    compare(int(sys.argv[1]), int(sys.argv[2]))
