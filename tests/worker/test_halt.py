"""A worker told to stop at once ends within moments whatever its main thread waits for: here
an acknowledgement held up by a row lock that another connection keeps, while the halt
comes. Its results are not written, and its jobs stay claimed by its session, to be
rescued once it expires. PostgreSQL: a call there waits on a socket, which can be cut. A
halt ends the process only where a signal began the stop."""

from __future__ import annotations

import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psycopg
import pytest

from plunder.model import JobSpec
from plunder.states import Status
from plunder.store import Store
from plunder.worker import Worker, WorkerOptions
from tests.chaos.chaosproxy import ChaosProxy
from tests.support import procs
from tests.worker import tasks
from tests.worker.conftest import EXPIRY, Workers, wait_for

# the worker's calls are cut after two expiries (20 s): only the halt can end one sooner
SLOW = ["--session-expiry", "10", "--heartbeat-interval", "0.5"]
HALTED_WITHIN = 3.0  # seconds; a halt takes ~0.1 s, the rest is a loaded machine's margin


# a call on SQLite waits on a local file lock, which no cut can end
POSTGRES = pytest.mark.parametrize("backend", ["postgres"])


@contextmanager
def rows_locked(url: str, job_ids: list[int]) -> Iterator[psycopg.Connection]:
    """The jobs' rows locked by another connection until the block ends."""
    with psycopg.connect(url) as blocker:
        blocker.execute("SELECT 1 FROM plunder_jobs WHERE id = ANY(%s) FOR UPDATE", (job_ids,))
        yield blocker
        blocker.rollback()


def halted_in_time(
    proc: subprocess.Popen[bytes], log: Path, since: float, within: float = HALTED_WITHIN
) -> None:
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        output = procs.stacks(proc, log)
        raise AssertionError(f"no exit 10 s after the signal:\n{output}") from None
    took = time.monotonic() - since
    assert took < within, f"exited {took:.1f}s after the signal"
    assert "stopped at once" in log.read_text(errors="replace")


def lock_waits(conn: psycopg.Connection) -> int:
    """Statements of other connections waiting on a lock in this database."""
    row = conn.execute(
        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
        " AND wait_event_type = 'Lock' AND pid <> pg_backend_pid()"
    ).fetchone()
    return int(row[0]) if row else 0


@POSTGRES
def test_a_second_signal_ends_a_worker_whose_acknowledgement_waits_on_a_lock(
    store_url: str, store: Store, workers: Workers
) -> None:
    proc = workers.start("-c", "2", "--grace", "60", *SLOW, name="held")
    wait_for(lambda: any(s.pid == proc.pid for s in store.session_list()), what="a session")
    jobs = store.job_enqueue_many([JobSpec("sleepy", [1.0]) for _ in range(2)])
    wait_for(
        lambda: all(store.job_get(j.id).status == Status.RUNNING for j in jobs),
        what="both jobs running",
    )
    with rows_locked(store_url, [j.id for j in jobs]) as blocker:
        proc.send_signal(signal.SIGTERM)  # graceful: the jobs end within a second
        wait_for(lambda: lock_waits(blocker), what="the acknowledgement waiting on the lock")
        halted = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        halted_in_time(proc, workers.path(0), halted)
    for job in jobs:  # no result written: the session, left to expire, still claims them
        assert store.job_get(job.id).status == Status.RUNNING
    assert any(s.pid == proc.pid for s in store.session_list())


@POSTGRES
def test_stop_at_once_ends_run_while_its_acknowledgement_waits_on_a_lock(
    store_url: str, store: Store
) -> None:
    tasks.app.configure(
        url=store_url, session_expiry=10.0, heartbeat_interval=0.5, poll_interval=0.05
    )
    worker = Worker(tasks.app, WorkerOptions(concurrency=2, grace=60))
    errors: list[BaseException] = []

    def run() -> None:
        try:
            worker.run(install_signals=False)
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    try:
        jobs = store.job_enqueue_many([JobSpec("sleepy", [1.0]) for _ in range(2)])
        wait_for(
            lambda: all(store.job_get(j.id).status == Status.RUNNING for j in jobs),
            what="both jobs running",
        )
        with rows_locked(store_url, [j.id for j in jobs]) as blocker:
            wait_for(lambda: lock_waits(blocker), what="the acknowledgement waiting on the lock")
            halted = time.monotonic()
            worker.stop(graceful=False)
            thread.join(timeout=10)
            took = time.monotonic() - halted
            assert not thread.is_alive(), "run() still runs 10 s after stop(graceful=False)"
            assert took < HALTED_WITHIN, f"run() returned {took:.1f}s after the halt"
        assert errors == []
        time.sleep(0.5)  # anything still on its way would land now
        for job in jobs:
            assert store.job_get(job.id).status == Status.RUNNING
        assert worker.session is not None
        assert worker.session.id in {s.id for s in store.session_list()}  # left to expire
    finally:
        worker.stop(graceful=False)
        thread.join(timeout=10)
        tasks.app.close()


@POSTGRES
def test_a_second_signal_ends_a_worker_that_waits_for_a_connection(
    store_url: str, store: Store, tmp_path: Path
) -> None:
    """No cut ends a wait for a pooled connection to a database that refuses every one;
    the process ends all the same."""
    host, port = store_url.split("@", 1)[1].split("/", 1)[0].rsplit(":", 1)
    with ChaosProxy(host, int(port)) as proxy:
        group = Workers(proxy.url_for(store_url), tmp_path)
        try:
            proc = group.start("-c", "2", *SLOW, name="refused")
            wait_for(lambda: any(s.pid == proc.pid for s in store.session_list()), what="a session")
            proxy.mode = "reset"  # every connection, and every new one, reset at once
            wait_for(lambda: "database slow or unreachable" in group.log(0), what="the reset seen")
            proc.send_signal(signal.SIGTERM)  # graceful: its calls wait for a connection
            time.sleep(0.3)
            assert proc.poll() is None
            halted = time.monotonic()
            proc.send_signal(signal.SIGTERM)
            halted_in_time(proc, group.path(0), halted)
        finally:
            group.stop_all()


@POSTGRES
def test_a_stop_ends_within_its_call_timeout_when_the_database_refuses_connections(
    store_url: str, store: Store, tmp_path: Path
) -> None:
    """Graceful, but nothing to wait for: the results and the session close cannot be
    written anyway, and the session expires."""
    host, port = store_url.split("@", 1)[1].split("/", 1)[0].rsplit(":", 1)
    call_timeout = 2 * EXPIRY  # the FAST intervals' (config.WorkerDeadlines)
    with ChaosProxy(host, int(port)) as proxy:
        group = Workers(proxy.url_for(store_url), tmp_path)
        try:
            proc = group.start("-c", "2", name="unreachable")
            wait_for(lambda: any(s.pid == proc.pid for s in store.session_list()), what="a session")
            proxy.mode = "reset"
            wait_for(lambda: "database slow or unreachable" in group.log(0), what="the reset seen")
            stopped = time.monotonic()
            proc.send_signal(signal.SIGTERM)
            halted_in_time(proc, group.path(0), stopped, within=call_timeout + HALTED_WITHIN)
        finally:
            group.stop_all()


def test_stop_at_once_never_ends_the_process_that_called_run(store_url: str) -> None:
    """Only a stop a signal began may end the process: this one returns from run()."""
    tasks.app.configure(url=store_url, session_expiry=3.0, heartbeat_interval=0.1)
    worker = Worker(tasks.app, WorkerOptions(concurrency=1))
    saved = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}

    def halt_once_open() -> None:
        wait_for(lambda: worker.session, what="a session")
        worker.stop(graceful=False)

    stopper = threading.Thread(target=halt_once_open, daemon=True)
    stopper.start()
    try:
        worker.run()  # on the main thread, with the signal handlers, as a script would
    finally:
        for sig, handler in saved.items():
            signal.signal(sig, handler)
        tasks.app.close()
    stopper.join(timeout=5)
    assert worker._halt.is_set() and worker.session is not None
