"""plunder through its gateway (``plunder serve``): remote workers that hold a worker key
and no database URL, each gateway a process of its own on loopback.

- drain: the jobs enqueued straight into the database (as in plunder_pg's drain), drained
  by remote workers with plunder_pg's worker settings (``-c 300``) through one gateway
  (``drain_1``, ``drain_2``) or through two, one worker each (``drain_2gw``);
- first_line: the producer and the worker both through the gateway, from just before the
  producer's enqueue call to the task's first line;
- sessions: ``sessions`` remote sessions (one process, a thread each, idle: long-polled
  exchanges and heartbeats) held by one gateway: the database connections of the gateway
  and its memory per session.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from bench.common import (
    Params,
    gated_drain,
    percentiles,
    spawn,
    stop_all,
    wait_idle,
    wait_until,
)
from bench.systems.plunder import CONCURRENCY, Probe, _app, _epoch, _sessions

SETTINGS = {
    "worker": "python -m plunder worker -A bench.tasks:app -c 300 --url http://127.0.0.1:PORT "
    "(a worker key; two turns in flight)",
    "gateway": "python -m plunder serve (pool of 8 connections, one listening)",
}


def _gateways(p: Params, count: int) -> list[tuple[subprocess.Popen[bytes], str]]:
    from tests.support.pgcluster import free_port

    started = []
    for _ in range(count):
        port = free_port()
        log = Path(p.workdir) / f"gateway-{port}.log"
        argv = [sys.executable, "-m", "plunder", "--log-level", "WARNING", "--db", p.url,
                "serve", "--port", str(port)]  # fmt: skip
        started.append((spawn(argv, log=log), f"http://127.0.0.1:{port}"))
    for process, url in started:
        wait_until(lambda u=url: _healthy(u), timeout=60, what="a gateway", interval=0.05)
        if process.poll() is not None:
            raise RuntimeError(f"a gateway exited with {process.returncode}")
    return started


def _healthy(url: str) -> bool:
    import httpx

    try:
        return httpx.get(url + "/v1/health", timeout=1).status_code == 200
    except httpx.TransportError:
        return False


def _key(p: Params, role: str) -> str:
    app = _app(p.url)
    try:
        return app.store.key_create(role=role, name="bench")[1]
    finally:
        app.close()


def _remote_workers(
    p: Params, urls: list[str], key: str, app_spec: str = "bench.tasks:app"
) -> list[subprocess.Popen[bytes]]:
    env = {k: v for k, v in os.environ.items() if k != "PLUNDER_URL"}
    env |= {"PLUNDER_KEY": key}
    log = Path(p.workdir) / "worker.log"
    argv = [sys.executable, "-m", "plunder", "--log-level", "WARNING", "worker", "-A",
            app_spec, "-c", str(CONCURRENCY["pg"])]  # fmt: skip
    return [spawn([*argv, "--url", url], env=env, log=log) for url in urls]


def _drain(p: Params, workers: int, gateways: int) -> dict[str, Any]:
    key = _key(p, "worker")
    app = _app(p.url)
    noop = app.registry.get("bench.noop")
    probe = Probe(p.url)
    started = _gateways(p, gateways)
    urls = [started[i % gateways][1] for i in range(workers)]
    low = probe.scalar("SELECT coalesce(max(id), 0) FROM plunder_jobs")
    calls = [(i,) for i in range(p.jobs)]
    try:
        return gated_drain(
            lambda: _remote_workers(p, urls, key),
            lambda: noop.enqueue_many(calls),
            lambda: probe.scalar(
                "SELECT count(*) FROM plunder_jobs WHERE id > %s "
                "AND status IN ('pending', 'running')",
                low,
            ),
            jobs=p.jobs,
            timeout=p.timeout,
            ready=lambda: _sessions(app, workers),
            last_finish=lambda: _epoch(
                probe.scalar("SELECT max(finished_at) FROM plunder_jobs WHERE id > %s", low)
            ),
        ) | {"concurrency": CONCURRENCY["pg"], "gateways": gateways}
    finally:
        stop_all([process for process, _ in started])
        probe.close()
        app.close()


def drain(p: Params) -> dict[str, Any]:
    return _drain(p, p.workers, 1)


def drain_gateways(p: Params) -> dict[str, Any]:
    return _drain(p, p.workers, p.workers)


def first_line(p: Params) -> dict[str, Any]:
    """One idle remote worker; jobs arrive one per enqueue at a steady rate from a
    producer App on the gateway's URL (a producer key)."""
    import plunder

    worker_key, producer_key = _key(p, "worker"), _key(p, "producer")
    (gateway,) = _gateways(p, 1)
    procs = _remote_workers(p, [gateway[1]], worker_key, "bench.systems.plunder_app:app")
    app = _app(p.url)
    # the producer has the task's code, as a user's does: no lookup of its options
    remote = plunder.App(gateway[1], key=producer_key)
    clock = remote.task(name="bench.clock", retries=0)(_clock)

    try:
        wait_idle(procs, check=lambda: _sessions(app, 1))
        time.sleep(0.5)
        sent: list[tuple[float, Any]] = []
        start = time.monotonic()
        for i in range(int(p.rate * p.seconds)):
            time.sleep(max(0.0, start + i / p.rate - time.monotonic()))
            before = time.monotonic()
            sent.append((before, clock.enqueue()))
        began = [(job.result(timeout=p.timeout), before) for before, job in sent]
    finally:
        stop_all(procs)
        stop_all([gateway[0]])
        remote.close()
        app.close()
    return percentiles([ran - before for ran, before in began])


def sessions(p: Params) -> dict[str, Any]:
    """``p.sessions`` idle remote sessions through one gateway: its connections to the
    database (pg_stat_activity) and its memory (RSS) before and with them."""
    from plunder.model import TaskInfo
    from plunder.protocol import ClaimRequest, Hello
    from plunder.store.http import Client, HttpLink

    count = int(p.extra.get("sessions", 200))
    key = _key(p, "worker")
    ((process, url),) = _gateways(p, 1)
    probe = Probe(p.url)
    stop = threading.Event()
    opened: list[str] = []

    def session(i: int) -> None:
        link = HttpLink(Client(url, key))
        task = TaskInfo("bench.noop", "default", "thread", {})
        hello = Hello(f"idle-{i}", "bench", os.getpid(), ("default",), (task,), 5.0, 4)
        current = link.open(hello)
        opened.append(current.id)
        claim = ClaimRequest(("default",), ("bench.noop",), 4, True, 10.0)
        beats = threading.Thread(target=_beat, args=(link, current.id, stop), daemon=True)
        beats.start()
        while not stop.is_set():
            link.exchange(current.id, [], claim)
        link.close(current.id)
        link.close_client()

    try:
        time.sleep(1.0)
        before = _rss(process.pid)
        threads = [threading.Thread(target=session, args=(i,), daemon=True) for i in range(count)]
        for thread in threads:
            thread.start()
        wait_until(lambda: len(opened) == count, timeout=120, what="the sessions")
        time.sleep(3.0)  # every session long-polling, heartbeats going
        with_sessions = _rss(process.pid)
        connections = probe.scalar(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name LIKE 'plunder:gateway%%'"
        )
        live = probe.scalar("SELECT count(*) FROM plunder_sessions WHERE expires_at > now()")
        stop.set()
        for thread in threads:
            thread.join(timeout=30)
    finally:
        stop_all([process])
        probe.close()
    return {
        "sessions": count,
        "live": live,
        "connections": connections,
        "rss_before_mib": before / 2**20,
        "rss_with_mib": with_sessions / 2**20,
        "kib_per_session": (with_sessions - before) / count / 1024,
    }


def _clock() -> float:
    return time.monotonic()  # the worker's bench.systems.plunder_app.clock runs instead


def _beat(link: Any, session_id: str, stop: threading.Event) -> None:
    from plunder.protocol import Beat

    while not stop.wait(1.0):
        link.heartbeat(Beat(session_id))


def _rss(pid: int) -> int:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"no RSS for {pid}")


SCENARIOS = {
    "drain": drain,
    "drain_gateways": drain_gateways,
    "first_line": first_line,
    "sessions": sessions,
}
