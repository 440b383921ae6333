"""A black-box harness for the chaos suite: real ``plunder worker`` and ``plunder janitor``
processes started through the command line, each in its own process group; a history of
client calls; faults whose undo is registered before they are injected; and an
observation of the end state through plunder's public API for :mod:`tests.chaos.checker`.

Faults are timed against observed state ("once worker 1 holds a claim"), never against a
fixed sleep, and every scenario asserts that the window it aims at was really hit.
"""

from __future__ import annotations

import glob
import json
import os
import random
import signal
import sqlite3
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager, suppress
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from plunder import errors
from plunder.janitor import LEASE_NAME
from plunder.model import JobRecord, JobSpec, Session
from plunder.states import Status, is_terminal
from plunder.store import Store, open_store
from tests.chaos.checker import Observation, Op
from tests.chaos.witness import EFFECTS_DDL

ROOT = Path(__file__).resolve().parents[2]
# errors that say the enqueue surely did not happen (a full disk rolls the insert back)
REFUSED = (errors.PayloadError, errors.InvalidName, errors.StoreFull, ValueError)
SEED = int(os.environ.get("PLUNDER_CHAOS_SEED", "0")) or random.randrange(1, 2**31)


@dataclass(frozen=True)
class Timing:
    """Intervals every process of a scenario runs with (seconds)."""

    heartbeat: float = 0.2
    expiry: float = 1.0
    janitor: float = 0.2
    poll: float = 0.1

    def flags(self) -> list[str]:
        return [
            "--heartbeat-interval",
            str(self.heartbeat),
            "--session-expiry",
            str(self.expiry),
            "--janitor-interval",
            str(self.janitor),
            "--poll-interval",
            str(self.poll),
        ]

    @property
    def lease(self) -> float:
        return max(self.expiry, 2 * self.janitor)

    @property
    def r_worker(self) -> float:
        """How soon a dead worker's jobs must be claimable again (RELIABILITY.md §4.1)."""
        return self.expiry + self.janitor + self.poll + 2.0

    @property
    def r_janitor(self) -> float:
        return self.lease + self.janitor + 2.0


def witness(
    uid: str | None = None,
    *,
    queue: str = "q1",
    max_attempts: int = 3,
    timeout: float | None = None,
    backoff: float = 0.05,
    **kwargs: Any,
) -> JobSpec:
    """A witness job; ``kwargs`` go to the task (sleep_ms, fail_times, kill_point, …)."""
    return JobSpec(
        "witness",
        kwargs={"uid": uid or uuid.uuid4().hex[:12], **kwargs},
        queue=queue,
        max_attempts=max_attempts,
        timeout=timeout,
        backoff_base=backoff,
        backoff_cap=backoff * 8,
    )


def _all_jobs(store: Store) -> list[JobRecord]:
    out: list[JobRecord] = []
    after = None
    while True:
        page = store.job_list(task="witness", after=after, limit=1000)
        out += page.jobs
        if page.next_after is None:
            return out
        after = page.next_after


class Proc:
    """One process of the system under test."""

    def __init__(self, name: str, role: str, popen: subprocess.Popen[bytes], log: Path) -> None:
        self.name, self.role, self.popen, self.log = name, role, popen, log
        self.retired = False  # stopped on purpose: the supervisor leaves it dead

    @property
    def pid(self) -> int:
        return self.popen.pid

    @property
    def alive(self) -> bool:
        return self.popen.poll() is None

    def output(self) -> str:
        return self.log.read_text(errors="replace")


class System:
    """plunder under test: processes, a store to observe it, a history, and faults."""

    def __init__(
        self,
        url: str,
        folder: Path,
        timing: Timing | None = None,
        store_options: dict[str, Any] | None = None,
    ) -> None:
        """``store_options`` are for the harness's own stores (observer, sampler, load),
        e.g. a smaller pool where the test counts connections."""
        self.url = url
        self.store_options = dict(store_options or {})
        self.folder = folder
        self.timing = timing or Timing()
        self.backend = "sqlite" if url.startswith("sqlite") else "postgres"
        self.rng = random.Random(SEED)
        self.store: Store = open_store(url, **self.store_options)
        self.store.migrate()
        self._execute(EFFECTS_DDL)
        self.history: list[Op] = []
        self.procs: list[Proc] = []
        self.faults = ExitStack()  # every fault's undo, run by close() whatever happened
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self.samples: list[tuple[float, dict[int, Status]]] = []
        self.leases: list[tuple[float, str, int]] = []
        self.restarts = 0
        self.env = {**os.environ, "PLUNDER_URL": url, "CHAOS_DIR": str(folder)}
        self.env["PYTHONPATH"] = os.pathsep.join(
            [str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]
        )

    # -- processes ----------------------------------------------------------------------
    def start(
        self,
        role: str = "worker",
        *,
        name: str | None = None,
        concurrency: int = 4,
        queues: str = "q1,q2",
        extra: Sequence[str] = (),
        module: str = "plunder",
        url: str | None = None,
        prefix: Sequence[str] = (),
    ) -> Proc:
        """Start a process; ``url`` reaches the database another way than the harness does
        (a proxy, a network namespace), ``prefix`` wraps the command (``ip netns exec …``)."""
        name = name or f"{role}{len(self.procs)}"
        if role == "enqueuer":
            args = [*prefix, sys.executable, "-m", module, *extra]
        else:
            args = [*prefix, sys.executable, "-m", module, "--db", url or self.url, role]
            if role == "worker":
                args += ["-A", "tests.chaos.witness:app", "--name", name, "-q", queues]
                args += ["-c", str(concurrency)]
            args += [*self.timing.flags(), *extra]
        log = self.folder / f"{name}-{len(self.procs)}.log"
        with log.open("wb") as out:
            popen = subprocess.Popen(
                args,
                cwd=ROOT,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=self.env,
                start_new_session=True,  # its own process group: signals reach its children
            )
        proc = Proc(name, role, popen, log)
        with self._lock:
            self.procs.append(proc)
        return proc

    def workers(self, count: int, **options: Any) -> list[Proc]:
        procs = [self.start(**options) for _ in range(count)]
        self.wait(lambda: all(self.session_of(p) for p in procs), what="worker sessions")
        return procs

    def signal(self, proc: Proc, sig: int) -> datetime:
        """Send ``sig`` to the process group; return the database time just before."""
        at = self.store.now()
        if sig in (signal.SIGKILL, signal.SIGTERM, signal.SIGINT):
            proc.retired = True
        with suppress(ProcessLookupError):
            os.killpg(proc.pid, sig)
        return at

    def _write_lock_free(self) -> bool:
        path = self.url[len("sqlite:///") :]
        probe = sqlite3.connect(path, timeout=0.2, isolation_level=None)
        try:
            probe.execute("BEGIN IMMEDIATE")
            probe.execute("ROLLBACK")
            return True
        except sqlite3.OperationalError:
            return False
        finally:
            probe.close()

    def kill(self, proc: Proc) -> datetime:
        at = self.signal(proc, signal.SIGKILL)
        proc.popen.wait(timeout=10)
        return at

    @contextmanager
    def paused(self, proc: Proc, *, holding_write: bool = False) -> Iterator[datetime]:
        """SIGSTOP the process group for the block; SIGCONT however the block ends.

        On SQLite a process paused inside a write transaction holds the database's one
        write lock, and every other process waits until it resumes (S25 aims at that).
        Unless ``holding_write``, the pause is retried until it lands outside a write, so
        the scenario is the zombie it means: a worker whose session expires while the
        others go on."""
        undo = self.faults.enter_context(ExitStack())
        undo.callback(self._resume, proc)
        at = self.signal(proc, signal.SIGSTOP)
        for _ in range(50):
            if holding_write or self.backend != "sqlite" or self._write_lock_free():
                break
            self._resume(proc)
            time.sleep(0.01)
            at = self.signal(proc, signal.SIGSTOP)
        try:
            yield at
        finally:
            undo.close()

    @staticmethod
    def _resume(proc: Proc) -> None:
        with suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGCONT)

    def supervise(self) -> None:
        """Restart any worker that died without being stopped on purpose (a poison job, a
        task's own SIGKILL), as a process supervisor would."""

        def loop() -> None:
            while not self._stop.wait(0.05):
                for proc in list(self.procs):
                    if proc.role == "worker" and not proc.retired and not proc.alive:
                        proc.retired = True
                        self.restarts += 1
                        self.start(name=f"{proc.name}r", **self._restart_options)

        self._restart_options: dict[str, Any] = {}
        self._spawn(loop)

    def restart_with(self, **options: Any) -> None:
        self._restart_options = options

    # -- observation --------------------------------------------------------------------
    def session_of(self, proc: Proc) -> Session | None:
        for session in self.store.session_list():
            if session.pid == proc.pid:
                return session
        return None

    def running_on(self, session_id: str) -> list[JobRecord]:
        return [j for j in self.jobs() if j.status == Status.RUNNING and j.session_id == session_id]

    def jobs(self) -> list[JobRecord]:
        return _all_jobs(self.store)

    def wait(self, condition: Callable[[], Any], timeout: float = 30.0, what: str = "") -> Any:
        """Poll observed state until ``condition()`` is truthy."""
        deadline = time.monotonic() + timeout
        while True:
            value = condition()
            if value:
                return value
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out after {timeout}s waiting for {what}")
            time.sleep(0.02)

    def wait_terminal(self, timeout: float = 60.0) -> None:
        try:
            self.wait(
                lambda: all(is_terminal(j.status) for j in self.jobs()),
                timeout,
                "every job to reach a terminal state",
            )
        except AssertionError as exc:
            stuck = [j for j in self.jobs() if not is_terminal(j.status)]
            sessions = self.store.session_list()
            raise AssertionError(
                f"{exc}: {len(stuck)} not terminal, e.g. {stuck[:3]}; live sessions "
                f"{[(s.name, s.pid, s.id[:8]) for s in sessions]}; live processes "
                f"{[(p.name, p.pid) for p in self.procs if p.alive]}\n{self.logs()[-6000:]}"
            ) from None

    def sample(self, every: float = 0.1) -> None:
        """Record every job's status and the janitor lease, for I7 and I10."""

        def loop() -> None:
            store = open_store(self.url, **self.store_options)
            try:
                while not self._stop.wait(every):
                    try:
                        statuses = {j.id: j.status for j in _all_jobs(store)}
                        lease = store.lease_get(LEASE_NAME)
                    except errors.StoreError:
                        continue  # the database is down on purpose; try again
                    t = time.monotonic()
                    self.samples.append((t, statuses))
                    if lease is not None:
                        self.leases.append((t, lease.holder, lease.term))
            finally:
                store.close()

        self._spawn(loop)

    def observe(self) -> Observation:
        jobs = {str(j.kwargs["uid"]): j for j in self.jobs()}
        return Observation(
            jobs=jobs,
            runs={j.id: self.store.job_runs(j.id) for j in jobs.values()},
            effects=[
                (str(r[0]), int(r[1]), int(r[2]), str(r[3]), int(r[4]))
                for r in self._execute("SELECT * FROM chaos_effects")
            ],
            execs=self.execs(),
            history=[*self.history, *self.producer_history()],
            samples=list(self.samples),
            leases=list(self.leases),
        )

    def execs(self) -> list[dict[str, Any]]:
        lines = []
        for path in glob.glob(str(self.folder / "exec-*.jsonl")):
            with open(path, encoding="utf-8") as f:
                lines += [json.loads(line) for line in f if line.strip()]
        return sorted(lines, key=lambda line: line["wall"])

    def producer_history(self) -> list[Op]:
        """The history written by producer processes (``tests.chaos.enqueuer``); a call
        with no answer (its process was killed) is ``info``."""
        ops = []
        for path in glob.glob(str(self.folder / "history-*.jsonl")):
            last: dict[str, dict[str, Any]] = {}
            with open(path, encoding="utf-8") as f:
                for line in f:
                    if line.strip():
                        entry = json.loads(line)
                        last[entry["uid"]] = entry
            for uid, entry in last.items():
                kind = "info" if entry["type"] == "invoke" else entry["type"]
                ops.append(Op("enqueue", uid, kind, entry["t"], entry["error"]))
        return ops

    def producer(
        self, name: str, count: int, rate: float, *, pad: int = 0, prefix: Sequence[str] = ()
    ) -> Proc:
        args = [self.url, str(self.folder), name, str(count), str(rate), str(pad)]
        return self.start(
            "enqueuer", name=name, module="tests.chaos.enqueuer", extra=args, prefix=prefix
        )

    def logs(self) -> str:
        return "\n".join(f"--- {p.name} (pid {p.pid})\n{p.output()}" for p in self.procs)

    # -- producers ----------------------------------------------------------------------
    def enqueue(self, specs: Sequence[JobSpec]) -> list[JobRecord]:
        """Enqueue in one call, recorded in the history (a lost connection is ``info``)."""
        uids = [str(s.kwargs["uid"]) for s in specs]
        self._record("invoke", uids)
        try:
            jobs = self.store.job_enqueue_many(list(specs))
        except REFUSED as exc:
            self._record("fail", uids, exc)
            raise
        except Exception as exc:
            self._record("info", uids, exc)
            raise
        self._record("ok", uids)
        return jobs

    def load(
        self, rate: float, make: Callable[[int], JobSpec], count: int, **store_options: Any
    ) -> threading.Thread:
        """Enqueue ``count`` jobs at ``rate`` per second on a thread of its own store (opened
        with ``store_options``); an enqueue that raises is recorded and the load goes on."""

        def loop() -> None:
            store = open_store(self.url, **{**self.store_options, **store_options})
            try:
                start = time.monotonic()
                for i in range(count):
                    delay = start + i / rate - time.monotonic()
                    if self._stop.wait(max(0.0, delay)):
                        return
                    spec = make(i)
                    uid = str(spec.kwargs["uid"])
                    self._record("invoke", [uid])
                    try:
                        store.job_enqueue_many([spec])
                    except REFUSED as exc:
                        self._record("fail", [uid], exc)
                    except Exception as exc:  # unknown outcome: recorded as info
                        self._record("info", [uid], exc)
                    else:
                        self._record("ok", [uid])
            finally:
                store.close()

        return self._spawn(loop)

    def _record(self, kind: str, uids: list[str], exc: BaseException | None = None) -> None:
        error = f"{type(exc).__name__}: {exc}" if exc else None
        t = time.monotonic()
        with self._lock:
            self.history += [Op("enqueue", uid, kind, t, error) for uid in uids]

    # -- plumbing -----------------------------------------------------------------------
    def _spawn(self, target: Callable[[], None]) -> threading.Thread:
        thread = threading.Thread(target=target, daemon=True)
        thread.start()
        self._threads.append(thread)
        return thread

    def _execute(self, sql: str) -> list[Any]:
        if self.backend == "sqlite":
            import sqlite3

            conn: Any = sqlite3.connect(self.url[len("sqlite:///") :], isolation_level=None)
        else:
            import psycopg

            conn = psycopg.connect(self.url, autocommit=True)
        try:
            cursor = conn.execute(sql)
            return list(cursor.fetchall()) if cursor.description else []
        finally:
            conn.close()

    def close(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=10)
        try:
            self.faults.close()
        finally:
            for proc in self.procs:
                if proc.alive:
                    self._resume(proc)
                    with suppress(ProcessLookupError):
                        os.killpg(proc.pid, signal.SIGKILL)
            for proc in self.procs:
                proc.popen.wait(timeout=10)
            self.store.close()
