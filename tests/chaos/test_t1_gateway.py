"""Tier T1 chaos through the gateway (PLUNDER_CHAOS_T1=1, root), on both backends: a remote
worker partitioned from its gateway by nftables in a network namespace of its own (G6; the
gateway's T0 scenarios G1-G5 are in tests/gateway/test_chaos.py)."""

from __future__ import annotations

import re
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import ExitStack
from datetime import datetime
from pathlib import Path

import httpx
import pytest

from plunder.states import Outcome, Status
from tests.chaos.checker import check
from tests.chaos.harness import ROOT, Proc, System, Timing, witness
from tests.chaos.netns import Namespace, clear_stale_network, namespace, network_left
from tests.chaos.prereqs import require
from tests.chaos.test_t1_faults import LOG_TIME, working_again
from tests.support.gateway import env_without_database
from tests.support.pgcluster import free_port

pytestmark = pytest.mark.t1

TIMING = Timing(heartbeat=0.25, expiry=2.0, janitor=0.25, poll=0.25)
# no effects table through a gateway (I3): the result is the run's one effect (I4)
INVARIANTS = ("I1", "I2", "I4", "I5", "I6", "I7")
APP = "tests.chaos.remote_witness:app"


@pytest.fixture
def network() -> Iterator[Namespace]:
    """A namespace joined to this machine by a veth pair (see test_t1_faults.namespace),
    gone after the test whatever it did; the leftovers of a crashed run removed first."""
    require("G6", "ip", "nft")
    clear_stale_network()
    with ExitStack() as undo:
        ns = namespace(undo)
        yield ns
    assert not network_left(ns), "a namespace outlived its test"


def healthy(url: str) -> bool:
    try:
        return httpx.get(url + "/v1/health", timeout=1).status_code == 200
    except httpx.TransportError:
        return False


def spawn(system: System, name: str, args: Sequence[str], env: dict[str, str]) -> Proc:
    """A process of the scenario in its own process group, killed by ``system.close()``."""
    log = system.folder / f"{name}.log"
    with log.open("wb") as out:
        popen = subprocess.Popen(
            list(args),
            cwd=ROOT,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
            start_new_session=True,
        )
    proc = Proc(name, name, popen, log)
    system.procs.append(proc)
    return proc


def serve(system: System, host: str) -> str:
    """``plunder serve`` on ``host`` (its janitor at the scenario's intervals); its URL."""
    port = free_port()
    env = {
        **system.env,
        "PLUNDER_JANITOR_INTERVAL": str(system.timing.janitor),
        "PLUNDER_POLL_INTERVAL": str(system.timing.poll),
    }
    args = [sys.executable, "-m", "plunder", "--db", system.url, "serve", "--host", host]
    proc = spawn(system, "gateway", [*args, "--port", str(port)], env)
    url = f"http://{host}:{port}"
    system.wait(lambda: healthy(url) or not proc.alive, what="the gateway's health check")
    assert proc.alive, proc.output()
    return url


def remote(
    system: System, name: str, url: str, key: str, concurrency: int, prefix: Sequence[str] = ()
) -> Proc:
    """A remote worker of the witness app: the gateway's URL and a worker key, no
    database URL; ``prefix`` runs it elsewhere (``ip netns exec …``)."""
    env = {**env_without_database(), "PLUNDER_URL": url, "PLUNDER_KEY": key}
    env["CHAOS_DIR"] = str(system.folder)
    timing = system.timing
    args = [*prefix, sys.executable, "-m", "plunder", "worker", "-A", APP, "--name", name]
    args += ["-q", "q1", "-c", str(concurrency), "--heartbeat-interval", str(timing.heartbeat)]
    args += ["--session-expiry", str(timing.expiry), "--poll-interval", str(timing.poll)]
    return spawn(system, name, args, env)


LOSS = re.compile(r"SESSION LOST: stopped \d+ running tasks and discarded (\d+) unacknowledged")


def losses(proc: Proc) -> list[tuple[float, int]]:
    """Each session the worker gave up: when (wall clock), and how many of its results
    were not acknowledged then."""
    out = []
    for line in proc.output().splitlines():
        stamp, found = LOG_TIME.match(line), LOSS.search(line)
        if stamp and found:
            at = datetime.strptime(stamp.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp()
            out.append((at, int(found.group(1))))
    return out


@pytest.mark.needs_root
def test_g6_a_remote_worker_partitioned_from_its_gateway(
    network: Namespace, store_url: str, tmp_path: Path
) -> None:
    """The gateway listens on the host's end of a veth pair; one remote worker runs in the
    namespace and reaches it there, another on the host. Once the first holds 4 claims,
    nftables drops everything in the namespace for 3 session expiries: two of its jobs
    return meanwhile (their results cannot leave), two sleep past the heal. The gateway's
    janitor ends its session, the other worker runs every job again and completes it; the
    cut worker's results are refused, and healed it opens a new session and works on."""
    ns = network
    system = System(store_url, tmp_path, TIMING)
    timing = system.timing
    try:
        system.sample()
        system.faults.callback(ns.heal)
        key = system.store.key_create(role="worker")[1]
        url = serve(system, ns.host_addr)
        cut = remote(system, "cut", url, key, 4, prefix=ns.exec())
        session = system.wait(lambda: system.session_of(cut), what="the cut worker's session")
        go = tmp_path / "go"
        long_ms = int(5 * timing.expiry * 1000)
        system.enqueue([witness(go=str(go), sleep_ms=300, max_attempts=5) for _ in range(2)])
        system.enqueue([witness(sleep_ms=long_ms, max_attempts=5) for _ in range(2)])
        held = system.wait(
            lambda: len(got := system.running_on(session.id)) == 4 and got,
            what="4 claims of the cut worker",
        )
        rescuer = remote(system, "rescuer", url, key, 8)
        system.wait(lambda: system.session_of(rescuer), what="the rescuer's session")

        ns.partition()
        fault, wall_fault = time.monotonic(), time.time()
        fault_db = system.store.now()
        go.touch()  # the two short jobs return now, with the partition in place

        def reclaimed() -> list[float]:
            gaps = []
            for job in held:
                runs = {r.attempt: r for r in system.store.job_runs(job.id)}
                if job.attempt + 1 not in runs:
                    return []
                gaps.append((runs[job.attempt + 1].started_at - fault_db).total_seconds())
            return gaps

        gaps = system.wait(
            reclaimed, timeout=timing.r_worker + 3 * timing.expiry, what="the jobs claimed again"
        )
        time.sleep(max(0.0, fault + 3 * timing.expiry - time.monotonic()))
        heal_db, wall_heal = system.store.now(), time.time()
        ns.heal()
        recovery = working_again(system, cut, "cut", session, heal_db)
        system.wait_terminal(timeout=60)
        found = system.wait(lambda: losses(cut), timeout=30, what="the session loss")
        assert len(found) == 1, f"the cut worker lost {len(found)} sessions: {found}"
        loss = found[0]
        obs = system.observe()
        report = check(obs, INVARIANTS)
        print(report.summary())
        # the short jobs returned in the partition: no result of theirs was accepted
        late = {
            (e["job"], e["attempt"])
            for e in obs.events("return")
            if e["pid"] == cut.pid and wall_fault <= e["wall"] <= wall_heal
        }
        final = {job.id: job for job in system.jobs()}
        runs = {job.id: {r.attempt: r for r in obs.runs[job.id]} for job in held}
        print(
            f"G6 {system.backend}: {len(obs.jobs)} jobs, 1 partition, "
            f"{sum(len(v) for v in report.violations.values())} invariant violations, "
            f"claimed again after {min(gaps):.2f}-{max(gaps):.2f}s, new session "
            f"{recovery:.2f}s after the heal, {len(late)} results returned in the partition, "
            f"{loss[1]} unacknowledged results dropped {loss[0] - wall_fault:.2f}s into the cut"
        )
        assert all(j.status is Status.SUCCEEDED for j in final.values())
        assert len(late) == 2 and late <= {(job.id, job.attempt) for job in held}, late
        for job in held:  # lost with the session, then run and completed by the rescuer
            assert final[job.id].attempt == job.attempt + 1, runs[job.id]
            assert runs[job.id][job.attempt].outcome == Outcome.LOST, runs[job.id]
            assert runs[job.id][job.attempt + 1].worker == "rescuer", runs[job.id]
        # the worker judged its session lost within the cut (its turns in flight cut with
        # it) and dropped the results it held: none was acknowledged (the checker's I4)
        assert wall_fault < loss[0] and loss[1] >= 1, loss
        assert max(gaps) <= timing.r_worker, gaps
        assert recovery <= timing.r_worker, recovery
        assert cut.alive and rescuer.alive, system.logs()[-5000:]
        assert "Traceback" not in system.logs(), system.logs()[-5000:]
        assert report.ok, report.summary() + system.logs()[-5000:]
    finally:
        system.close()
