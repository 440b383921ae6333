"""The warm process pool: long-lived children run many jobs each; a child past its job's
timeout is killed and replaced; a child that dies takes only its own job with it."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from plunder import JobFailed
from plunder.worker import Worker
from tests.worker import tasks
from tests.worker.conftest import wait_for, worker_in_thread


@pytest.fixture
def worker(store_url: str) -> Iterator[Worker]:
    with worker_in_thread(store_url, concurrency=2) as running:
        yield running


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_many_jobs_reuse_the_same_children(worker: Worker) -> None:
    jobs = tasks.child_pid.enqueue_many([() for _ in range(40)])
    pids = {job.result(timeout=60) for job in jobs}
    assert os.getpid() not in pids
    assert 1 <= len(pids) <= 2  # at most one child per slot, each running many jobs
    assert set(worker._slots._processes.pids()) == pids


def test_a_child_past_its_jobs_timeout_is_killed_and_replaced(
    worker: Worker, tmp_path: Path
) -> None:
    # both children started and running jobs first: the hung job's 0.5 s timeout counts
    # from its claim, and a child still starting on a loaded machine would never run it
    gate = tmp_path / "gate"
    warm = [tasks.child_gate.enqueue(str(tmp_path / f"warm{i}"), str(gate)) for i in range(2)]
    wait_for(lambda: all((tmp_path / f"warm{i}").exists() for i in range(2)), what="children")
    gate.touch()
    assert len({job.result(timeout=20) for job in warm}) == 2
    out = tmp_path / "pid"
    hung = tasks.child_hang.enqueue(str(out))
    with pytest.raises(JobFailed) as caught:
        hung.result(timeout=20)
    assert caught.value.status == "timed_out"
    pid = int(out.read_text())
    wait_for(lambda: not _alive(pid), timeout=5, what="the hung child is dead")
    after = {job.result(timeout=30) for job in tasks.child_pid.enqueue_many([(), ()])}
    assert pid not in after


def test_a_child_killed_mid_job_fails_only_that_job(worker: Worker, tmp_path: Path) -> None:
    gate = tmp_path / "gate"
    victim, neighbour = (
        tasks.child_gate.enqueue(str(tmp_path / name), str(gate)) for name in ("a", "b")
    )
    wait_for(lambda: (tmp_path / "a").exists() and (tmp_path / "b").exists(), what="both run")
    killed = int((tmp_path / "a").read_text())
    os.kill(killed, signal.SIGKILL)
    with pytest.raises(JobFailed) as caught:
        victim.result(timeout=20)
    assert caught.value.error_type == "plunder.ProcessDied"
    gate.touch()
    survivor = neighbour.result(timeout=20)
    assert survivor == int((tmp_path / "b").read_text()) != killed
    chunks = [e.data for e in neighbour.stream(timeout=5) if e.kind == "chunk"]
    assert chunks == [{"pid": survivor}]
    nexts = {job.result(timeout=30) for job in tasks.child_pid.enqueue_many([(), ()])}
    assert killed not in nexts and survivor in nexts
