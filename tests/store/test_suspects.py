"""Suspects: jobs lost with a dead worker. Any of them may be the job that killed it, so a
worker runs at most one at a time, and a poison job cannot take the same neighbours down
with it on every attempt."""

from __future__ import annotations

from plunder.model import SUSPECT_LOSSES, ErrorInfo, Failure, JobSpec
from plunder.states import Outcome, Status
from plunder.store import Store
from tests.store.helpers import claim, complete, enqueue, open_session


def _lose_all(store: Store, count: int, *, times: int = SUSPECT_LOSSES) -> list[int]:
    """``count`` jobs, claimed together by a worker that then dies, ``times`` over; their
    ids."""
    jobs = enqueue(store, *[JobSpec("t", [i], max_attempts=times + 2) for i in range(count)])
    for time in range(times):  # not suspects yet: each dying worker claims them all
        dying = open_session(store, name=f"dying-{time}")
        assert len(claim(store, dying, limit=count)) == count
        store.session_close(dying.id, lost=True)
    return [j.id for j in jobs]


def test_the_jobs_of_a_worker_that_died_once_are_rescued_together(store: Store) -> None:
    lost = _lose_all(store, 3, times=1)
    assert [store.job_get(i).losses for i in lost] == [1, 1, 1]
    assert not any(store.job_get(i).suspect for i in lost)
    worker = open_session(store, name="worker")
    assert [j.id for j in claim(store, worker, limit=10)] == lost


def test_jobs_lost_again_and_again_become_suspects(store: Store) -> None:
    lost = _lose_all(store, 2)
    (fresh,) = enqueue(store, JobSpec("t"))
    assert [store.job_get(i).losses for i in lost] == [SUSPECT_LOSSES] * 2
    assert [store.job_get(i).suspect for i in lost] == [True, True]
    assert store.job_get(fresh.id).suspect is False


def test_a_claim_takes_at_most_one_suspect_and_keeps_claim_order(store: Store) -> None:
    first, second, third = _lose_all(store, 3)
    later_jobs = enqueue(store, JobSpec("t", ["a"]), JobSpec("t", ["b"]))
    worker = open_session(store, name="worker")
    got = claim(store, worker, limit=10)
    # the first suspect in claim order, then the jobs that are not suspects
    assert [j.id for j in got] == [first, *(j.id for j in later_jobs)]
    assert got[0].suspect and not any(j.suspect for j in got[1:])
    assert store.job_get(second).status == Status.PENDING
    assert store.job_get(third).status == Status.PENDING


def test_a_worker_running_a_suspect_is_given_none(store: Store) -> None:
    lost = _lose_all(store, 2)
    (plain,) = enqueue(store, JobSpec("t", ["plain"]))
    worker = open_session(store, name="worker")
    got = store.job_claim_many(
        worker.id, queues=["default"], tasks=["t"], limit=10, take_suspect=False
    )
    assert [j.id for j in got] == [plain.id]
    other = open_session(store, name="other")
    assert [j.id for j in claim(store, other, limit=10)] == [lost[0]]


def test_an_exchange_claims_suspects_by_the_same_rule(store: Store) -> None:
    lost = _lose_all(store, 2)
    worker = open_session(store, name="worker")
    exchange = store.job_exchange_many(
        [], [], session_id=worker.id, queues=["default"], tasks=["t"], limit=5
    )
    assert [j.id for j in exchange.claimed] == [lost[0]]
    again = store.job_exchange_many(
        [], [], session_id=worker.id, queues=["default"], tasks=["t"], limit=5, take_suspect=False
    )
    assert again.claimed == ()


def test_a_suspect_that_runs_to_an_outcome_is_cleared(store: Store) -> None:
    failing, finishing = _lose_all(store, 2)
    worker = open_session(store, name="worker")
    (got,) = claim(store, worker)
    assert got.id == failing
    try:
        raise RuntimeError("an ordinary failure: the worker lived")
    except RuntimeError as exc:
        error = ErrorInfo.from_exception(exc)
    store.job_fail_many([Failure(got.claim, error, retry_delay=0)])
    assert store.job_get(failing).status == Status.PENDING
    assert store.job_get(failing).losses == 0
    # no longer a suspect, it is claimed beside the remaining suspect
    assert {j.id: j.suspect for j in claim(store, worker)} == {failing: False, finishing: True}


def test_an_innocent_job_loses_at_most_two_attempts_to_a_poison_job(store: Store) -> None:
    """A poison job (the first) kills every worker that claims it, each worker claims two
    jobs at a time, and a rescued job keeps its place in the claim order, so without
    suspects the job after the poison one would die beside it on every attempt. The
    poison job ends after its attempts; every innocent job finishes, having lost at most
    SUSPECT_LOSSES attempts."""
    poison, *_ = (j.id for j in enqueue(store, JobSpec("t", ["poison"], max_attempts=4)))
    specs = [JobSpec("t", [i], max_attempts=SUSPECT_LOSSES + 1) for i in range(6)]
    innocent = [j.id for j in enqueue(store, *specs)]
    for round_ in range(30):
        worker = open_session(store, name=f"w{round_}")
        got = claim(store, worker, limit=2)
        if not got:
            break
        if poison in [j.id for j in got]:
            store.session_close(worker.id, lost=True)  # the poison job killed the worker
            continue
        for job in got:
            assert complete(store, job.claim, "ok")
        store.session_close(worker.id)
    assert store.job_get(poison).status == Status.TIMED_OUT
    assert store.job_get(poison).attempt == 4
    for job_id in innocent:
        assert store.job_get(job_id).status == Status.SUCCEEDED
        lost = [r for r in store.job_runs(job_id) if r.outcome == Outcome.LOST]
        assert len(lost) <= SUSPECT_LOSSES
