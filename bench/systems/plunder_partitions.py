"""Scenario 12, partition rebalance: plunder with ``workers`` worker processes (8, the real
command line, ``-q parts -c 4``) on a queue of 8 partitions while keyed no-op jobs stream
in (a producer thread, 20 jobs every 50 ms); then, ``cycles`` times, one worker SIGKILLed
and, once the others own every partition, one new worker started.

    8 workers own one partition each ─▶ kill one ─▶ its partitions' jobs stolen ─▶ its
    session expires ─▶ the live ones own every partition ─▶ start one ─▶ it owns its share

* kill→owned: from the kill to the first look (every 20 ms) that finds every partition
  owned by a live worker; expiry→owned: the same from the killed session's ``expires_at``
  (the janitor cannot know of the death sooner; target ≤ janitor interval + 1 s);
* join→owned: from the new session's ``started_at`` to every worker owning one partition;
* stolen: jobs of the killed worker's partitions that started between the kill and the
  rebalance (run by the others, stealing);
* double claims: jobs run again more often than their runs lost with a killed worker
  explain (attempts beyond the first against the runs that ended ``lost``): zero.

Times are the wall clock (time.time()) against the database's stamps, one machine.
"""

from __future__ import annotations

import random
import signal
import statistics
import threading
import time
from typing import Any

from bench.common import BenchError, Params, stop_all, wait_idle, wait_until
from bench.systems.plunder import Probe, _app, _epoch, _workers

PARTITIONS = 8
CONCURRENCY = 4
BATCH, EVERY = 20, 0.05  # the producer: keyed no-ops, 400 a second
OWNERS = "SELECT partition, session_id FROM plunder_partition_owners WHERE queue = 'parts'"
# jobs run again more often than their runs lost with a killed worker explain
RERUN_UNEXPLAINED = (
    "SELECT count(*) FROM plunder_jobs AS j WHERE j.attempt - 1 > (SELECT count(*) "
    "FROM plunder_runs AS r WHERE r.job_id = j.id AND r.outcome = 'lost')"
)


class Fleet:
    """The worker processes and their sessions."""

    def __init__(self, p: Params, app: Any, probe: Probe) -> None:
        self.p, self.app, self.probe = p, app, probe
        self.procs: list[Any] = []
        self.sessions: dict[int, str] = {}  # pid: session id

    def start(self, count: int) -> list[str]:
        extra = {**self.p.extra, "worker_args": ["-q", "parts"]}
        params = Params(**{**self.p.__dict__, "extra": extra})
        procs = _workers(params, count, "bench.systems.plunder_app:app", concurrency=CONCURRENCY)
        self.procs += procs

        def opened() -> bool:
            found = {s.pid: s.id for s in self.app.store.session_list()}
            if not all(p.pid in found for p in procs):
                return False
            self.sessions.update({p.pid: found[p.pid] for p in procs})
            return True

        wait_idle(procs, check=opened, timeout=120)
        return [self.sessions[p.pid] for p in procs]

    def kill_one(self) -> tuple[str, float]:
        victim = self.procs.pop(0)
        session = self.sessions.pop(victim.pid)
        killed = time.time()
        victim.send_signal(signal.SIGKILL)
        victim.wait()
        return session, killed

    def owned_evenly(self) -> bool:
        """Every partition owned by a live worker, none owning more than its share."""
        owners = [str(s) for _, s in self.probe.rows(OWNERS)]
        live = set(self.sessions.values())
        share = -(-PARTITIONS // len(live))
        counts = {s: owners.count(s) for s in live}
        return len(owners) == PARTITIONS and set(owners) <= live and max(counts.values()) <= share


def _produce(app: Any, stop: threading.Event, sent: list[int]) -> None:
    noop = app.registry.get("bench.noop").options(queue="parts")
    while not stop.is_set():
        keys = [str(random.randrange(10_000)) for _ in range(BATCH)]
        app.enqueue_specs([noop.options(partition_key=k).spec((0,)) for k in keys])
        sent[0] += BATCH
        stop.wait(EVERY)


def rebalance(p: Params) -> dict[str, Any]:
    app = _app(p.url)
    app.partition("parts", PARTITIONS)
    probe = Probe(p.url)
    fleet = Fleet(p, app, probe)
    stop, sent = threading.Event(), [0]
    producer = threading.Thread(target=_produce, args=(app, stop, sent), daemon=True)
    events: list[dict[str, float]] = []
    try:
        fleet.start(p.workers)
        wait_until(fleet.owned_evenly, timeout=30, interval=0.02, what="the first division")
        producer.start()
        for _ in range(max(1, int(p.seconds // 3))):
            events.append(_cycle(fleet, probe))
        stop.set()
        producer.join()
        low = "status IN ('pending', 'running')"
        wait_until(
            lambda: probe.scalar(f"SELECT count(*) FROM plunder_jobs WHERE {low}") == 0,
            timeout=p.timeout,
            what="the drain",
        )
        double = probe.scalar(RERUN_UNEXPLAINED)
    finally:
        stop.set()
        stop_all(fleet.procs, grace=2.0)
        probe.close()
        app.close()
    return _summary(events) | {"jobs": sent[0], "double_claims": int(double)}


def _cycle(fleet: Fleet, probe: Probe) -> dict[str, float]:
    before = {int(part): str(s) for part, s in probe.rows(OWNERS)}
    victim, killed = fleet.kill_one()
    expires = _epoch(probe.scalar("SELECT expires_at FROM plunder_sessions WHERE id = %s", victim))
    owned = wait_until(fleet.owned_evenly, timeout=60, interval=0.02, what="the rebalance")
    queues = [f"parts~{part}" for part, s in before.items() if s == victim]
    stolen = _started_between(probe, queues, killed, owned)
    (joined,) = fleet.start(1)
    started = _epoch(probe.scalar("SELECT started_at FROM plunder_sessions WHERE id = %s", joined))
    settled = wait_until(fleet.owned_evenly, timeout=60, interval=0.02, what="the join")
    if expires is None or started is None:
        raise BenchError("a session's times were not found")
    return {
        "kill_owned": owned - killed,
        "expiry_owned": owned - expires,
        "join_owned": settled - started,
        "stolen": float(stolen),
    }


def _started_between(probe: Probe, queues: list[str], start: float, end: float) -> int:
    """Jobs of these queues whose (last) run started between ``start`` and ``end``."""
    if not queues:
        return 0
    marks = ",".join(["%s"] * len(queues))
    found = probe.rows(
        f"SELECT started_at FROM plunder_jobs WHERE queue IN ({marks}) AND started_at IS NOT NULL",
        *queues,
    )
    times = [_epoch(value) for (value,) in found]
    return sum(1 for when in times if when is not None and start <= when <= end)


def _summary(events: list[dict[str, float]]) -> dict[str, float]:
    out: dict[str, float] = {"cycles": float(len(events))}
    for key in ("kill_owned", "expiry_owned", "join_owned"):
        values = [e[key] for e in events]
        out[key] = statistics.median(values)
        out[f"{key}_max"] = max(values)
    out["stolen"] = sum(e["stolen"] for e in events)
    out["seconds"] = out["expiry_owned_max"]
    return out
