"""Partitioned queues with real worker processes: the live workers divide the partitions,
each claims its own first, an idle one steals from the others, and the partitions of an
owner killed with SIGKILL are stolen at once and assigned anew once its session expires
(plunder.store.partitions, plunder.ownership)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from collections.abc import Sequence

import plunder
from plunder.model import JobSpec
from plunder.states import Status
from plunder.store import Store
from plunder.store.partitions import partition_of
from tests.worker.conftest import JANITOR, ROOT, Workers, session_of, wait_for

PARTITIONS = 4


def keys_of(partition: int, count: int) -> list[str]:
    """``count`` partition keys that hash to ``partition``."""
    found = (f"key-{i}" for i in range(100_000))
    return [k for k in found if partition_of(k, PARTITIONS) == partition][:count]


def owned(store: Store, session_id: str) -> tuple[int, ...]:
    """What the session owns of queue "parts", as its heartbeat hears it."""
    found = store.session_heartbeat(session_id).partitions or ()
    return next((p.owned for p in found if p.queue == "parts"), ())


def start(store: Store, workers: Workers, count: int, *extra: str) -> list[str]:
    procs = [workers.start("-q", "parts", *extra) for _ in range(count)]
    return [str(wait_for(lambda p=p: session_of(store, p.pid), what="a session")) for p in procs]


def ran_by(store: Store, job_id: int) -> str:
    """The session of the job's last run."""
    return store.job_runs(job_id)[-1].session_id


def divided(store: Store, sessions: Sequence[str]) -> dict[str, tuple[int, ...]]:
    """Wait until the sessions own every partition between them, as many each; who owns
    which."""

    def look() -> dict[str, tuple[int, ...]] | None:
        found = {s: owned(store, s) for s in sessions}
        every = sorted(p for parts in found.values() for p in parts)
        even = all(len(parts) == PARTITIONS // len(sessions) for parts in found.values())
        return found if even and every == list(range(PARTITIONS)) else None

    result = wait_for(look, what="the partitions divided among the workers")
    assert isinstance(result, dict)
    # and each worker heard it: a heartbeat of its own since, and one more, which its
    # heartbeat thread sends only once it has taken in the answer to the first
    now = store.now()
    for what in ("a heartbeat of each worker", "a second heartbeat of each worker"):
        wait_for(
            lambda now=now: all(
                s.heartbeat_at > now for s in store.session_list() if s.id in sessions
            ),
            what=what,
        )
        now = max(s.heartbeat_at for s in store.session_list() if s.id in sessions)
    return result


def test_workers_divide_the_partitions_and_claim_their_own_first(
    store: Store, workers: Workers
) -> None:
    store.partition_declare("parts", PARTITIONS)
    sessions = start(store, workers, 2, "-c", "1")
    owners = divided(store, sessions)  # balanced, disjoint
    owner_of = {p: s for s, parts in owners.items() for p in parts}
    shown = subprocess.run(
        [sys.executable, "-m", "plunder", "--db", workers.url, "partitions", "--json"],
        check=True, capture_output=True, text=True, timeout=60, cwd=ROOT,
    )  # fmt: skip
    (listed,) = json.loads(shown.stdout)
    assert listed["owners"] == [owner_of[p] for p in range(PARTITIONS)]
    specs = [
        JobSpec("sleepy", [0.05], queue="parts", partition_key=key)
        for p in range(PARTITIONS)
        for key in keys_of(p, 5)
    ]
    jobs = store.job_enqueue_many(specs)
    ids = [j.id for j in jobs]
    wait_for(
        lambda: all(store.job_get(i).status == Status.SUCCEEDED for i in ids),
        what="every job",
    )
    done = [store.job_get(i) for i in ids]
    for session in sessions:
        mine = [j for j in done if ran_by(store, j.id) == session]
        ran = sorted(mine, key=lambda j: j.started_at or j.created_at)
        # each has ten of its own: its first runs are of its own partitions. The very first
        # may be another's: an idle worker whose claim of its own partitions ran just
        # before the enqueue committed steals with the claim that follows it (it was idle)
        firsts = [int(j.queue.split("~")[1]) for j in ran[:5]]
        assert all(owner_of[p] == session for p in firsts[1:]), (session[:8], firsts, owners)


def test_an_idle_worker_steals_from_a_busy_owner(store: Store, workers: Workers) -> None:
    store.partition_declare("parts", PARTITIONS)
    sessions = start(store, workers, 2, "-c", "2")
    owners = divided(store, sessions)
    busy, idle = sessions
    keys = [k for p in owners[busy] for k in keys_of(p, 4)]
    jobs = store.job_enqueue_many(
        [JobSpec("sleepy", [0.3], queue="parts", partition_key=k) for k in keys]
    )
    wait_for(
        lambda: all(store.job_get(j.id).status == Status.SUCCEEDED for j in jobs),
        what="the busy owner's jobs",
    )
    ran = {ran_by(store, j.id) for j in jobs}
    assert ran == {busy, idle}  # eight jobs of 0.3 s: the owner's two slots had help


def test_an_owner_killed_mid_partition_is_stolen_from_then_replaced(
    store: Store, workers: Workers
) -> None:
    """The chaos case: SIGKILL an owner with jobs of its partitions pending. The survivor
    steals them before the rebalance (they start before the victim's session expires, by
    the database clock), then owns every partition within session expiry + janitor
    interval + 1 s of the kill; no job is claimed twice. The sessions live 4 s here, not
    the suite's 1 s: a steal on a loaded machine may take longer than what is left of a
    1 s session after the kill, and then only the rebalance is seen."""
    expiry = 4.0
    store.partition_declare("parts", PARTITIONS)
    sessions = start(store, workers, 2, "-c", "4", "--session-expiry", str(expiry))
    owners = divided(store, sessions)
    victim, survivor = sessions
    victim_proc = next(p for p in workers.procs if session_of(store, p.pid) == victim)
    victim_proc.send_signal(signal.SIGKILL)
    victim_proc.wait(timeout=10)
    killed = time.monotonic()
    gone = store.session_get(victim)
    assert gone is not None
    keys = [k for p in owners[victim] for k in keys_of(p, 5)]
    jobs = store.job_enqueue_many(
        [JobSpec("add", [1, 2], queue="parts", partition_key=k) for k in keys]
    )
    wait_for(
        lambda: all(store.job_get(j.id).status == Status.SUCCEEDED for j in jobs),
        what="the killed owner's jobs",
    )
    wait_for(lambda: owned(store, survivor) == tuple(range(PARTITIONS)), what="the rebalance")
    took = time.monotonic() - killed
    assert took <= expiry + JANITOR + 1.0, f"owned every partition {took:.2f}s after the kill"
    for job in jobs:
        done = store.job_get(job.id)
        runs = store.job_runs(job.id)
        assert [r.session_id for r in runs] == [survivor] and done.attempt == 1  # once
        assert runs[0].started_at < gone.expires_at, "stolen only after the rebalance"


def test_a_task_declares_its_partitions_before_its_first_enqueue(store_url: str) -> None:
    app = plunder.App(store_url)
    try:

        @app.task(queue="tenants", partitions=8, name="refresh")
        def refresh(tenant: str) -> None: ...

        assert app.store.partition_counts(fresh=0) == {}  # not before it is needed
        first = refresh.options(partition_key="acme").enqueue("acme")
        again = refresh.options(partition_key="acme").enqueue("acme")
        assert first.record.queue == again.record.queue == f"tenants~{partition_of('acme', 8)}"
        assert app.store.partition_counts(fresh=0) == {"tenants": 8}
        app.partition("tenants", 4)
        assert app.store.partition_counts(fresh=0) == {"tenants": 4}
        assert refresh.enqueue("x").record.queue.startswith("tenants~")
    finally:
        app.close()
