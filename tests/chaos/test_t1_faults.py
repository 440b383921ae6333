"""Tier T1 network and storage faults (PLUNDER_CHAOS_T1=1): a database peer that hangs
(S09, through :mod:`tests.chaos.chaosproxy`), a worker partitioned from PostgreSQL by
nftables in a network namespace of its own (S08, root), and a full disk under SQLite and
PostgreSQL (S15, root for the tmpfs mounts)."""

from __future__ import annotations

import base64
import os
import re
import secrets
import sqlite3
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, suppress
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import psycopg
import pytest

from plunder import errors, worker
from plunder.model import Run, Session
from plunder.states import Outcome
from tests.chaos.chaosproxy import ChaosProxy
from tests.chaos.checker import check
from tests.chaos.harness import Proc, System, Timing, witness
from tests.chaos.netns import (
    Namespace,
    alive,
    clear_stale_network,
    must,
    namespace,
    network_left,
    run,
)
from tests.chaos.prereqs import require
from tests.support import pgcluster

pytestmark = pytest.mark.t1

NOTICED = r"slow or unreachable|heartbeat failed|no heartbeat renewal|periodic call .* failed"
LOG_TIME = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) ")


def log_times(proc: Proc, pattern: str) -> list[float]:
    """Wall-clock times (seconds since the epoch) of the process's log lines that match."""
    out = []
    for line in proc.output().splitlines():
        found = LOG_TIME.match(line)
        if found and re.search(pattern, line):
            at = datetime.strptime(found.group(1), "%Y-%m-%d %H:%M:%S,%f")
            out.append(at.timestamp())
    return out


def runs_of(system: System, worker: str) -> list[Run]:
    return [
        run
        for job in system.jobs()
        for run in system.store.job_runs(job.id)
        if run.worker == worker
    ]


def working_again(system: System, proc: Proc, name: str, old: Session, healed: datetime) -> float:
    """Once a cut is healed: seconds from the heal (database clock) to the new session
    ``proc`` (worker ``name``) opens, after which it must complete a job started since."""

    def reopened() -> float | None:
        now = system.session_of(proc)
        if now is None or now.id == old.id:
            return None
        return (now.started_at - healed).total_seconds()

    recovery: float = system.wait(reopened, timeout=30, what="a new session after the heal")
    system.enqueue([witness(sleep_ms=300) for _ in range(16)])
    system.wait(
        lambda: any(
            r.outcome == Outcome.SUCCEEDED and r.started_at > healed for r in runs_of(system, name)
        ),
        timeout=30,
        what=f"worker {name} to complete a job after the heal",
    )
    return recovery


def first(items: list[float], after: float) -> float | None:
    return min((t for t in items if t >= after), default=None)


# -- S09: a hung database peer ----------------------------------------------------------


@pytest.fixture
def slow_system(store_url: str, tmp_path: Path) -> System:
    """Half-second heartbeats: a deadline of one heartbeat must not be hit by a busy
    machine (two cores shared with other test runs), only by the fault."""
    return System(store_url, tmp_path, Timing(heartbeat=0.5, expiry=2.5, janitor=0.25, poll=0.25))


@pytest.mark.parametrize("backend", ["postgres"], indirect=True)
def test_s09_hung_database_peer(slow_system: System) -> None:
    """A worker whose database peer hangs (the proxy swallows every byte, the kernel still
    ACKs) notices through its own deadlines, stops, loses its session and claims nothing;
    the other worker rescues its jobs; after healing it opens a new session and works, and
    its tasks' late commits are refused."""
    system = slow_system
    timing = system.timing
    host, port = system.url.split("@", 1)[1].split("/", 1)[0].rsplit(":", 1)
    proxy = ChaosProxy(host, int(port))
    try:
        system.sample()
        system.faults.callback(proxy.close)  # last in, first undone: heal, then close
        proxy.start()
        system.faults.callback(setattr, proxy, "mode", "pass")
        hung = system.start(name="hung", concurrency=4, url=proxy.url_for(system.url))
        session = system.wait(lambda: system.session_of(hung), what="the hung worker's session")
        # its tasks outlive the fault, so that they try to commit after healing
        long_ms = int(5 * timing.expiry * 1000)
        system.enqueue([witness(sleep_ms=long_ms, max_attempts=5) for _ in range(4)])
        held = system.wait(
            lambda: len(got := system.running_on(session.id)) == 4 and got,
            what="4 claims of the hung worker",
        )
        healthy = system.start(name="healthy", concurrency=8)
        system.wait(lambda: system.session_of(healthy), what="the healthy worker's session")

        proxy.mode = "blackhole"
        wall_fault = time.time()
        fault_db = system.store.now()  # after the switch: nothing of the hung worker passes
        # a transaction caught open keeps its row locks until the server's idle limit
        states = [state for state, _ in backends_of(system.url, "plunder:worker:hung")]
        caught_open = any(state != "idle" for state in states)
        system.enqueue([witness(sleep_ms=100) for _ in range(8)])  # the others go on (I13)
        noticed = system.wait(
            lambda: first(log_times(hung, NOTICED), wall_fault),
            timeout=3 * timing.expiry,
            what="the hung worker to notice",
        )
        notice = noticed - wall_fault

        def rescued() -> list[float]:
            """Seconds from the fault until each claim of the hung worker was ended by the
            janitor (database clock), once every one of them is claimed again."""
            ends = []
            for job in held:
                runs = {r.attempt: r for r in system.store.job_runs(job.id)}
                lost = runs[job.attempt]
                if lost.finished_at is None or job.attempt + 1 not in runs:
                    return []
                ends.append((lost.finished_at - fault_db).total_seconds())
            return ends

        released = system.wait(rescued, timeout=3 * timing.expiry, what="the jobs rescued")
        time.sleep(max(0.0, wall_fault + 3 * timing.expiry - time.time()))
        heal_db = system.store.now()
        proxy.mode = "pass"

        def reopened() -> float | None:
            now = system.session_of(hung)
            if now is None or now.id == session.id:
                return None
            return (now.started_at - heal_db).total_seconds()

        recovery = system.wait(reopened, timeout=30, what="a new session of the hung worker")
        # its first tasks, stopped but deaf to it, keep their slots until they return (and
        # try to commit, refused): only then has it slots for new work
        late = {(job.id, job.attempt) for job in held}
        system.wait(
            lambda: late <= settled(system, hung.pid),
            timeout=30,
            what="the late commits of the hung worker's first tasks",
        )
        system.enqueue([witness(sleep_ms=300) for _ in range(16)])
        system.wait(
            lambda: any(
                r.outcome == Outcome.SUCCEEDED and r.started_at > heal_db
                for r in runs_of(system, "hung")
            ),
            timeout=30,
            what="the hung worker to complete a job after healing",
        )
        system.wait_terminal(timeout=60)
        obs = system.observe()
        during = [r for r in runs_of(system, "hung") if fault_db < r.started_at < heal_db]
        healthy_during = [
            r
            for r in runs_of(system, "healthy")
            if r.finished_at is not None and fault_db < r.finished_at < heal_db
        ]
        refused = [
            e
            for e in obs.events("commit_stale")
            if e["pid"] == hung.pid and (e["job"], e["attempt"]) in late
        ]
        report = check(obs)
        print(report.summary())
        print(
            f"S09 postgres: {len(obs.jobs)} jobs, 1 faults injected, "
            f"{sum(len(v) for v in report.violations.values())} invariant violations, "
            f"recovery {recovery:.2f}s; noticed after {notice:.2f}s, {len(during)} claims "
            f"while hung, {len(held)} jobs rescued after {min(released):.2f}-"
            f"{max(released):.2f}s (a transaction caught open: {caught_open}), "
            f"{len(refused)} late commits refused, "
            f"{len(healthy_during)} jobs done by the other worker meanwhile, "
            f"{proxy.stats.dropped} bytes dropped"
        )
        assert proxy.stats.dropped > 0 and proxy.stats.poisoned > 0  # the fault was real
        # the last renewal was sent at most one interval before the fault; the watchdog
        # looks every half interval and speaks after two: 2.5 intervals, plus a margin
        assert notice <= 2.5 * timing.heartbeat + 0.5, notice
        assert during == [], during
        idle = 2 * timing.expiry if caught_open else 0.0
        assert max(released) <= timing.r_worker + idle, (released, states)
        assert healthy_during, "the other worker did nothing during the fault"
        assert refused, "no late commit of the hung worker's tasks was tried and refused"
        assert recovery <= r_db(timing), recovery
        assert hung.alive
        assert report.ok, report.summary() + system.logs()[-5000:]
    finally:
        system.close()


def settled(system: System, pid: int) -> set[tuple[int, int]]:
    """(job, attempt) of every commit the process tried and got an answer to."""
    ends = ("commit_stale", "commit_ok", "commit_error")
    return {(e["job"], e["attempt"]) for e in system.execs() if e["ev"] in ends and e["pid"] == pid}


def r_db(timing: Timing) -> float:
    """How soon a worker works again once the database is back (RELIABILITY.md §4.1: the
    reconnect backoff cap, a poll interval and 2 s), plus one connect timeout: a connect
    attempt that started while the database was out of reach has to give up first."""
    connect = max(2.0, timing.expiry)
    return worker.RECONNECT_CAP + timing.poll + 2.0 + connect


# -- the machine: tmpfs mounts, leftovers of crashed runs ------------------------------

MOUNT_PREFIX = "/tmp/plunder-chaos-"  # + <pid of the test process>-<random>


def our_mounts() -> dict[str, int]:
    """tmpfs mounts of this suite, with the pid of the test process that made each."""
    out = {}
    for line in Path("/proc/mounts").read_text().splitlines():
        point = line.split()[1]
        found = re.match(re.escape(MOUNT_PREFIX) + r"(\d+)-", point)
        if found:
            out[point] = int(found.group(1))
    return out


def stale_mounts() -> list[str]:
    """Mounts of ours whose test process is gone (a crashed or killed run)."""
    return [point for point, pid in our_mounts().items() if not alive(pid)]


def clean_stale_mounts() -> list[str]:
    gone = stale_mounts()
    for point in gone:
        run("umount", "-l", point)
        with suppress(OSError):
            os.rmdir(point)
    return gone


def tmpfs(undo: ExitStack, size_bytes: int, owner: str | None = None) -> Path:
    """Mount a tmpfs of ``size_bytes`` at a fresh directory; ``undo`` unmounts it (lazily:
    a process that still holds a file there cannot keep it mounted) and removes it."""
    point = Path(f"{MOUNT_PREFIX}{os.getpid()}-{secrets.token_hex(4)}")
    point.mkdir(mode=0o700)
    undo.callback(point.rmdir)
    must("mount", "-t", "tmpfs", "-o", f"size={size_bytes},mode=0700", "tmpfs", str(point))
    undo.callback(run, "umount", "-l", str(point))
    if owner:
        must("chown", owner, str(point))
    return point


def grow(point: Path, size_bytes: int) -> None:
    must("mount", "-o", f"remount,size={size_bytes}", str(point))


@pytest.fixture
def no_leftovers() -> Iterator[None]:
    """A crashed run may have left a mount behind: remove it, and say so."""
    require("S15", "mount", "umount")
    gone = clean_stale_mounts()
    if gone:
        print(f"removed leftovers of a crashed run: {gone}")
    yield
    left = [point for point, pid in our_mounts().items() if pid == os.getpid()]
    assert not left, f"a mount outlived its test: {left}"


# -- S15: disk full --------------------------------------------------------------------

FULL_TIMING = Timing(heartbeat=0.5, expiry=2.5, janitor=0.25, poll=0.25)
FULL_WINDOW = 30.0  # seconds the workers keep running on a full disk


def ballast(size: int) -> str:
    """Text that does not compress (PostgreSQL compresses large values)."""
    return base64.b64encode(os.urandom(size * 3 // 4)).decode()


def cpu_seconds(pid: int) -> float:
    """User + system CPU of a process and its waited-for children."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return sum(int(x) for x in fields[11:15]) / os.sysconf("SC_CLK_TCK")


@dataclass
class Usage:
    """CPU (cores) and log lines per second of each worker over a window."""

    cores: dict[str, float]
    lines: dict[str, float]

    @classmethod
    def measure(cls, procs: list[Proc], seconds: float, during: threading.Event) -> Usage:
        live = [p for p in procs if p.alive]
        cpu = {p.name: cpu_seconds(p.pid) for p in live}
        lines = {p.name: len(p.output().splitlines()) for p in live}
        started = time.monotonic()
        during.wait(seconds)
        took = time.monotonic() - started
        return cls(
            cores={p.name: (cpu_seconds(p.pid) - cpu[p.name]) / took for p in live},
            lines={p.name: (len(p.output().splitlines()) - lines[p.name]) / took for p in live},
        )


def went_down(down: Callable[[], bool], timeout: float = 10.0) -> bool:
    """Whether ``down()`` holds within ``timeout`` seconds (a server that PANICked takes a
    moment to be seen stopped)."""
    deadline = time.monotonic() + timeout
    while not down():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.2)
    return True


def fill(
    system: System, pad: int, *, limit: int = 400, down: Callable[[], bool] = lambda: False
) -> int:
    """Enqueue padded jobs until three in a row are refused as storage full, or the server
    went ``down()`` on the way (a PANIC: PostgreSQL 18 may need a new WAL segment before
    its tables refuse a row); how many were stored on the way."""
    stored = refused = 0
    for _ in range(limit):
        try:
            system.enqueue([witness(sleep_ms=50, pad=ballast(pad), max_attempts=5)])
        except errors.StoreFull:
            refused += 1
            if refused == 3:
                return stored
            continue
        except (errors.StoreUnavailable, errors.OutcomeUnknown):
            if went_down(down):  # the one in flight may be stored or not: I1 judges it
                return stored
            raise
        stored += 1
        refused = 0
    raise AssertionError(f"the disk never filled: {stored} padded jobs stored")


def enqueue_errors(system: System, since: float) -> list[str]:
    return [
        op.error or "" for op in system.history if op.t >= since and op.type in ("fail", "info")
    ]


def full_load(system: System, pad: int) -> threading.Thread:
    """Producers go on while the disk is full: every enqueue is ok or StoreFull."""
    return system.load(
        rate=4,
        make=lambda i: witness(sleep_ms=50, pad=ballast(pad) if i % 2 else "", max_attempts=5),
        count=int(FULL_WINDOW * 4),
    )


def recovered(system: System, since_db: datetime) -> float:
    """Seconds from ``since_db`` until the first job enqueued after it succeeded."""
    system.enqueue([witness(sleep_ms=50) for _ in range(8)])
    system.wait_terminal(timeout=90)
    finished = [
        job.finished_at
        for job in system.jobs()
        if job.finished_at is not None and job.created_at > since_db
    ]
    return (min(finished) - since_db).total_seconds()


def summary_full(
    backend: str, obs_jobs: int, violations: int, recovery: float, **measured: object
) -> str:
    extra = ", ".join(f"{k.replace('_', ' ')} {v}" for k, v in measured.items())
    return (
        f"S15 {backend}: {obs_jobs} jobs, 1 faults injected, {violations} invariant violations, "
        f"recovery {recovery:.2f}s; {extra}"
    )


@pytest.mark.needs_root
def test_s15_disk_full_sqlite(tmp_path: Path, no_leftovers: None) -> None:
    """SQLite on a 4 MB tmpfs: filled with padded jobs until SQLITE_FULL, workers running on
    the full disk for 30 s, then the tmpfs grows and everything finishes."""
    with ExitStack() as undo:
        point = tmpfs(undo, 4 << 20)
        system = System(f"sqlite:///{point / 'plunder.db'}", tmp_path, FULL_TIMING)
        undo.callback(system.close)  # processes end before the unmount
        system.sample()
        procs = system.workers(2, concurrency=2)
        system.enqueue([witness(sleep_ms=50) for _ in range(8)])
        stored = fill(system, 150_000)
        window = time.monotonic()
        loader = full_load(system, 150_000)
        usage = Usage.measure(procs, FULL_WINDOW, threading.Event())
        loader.join(timeout=30)
        refused = enqueue_errors(system, window)
        grown_db = system.store.now()
        grow(point, 64 << 20)
        recovery = recovered(system, grown_db)
        obs = system.observe()
        report = check(obs)
        with sqlite3.connect(point / "plunder.db") as conn:
            integrity = conn.execute("PRAGMA integrity_check").fetchone()[0]
        print(report.summary())
        print(
            summary_full(
                "sqlite",
                len(obs.jobs),
                sum(len(v) for v in report.violations.values()),
                recovery,
                padded_jobs_stored=stored,
                enqueues_refused_while_full=len(refused),
                worker_cpu_max=f"{max(usage.cores.values()):.2f} cores",
                log_lines_max=f"{max(usage.lines.values()):.1f}/s",
            )
        )
        full = [e for e in refused if e.startswith("StoreFull") and "full" in e]
        assert full, f"no enqueue was refused as full during the window: {refused[:3]}"
        assert len(full) == len(refused), [e for e in refused if e not in full][:3]
        assert max(usage.cores.values()) < 1.0, usage
        assert max(usage.lines.values()) < 10, usage
        assert integrity == "ok"
        assert all(p.alive for p in procs)
        assert recovery <= r_db(system.timing), recovery
        assert report.ok, report.summary() + system.logs()[-5000:]


def test_s15_file_size_limit_sqlite(tmp_path: Path) -> None:
    """The non-root variant: one producer runs under ``prlimit --fsize``, so its writes past
    the limit fail with EFBIG (SQLITE_IOERR_WRITE, CPython ignores SIGXFSZ). Its enqueues
    must be refused as storage full, the other processes go on, nothing is lost."""
    require("S15", "prlimit")
    system = System(f"sqlite:///{tmp_path / 'plunder.db'}", tmp_path, FULL_TIMING)
    try:
        system.sample()
        procs = system.workers(2, concurrency=2)
        files = [tmp_path / name for name in ("plunder.db", "plunder.db-wal")]
        limit = sum(f.stat().st_size for f in files if f.exists()) + (512 << 10)
        limited = system.producer(
            "limited", count=40, rate=20, pad=100_000, prefix=["prlimit", f"--fsize={limit}"]
        )
        system.wait(lambda: not limited.alive, timeout=60, what="the limited producer")
        fault_over = system.store.now()
        free = system.producer("free", count=20, rate=20)
        system.wait(lambda: not free.alive, timeout=30, what="the free producer")
        system.wait_terminal(timeout=60)
        obs = system.observe()
        mine = [op for op in obs.history if op.uid.startswith("limited-")]
        refused = [op for op in mine if op.type != "ok"]
        finished = [
            j.finished_at for j in obs.jobs.values() if j.finished_at and j.created_at > fault_over
        ]
        recovery = (min(finished) - fault_over).total_seconds()
        report = check(obs)
        print(report.summary())
        print(
            summary_full(
                "sqlite (prlimit --fsize)",
                len(obs.jobs),
                sum(len(v) for v in report.violations.values()),
                recovery,
                enqueues_refused=f"{len(refused)} of {len(mine)}",
                errors=sorted({(op.error or "").split(":", 1)[0] for op in refused}),
            )
        )
        assert limited.popen.returncode == 0, limited.output()[-3000:]
        assert refused, "the producer never reached its file size limit"
        assert all(op.type == "fail" for op in refused), refused[:3]
        assert all("StoreFull" in (op.error or "") for op in refused), refused[:3]
        assert any("disk I/O error" in (op.error or "") for op in refused), refused[:3]
        assert all(p.alive for p in procs)
        assert report.ok, report.summary() + system.logs()[-5000:]
    finally:
        system.close()


def pg_running(cluster: pgcluster.Cluster) -> bool:
    done = subprocess.run(
        cluster._cmd(str(cluster.bindir / "pg_ctl"), "-D", str(cluster.datadir), "status"),
        capture_output=True,
        timeout=30,
        check=False,
    )
    return done.returncode == 0


@pytest.fixture
def full_cluster(no_leftovers: None) -> Iterator[tuple[pgcluster.Cluster, Path]]:
    """A cluster of its own whose data directory is a tmpfs of its current size plus
    40 MB; durable settings (fsync and synchronous commit on), since this test crashes it."""
    cluster = pgcluster.create({})
    try:
        with ExitStack() as undo:
            cluster.stop("fast")
            used = int(must("du", "-sb", str(cluster.datadir)).split()[0])
            point = tmpfs(undo, used + (40 << 20), owner=cluster.user)
            must("cp", "-a", f"{cluster.datadir}/.", str(point))
            must("rm", "-rf", str(cluster.datadir))
            cluster.datadir.symlink_to(point)
            undo.callback(lambda: pg_running(cluster) and cluster.stop("immediate"))
            cluster.start()
            with psycopg.connect(cluster.url(), autocommit=True) as conn:
                conn.execute("CREATE DATABASE chaos")
            yield cluster, point
    finally:
        cluster.destroy()


def exhaust_wal(cluster: pgcluster.Cluster) -> bool:
    """Write WAL (1 MB logical messages, which need no table space) until the server has
    to start a new WAL segment on the full disk and cannot: a PANIC, as any write workload
    would meet it sooner or later. True if the server went down."""
    try:
        with psycopg.connect(cluster.url("chaos"), autocommit=True, connect_timeout=5) as conn:
            for _ in range(100):
                conn.execute("SELECT pg_logical_emit_message(false, 'chaos', repeat('x', 1 << 20))")
    except psycopg.OperationalError:
        return True
    return False


@pytest.mark.needs_root
def test_s15_disk_full_postgres(
    full_cluster: tuple[pgcluster.Cluster, Path], tmp_path: Path
) -> None:
    """PostgreSQL on a tmpfs with 40 MB to spare: filled with padded jobs until inserts are
    refused (53100), then WAL is written until the server PANICs and shuts itself down;
    workers run on meanwhile for 30 s; then the tmpfs grows, the server is started again if
    it stopped, and everything finishes."""
    cluster, point = full_cluster
    system = System(cluster.url("chaos"), tmp_path, FULL_TIMING)
    try:
        system.sample()
        procs = system.workers(2, concurrency=2)
        system.enqueue([witness(sleep_ms=50) for _ in range(8)])
        system.wait_terminal(timeout=30)
        stored = fill(system, 700_000, down=lambda: not pg_running(cluster))
        panicked = exhaust_wal(cluster)
        window = time.monotonic()
        loader = full_load(system, 700_000)
        usage = Usage.measure(procs, FULL_WINDOW, threading.Event())
        refused = enqueue_errors(system, window)
        down = not pg_running(cluster)
        grow(point, int(must("du", "-sb", str(point)).split()[0]) + (400 << 20))
        if down:
            cluster.start()
        grown_db = system.store.now()
        recovery = recovered(system, grown_db)
        loader.join(timeout=120)
        system.wait_terminal(timeout=60)
        obs = system.observe()
        report = check(obs)
        print(report.summary())
        print(
            summary_full(
                "postgres",
                len(obs.jobs),
                sum(len(v) for v in report.violations.values()),
                recovery,
                padded_jobs_stored=stored,
                server_panicked=panicked,
                server_down=down,
                enqueues_refused_while_full=len(refused),
                errors=sorted({e.split(":", 1)[0] for e in refused}),
                worker_cpu_max=f"{max(usage.cores.values()):.2f} cores",
                log_lines_max=f"{max(usage.lines.values()):.1f}/s",
            )
        )
        assert panicked and down, "the server did not go down: the window was not hit"
        assert refused, "no enqueue failed during the window"
        # while the server is down nothing says "full" any more: the outcome is unknown,
        # and I1 checks that such a job is either absent or processed
        known = ("StoreFull", "StoreBusy", "StoreUnavailable")
        assert all(e.startswith(known) for e in refused), refused[:3]
        assert max(usage.cores.values()) < 1.0, usage
        assert max(usage.lines.values()) < 10, usage
        assert all(p.alive for p in procs)
        assert recovery <= r_db(system.timing), recovery
        assert report.ok, report.summary() + system.logs()[-5000:]
    finally:
        system.close()


# -- S08: a worker partitioned from PostgreSQL -------------------------------------------


@pytest.fixture
def partitioned() -> Iterator[tuple[pgcluster.Cluster, Namespace]]:
    """A namespace and a cluster of its own that also listens on the host's end of the
    veth pair and lets the namespace in. The server has no idle or keepalive settings of
    its own: whatever ends a partitioned worker's transaction, plunder asked for it."""
    require("S08", "ip", "nft")
    clear_stale_network()
    with ExitStack() as undo:
        ns = namespace(undo)
        cluster = pgcluster.create({"listen_addresses": f"127.0.0.1,{ns.host_addr}"})
        undo.callback(cluster.destroy)
        hba = cluster.datadir / "pg_hba.conf"
        with hba.open("a") as f:
            f.write(f"host all all {ns.ns_addr}/32 trust\n")
        with psycopg.connect(cluster.url(), autocommit=True) as conn:
            conn.execute("SELECT pg_reload_conf()")
            conn.execute("CREATE DATABASE chaos")
        yield cluster, ns
    assert not network_left(ns), "a namespace outlived its test"


def backends_of(url: str, app: str) -> list[tuple[str, float]]:
    """(state, seconds in that state) of the backends whose application_name starts so."""
    with psycopg.connect(url, autocommit=True, connect_timeout=5) as conn:
        rows = conn.execute(
            "SELECT state, extract(epoch FROM clock_timestamp() - state_change) "
            "FROM pg_stat_activity WHERE application_name LIKE %s",
            (f"{app}%",),
        ).fetchall()
    return [(str(r[0]), float(r[1])) for r in rows]


def _lock_waits(url: str) -> float:
    """The longest wait on a lock right now (seconds), 0 if none."""
    with psycopg.connect(url, autocommit=True, connect_timeout=5) as conn:
        row = conn.execute(
            "SELECT max(extract(epoch FROM clock_timestamp() - query_start)) "
            "FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
        ).fetchone()
    return float(row[0]) if row and row[0] is not None else 0.0


@dataclass
class Watch:
    """What a side thread saw of the server during the partition."""

    max_lock_wait: float = 0.0
    idle_in_tx_seen: bool = False
    idle_in_tx_gone: float | None = None  # seconds after the fault


@pytest.mark.needs_root
def test_s08_worker_partitioned_from_postgres(
    partitioned: tuple[pgcluster.Cluster, Namespace], tmp_path: Path
) -> None:
    """A worker in a network namespace holds claims and an open transaction with its job's
    row locked when nftables drops all its traffic for 3 session expiries. The server ends
    the abandoned transaction (plunder asks for idle_in_transaction_session_timeout), the other
    worker rescues the jobs, the partitioned worker's late commits are refused after the
    heal, and it reconnects and works again."""
    cluster, ns = partitioned
    system = System(cluster.url("chaos"), tmp_path, FULL_TIMING)
    timing = system.timing
    app = "plunder:worker:part"
    try:
        system.sample()
        system.faults.callback(ns.heal)
        far = cluster.url("chaos").replace("127.0.0.1", ns.host_addr)
        part = system.start(name="part", concurrency=4, url=far, prefix=ns.exec())
        session = system.wait(lambda: system.session_of(part), what="the partitioned session")
        # one job opens its transaction once the other worker is up, locks its row and
        # stays in it for most of a session expiry (well inside the idle limit of two);
        # the others sleep past the partition and try to commit after the heal
        long_ms, expiry_ms = int(5 * timing.expiry * 1000), int(timing.expiry * 1000)
        locked = system.enqueue(
            [witness(sleep_ms=3000, tx_sleep_ms=int(0.8 * expiry_ms), lock_job=True)]
        )
        system.enqueue([witness(sleep_ms=long_ms, max_attempts=5) for _ in range(3)])
        held = system.wait(
            lambda: len(got := system.running_on(session.id)) == 4 and got,
            what="4 claims of the partitioned worker",
        )
        healthy = system.start(name="healthy", concurrency=8)
        system.wait(lambda: system.session_of(healthy), what="the healthy session")
        system.wait(
            lambda: any(e["ev"] == "tx_locked" for e in system.execs()),
            what="the partitioned worker's transaction holding its job's row",
        )
        ns.partition()
        fault = time.monotonic()
        fault_db = system.store.now()
        watch = Watch()
        stop = threading.Event()

        def observe() -> None:
            while not stop.wait(0.05):
                with suppress(psycopg.Error):
                    watch.max_lock_wait = max(watch.max_lock_wait, _lock_waits(system.url))
                    states = [s for s, _ in backends_of(system.url, app)]
                    if "idle in transaction" in states:
                        watch.idle_in_tx_seen = True
                    elif watch.idle_in_tx_seen and watch.idle_in_tx_gone is None:
                        watch.idle_in_tx_gone = time.monotonic() - fault

        watcher = threading.Thread(target=observe, daemon=True)
        watcher.start()

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
        heal_db = system.store.now()
        ns.heal()
        stop.set()
        watcher.join(timeout=10)
        recovery = working_again(system, part, "part", session, heal_db)
        system.wait_terminal(timeout=60)
        late = {(job.id, job.attempt) for job in held if job.id != locked[0].id}
        system.wait(
            lambda: late <= settled(system, part.pid),
            timeout=30,
            what="the late commits of the partitioned worker",
        )
        obs = system.observe()
        refused = [
            e
            for e in obs.events("commit_stale")
            if e["pid"] == part.pid and (e["job"], e["attempt"]) in late
        ]
        report = check(obs)
        print(report.summary())
        released = watch.idle_in_tx_gone
        print(
            f"S08 postgres: {len(obs.jobs)} jobs, 1 faults injected, "
            f"{sum(len(v) for v in report.violations.values())} invariant violations, "
            f"recovery {recovery:.2f}s; open transaction ended by the server after "
            f"{released if released is None else round(released, 2)}s, longest lock wait "
            f"{watch.max_lock_wait:.2f}s, claimed again after {min(gaps):.2f}-{max(gaps):.2f}s, "
            f"{len(refused)} late commits refused"
        )
        assert watch.idle_in_tx_seen, "no open transaction of the partitioned worker was seen"
        # the server ends it two session expiries after it went idle (plunder's
        # idle_in_transaction_session_timeout), plus the watcher's look; the rescue may
        # wait for that on top of the usual bound
        idle = 2 * timing.expiry
        assert released is not None and released <= idle + 1.0, released
        assert max(gaps) <= timing.r_worker + idle, gaps
        assert refused, "no late commit of the partitioned worker was tried and refused"
        assert recovery <= r_db(timing), recovery
        assert part.alive
        assert report.ok, report.summary() + system.logs()[-5000:]
    finally:
        system.close()
