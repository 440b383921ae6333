"""Tier T1 network and storage faults (PLUNDER_CHAOS_T1=1): a database peer that hangs
(S09, through :mod:`tests.chaos.chaosproxy`), a worker partitioned from PostgreSQL by
nftables in a network namespace of its own (S08, root), and a full disk under SQLite and
PostgreSQL (S15, root for the tmpfs mounts)."""

from __future__ import annotations

import re
import time
from datetime import datetime
from pathlib import Path

import pytest

from plunder import worker
from plunder.model import Run
from plunder.states import Outcome
from tests.chaos.chaosproxy import ChaosProxy
from tests.chaos.checker import check
from tests.chaos.harness import Proc, System, Timing, witness

pytestmark = pytest.mark.t1

NOTICED = r"slow or unreachable|heartbeat failed|no heartbeat renewal|periodic call .* failed"
LOG_TIME = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) ")


def log_times(proc: Proc, pattern: str) -> list[float]:
    """Wall-clock times (seconds since the epoch) of the process's log lines that match."""
    out = []
    for line in proc.output().splitlines():
        found = LOG_TIME.match(line)
        if found and re.search(pattern, line):
            at = datetime.strptime(found.group(1), "%Y-%m-%d %H:%M:%S,%f")
            out.append(at.timestamp())
    return out


def runs_of(system: System, worker: str) -> list[Run]:
    return [
        run
        for job in system.jobs()
        for run in system.store.job_runs(job.id)
        if run.worker == worker
    ]


def first(items: list[float], after: float) -> float | None:
    return min((t for t in items if t >= after), default=None)


# -- S09: a hung database peer ----------------------------------------------------------


@pytest.fixture
def slow_system(store_url: str, tmp_path: Path) -> System:
    """Half-second heartbeats: a deadline of one heartbeat must not be hit by a busy
    machine (two cores shared with other test runs), only by the fault."""
    return System(store_url, tmp_path, Timing(heartbeat=0.5, expiry=2.5, janitor=0.25, poll=0.25))


@pytest.mark.parametrize("backend", ["postgres"], indirect=True)
def test_s09_hung_database_peer(slow_system: System) -> None:
    """A worker whose database peer hangs (the proxy swallows every byte, the kernel still
    ACKs) notices through its own deadlines, stops, loses its session and claims nothing;
    the other worker rescues its jobs; after healing it opens a new session and works, and
    its tasks' late commits are refused."""
    system = slow_system
    timing = system.timing
    host, port = system.url.split("@", 1)[1].split("/", 1)[0].rsplit(":", 1)
    proxy = ChaosProxy(host, int(port))
    try:
        system.sample()
        system.faults.callback(proxy.close)  # last in, first undone: heal, then close
        proxy.start()
        system.faults.callback(setattr, proxy, "mode", "pass")
        hung = system.start(name="hung", concurrency=4, url=proxy.url_for(system.url))
        session = system.wait(lambda: system.session_of(hung), what="the hung worker's session")
        # its tasks outlive the fault, so that they try to commit after healing
        long_ms = int(5 * timing.expiry * 1000)
        system.enqueue([witness(sleep_ms=long_ms, max_attempts=5) for _ in range(4)])
        held = system.wait(
            lambda: len(got := system.running_on(session.id)) == 4 and got,
            what="4 claims of the hung worker",
        )
        healthy = system.start(name="healthy", concurrency=8)
        system.wait(lambda: system.session_of(healthy), what="the healthy worker's session")

        proxy.mode = "blackhole"
        wall_fault = time.time()
        fault_db = system.store.now()  # after the switch: nothing of the hung worker passes
        system.enqueue([witness(sleep_ms=100) for _ in range(8)])  # the others go on (I13)
        noticed = system.wait(
            lambda: first(log_times(hung, NOTICED), wall_fault),
            timeout=3 * timing.expiry,
            what="the hung worker to notice",
        )
        notice = noticed - wall_fault

        def rescued() -> list[float]:
            """Seconds from the fault until each claim of the hung worker was ended by the
            janitor (database clock), once every one of them is claimed again."""
            ends = []
            for job in held:
                runs = {r.attempt: r for r in system.store.job_runs(job.id)}
                lost = runs[job.attempt]
                if lost.finished_at is None or job.attempt + 1 not in runs:
                    return []
                ends.append((lost.finished_at - fault_db).total_seconds())
            return ends

        released = system.wait(rescued, timeout=3 * timing.expiry, what="the jobs rescued")
        time.sleep(max(0.0, wall_fault + 3 * timing.expiry - time.time()))
        heal_db = system.store.now()
        proxy.mode = "pass"

        def reopened() -> float | None:
            now = system.session_of(hung)
            if now is None or now.id == session.id:
                return None
            return (now.started_at - heal_db).total_seconds()

        recovery = system.wait(reopened, timeout=30, what="a new session of the hung worker")
        system.enqueue([witness(sleep_ms=300) for _ in range(16)])
        system.wait(
            lambda: any(
                r.outcome == Outcome.SUCCEEDED and r.started_at > heal_db
                for r in runs_of(system, "hung")
            ),
            timeout=30,
            what="the hung worker to complete a job after healing",
        )
        system.wait_terminal(timeout=60)
        late = {(job.id, job.attempt) for job in held}
        system.wait(
            lambda: late <= settled(system, hung.pid),
            timeout=30,
            what="the late commits of the hung worker's first tasks",
        )
        obs = system.observe()
        during = [r for r in runs_of(system, "hung") if fault_db < r.started_at < heal_db]
        healthy_during = [
            r
            for r in runs_of(system, "healthy")
            if r.finished_at is not None and fault_db < r.finished_at < heal_db
        ]
        refused = [
            e
            for e in obs.events("commit_stale")
            if e["pid"] == hung.pid and (e["job"], e["attempt"]) in late
        ]
        report = check(obs)
        print(report.summary())
        print(
            f"S09 postgres: {len(obs.jobs)} jobs, 1 faults injected, "
            f"{sum(len(v) for v in report.violations.values())} invariant violations, "
            f"recovery {recovery:.2f}s; noticed after {notice:.2f}s, {len(during)} claims "
            f"while hung, {len(held)} jobs rescued after {min(released):.2f}-"
            f"{max(released):.2f}s, {len(refused)} late commits refused, "
            f"{len(healthy_during)} jobs done by the other worker meanwhile, "
            f"{proxy.stats.dropped} bytes dropped"
        )
        assert proxy.stats.dropped > 0 and proxy.stats.poisoned > 0  # the fault was real
        # the last renewal was sent at most one interval before the fault; the watchdog
        # looks every half interval and speaks after two: 2.5 intervals, plus a margin
        assert notice <= 2.5 * timing.heartbeat + 0.5, notice
        assert during == [], during
        assert max(released) <= timing.r_worker, released
        assert healthy_during, "the other worker did nothing during the fault"
        assert refused, "no late commit of the hung worker's tasks was tried and refused"
        assert recovery <= r_db(timing), recovery
        assert hung.alive
        assert report.ok, report.summary() + system.logs()[-5000:]
    finally:
        system.close()


def settled(system: System, pid: int) -> set[tuple[int, int]]:
    """(job, attempt) of every commit the process tried and got an answer to."""
    ends = ("commit_stale", "commit_ok", "commit_error")
    return {(e["job"], e["attempt"]) for e in system.execs() if e["ev"] in ends and e["pid"] == pid}


def r_db(timing: Timing) -> float:
    """How soon a worker works again once the database is back (RELIABILITY.md §4.1: the
    reconnect backoff cap, a poll interval and 2 s), plus one connect timeout: a connect
    attempt that started while the database was out of reach has to give up first."""
    connect = max(2.0, timing.expiry)
    return worker.RECONNECT_CAP + timing.poll + 2.0 + connect
