"""``plunder bench``: plunder beside its peers, in the same run, on the same database.

    plunder bench [--quick] [--repeat N] [--systems a,b] [--scenarios 1,2,…] [--json PATH]

One throwaway PostgreSQL cluster on loopback (``tests.support.pgcluster.create()`` with no test
settings: fsync and synchronous_commit on, defaults otherwise) serves every PostgreSQL
system; each measurement gets a fresh database (SQLite: a fresh file). Runs are
interleaved — run 1 of every system, then run 2, … — and the table shows medians. Within a
run, one measurement at a time goes through every system (the systems compared in it run
minutes apart at most, not a whole run apart: this machine's speed drifts over minutes),
and the order of the systems turns by one each run, so that none always goes first.

Every measurement runs in its own process, ``python -m bench.runner``: under this
interpreter for plunder and the raw bounds, under ``bench/.venv`` for the peers, which
are installed there from PyPI on first use and never touch plunder's environment.

Scenarios:
  1 enqueue N no-op jobs with the system's fastest batch API
  2 drain N pre-enqueued no-op jobs with one worker process
  3 the same with two worker processes
  4 enqueue→start latency, one idle worker, jobs arriving one per enqueue at 50/s: from
    just before the producer's enqueue call to the task's first line (both by
    time.monotonic(), one clock for every process on the machine), and beside it
    ``started_at - created_at`` as the database stamps them
  5 kill-to-rescue: SIGKILL a worker holding jobs, time until they run elsewhere
  6 drain 10,000 jobs (one worker) on top of 10,000 and of 1,000,000 jobs it must skip
  7 SQLite systems: enqueue N, drain N with one and with four worker processes
  8 1,000 no-op jobs through one worker with -c 8: tasks on threads vs its warm process pool
  9 cost as the fleet grows: 1, 2, 4, 8 and 16 idle workers (-c 50 each), then 100,000
    no-op jobs in batches of 1,000: drain rate, idle CPU and connections per process.
    Long (minutes): run only when named, ``--scenarios 9``
 10 the gateway (plunder_gw): 200 idle remote sessions on one gateway, its database
    connections and its memory per session (scenarios 2-4 run through it too)
 11 a concurrency limit beside unlimited work: 4 idle workers (-c 50 each), N no-ops
    drained alone, beside N/10 jobs of 10 ms limited to 10 at once, and beside them
    unlimited, back to back in each of 6 rounds, each drain on the same table: the median
    of the rounds' ratios of the drain rates, and the most limited runs at once (from
    their start and end times). Run only when named, ``--scenarios 11``
 12 partition rebalance: 8 workers on a queue of 8 partitions while keyed jobs stream in;
    one killed and one added, 3 times (1 with --quick): time to full ownership after each,
    jobs of a killed owner's partitions stolen before the rebalance, double claims.
    Run only when named, ``--scenarios 12``
 14 fairness between tenants: 2 workers; tenant a enqueues 100,000 no-ops, tenant b 100
    a second later: b's p99 wait (started_at - created_at) on a plain queue and on a fair
    one, in the same run. Run only when named, ``--scenarios 14``
 16 ordered keys: 4 workers (-c 50 each) on a queue of 8 partitions, keyed no-ops (100
    keys) drained unordered and ordered, alternating: both rates, their ratio, and runs of
    a key that overlapped or started out of order (must be 0). Only when named
 15 workflows (bench.systems.plunder_flows), one worker: a child's latency from its last
    parent's acknowledgement (finished_at) to its first line, beside plain enqueue→first
    line in the same run; a fan-out and fan-in of 10,000 jobs (1,000 with --quick), its
    jobs/s and its one enqueue's time. Run only when named, ``--scenarios 15``
 17 slot cost: 2 workers (-c 8), a shuffled burst of jobs of cost 1, 2, 4 and 8: the share
    of the slots they held (sum of cost x duration / slots x wall), the most held at once,
    and the longest wait of a job of 8 beside one of 1. Run only when named, ``--scenarios 17``
 13 affinity: 4 workers (-c 2), 2 holding label A; a burst of jobs preferring A: the share
    run on holders while one had a free slot, and, all holders busy, a preferred job's
    enqueue→first line against a plain one's. Run only when named, ``--scenarios 13``
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench.common import RESULT_PREFIX, ROOT, Params, python_for
from bench.environment import ensure_venv, machine
from bench.report import markdown, median_of, print_tables, summary, targets

RESULTS = ROOT / "bench" / "results"

# measurement name -> (runner measurement, parameter overrides)
MEASUREMENTS: dict[str, tuple[str, dict[str, Any]]] = {
    "enqueue": ("enqueue", {}),
    "drain_1": ("drain", {"workers": 1}),
    "drain_2": ("drain", {"workers": 2}),
    "drain_4": ("drain", {"workers": 4}),
    "latency": ("latency", {}),
    "rescue": ("rescue", {}),
    "depth_small": ("depth", {"deep": "small"}),
    "depth_large": ("depth", {"deep": "large"}),
    "pool": ("pool", {}),
    "first_line": ("first_line", {}),
    "drain_2gw": ("drain_gateways", {"workers": 2}),
    "sessions": ("sessions", {}),
    "limits": ("limits", {}),
    **{f"fleet_{n}": ("fleet", {"workers": n}) for n in (1, 2, 4, 8, 16)},
    "rebalance": ("rebalance", {"workers": 8}),
    "fairness": ("fairness", {"workers": 2}),
    "ordered": ("ordered", {}),
    "flows": ("flows", {}),
    "affinity": ("affinity", {"workers": 4}),
    "cost": ("cost", {"workers": 2}),
}
PG_SCENARIOS = {
    "1": ["enqueue"],
    "2": ["drain_1"],
    "3": ["drain_2"],
    "4": ["first_line", "latency"],
    "5": ["rescue"],
    "6": ["depth_small", "depth_large"],
}
# the peers' latency is their own database stamps only (no first-line measurement)
PEER_SCENARIOS = {k: v for k, v in PG_SCENARIOS.items() if k != "6"} | {"4": ["latency"]}
SQLITE_SCENARIOS = {
    "7": ["enqueue", "drain_1", "drain_4"],
    "4": ["first_line", "latency"],
    "5": ["rescue"],
    "6": ["depth_small", "depth_large"],
}


@dataclass(frozen=True)
class System:
    name: str
    backend: str  # "pg" or "sqlite"
    peer: bool  # runs under bench/.venv
    scenarios: dict[str, list[str]]
    settings: str
    once: frozenset[str] = frozenset()  # measured in the first run only (see its note)
    extra: tuple[tuple[str, Any], ...] = ()  # added to each run's Params.extra


POOL_SCENARIO = {"8": ["pool"]}  # pool_jobs no-op jobs, -c 8: threads vs the warm pool
FLEET_SCENARIO = {"9": [f"fleet_{n}" for n in (1, 2, 4, 8, 16)]}
LIMITS_SCENARIO = {"11": ["limits"]}
PARTITIONS_SCENARIO = {"12": ["rebalance"]}  # 8 workers: only when --scenarios names it
AFFINITY_SCENARIO = {"13": ["affinity"]}
FAIRNESS_SCENARIO = {"14": ["fairness"]}
FLOWS_SCENARIO = {"15": ["flows"]}
ORDERED_SCENARIO = {"16": ["ordered"]}
COST_SCENARIO = {"17": ["cost"]}
# too long for every run: only when --scenarios names them
NAMED_ONLY = frozenset(
    FLEET_SCENARIO
    | LIMITS_SCENARIO
    | PARTITIONS_SCENARIO
    | AFFINITY_SCENARIO
    | FAIRNESS_SCENARIO
    | FLOWS_SCENARIO
    | ORDERED_SCENARIO
    | COST_SCENARIO
)
SERIAL = "-c 100 --depth 1"
SYSTEMS = {
    s.name: s
    for s in [
        System(
            "plunder_pg",
            "pg",
            False,
            PG_SCENARIOS
            | POOL_SCENARIO
            | FLEET_SCENARIO
            | LIMITS_SCENARIO
            | PARTITIONS_SCENARIO
            | AFFINITY_SCENARIO
            | FAIRNESS_SCENARIO
            | FLOWS_SCENARIO
            | ORDERED_SCENARIO
            | COST_SCENARIO,
            "production defaults (fencing, run history, wake-ups, session expiry 5 s, "
            "janitor 1 s); worker `-c 300` (turns sent ahead, each claiming up to 100, a "
            "third of the slots); scenario 8 with `-c 8`, tasks on threads; scenario 9 "
            "with `-c 50` per worker process",
        ),
        System(
            "plunder_pg_process",
            "pg",
            False,
            POOL_SCENARIO,
            "as plunder_pg's scenario 8, with `--pool process`: the no-op task in the "
            "worker's warm pool of 8 child processes (warmed before the clock starts)",
            extra=(("worker_args", ["--pool", "process"]),),
        ),
        System(
            "plunder_pg_serial",
            "pg",
            False,
            {k: v for k, v in PG_SCENARIOS.items() if k in ("2", "3")},
            "as plunder_pg, with `-c 100 --depth 1`: one turn at a time, each "
            "claiming as many jobs as there are free slots (2 connections per worker "
            "instead of 3; the default before turns were sent ahead)",
            extra=(("worker_args", SERIAL.split()),),
        ),
        System(
            "plunder_pg_default",
            "pg",
            False,
            {"4": ["first_line"]},
            "as plunder_pg's scenario 4, with the worker command's default concurrency "
            "(`-c 4`): the first line as a user who sets nothing sees it",
            extra=(("worker_args", ["-c", "4"]),),
        ),
        System(
            "plunder_pg_metrics",
            "pg",
            False,
            {k: v for k, v in PG_SCENARIOS.items() if k in ("2", "3", "4")},
            "as plunder_pg, each worker with `--metrics-port` (counting on) and its "
            "/metrics scraped once a second during the run",
            extra=(("metrics", True),),
        ),
        System(
            "plunder_gw",
            "pg",
            False,
            {
                "2": ["drain_1"],
                "3": ["drain_2", "drain_2gw"],
                "4": ["first_line"],
                "10": ["sessions"],
            },
            "through `plunder serve` (pool of 8): remote workers `-c 300` with a worker key "
            "and no database URL (two turns in flight, each claiming up to 150); scenario "
            "4's producer through "
            "the gateway too; scenario 10: 200 idle remote sessions on one gateway",
        ),
        System(
            "raw_pg",
            "pg",
            False,
            {k: v for k, v in PG_SCENARIOS.items() if k != "5"},
            "psycopg, one statement per transaction, claim batch 100, COPY enqueue, LISTEN/NOTIFY",
        ),
        System(
            "pgqueuer",
            "pg",
            True,
            PEER_SCENARIOS,
            "set by bench/systems/pgqueuer.py",
        ),
        System(
            "procrastinate",
            "pg",
            True,
            PEER_SCENARIOS,
            "set by bench/systems/procrastinate.py",
        ),
        System(
            "dbos_pg",
            "pg",
            True,
            PEER_SCENARIOS,
            "set by bench/systems/dbos.py",
            once=frozenset({"rescue"}),
        ),
        System(
            "plunder_sqlite",
            "sqlite",
            False,
            SQLITE_SCENARIOS
            | LIMITS_SCENARIO
            | PARTITIONS_SCENARIO
            | FAIRNESS_SCENARIO
            | FLOWS_SCENARIO
            | ORDERED_SCENARIO
            | AFFINITY_SCENARIO
            | COST_SCENARIO,
            "production defaults, synchronous=FULL; worker `-c 100`; scenario 11 with "
            "`-c 50` per worker process",
        ),
        System(
            "raw_sqlite",
            "sqlite",
            False,
            {"7": SQLITE_SCENARIOS["7"]},
            "sqlite3, WAL, synchronous=FULL, claim batch 100 under BEGIN IMMEDIATE",
        ),
        System(
            "dbos_sqlite",
            "sqlite",
            True,
            {"7": SQLITE_SCENARIOS["7"]},
            "set by bench/systems/dbos.py (no latency row: on SQLite its timestamps have "
            "one-second resolution)",
        ),
    ]
}
DEFAULT_SYSTEMS = list(SYSTEMS)


@dataclass
class Sizes:
    jobs: int = 20_000
    rate: float = 50.0
    seconds: float = 10.0
    depth_jobs: int = 10_000
    deep_small: int = 10_000
    deep_large: int = 1_000_000
    hold_jobs: int = 4
    rescue_cap: float = 90.0
    timeout: float = 900.0
    pool_jobs: int = 1_000
    fleet_jobs: int = 100_000
    fleet_batch: int = 1_000
    fleet_idle: float = 5.0  # seconds of idleness over which each worker's CPU is read
    fair_jobs: int = 100_000  # scenario 14: tenant a's burst

    @classmethod
    def quick(cls) -> Sizes:
        return cls(
            jobs=500,
            seconds=1.0,
            depth_jobs=200,
            deep_small=200,
            deep_large=2_000,
            rescue_cap=30.0,
            timeout=120.0,
            pool_jobs=100,
            fleet_jobs=2_000,
            fleet_batch=200,
            fleet_idle=1.0,
            fair_jobs=2_000,
        )


@dataclass
class Options:
    quick: bool = False
    repeat: int = 3
    systems: list[str] = field(default_factory=lambda: list(DEFAULT_SYSTEMS))
    scenarios: list[str] | None = None  # None: every scenario each system has
    json_path: Path | None = None
    sizes: Sizes = field(default_factory=Sizes)
    extra: dict[str, Any] = field(default_factory=dict)  # per-run overrides (tests)
    echo: Callable[[str], None] = print


# -- one measurement ----------------------------------------------------------------------
class Databases:
    """A fresh database (or SQLite file) for each measurement."""

    def __init__(self, cluster: Any, folder: Path) -> None:
        self.cluster = cluster
        self.folder = folder
        self.count = 0

    def fresh(self, system: System, label: str) -> str:
        self.count += 1
        name = f"b{self.count}_{system.name}_{label}"[:60]
        if system.backend == "sqlite":
            return f"sqlite:///{self.folder / (name + '.db')}"
        import psycopg

        with psycopg.connect(self.cluster.url(), autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        return str(self.cluster.url(name))

    def drop(self, url: str) -> None:
        if url.startswith("sqlite:"):
            path = Path(url.removeprefix("sqlite:///"))
            for suffix in ("", "-wal", "-shm"):
                Path(str(path) + suffix).unlink(missing_ok=True)
            return
        import psycopg

        name = url.rsplit("/", 1)[1]
        with psycopg.connect(self.cluster.url(), autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def params_for(options: Options, measurement: str, url: str, workdir: Path) -> Params:
    sizes = options.sizes
    _, overrides = MEASUREMENTS[measurement]
    p = Params(
        url=url,
        workdir=str(workdir),
        jobs=sizes.jobs,
        rate=sizes.rate,
        seconds=sizes.seconds,
        hold_jobs=sizes.hold_jobs,
        rescue_cap=sizes.rescue_cap,
        timeout=sizes.timeout,
        extra=dict(options.extra),
    )
    if "workers" in overrides:
        p.workers = overrides["workers"]
    if measurement == "pool":
        p.jobs = sizes.pool_jobs
    if measurement == "fairness":
        p.jobs = sizes.fair_jobs
    if measurement == "flows":
        p.extra.setdefault("fan", 1_000 if options.quick else 10_000)
    if measurement.startswith("fleet_"):
        p.jobs, p.batch, p.idle = sizes.fleet_jobs, sizes.fleet_batch, sizes.fleet_idle
    if "deep" in overrides:
        p.jobs = sizes.depth_jobs
        p.deep = sizes.deep_small if overrides["deep"] == "small" else sizes.deep_large
    return p


def run_one(system: System, measurement: str, params: Params, log: Path) -> dict[str, Any]:
    runner, _ = MEASUREMENTS[measurement]
    argv = [python_for(system.peer), "-m", "bench.runner", system.name, runner]
    argv.append(json.dumps(asdict(params)))
    # plunder and the raw bounds run this checkout's src/, not whichever plunder happens to
    # be installed; the peers never import plunder
    path = str(ROOT) if system.peer else os.pathsep.join([str(ROOT / "src"), str(ROOT)])
    env = {**os.environ, "PYTHONPATH": path, "PYTHONUNBUFFERED": "1"}
    try:
        with open(log, "ab") as err:
            done = subprocess.run(
                argv,
                cwd=ROOT,
                env=env,
                stdout=subprocess.PIPE,
                stderr=err,
                stdin=subprocess.DEVNULL,
                timeout=params.timeout + 300,
                check=False,
            )
    except subprocess.TimeoutExpired:
        return {"error": f"no result within {params.timeout + 300:.0f}s"}
    for line in reversed(done.stdout.decode(errors="replace").splitlines()):
        if line.startswith(RESULT_PREFIX):
            result: dict[str, Any] = json.loads(line[len(RESULT_PREFIX) :])
            return result
    return {"error": f"the runner exited with {done.returncode} and no result (see {log})"}


# -- the whole run ------------------------------------------------------------------------
def plan(options: Options) -> list[tuple[System, str]]:
    chosen: list[tuple[System, str]] = []
    for name in options.systems:
        system = SYSTEMS[name]
        for scenario, measurements in system.scenarios.items():
            named = options.scenarios is not None and scenario in options.scenarios
            if named or (options.scenarios is None and scenario not in NAMED_ONLY):
                chosen += [(system, m) for m in measurements]
    return chosen


def in_turn(work: list[tuple[System, str]], number: int) -> list[tuple[System, str]]:
    """Run ``number``'s measurements: one measurement through every system, then the
    next, with the systems' order turned ``number`` places (see the module docstring)."""
    measurements = list(dict.fromkeys(m for _, m in work))
    systems = list(dict.fromkeys(s.name for s, _ in work))
    shift = number % len(systems) if systems else 0
    place = {name: (i - shift) % len(systems) for i, name in enumerate(systems)}
    return sorted(work, key=lambda sm: (measurements.index(sm[1]), place[sm[0].name]))


def run(options: Options) -> dict[str, Any]:
    from tests.support import pgcluster

    notes: list[str] = []
    work = plan(options)
    if any(s.peer for s, _ in work):
        problem = ensure_venv(options.echo)
        if problem:
            notes.append(problem)
            work = [(s, m) for s, m in work if not s.peer]
    folder = Path(tempfile.mkdtemp(prefix="plunder-bench-"))
    log = folder / "bench.log"
    needs_pg = any(s.backend == "pg" for s, _ in work)
    cluster = pgcluster.create() if needs_pg else None  # no TEST_SETTINGS: fsync on
    pg_version = None
    try:
        if cluster is not None:
            import psycopg

            with psycopg.connect(cluster.url(), autocommit=True) as conn:
                pg_version = conn.execute("SHOW server_version").fetchone()[0]  # type: ignore[index]
        results = measure_all(options, work, Databases(cluster, folder), log)
    finally:
        if cluster is not None:
            cluster.destroy()
    return report_of(options, results, notes, machine(pg_version), log)


def measure_all(
    options: Options, work: list[tuple[System, str]], databases: Databases, log: Path
) -> dict[str, dict[str, list[dict[str, Any]]]]:
    """Every run of the planned work, in turn; each measurement on a fresh database."""
    results: dict[str, dict[str, list[dict[str, Any]]]] = {}
    for number in range(options.repeat):
        for system, measurement in in_turn(work, number):
            if number > 0 and measurement in system.once:
                continue
            url = databases.fresh(system, measurement)
            params = params_for(options, measurement, url, databases.folder)
            params.extra.update(system.extra)
            started = time.monotonic()
            result = run_one(system, measurement, params, log)
            databases.drop(url)
            results.setdefault(system.name, {}).setdefault(measurement, []).append(result)
            options.echo(
                f"run {number + 1}/{options.repeat} {system.name:15} {measurement:12} "
                f"{summary(result)}  ({time.monotonic() - started:.0f}s)"
            )
    return results


def report_of(
    options: Options,
    results: dict[str, dict[str, list[dict[str, Any]]]],
    notes: list[str],
    machine_facts: dict[str, Any],
    log: Path,
) -> dict[str, Any]:
    medians = {
        system: {m: median_of(rs) for m, rs in by_measurement.items()}
        for system, by_measurement in results.items()
    }
    for system, by_measurement in medians.items():
        notes += [f"{system} {m}: {r['error']}" for m, r in by_measurement.items() if "error" in r]
    for system in options.systems:
        if SYSTEMS[system].once:
            notes.append(
                f"{system}: {', '.join(sorted(SYSTEMS[system].once))} measured in the first run "
                "only (no automatic rescue at its defaults; see bench/RESULTS.md)"
            )
    variants = {"plunder_pg_serial": SERIAL}
    return {
        "command": "plunder bench " + shlex.join(sys.argv[2:] if len(sys.argv) > 2 else []),
        "when": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": machine_facts,
        "options": {
            "quick": options.quick,
            "repeat": options.repeat,
            "systems": options.systems,
            "scenarios": options.scenarios,
            "sizes": asdict(options.sizes),
        },
        "settings": {name: SYSTEMS[name].settings for name in options.systems},
        "runs": results,
        "medians": medians,
        "targets": targets(medians, variants),
        "notes": notes,
        "log": str(log),
    }


def write(report: dict[str, Any], path: Path | None) -> Path:
    if path is None:
        RESULTS.mkdir(parents=True, exist_ok=True)
        stamp = datetime.now(UTC).strftime("%Y%m%d-%H%M%S")
        path = RESULTS / f"bench-{stamp}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=2) + "\n")
    path.with_suffix(".md").write_text(markdown(report))
    return path


def main(options: Options) -> int:
    unknown = [s for s in options.systems if s not in SYSTEMS]
    if unknown:
        options.echo(f"unknown system(s): {', '.join(unknown)}; choose from {', '.join(SYSTEMS)}")
        return 2
    known = {n for name in options.systems for n in SYSTEMS[name].scenarios}
    strange = sorted(set(options.scenarios or ()) - known)
    if strange:
        options.echo(
            f"unknown scenario(s) for these systems: {', '.join(strange)}; "
            f"choose from {', '.join(sorted(known, key=int))}"
        )
        return 2
    report = run(options)
    print_tables(report)
    path = write(report, options.json_path)
    options.echo(f"results: {path} (and {path.with_suffix('.md').name})")
    return 0
