"""Ordered keys through a worker (plunder.store.ordering): a key's next job is admitted as
soon as the worker has written its current one's result, also when that result committed
in the task's own transaction — not a janitor interval later."""

from __future__ import annotations

import itertools
import threading
import time

from plunder.worker import Worker, WorkerOptions
from tests.worker import tasks
from tests.worker.conftest import wait_for

JANITOR = 60.0  # seconds: no janitor pass admits anything while the test runs


def test_a_key_goes_on_after_a_result_committed_in_the_tasks_transaction(
    store_url: str,
) -> None:
    tasks.app.configure(
        url=store_url, heartbeat_interval=0.1, session_expiry=1.0, poll_interval=0.05,
        janitor_interval=JANITOR,
    )  # fmt: skip
    worker = Worker(tasks.app, WorkerOptions(concurrency=4))
    thread = threading.Thread(target=worker.run, kwargs={"install_signals": False}, daemon=True)
    thread.start()
    try:
        wait_for(lambda: worker.session is not None or not thread.is_alive(), what="a session")
        task = tasks.ordered_in_transaction.options(partition_key="k")
        jobs = task.enqueue_many([(i,) for i in range(5)])
        started = time.monotonic()
        assert [job.result(timeout=30) for job in jobs] == list(range(5))
        took = time.monotonic() - started
        assert took < JANITOR / 2, f"the key waited for the janitor ({took:.1f} s)"
        runs = [job.refresh() for job in jobs]
        for before, after in itertools.pairwise(runs):
            assert before.finished_at is not None and after.started_at is not None
            assert before.finished_at <= after.started_at, "two jobs of the key overlapped"
    finally:
        worker.stop()
        thread.join(timeout=15)
        tasks.app.close()
    assert not thread.is_alive()
