"""Workflows run by real worker processes: a diamond whose last job sees its parents'
results, and a worker SIGKILLed while it runs one of the middle jobs."""

from __future__ import annotations

import signal

import plunder
from plunder.states import Outcome, Status
from plunder.store import Store
from tests.support.flows import run_diamond
from tests.worker.conftest import EXPIRY, JANITOR, Workers, session_of, wait_for


def test_a_diamond_run_by_a_worker_gives_d_the_results_of_b_and_c(
    store: Store, store_url: str, workers: Workers
) -> None:
    proc = workers.start("-c", "4")
    wait_for(lambda: session_of(store, proc.pid), what="worker session")
    app = plunder.App(store_url)
    try:
        ids = run_diamond(app, lambda: workers.log(0))
        state = app.workflow(ids[0])
        assert [j.status for j in state.jobs] == [Status.SUCCEEDED] * 4
        assert state.parents(ids[3]) == ids[1:3]
    finally:
        app.close()


def test_a_worker_killed_while_running_c_is_rescued_and_d_runs_once(
    store: Store, store_url: str, workers: Workers
) -> None:
    procs = [workers.start("-c", "4"), workers.start("-c", "4")]
    sessions = [wait_for(lambda p=p: session_of(store, p.pid), what="a session") for p in procs]
    app = plunder.App(store_url)
    try:
        flow = plunder.Flow(app)
        a = flow.add("gather", "a")
        b = flow.add("gather", "b", after=a)
        c = flow.add("sleepy", 3.0, after=a)
        d = flow.add("gather", "d", after=[b, c])
        workflow = flow.enqueue()
        b_id, c_id, d_id = (workflow.job(n).id for n in (b, c, d))
        holder = wait_for(
            lambda: store.job_get(c_id).status == Status.RUNNING and store.job_get(c_id).session_id,
            what="a worker runs C",
        )
        victim = procs[sessions.index(holder)]
        victim.send_signal(signal.SIGKILL)
        victim.wait()
        result = workflow.job(d).result(timeout=EXPIRY + JANITOR + 30)
        assert result[0] == "d" and [pair[0] for pair in result[1]] == [b_id, c_id]
        assert result[1][1][1] == "slept"
        runs = store.job_runs(c_id)
        assert [r.outcome for r in runs] == [Outcome.LOST, Outcome.SUCCEEDED]
        assert runs[1].session_id != holder
        assert len(store.job_runs(d_id)) == 1 and store.job_get(d_id).attempt == 1
    finally:
        app.close()
