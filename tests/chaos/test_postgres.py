"""PostgreSQL faults (RELIABILITY.md §5 B, C): listener connections killed again and again
(S10a), the server restarted and crashed under load (S13), backends terminated at precise
points — claims, open completion transactions, heartbeats, the janitor (S14) — and a busy
worker's turns sent ahead cut while in flight (S14b)."""

from __future__ import annotations

import statistics
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from tests.chaos.checker import DEFAULT, check
from tests.chaos.harness import System, witness
from tests.support import pgcluster

pytestmark = pytest.mark.parametrize("backend", ["postgres"], indirect=True)

LISTENERS = "application_name LIKE 'plunder:worker:%:listen'"


def terminate(url: str, where: str) -> int:
    """pg_terminate_backend every other backend matching ``where``; how many."""
    with psycopg.connect(url, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            f"WHERE pid <> pg_backend_pid() AND {where}"
        ).fetchall()
    return len(rows)


def count(url: str, where: str) -> int:
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute(f"SELECT count(*) FROM pg_stat_activity WHERE {where}").fetchone()
    return int(row[0]) if row else 0


def _latencies(system: System) -> list[tuple[float, float]]:
    """(created, enqueue->start seconds) of every job's first run, in creation order."""
    out = []
    for job in system.jobs():
        first = min(system.store.job_runs(job.id), key=lambda r: r.attempt)
        out.append(
            (job.created_at.timestamp(), (first.started_at - job.created_at).total_seconds())
        )
    return sorted(out)


def test_s10a_listener_killed_repeatedly(system: System) -> None:
    system.workers(3, concurrency=4)
    system.wait(lambda: count(system.url, LISTENERS) == 3, what="3 LISTEN connections")
    loader = system.load(rate=5, make=lambda i: witness(queue=f"q{1 + i % 2}"), count=40)
    killed = 0
    for _ in range(5):  # the storm: every second, every listener, for 5 s
        time.sleep(1.0)
        killed += terminate(system.url, LISTENERS)
    storm_over = time.time()
    loader.join(timeout=30)
    system.wait_terminal()
    system.wait(lambda: count(system.url, LISTENERS) == 3, timeout=5, what="LISTEN is back")
    latencies = _latencies(system)
    worst = max(lat for _, lat in latencies)
    after = [lat for created, lat in latencies if created > storm_over + 2 * system.timing.poll]
    assert killed >= 10, f"only {killed} listeners terminated: the window was not hit"
    assert worst <= system.timing.poll + 1.0, f"a job waited {worst:.2f}s to start"
    assert after and statistics.median(after) < 0.05, after
    report = check(system.observe())
    print(report.summary())
    print(
        f"S10a: {killed} listeners killed; enqueue->start worst {worst * 1000:.0f} ms, "
        f"median after the storm {statistics.median(after) * 1000:.1f} ms"
    )
    assert report.ok, report.summary()


@pytest.fixture
def own_cluster() -> Iterator[pgcluster.Cluster]:
    """A cluster of this test's own, so it can be restarted and crashed; durable (the
    defaults: fsync and synchronous commit on), since a crash of the fast test settings
    forgets commits the clients were told about, which no queue can survive."""
    cluster = pgcluster.create({})
    try:
        with psycopg.connect(cluster.url(), autocommit=True) as conn:
            conn.execute("CREATE DATABASE chaos")
        yield cluster
    finally:
        cluster.destroy()


def _restart(cluster: pgcluster.Cluster, mode: str) -> float:
    """Stop the server (``fast``: clean; ``immediate``: a crash) and start it again;
    return the monotonic time it accepted connections again."""
    cluster.stop(mode)
    cluster.start()
    return time.monotonic()


def test_s13_restart_and_crash_under_load(
    own_cluster: pgcluster.Cluster, tmp_path: Path, backend: str
) -> None:
    system = System(own_cluster.url("chaos"), tmp_path)
    try:
        system.sample()
        system.workers(3, concurrency=4)
        loader = system.load(rate=40, make=lambda i: witness(sleep_ms=i % 50), count=400)
        time.sleep(3)
        back = [_restart(own_cluster, "fast")]
        time.sleep(3)
        back.append(_restart(own_cluster, "immediate"))
        loader.join(timeout=60)
        system.wait_terminal(timeout=90)
        obs = system.observe()
        finishes = sorted(
            j.finished_at.timestamp() for j in obs.jobs.values() if j.finished_at is not None
        )
        wall_back = [time.time() - (time.monotonic() - t) for t in back]
        recovery = [next(f for f in finishes if f > t) - t for t in wall_back]
        report = check(obs)
        print(report.summary())
        given_back = system.logs().count("never started")
        print(
            f"S13: {len(obs.jobs)} jobs, recovery after restart {recovery[0]:.2f}s, "
            f"after crash {recovery[1]:.2f}s, {given_back} lost claims given back"
        )
        assert report.ok, report.summary() + system.logs()[-5000:]
        assert max(recovery) <= 10.0, recovery
    finally:
        system.close()


def test_s14_backends_terminated_at_precise_points(system: System) -> None:
    system.workers(2, concurrency=4)
    loader = system.load(
        rate=30, make=lambda i: witness(sleep_ms=20, tx_sleep_ms=30, max_attempts=5), count=240
    )
    points = {
        "claim": "application_name LIKE 'plunder:worker:%' AND application_name NOT LIKE "
        "'%:listen' AND application_name NOT LIKE '%:janitor' AND state = 'active'",
        "completion": "application_name LIKE 'plunder:worker:%' AND state = 'idle in transaction'",
        "heartbeat": LISTENERS,
        "janitor": "application_name LIKE 'plunder:worker:%:janitor'",
    }
    kills: Counter[str] = Counter()
    stop = threading.Event()

    def killer() -> None:
        while not stop.wait(0.05):
            point = system.rng.choice(list(points))
            kills[point] += terminate(system.url, points[point])

    def janitor_killer() -> None:
        """The janitor's transactions (on the holder's pooled connections, going by its
        name) last milliseconds every pass: looked for often, a few of them ended."""
        while kills["janitor"] < 3 and not stop.wait(0.002):
            kills["janitor"] += terminate(system.url, points["janitor"])

    threads = [threading.Thread(target=f, daemon=True) for f in (killer, janitor_killer)]
    for thread in threads:
        thread.start()
    try:
        loader.join(timeout=60)
    finally:
        stop.set()
        for thread in threads:
            thread.join()
    system.wait_terminal(timeout=60)
    report = check(system.observe(), DEFAULT)
    print(report.summary())
    print(f"S14: terminated {dict(kills)}")
    assert kills["completion"] >= 1 and kills["heartbeat"] >= 1 and kills["janitor"] >= 1, kills
    assert report.ok, report.summary() + system.logs()[-5000:]


@pytest.mark.alone  # a drain under constant kills: it would stretch its neighbours' timing
def test_s14b_a_busy_workers_turns_cut_in_flight(system: System) -> None:
    """A busy worker keeps a turn in flight on a connection it holds (turns sent ahead),
    committed by the server before the worker reads it. That connection's backend,
    terminated again and again while the worker drains a backlog, costs no job and runs
    none twice: a turn that was cut may or may not have committed, its results are sent
    again and its claims, if it did, are given back once the heartbeat reports them."""
    system.workers(1, concurrency=40)
    busy = (
        "application_name LIKE 'plunder:worker:%' AND application_name NOT LIKE '%:listen' "
        "AND application_name NOT LIKE '%:janitor' AND state = 'active'"
    )
    unfinished = "SELECT count(*) FROM plunder_jobs WHERE status IN ('pending', 'running')"
    kills = cut = rounds = 0
    with psycopg.connect(system.url, autocommit=True) as conn:
        while cut < 3 and rounds < 6:  # backlogs until a few turns in flight were cut
            rounds += 1
            system.enqueue([witness(sleep_ms=1) for _ in range(1000)])  # every claim is full
            while (row := conn.execute(unfinished).fetchone()) and row[0] > 0:
                kills += terminate(system.url, busy)
                time.sleep(0.02)
            logs = system.logs()
            cut = logs.count("a turn failed") + logs.count("could not send a turn")
    system.wait_terminal(timeout=90)
    report = check(system.observe(), DEFAULT)
    print(report.summary())
    print(f"S14b: {rounds} backlogs, {kills} busy worker backends terminated, {cut} turns cut")
    assert cut >= 1, f"{kills} backends terminated in {rounds} backlogs, no turn cut"
    assert report.ok, report.summary() + system.logs()[-5000:]
