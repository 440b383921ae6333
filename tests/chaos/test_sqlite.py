"""S25: many processes on one SQLite file — 4 workers (the janitor runs inside them) and 2
producer processes, while a random worker or producer is SIGKILLed (mid-write included)
and a producer is paused with SIGSTOP. Nothing reaches a caller as "database is locked",
no job is claimed twice, and the file passes ``PRAGMA integrity_check``."""

from __future__ import annotations

import sqlite3
import time

import pytest

from tests.chaos.checker import check
from tests.chaos.harness import System


@pytest.mark.parametrize("backend", ["sqlite"], indirect=True)
def test_s25_sqlite_contention_and_crashes(system: System) -> None:
    workers = system.workers(4, concurrency=4)
    producers = [system.producer(f"p{i}", count=300, rate=30) for i in range(2)]
    killed: list[str] = []
    end = time.monotonic() + 10
    paused = False
    while time.monotonic() < end:
        time.sleep(1.5)
        live = [p for p in system.procs if p.alive and p.role in ("worker", "enqueuer")]
        victim = system.rng.choice(live)
        if victim.role == "enqueuer" and not paused:
            with system.paused(victim, holding_write=True):  # it may hold the write lock
                time.sleep(1.0)
            paused = True
            continue
        system.kill(victim)
        killed.append(victim.name)
        if victim.role == "worker":  # a supervisor starts it again (a producer stays dead)
            system.start(name=f"{victim.name}r", concurrency=4)
    system.wait(lambda: not any(p.alive for p in producers), timeout=30, what="producers")
    system.wait_terminal(timeout=60)
    obs = system.observe()
    errors = [op for op in obs.history if op.type != "ok" and op.error]
    assert not [op for op in errors if "locked" in (op.error or "")], errors[:5]
    path = system.url[len("sqlite:///") :]
    with sqlite3.connect(path) as conn:
        assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    report = check(obs)
    print(report.summary())
    print(f"S25: killed {killed}, paused a producer: {paused}, {len(errors)} errors seen")
    assert report.ok, report.summary()
    assert killed and workers
