"""Tier T1 database scenarios (PLUNDER_CHAOS_T1=1), PostgreSQL only (RELIABILITY.md §5 C):
every connection slot taken while some workers must reconnect (S16); serialization
failures injected at COMMIT, as CockroachDB raises them, at p = 0.2 and then 0.9 (S18);
every component behind pgbouncer in transaction-pooling mode while a worker and the
janitor's holder are killed (S19). Each undoes its fault whatever happens, checks the
invariants and prints one summary line."""

from __future__ import annotations

import os
import pwd
import re
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import ExitStack, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import psycopg
import pytest

from plunder.janitor import LEASE_NAME
from plunder.states import Outcome, Status
from plunder.worker import RECONNECT_CAP
from tests.chaos.checker import DEFAULT, Observation, check
from tests.chaos.harness import Proc, System, Timing, witness
from tests.chaos.prereqs import require
from tests.chaos.test_janitor import _holder
from tests.support import pgcluster

pytestmark = [
    pytest.mark.t1,
    pytest.mark.parametrize("backend", ["postgres"], indirect=True),
]

# -- S16: every connection slot taken ------------------------------------------------------
# superuser_reserved_connections (3) leaves 27 to the application role: room for the six
# workers' budgets (3 each at depth 3, one more for the janitor's lease holder) and the
# harness's own connections, which must still connect once the hog lets go
MAX_CONNECTIONS = 30
APP_ROLE = "plunder_app"  # not a superuser: the reserved slots are not its to take
REFUSED = re.compile(
    r"FATAL:  (sorry, too many clients already|remaining connection slots are reserved)"
)


@pytest.fixture
def small_cluster() -> Iterator[pgcluster.Cluster]:
    """A cluster of this test's own with max_connections = 20 and a database owned by a
    role that is not a superuser."""
    cluster = pgcluster.create({**pgcluster.TEST_SETTINGS, "max_connections": str(MAX_CONNECTIONS)})
    try:
        with psycopg.connect(cluster.url(), autocommit=True) as conn:
            conn.execute(f"CREATE ROLE {APP_ROLE} LOGIN")
            conn.execute(f"CREATE DATABASE chaos OWNER {APP_ROLE}")
        yield cluster
    finally:
        cluster.destroy()


class Hog:
    """Takes every connection slot the application role can get, on a thread, and keeps
    taking the ones that free up until released."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.held: list[psycopg.Connection[Any]] = []
        self.refused = 0  # its own refusals, which the server log counts too
        self.full = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._take, daemon=True)

    def __enter__(self) -> Hog:
        self._thread.start()
        return self

    def _take(self) -> None:
        while not self._stop.is_set():
            try:
                self.held.append(psycopg.connect(self.url, connect_timeout=2))
                continue  # there may be more: no pause
            except psycopg.OperationalError as exc:
                if REFUSED.search(str(exc)):  # 53300, as the server log has it
                    self.refused += 1
                self.full.set()
            self._stop.wait(0.01)

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
        for conn in self.held:
            conn.close()


def test_s16_connection_exhaustion(
    small_cluster: pgcluster.Cluster, tmp_path: Path, backend: str
) -> None:
    """Six workers work; a hog (the same non-superuser role) takes every free slot, and
    three workers lose all their connections while it holds them for 2 x expiry. Those
    three are refused (53300) on every reconnect and must back off without dying; their
    sessions expire and the other three, whose connections (heartbeats included) stay
    open, run their jobs again, fenced. Released, the three claim work again within the
    poll interval plus plunder's reconnect cap."""
    # RELIABILITY §4.1's intervals, but a 10 s expiry: the hold (2 x expiry) then lasts
    # long enough for a reconnect backoff that doubles without a cap to show after it
    timing = Timing(heartbeat=2.0, expiry=10.0, janitor=1.0, poll=1.0)
    hold = 2 * timing.expiry
    url = small_cluster.url("chaos").replace("postgres@", f"{APP_ROLE}@", 1)
    # the harness's own stores take one connection each: the test counts them
    system = System(url, tmp_path, timing, store_options={"pool_size": 1})
    try:
        system.sample(0.25)
        procs = system.workers(6, concurrency=2)
        make = lambda i: witness(queue=f"q{1 + i % 2}", sleep_ms=100 + 30 * (i % 10))  # noqa: E731
        loader = system.load(8, make, 320)
        system.wait(
            lambda: sum(j.status == Status.SUCCEEDED for j in system.jobs()) >= 20,
            what="a baseline of finished jobs",
        )
        lease = system.store.lease_get(LEASE_NAME)
        victims = [p for p in procs if not (lease and lease.holder.startswith(f"{p.name}:"))][:3]
        healthy = [p for p in procs if p not in victims]
        before = {p.name: getattr(system.session_of(p), "id", None) for p in procs}
        with Hog(url) as hog:
            assert hog.full.wait(10), "the hog never filled the free slots"
            cut = _terminate(small_cluster, _backends_of(victims))
            time.sleep(hold)
            held = len(hog.held)
            released = system.store.now()
        # plenty of work, so that each victim finds some as soon as it can claim again
        system.enqueue([witness(sleep_ms=1000) for _ in range(60)])
        loader.join(timeout=60)  # every job enqueued before the end is judged
        system.wait_terminal(timeout=60)
        obs = system.observe()
        report = check(obs, DEFAULT)
        print(report.summary())
        server_log = (small_cluster.root / "server.log").read_text(errors="replace")
        refusals = len(REFUSED.findall(server_log)) - hog.refused  # those plunder met
        back = []
        for victim in victims:
            starts = [
                r.started_at
                for runs in obs.runs.values()
                for r in runs
                if r.pid == victim.pid and r.started_at > released
            ]
            back.append((min(starts) - released).total_seconds() if starts else float("inf"))
        recovery = max(back)
        after = {p.name: getattr(system.session_of(p), "id", None) for p in procs}
        healthy_lost = [
            r
            for runs in obs.runs.values()
            for r in runs
            if r.outcome == Outcome.LOST and r.session_id in {before[p.name] for p in healthy}
        ]
        victims_lost = sum(before[p.name] != after[p.name] for p in victims)
        violations = sum(len(v) for v in report.violations.values())
        rate = refusals / hold / len(victims)
        print(
            f"S16 detail: hog held {held} connections, {cut} victim connections cut; plunder "
            f"refused {refusals} times ({rate:.1f}/s per victim); {victims_lost} of "
            f"{len(victims)} victims lost their session; each back after "
            f"{', '.join(f'{b:.2f}s' for b in back)}; healthy runs lost {len(healthy_lost)}"
        )
        print(
            f"S16 postgres: {len(obs.jobs)} jobs, {refusals} faults injected, "
            f"{violations} invariant violations, recovery {recovery:.2f}s"
        )
        logs = system.logs()
        assert report.ok, report.summary() + logs[-4000:]
        assert refusals >= 1, "plunder never met a refused connection: the window was missed"
        assert all(p.alive for p in procs), "a worker died of connection exhaustion"
        # backing off: a few tries a second (a crash loop or a hot retry makes hundreds)
        assert rate <= 20, f"{rate:.1f} refused connections per second per victim"
        assert not healthy_lost, healthy_lost  # their heartbeats kept their own connection
        assert all(before[p.name] == after[p.name] for p in healthy), (before, after)
        assert victims_lost >= 1, "no victim lost its session: fencing was not exercised"
        assert all(j.status == Status.SUCCEEDED for j in obs.jobs.values()), _unfinished(obs)
        assert recovery <= timing.poll + RECONNECT_CAP + 1.0, back
    finally:
        system.close()


def _unfinished(obs: Observation) -> list[tuple[str, str, Any, list[tuple[int, str]]]]:
    """Jobs that did not succeed, with their runs, for a failure message."""
    return [
        (uid, str(job.status), job.error, [(r.attempt, str(r.outcome)) for r in obs.runs[job.id]])
        for uid, job in obs.jobs.items()
        if job.status != Status.SUCCEEDED
    ][:10]


def _backends_of(procs: list[Proc]) -> str:
    """A pg_stat_activity condition for every connection of these workers."""
    names = [f"plunder:worker:{p.name}" for p in procs]
    return " OR ".join(f"application_name = '{n}' OR application_name LIKE '{n}:%'" for n in names)


def _terminate(cluster: pgcluster.Cluster, where: str) -> int:
    with psycopg.connect(cluster.url("chaos"), autocommit=True) as conn:
        rows = conn.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            f"WHERE pid <> pg_backend_pid() AND ({where})"
        ).fetchall()
    return len(rows)


# -- S18: a deferred constraint trigger that fails COMMIT with SQLSTATE 40001 -----------------
INJECTED = "plunder-chaos 40001"
INJECTOR_TABLES = ("plunder_jobs", "plunder_sessions", "plunder_leases", "chaos_effects")
INJECTOR_DDL = f"""
CREATE TABLE chaos_40001 (p DOUBLE PRECISION NOT NULL);
INSERT INTO chaos_40001 VALUES (0);
CREATE FUNCTION chaos_40001() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    -- one draw per transaction: the first deferred row event decides for all the others
    IF current_setting('chaos.drawn', true) = 'yes' THEN
        RETURN NULL;
    END IF;
    PERFORM set_config('chaos.drawn', 'yes', true);
    IF random() < (SELECT p FROM chaos_40001) THEN
        -- the server log keeps one line per injected failure: the count the test reads
        RAISE EXCEPTION USING ERRCODE = '40001', MESSAGE = format(
            '{INJECTED} db=%s app=%s table=%s at=%s', current_database(),
            current_setting('application_name'), TG_TABLE_NAME,
            extract(epoch FROM clock_timestamp()));
    END IF;
    RETURN NULL;
END $$;
""" + "".join(
    f"CREATE CONSTRAINT TRIGGER chaos_40001 AFTER INSERT OR UPDATE OR DELETE ON {table} "
    "DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION chaos_40001();\n"
    for table in INJECTOR_TABLES
)
INJECTOR_UNDO = "UPDATE chaos_40001 SET p = 0;\n" + "".join(
    f"DROP TRIGGER IF EXISTS chaos_40001 ON {table};\n" for table in INJECTOR_TABLES
)


@dataclass(frozen=True)
class Injected:
    """One failure the injector raised, as the server logged it."""

    app: str
    table: str
    at: float  # database clock, seconds since the epoch


def _sql(url: str, sql: str) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(sql.encode())


def _injected(cluster: pgcluster.Cluster, url: str) -> list[Injected]:
    """Every failure the injector raised in this test's database: the server logs each
    ERROR it sends, so this count does not rely on plunder saying anything."""
    database = urlsplit(url).path.lstrip("/")
    pattern = re.compile(
        rf"ERROR:  {INJECTED} db={re.escape(database)} app=(\S*) table=(\S+) at=([0-9.]+)"
    )
    log = (cluster.root / "server.log").read_text(errors="replace")
    return [Injected(m[1], m[2], float(m[3])) for m in pattern.finditer(log)]


@pytest.fixture
def injector(system: System) -> Iterator[Callable[[float], float]]:
    """The 40001 injector on this test's database. Yields ``set_p(p)``, which returns the
    database time the new probability took effect; the undo (p = 0, triggers dropped) is
    registered before the triggers exist."""

    def set_p(p: float) -> float:
        _sql(system.url, f"UPDATE chaos_40001 SET p = {float(p)}")
        return system.store.now().timestamp()

    with ExitStack() as undo:
        undo.callback(_sql, system.url, INJECTOR_UNDO)
        _sql(system.url, INJECTOR_DDL)
        yield set_p


WORKER_GAVE_UP = ("claim failed", "acknowledgement failed", "acknowledge-and-claim failed")


def test_s18_serialization_failures_at_commit(
    system: System, injector: Callable[[float], float], pg_cluster: pgcluster.Cluster
) -> None:
    """Every transaction plunder runs — enqueue, claim, acknowledge, heartbeat, janitor —
    meets a 40001 at COMMIT with probability 0.2 for 18 s, then 0.9 for 10 s. At 0.2 each
    is retried as a whole and nothing shows: no enqueue gives up, no worker gives up, no
    session is lost. At 0.9 the retry budgets run out: a producer with a 1 s budget gets
    a typed StoreBusy, sessions are lost and fenced. Once the fault lifts, the backlog is
    done within the bound for a lost worker. A task's own transaction cannot be replayed
    by the store: its failed COMMIT fails the attempt, and the job runs again.

    plunder runs at the database's default isolation; here that is SERIALIZABLE (as
    CockroachDB always is), which adds genuine serialization failures of its own."""
    timing, budget = system.timing, 1.0
    server_log = pg_cluster.root / "server.log"
    log_from = server_log.stat().st_size
    database = urlsplit(system.url).path.lstrip("/")
    isolation = "SET default_transaction_isolation = serializable"
    _sql(system.url, f'ALTER DATABASE "{database}" {isolation}')
    system.store.close()  # its next connection, like every process's, is SERIALIZABLE
    workers = system.workers(3, concurrency=4)
    make = lambda i: witness(queue=f"q{1 + i % 2}", sleep_ms=i % 40, max_attempts=10)  # noqa: E731
    calm_from = injector(0.2)
    loader = system.load(
        10, make, 330, busy_total=budget, application_name="plunder:chaos-producer"
    )
    time.sleep(18)
    storm_from, storm_mono = injector(0.9), time.monotonic()
    time.sleep(10)
    lifted, lifted_mono = injector(0.0), time.monotonic()
    loader.join(timeout=60)
    system.wait_terminal(timeout=60)
    obs = system.observe()
    report = check(obs, DEFAULT)
    injected = _injected(pg_cluster, system.url)
    with server_log.open("rb") as log:
        log.seek(log_from)
        genuine = log.read().decode(errors="replace").count("ERROR:  could not serialize access")
    print(report.summary())

    def during(items: list[Injected], start: float, end: float) -> list[Injected]:
        return [i for i in items if start <= i.at < end]

    calm = during(injected, calm_from, storm_from)
    by_role = Counter(_role(i.app, i.table) for i in calm)
    # the window was hit: every kind of transaction met injected failures while p = 0.2
    for role in ("producer", "worker", "heartbeat", "janitor", "task"):
        assert by_role[role] >= 1, f"no injected failure hit the {role}: {by_role}"
    # ... and plunder retried them: no enqueue gave up before the storm, no worker gave up
    enqueues = [op for op in obs.history if op.op == "enqueue"]
    gave_up = [op for op in enqueues if op.type == "info"]
    assert all(op.t >= storm_mono for op in gave_up), gave_up
    logs = system.logs()
    assert not [line for line in logs.splitlines() if any(w in line for w in WORKER_GAVE_UP)]
    # no session was lost to a few busy heartbeats in a row (I9 while p = 0.2)
    lost = [
        r
        for runs in obs.runs.values()
        for r in runs
        if r.outcome == Outcome.LOST and r.finished_at and r.finished_at.timestamp() < storm_from
    ]
    assert not lost, lost
    # a task's failed COMMIT reaches it as plunder's typed error, never the driver's
    task_errors = [e["error"] for e in obs.events("commit_error")]
    assert task_errors and all(e.startswith("StoreBusy: ") for e in task_errors), task_errors
    # at p = 0.9 the bounded budgets give up with the typed, retryable error
    assert gave_up, "no enqueue gave up during the storm: the window was not hit"
    assert all((op.error or "").startswith("StoreBusy: ") for op in gave_up), gave_up
    invoked = {op.uid: op.t for op in enqueues if op.type == "invoke"}
    slowest = max(op.t - invoked[op.uid] for op in gave_up)
    assert slowest <= budget + 1.0, f"an enqueue gave up only after {slowest:.2f}s"
    assert all(storm_mono <= op.t <= lifted_mono + budget + 1.0 for op in gave_up), gave_up
    # recovery: every job that existed when the fault lifted is done within R_worker
    before = [j for j in obs.jobs.values() if j.created_at.timestamp() < lifted]
    done = max(j.finished_at.timestamp() for j in before if j.finished_at is not None)
    recovery = max(0.0, done - lifted)
    storm_lost = sum(r.outcome == Outcome.LOST for runs in obs.runs.values() for r in runs)
    print(
        f"S18 detail: injected while p=0.2 {dict(by_role)}; while p=0.9 "
        f"{len(during(injected, storm_from, lifted))}; {len(task_errors)} task commits "
        f"refused and run again; {len(gave_up)} enqueues gave up (typed, <= {slowest:.2f}s); "
        f"{storm_lost} runs lost with their session while p=0.9; {genuine} genuine "
        "serialization failures besides"
    )
    violations = sum(len(v) for v in report.violations.values())
    print(
        f"S18 postgres: {len(obs.jobs)} jobs, {len(injected)} faults injected, "
        f"{violations} invariant violations, recovery {recovery:.2f}s"
    )
    assert report.ok, report.summary() + logs[-4000:]
    assert all(p.alive for p in workers)
    assert all(j.status == Status.SUCCEEDED for j in obs.jobs.values()), _unfinished(obs)
    assert recovery <= timing.r_worker, recovery


def _role(app: str, table: str) -> str:
    """Which kind of plunder transaction an application name and table point to."""
    if app == "plunder:chaos-producer":
        return "producer"
    if app.endswith(":listen"):
        return "heartbeat"
    if app.endswith(":janitor") or table == "plunder_leases":
        return "janitor"
    if table == "chaos_effects":
        return "task"  # the witness's own transaction: its effects row and its ack
    if app.startswith("plunder:worker:"):
        return "worker"
    return f"other ({app})"


# -- S19: every component through pgbouncer in transaction-pooling mode ------------------------
BOUNCER_POOL = 3  # server connections per database: a small pool


@dataclass(frozen=True)
class Bouncer:
    cluster: pgcluster.Cluster
    port: int
    folder: Path

    def url(self, database: str) -> str:
        return self.cluster.url(database).replace(f":{self.cluster.port}/", f":{self.port}/")

    def log(self) -> str:
        path = self.folder / "pgbouncer.log"
        return path.read_text(errors="replace") if path.exists() else ""


@pytest.fixture
def pgbouncer(pg_cluster: pgcluster.Cluster) -> Iterator[Bouncer]:
    """pgbouncer in transaction-pooling mode in front of the test cluster, on a free
    loopback port, as the cluster's unprivileged OS user, with a folder of its own (that
    user cannot enter the test's); stopped and removed whatever the test did."""
    binary = require("S19", "pgbouncer")["pgbouncer"]
    with ExitStack() as undo:
        folder = Path(tempfile.mkdtemp(prefix="plunder-pgbouncer-"))
        undo.callback(shutil.rmtree, folder, ignore_errors=True)
        bouncer = Bouncer(pg_cluster, pgcluster.free_port(), folder)
        (folder / "users.txt").write_text('"postgres" ""\n')
        (folder / "pgbouncer.ini").write_text(
            f"""[databases]
* = host=127.0.0.1 port={pg_cluster.port}

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = {bouncer.port}
unix_socket_dir =
auth_type = trust
auth_file = {folder / "users.txt"}
pool_mode = transaction
default_pool_size = {BOUNCER_POOL}
max_client_conn = 500
logfile = {folder / "pgbouncer.log"}
pidfile = {folder / "pgbouncer.pid"}
"""
        )
        command = [binary, str(folder / "pgbouncer.ini")]
        if pg_cluster.user:  # pgbouncer will not run as root
            entry = pwd.getpwnam(pg_cluster.user)
            for path in (folder, *folder.iterdir()):
                os.chown(path, entry.pw_uid, entry.pw_gid)
            command = ["runuser", "-u", pg_cluster.user, "--", *command]
        proc = subprocess.Popen(
            command, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, start_new_session=True
        )
        undo.callback(_stop_group, proc)
        deadline = time.monotonic() + 20
        while True:
            try:
                with psycopg.connect(bouncer.url("postgres"), connect_timeout=2):
                    break
            except psycopg.OperationalError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"pgbouncer did not start:\n{bouncer.log()}") from None
                time.sleep(0.05)
        yield bouncer


def _stop_group(proc: subprocess.Popen[bytes]) -> None:
    with suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        with suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)


@pytest.fixture
def bounced(store_url: str, pgbouncer: Bouncer, tmp_path: Path) -> Iterator[System]:
    """A System whose every process — workers, janitors, the producer and the observer —
    reaches PostgreSQL only through pgbouncer."""
    system = System(pgbouncer.url(urlsplit(store_url).path.lstrip("/")), tmp_path)
    try:
        system.sample()
        yield system
    finally:
        system.close()  # before pgbouncer stops (fixtures end in reverse order)


BOUNCER_TROUBLE = ("prepared statement", "unsupported startup parameter", "pooler error")
# the store's one probe per process, whether the server takes startup options (see
# PostgresStore._options_accepted): refused here by design, on a connection of its own
PROBE_REFUSED = ("options=-c statement_timeout=0", "unsupported startup parameter: options")


def _bouncer_trouble(logs: str) -> list[str]:
    return [
        line
        for line in logs.splitlines()
        if any(t in line for t in BOUNCER_TROUBLE) and not any(p in line for p in PROBE_REFUSED)
    ]


def test_s19_pgbouncer_transaction_pooling(bounced: System, pgbouncer: Bouncer) -> None:
    """plunder keeps no state in a database session (no advisory locks, no session SET, no
    server-side prepared statements, LISTEN only as an optimisation), so it works through
    a transaction pooler: by polling, with one janitor at a time, while a worker is killed
    (S01) and the janitor's holder is killed twice (S21)."""
    system = bounced
    timing = system.timing
    janitors = [system.start("janitor") for _ in range(3)]
    victim, *_ = system.workers(3, concurrency=4, extra=["--no-janitor"])
    loader = system.load(
        10,
        lambda i: witness(queue=f"q{1 + i % 2}", sleep_ms=200 + 30 * (i % 10), max_attempts=3),
        250,
    )
    # S01: SIGKILL a worker while it holds claims
    sid = system.session_of(victim).id  # type: ignore[union-attr]
    system.wait(lambda: system.running_on(sid), what="the victim holds claims")
    killed_at = system.kill(victim)
    orphans = system.running_on(sid)
    # S21: SIGKILL the janitor's holder, twice
    takeovers = []
    for _ in range(2):
        lease, holder = _holder(system, janitors)
        killed = time.monotonic()
        system.kill(holder)
        janitors.append(system.start("janitor"))
        new, _ = _holder(system, janitors)
        assert new.term > lease.term and new.holder != lease.holder
        takeovers.append(time.monotonic() - killed)
    loader.join(timeout=60)  # every job enqueued before the end is judged
    system.wait_terminal(timeout=60)
    obs = system.observe()
    report = check(obs, (*DEFAULT, "I10"))
    print(report.summary())
    gaps = []
    for job in orphans:
        runs = obs.runs[job.id]
        assert runs[0].outcome == Outcome.LOST and runs[0].session_id == sid, runs
        gaps.append((runs[1].started_at - killed_at).total_seconds())
    waits = [
        (min(obs.runs[j.id], key=lambda r: r.attempt).started_at - j.created_at).total_seconds()
        for j in obs.jobs.values()
    ]
    logs = system.logs() + pgbouncer.log()
    trouble = _bouncer_trouble(logs)
    workers = [p for p in system.procs if p.role == "worker" and p.alive]  # not the victim
    polling = [p.name for p in workers if "falling back to polling only" in p.output()]
    stray = pgbouncer.log().count("from server when not linked")
    recovery = max([*gaps, *takeovers])
    violations = sum(len(v) for v in report.violations.values())
    print(
        f"S19 detail: {len(orphans)} orphans re-claimed after {max(gaps, default=0):.2f}s, "
        f"janitor takeovers {', '.join(f'{t:.2f}s' for t in takeovers)}, terms "
        f"{sorted({t for _, _, t in obs.leases})}; enqueue->start worst {max(waits):.2f}s; "
        f"{len(polling)} of {len(workers)} workers found LISTEN does not come back and "
        f"poll; {stray} notifications pgbouncer could not deliver"
    )
    print(
        f"S19 postgres: {len(obs.jobs)} jobs, {1 + len(takeovers)} faults injected, "
        f"{violations} invariant violations, recovery {recovery:.2f}s"
    )
    assert report.ok, report.summary() + logs[-4000:]
    assert not trouble, trouble[:10]
    # plunder works here by polling: every worker saw its LISTEN probe fail
    assert len(polling) == len(workers), (polling, [p.name for p in workers])
    assert orphans, "the victim held no claims when it was killed: the window was not hit"
    assert max(gaps) <= timing.r_worker, gaps
    assert max(takeovers) <= timing.r_janitor, takeovers
    assert max(waits) <= timing.poll + 1.0, f"a job waited {max(waits):.2f}s to start"
    assert all(j.status == Status.SUCCEEDED for j in obs.jobs.values()), _unfinished(obs)
