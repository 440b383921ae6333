"""The hub thread claims for a worker whose main loop waits idle (plunder.idle): on
PostgreSQL, where turns have a pipe, the enqueue's wake-up claims and starts the job, the
main loop asleep; on SQLite the main loop claims, woken, as before."""

from __future__ import annotations

import time

from tests.worker import tasks
from tests.worker.conftest import wait_for, worker_in_thread

SLOW_POLL = 5.0  # no claim comes from polling within a test's waits


def test_an_idle_worker_starts_each_job_it_hears_of(backend: str, store_url: str) -> None:
    with worker_in_thread(store_url, poll_interval=SLOW_POLL) as worker:
        for i in range(5):
            wait_for(lambda: worker._idle._parked, what="the main loop to wait idle")
            sent = time.monotonic()
            assert tasks.add.enqueue(i, 1).result(timeout=SLOW_POLL / 2) == i + 1
            assert time.monotonic() - sent < SLOW_POLL / 2
        wait_for(lambda: worker.stats["succeeded"] == 5, what="the acknowledgements")
        assert worker.stats["claimed"] == 5
        assert worker._idle.claims >= 5  # each tried for the idle loop (SQLite: more wakes)
        # on PostgreSQL answered there (but where one answer was late: the loop reads it)
        settled = worker._idle.settled
        assert settled >= 3 if backend == "postgres" else settled == 0


def test_a_busy_worker_claims_on_its_main_loop(store_url: str) -> None:
    """With a job running the main loop is not parked: new work wakes it, and it claims
    with its own turn, beside the running job."""
    with worker_in_thread(store_url, concurrency=2, poll_interval=SLOW_POLL) as worker:
        wait_for(lambda: worker._idle._parked, what="the main loop to wait idle")
        long = tasks.sleepy.enqueue(30)
        wait_for(lambda: worker._slots.busy() == 1, what="the long job to start")
        claims = worker._idle.claims
        assert tasks.add.enqueue(2, 3).result(timeout=SLOW_POLL / 2) == 5
        assert worker._idle.claims == claims
        long.cancel()


def test_a_stopping_worker_claims_nothing(store_url: str) -> None:
    """Parked, then told to stop: a wake-up claims nothing, and the job stays pending."""
    with worker_in_thread(store_url, poll_interval=SLOW_POLL) as worker:
        wait_for(lambda: worker._idle._parked, what="the main loop to wait idle")
        worker._stop.set()
        job = tasks.add.enqueue(1, 1)
        time.sleep(0.5)
        assert worker.stats["claimed"] == 0
        assert job.refresh().status == "pending"


def test_a_delayed_job_heard_of_while_idle_starts_when_due(store_url: str) -> None:
    """The claim made for the idle loop finds the job not due yet: the loop, woken, reads
    when it is due and wakes then, not at the next poll."""
    with worker_in_thread(store_url, poll_interval=SLOW_POLL) as worker:
        wait_for(lambda: worker._idle._parked, what="the main loop to wait idle")
        sent = time.monotonic()
        job = tasks.add.options(delay=1.0).enqueue(20, 22)
        assert job.result(timeout=SLOW_POLL / 2) == 42
        assert 0.9 < time.monotonic() - sent < SLOW_POLL / 2
        assert worker._idle.claims >= 1
