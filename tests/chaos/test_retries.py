"""S24(a): retries follow the policy exactly — attempt counts, final statuses, the error
recorded on every failed run, and each delay within the jitter of ``min(cap,
base·2^(attempt-1))`` measured in database time."""

from __future__ import annotations

from plunder.states import Outcome, Status
from tests.chaos.checker import check
from tests.chaos.harness import System, witness

BASE, CAP = 0.2, 1.6


def test_s24a_retry_schedule_and_error_history(system: System) -> None:
    system.workers(2, concurrency=4)
    cases = {0: 1, 1: 2, 3: 4, 99: 4}  # fail_times -> attempts it takes (max_attempts 4)
    jobs = system.enqueue(
        [witness(fail_times=k, max_attempts=4, backoff=BASE) for k in cases for _ in range(3)]
    )
    system.wait_terminal(timeout=60)
    obs = system.observe()
    delays = []
    for job in jobs:
        k = job.kwargs["fail_times"]
        final = system.store.job_get(job.id)
        assert final.attempt == cases[k], (k, final)
        assert final.status == (Status.FAILED if k >= 4 else Status.SUCCEEDED)
        runs = sorted(obs.runs[job.id], key=lambda r: r.attempt)
        for run, nxt in zip(runs, [*runs[1:], None], strict=True):
            if nxt is None:
                break
            assert run.outcome == Outcome.FAILED and run.error is not None
            assert run.error["type"] == "RuntimeError"
            assert f"fails attempt {run.attempt}" in run.error["message"]
            assert "Traceback" in run.error["traceback"]
            assert run.finished_at is not None
            ceiling = min(CAP, BASE * 2 ** (run.attempt - 1))
            waited = (nxt.started_at - run.finished_at).total_seconds()
            delays.append((run.attempt, waited))
            assert ceiling / 2 - 0.01 <= waited <= ceiling + system.timing.poll + 0.5, (
                run.attempt,
                waited,
            )
        if k >= 4:
            assert final.error is not None and final.error["type"] == "RuntimeError"
    report = check(obs)
    print(report.summary())
    print(f"S24a {system.backend}: delays {sorted(delays)}")
    assert report.ok, report.summary()
