"""Wake-ups: workers start jobs at once through notifications, fall back to polling when
notifications are off or lost, and a rolled-back enqueue wakes nobody."""

from __future__ import annotations

import statistics
import threading
import time
from pathlib import Path

import pytest

import plunder
from plunder.janitor import LEASE_NAME
from plunder.model import JobSpec
from plunder.states import Status
from plunder.store import Store
from tests.store.helpers import raw_connect
from tests.worker.conftest import Workers, session_of, wait_for


def _start_latencies(store: Store, count: int, gap: float = 0.05) -> list[float]:
    """Enqueue jobs one by one and return enqueue-to-start delays by the database clock."""
    jobs = []
    for i in range(count):
        jobs += store.job_enqueue_many([JobSpec("add", [i, i])])
        time.sleep(gap)
    wait_for(
        lambda: all(store.job_get(j.id).status == Status.SUCCEEDED for j in jobs),
        timeout=30,
        what="jobs done",
    )
    latencies = []
    for job in jobs:
        done = store.job_get(job.id)
        assert done.started_at is not None
        latencies.append((done.started_at - done.created_at).total_seconds())
    return latencies


def test_notifications_start_jobs_long_before_the_poll_interval(
    store: Store, workers: Workers
) -> None:
    proc = workers.start("--poll-interval", "5")
    wait_for(lambda: session_of(store, proc.pid), what="session")
    time.sleep(0.3)  # let the hub settle after its first "re-check everything"
    latencies = _start_latencies(store, 20)
    assert max(latencies) < 1.0, latencies  # polling alone would take up to 5 s
    assert statistics.median(latencies) < 0.1, latencies


def test_without_notifications_polling_alone_picks_jobs_up(store: Store, workers: Workers) -> None:
    proc = workers.start("--no-listen", "--poll-interval", "0.3")
    wait_for(lambda: session_of(store, proc.pid), what="session")
    latencies = _start_latencies(store, 8, gap=0.1)
    assert max(latencies) < 0.3 + 0.5, latencies


def test_a_killed_listener_comes_back_and_polling_covers_the_gap(
    store: Store, store_url: str, workers: Workers
) -> None:
    if not store_url.startswith("postgresql"):
        pytest.skip("LISTEN connections exist on PostgreSQL only")
    proc = workers.start("--poll-interval", "1", name="listener-victim")
    wait_for(lambda: session_of(store, proc.pid), what="session")
    conn = raw_connect(store_url)
    conn.autocommit = True
    listener = (
        "FROM pg_stat_activity WHERE application_name = 'plunder:worker:listener-victim:listen'"
    )
    try:
        # the session is open before the hub has connected its listener
        wait_for(lambda: conn.execute(f"SELECT pid {listener}").fetchall(), what="listener")
        killed = conn.execute(f"SELECT pg_terminate_backend(pid) {listener}").fetchall()
    finally:
        conn.close()
    assert killed == [(True,)]
    gap = _start_latencies(store, 3, gap=0.0)  # right after the kill
    assert max(gap) < 1.0 + 0.5, gap
    time.sleep(1.0)
    again = _start_latencies(store, 10)
    assert statistics.median(again) < 0.1, again  # LISTEN is back
    assert session_of(store, proc.pid) is not None  # the heartbeat reconnected too


def test_a_rolled_back_enqueue_wakes_nobody(store_url: str, tmp_path: Path) -> None:
    app = plunder.App(store_url, poll_interval=5)
    woken = threading.Event()
    try:
        app.hub.on_work(["default"], woken.set)
        time.sleep(0.3)
        woken.clear()  # the hub's first pass re-checks everything once
        conn = raw_connect(store_url)
        try:
            if store_url.startswith("sqlite"):
                conn.execute("BEGIN IMMEDIATE")
            app.store.job_enqueue_many([JobSpec("add", [1, 2])], conn=conn)
            conn.rollback() if not store_url.startswith("sqlite") else conn.execute("ROLLBACK")
        finally:
            conn.close()
        assert not woken.wait(0.5)
        app.store.job_enqueue_many([JobSpec("add", [1, 2])])
        assert woken.wait(2.0)
    finally:
        app.close()


def test_an_enqueue_wakes_the_workers_of_its_queues_however_many(store_url: str) -> None:
    """Notification payloads are limited to 8000 bytes: an enqueue into more queues than
    one payload can name wakes every worker; into a few, only theirs."""
    app = plunder.App(store_url, poll_interval=5)
    mine, other = threading.Event(), threading.Event()
    try:
        app.hub.on_work(["q-mine"], mine.set)
        app.hub.on_work(["q-other"], other.set)
        time.sleep(0.3)
        mine.clear()  # the hub's first pass re-checks everything once
        other.clear()
        app.store.job_enqueue_many([JobSpec("add", [1, 2], queue="q-mine")])
        assert mine.wait(2.0)
        if store_url.startswith("postgresql"):  # SQLite's wake-up names no queue
            assert not other.wait(0.3)
        mine.clear()
        other.clear()
        many = [JobSpec("add", [i, i], queue=f"q-{i:03d}-{'x' * 100}") for i in range(100)]
        app.store.job_enqueue_many(many)
        assert mine.wait(2.0) and other.wait(2.0)
    finally:
        app.close()


@pytest.mark.parametrize(
    ("flags", "budget"),
    [
        ([], 3),
        (["--depth", "1"], 2),
    ],
    ids=["depth-3", "depth-1"],
)
def test_a_worker_keeps_to_its_connection_budget(
    store: Store, store_url: str, workers: Workers, flags: list[str], budget: int
) -> None:
    """Work (and turns sent ahead, above depth 1) and the hub's; the janitor, whose lease
    this worker holds (it is the only one), works on those."""
    if not store_url.startswith("postgresql"):
        pytest.skip("connections are counted on PostgreSQL")
    proc = workers.start("-c", "16", *flags, name="budget")
    wait_for(lambda: session_of(store, proc.pid), what="session")
    jobs = store.job_enqueue_many(
        [JobSpec("streamer", [20]) for _ in range(30)]
        + [JobSpec("add", [i, i]) for i in range(100)]
    )
    conn = raw_connect(store_url)
    conn.autocommit = True
    peak, names = 0, []
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            # not the hub's probe, a connection of a moment after each (re)connect, which a
            # loaded machine can make coincide with the janitor's
            rows = conn.execute(
                "SELECT application_name FROM pg_stat_activity "
                "WHERE application_name LIKE 'plunder:worker:budget%' "
                "AND application_name NOT LIKE '%:probe'"
            ).fetchall()
            if len(rows) > peak:
                peak, names = len(rows), sorted(row[0] for row in rows)
            if all(store.job_get(j.id).status == Status.SUCCEEDED for j in jobs[::10]):
                break
            time.sleep(0.05)
    finally:
        conn.close()
    assert store.lease_get(LEASE_NAME).holder.startswith("budget:")
    assert peak == budget, names


def test_delayed_jobs_and_retries_start_when_due_not_at_the_next_poll(
    store: Store, workers: Workers
) -> None:
    """The worker sleeps until the earliest due job (by the database clock), so a delayed
    job and a retry after its backoff start on time even with a 5 s poll interval."""
    proc = workers.start("--poll-interval", "5")
    wait_for(lambda: session_of(store, proc.pid), what="session")
    delayed = store.job_enqueue_many([JobSpec("add", [i, i], delay=0.5 + i / 4) for i in range(4)])
    (retried,) = store.job_enqueue_many(
        [JobSpec("fails", ["runtime"], max_attempts=2, backoff_base=0.8, backoff_cap=0.8)]
    )
    wait_for(
        lambda: (
            all(store.job_get(j.id).status == Status.SUCCEEDED for j in delayed)
            and store.job_get(retried.id).status == Status.FAILED
        ),
        timeout=30,
        what="delayed jobs done and the retry failed again",
    )
    lateness = []
    for job in delayed:
        done = store.job_get(job.id)
        assert done.started_at is not None
        assert done.started_at >= done.run_at  # never early
        lateness.append((done.started_at - done.run_at).total_seconds())
    first, second = store.job_runs(retried.id)
    assert first.finished_at is not None
    waited = (second.started_at - first.finished_at).total_seconds()
    assert waited >= 0.8 * 0.5, waited  # the backoff (with its jitter) was kept
    lateness.append((second.started_at - store.job_get(retried.id).run_at).total_seconds())
    assert max(lateness) < 0.5, lateness  # the poll interval is 5 s


def test_a_result_can_be_awaited(store: Store, workers: Workers) -> None:
    import asyncio

    proc = workers.start()
    wait_for(lambda: session_of(store, proc.pid), what="session")
    app = plunder.App(store.url)
    try:
        jobs = [
            app.job(j.id)
            for j in store.job_enqueue_many([JobSpec("add", [i, 1]) for i in range(5)])
        ]
        failing = app.job(store.job_enqueue_many([JobSpec("fails", ["key"])])[0].id)

        async def gather() -> list[int]:
            return list(await asyncio.gather(*(j.result_async(timeout=20) for j in jobs)))

        assert asyncio.run(gather()) == [i + 1 for i in range(5)]
        with pytest.raises(plunder.JobFailed, match="KeyError"):
            asyncio.run(failing.result_async(timeout=20))
        with pytest.raises(TimeoutError):
            slow = app.job(store.job_enqueue_many([JobSpec("sleepy", [5])])[0].id)
            asyncio.run(slow.result_async(timeout=0.2))
    finally:
        app.close()
