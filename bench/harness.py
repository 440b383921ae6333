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
  4 enqueue→start latency, one idle worker, jobs arriving at 50/s
  5 kill-to-rescue: SIGKILL a worker holding jobs, time until they run elsewhere
  6 drain 10,000 jobs (one worker) on top of 10,000 and of 1,000,000 jobs it must skip
  7 SQLite systems: enqueue N, drain N with one and with four worker processes
  8 1,000 no-op jobs through one worker with -c 8: tasks on threads vs its warm process pool
"""

from __future__ import annotations

import json
import os
import platform
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
import venv
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench.common import RESULT_PREFIX, ROOT, Params, python_for

RESULTS = ROOT / "bench" / "results"
VENV = ROOT / "bench" / ".venv"
PEER_PACKAGES = ["pgqueuer", "procrastinate", "dbos", "psycopg[binary]", "asyncpg", "uvloop"]

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
}
PG_SCENARIOS = {
    "1": ["enqueue"],
    "2": ["drain_1"],
    "3": ["drain_2"],
    "4": ["latency"],
    "5": ["rescue"],
    "6": ["depth_small", "depth_large"],
}
SQLITE_SCENARIOS = {
    "7": ["enqueue", "drain_1", "drain_4"],
    "4": ["latency"],
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
SERIAL = "-c 100 --no-turns-ahead"
SYSTEMS = {
    s.name: s
    for s in [
        System(
            "plunder_pg",
            "pg",
            False,
            PG_SCENARIOS | POOL_SCENARIO,
            "production defaults (fencing, run history, wake-ups, session expiry 5 s, "
            "janitor 1 s); worker `-c 300` (turns sent ahead, each claiming up to 100, a "
            "third of the slots); scenario 8 with `-c 8`, tasks on threads",
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
            "as plunder_pg, with `-c 100 --no-turns-ahead`: one turn at a time, each "
            "claiming as many jobs as there are free slots (2 connections per worker "
            "instead of 3; the default before turns were sent ahead)",
            extra=(("worker_args", SERIAL.split()),),
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
            {k: v for k, v in PG_SCENARIOS.items() if k != "6"},
            "set by bench/systems/pgqueuer.py",
        ),
        System(
            "procrastinate",
            "pg",
            True,
            {k: v for k, v in PG_SCENARIOS.items() if k != "6"},
            "set by bench/systems/procrastinate.py",
        ),
        System(
            "dbos_pg",
            "pg",
            True,
            {k: v for k, v in PG_SCENARIOS.items() if k != "6"},
            "set by bench/systems/dbos.py",
            once=frozenset({"rescue"}),
        ),
        System(
            "plunder_sqlite",
            "sqlite",
            False,
            SQLITE_SCENARIOS,
            "production defaults, synchronous=FULL; worker `-c 100`",
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


# -- environment --------------------------------------------------------------------------
def ensure_venv(echo: Callable[[str], None]) -> str | None:
    """Create bench/.venv with the peers on first use; None when it works, else why not."""
    python = VENV / "bin" / "python"
    marker = VENV / ".peers-installed"
    if marker.exists():
        return None
    echo(f"installing the peers into {VENV} (first use): {' '.join(PEER_PACKAGES)}")
    try:
        if not python.exists():
            venv.create(VENV, with_pip=True)
        subprocess.run(
            [str(python), "-m", "pip", "install", "--quiet", *PEER_PACKAGES],
            check=True,
            timeout=900,
        )
    except (OSError, subprocess.SubprocessError) as exc:
        return f"could not install the peers into {VENV}: {exc}"
    marker.write_text("\n".join(PEER_PACKAGES) + "\n")
    return None


def peer_versions() -> dict[str, str]:
    python = VENV / "bin" / "python"
    if not python.exists():
        return {}
    out = subprocess.run(
        [str(python), "-m", "pip", "list", "--format", "json"],
        capture_output=True,
        text=True,
        check=False,
    )
    try:
        listed = {p["name"].lower(): p["version"] for p in json.loads(out.stdout)}
    except json.JSONDecodeError:
        return {}
    return {n: listed[n] for n in ("pgqueuer", "procrastinate", "dbos", "asyncpg") if n in listed}


def machine(pg_version: str | None) -> dict[str, Any]:
    cpu = "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
        mem_kb = int(Path("/proc/meminfo").read_text().split()[1])
    except (OSError, ValueError, IndexError):
        mem_kb = 0
    import plunder

    def git(*args: str) -> str:
        done = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=False)
        return done.stdout.strip()

    return {
        "commit": git("rev-parse", "--short", "HEAD")
        + (
            " (+ uncommitted changes)"
            if git("status", "--porcelain", "--untracked-files=no")
            else ""
        ),
        "nproc": os.cpu_count(),
        "cpu": cpu,
        "ram_gib": round(mem_kb / 1024 / 1024, 1),
        "kernel": platform.release(),
        "python": platform.python_version(),
        "postgresql": pg_version,
        "plunder": getattr(plunder, "__version__", "?"),
        "peers": peer_versions(),
    }


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


# -- medians and the table ----------------------------------------------------------------
def median_of(results: list[dict[str, Any]]) -> dict[str, Any]:
    good = [r for r in results if "error" not in r]
    if not good:
        return {"error": results[0]["error"] if results else "not run"}
    out: dict[str, Any] = {"runs": len(good)}
    for key in ("rate", "seconds", "p50", "p95", "p99"):
        values = [r[key] for r in good if key in r]
        if values:
            out[key] = statistics.median(values)
    if len(good) < len(results):
        out["failed_runs"] = len(results) - len(good)
    return out


def cell(m: dict[str, Any] | None, measurement: str) -> str:
    if m is None:
        return "—"
    if "error" in m:
        return "n/a"
    if measurement == "latency":
        return f"{m['p50']:.1f} / {m['p95']:.1f} / {m['p99']:.1f}"
    if measurement == "rescue":
        return f"{m['seconds']:.1f}"
    return f"{m['rate']:,.0f}"


COLUMNS = [
    ("enqueue", "enqueue (jobs/s)"),
    ("drain_1", "drain, 1 proc (jobs/s)"),
    ("drain_2", "drain, 2 procs (jobs/s)"),
    ("drain_4", "drain, 4 procs (jobs/s)"),
    ("latency", "enqueue→start p50/p95/p99 (ms)"),
    ("rescue", "kill→rescue (s)"),
    ("depth_small", "drain on small depth (jobs/s)"),
    ("depth_large", "drain on large depth (jobs/s)"),
    ("pool", "1,000 no-ops, -c 8 (jobs/s)"),
]


def targets(medians: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """The issue's targets, each with what was measured and whether it is met."""

    def get(system: str, measurement: str, key: str = "rate") -> float | None:
        m = medians.get(system, {}).get(measurement)
        return None if not m or "error" in m or key not in m else float(m[key])

    rows: list[dict[str, Any]] = []

    def ratio(name: str, a: float | None, b: float | None, goal: float, higher: bool = True):
        value = None if a is None or b is None or b == 0 else a / b
        met = None if value is None else (value >= goal if higher else value <= goal)
        rows.append({"target": name, "value": value, "goal": goal, "unit": "×", "met": met})

    def absolute(name: str, value: float | None, goal: float, unit: str, higher: bool = True):
        met = None if value is None else (value >= goal if higher else value <= goal)
        rows.append({"target": name, "value": value, "goal": goal, "unit": unit, "met": met})

    for drain in ("drain_1", "drain_2"):
        procs = drain[-1]
        ratio(
            f"plunder drain ({procs} proc) ≥ 2.0× PgQueuer",
            get("plunder_pg", drain),
            get("pgqueuer", drain),
            2.0,
        )
    ratio(
        "plunder enqueue ≥ 1.0× PgQueuer",
        get("plunder_pg", "enqueue"),
        get("pgqueuer", "enqueue"),
        1.0,
    )
    for drain in ("drain_1", "drain_2"):
        procs = drain[-1]
        ratio(
            f"plunder drain ({procs} proc) ≥ 0.5× raw bound (batch 100)",
            get("plunder_pg", drain),
            get("raw_pg", drain),
            0.5,
        )
    # the same drains with a worker's options for short jobs (nothing turned off)
    for system, flags in (("plunder_pg_serial", SERIAL),):
        for drain in ("drain_1", "drain_2"):
            procs = drain[-1]
            mine = get(system, drain)
            ratio(
                f"plunder drain ({procs} proc, `{flags}`) ≥ 2.0× PgQueuer",
                mine,
                get("pgqueuer", drain),
                2.0,
            )
            ratio(
                f"plunder drain ({procs} proc, `{flags}`) ≥ 0.5× raw bound",
                mine,
                get("raw_pg", drain),
                0.5,
            )
    ratio(
        "latency p50 ≤ 1.5× raw LISTEN/NOTIFY bound",
        get("plunder_pg", "latency", "p50"),
        get("raw_pg", "latency", "p50"),
        1.5,
        higher=False,
    )
    absolute("latency p99 ≤ 8 ms", get("plunder_pg", "latency", "p99"), 8.0, "ms", higher=False)
    absolute("rescue ≤ 10 s (defaults)", get("plunder_pg", "rescue", "seconds"), 10.0, "s", False)
    ratio(
        "depth: drain on large / small depth ≥ 0.8",
        get("plunder_pg", "depth_large"),
        get("plunder_pg", "depth_small"),
        0.8,
    )
    ratio(
        "SQLite depth: drain on large / small depth ≥ 0.8",
        get("plunder_sqlite", "depth_large"),
        get("plunder_sqlite", "depth_small"),
        0.8,
    )
    absolute(
        "SQLite drain, 1 proc ≥ 15,000 jobs/s", get("plunder_sqlite", "drain_1"), 15_000, "jobs/s"
    )
    absolute("SQLite enqueue ≥ 50,000 jobs/s", get("plunder_sqlite", "enqueue"), 50_000, "jobs/s")
    return rows


def print_tables(report: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console(highlight=False)
    console.width = max(console.width, 170)
    medians = report["medians"]
    sizes = report["options"]["sizes"]
    table = Table(
        title=f"plunder bench — medians of {report['options']['repeat']} runs; N = {sizes['jobs']:,}, "
        f"depth: {sizes['depth_jobs']:,} jobs on {sizes['deep_small']:,} / {sizes['deep_large']:,}"
    )
    table.add_column("system")
    used = [c for c in COLUMNS if any(c[0] in medians.get(s, {}) for s in medians)]
    for _, title in used:
        table.add_column(title, justify="right")
    for system in medians:
        table.add_row(system, *(cell(medians[system].get(key), key) for key, _ in used))
    console.print(table)
    goals = Table(title="targets")
    for column in ("target", "measured", "met"):
        goals.add_column(column)
    for row in report["targets"]:
        value = "n/a" if row["value"] is None else f"{row['value']:,.2f} {row['unit']}"
        met = {True: "yes", False: "NO", None: "—"}[row["met"]]
        goals.add_row(row["target"], value, met)
    console.print(goals)
    for note in report["notes"]:
        console.print(f"• {note}", soft_wrap=True)


def markdown(report: dict[str, Any]) -> str:
    medians = report["medians"]
    used = [c for c in COLUMNS if any(c[0] in medians.get(s, {}) for s in medians)]
    lines = ["| system | " + " | ".join(t for _, t in used) + " |"]
    lines.append("|---|" + "---:|" * len(used))
    for system in medians:
        lines.append(
            f"| {system} | " + " | ".join(cell(medians[system].get(k), k) for k, _ in used) + " |"
        )
    lines += ["", "| target | measured | met |", "|---|---:|---|"]
    for row in report["targets"]:
        value = "n/a" if row["value"] is None else f"{row['value']:,.2f} {row['unit']}"
        lines.append(
            f"| {row['target']} | {value} | {({True: 'yes', False: '**no**', None: '—'})[row['met']]} |"
        )
    return "\n".join(lines) + "\n"


# -- the whole run ------------------------------------------------------------------------
def plan(options: Options) -> list[tuple[System, str]]:
    chosen: list[tuple[System, str]] = []
    for name in options.systems:
        system = SYSTEMS[name]
        for scenario, measurements in system.scenarios.items():
            if options.scenarios is None or scenario in options.scenarios:
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

    echo = options.echo
    notes: list[str] = []
    work = plan(options)
    if any(s.peer for s, _ in work):
        problem = ensure_venv(echo)
        if problem:
            notes.append(problem)
            work = [(s, m) for s, m in work if not s.peer]
    folder = Path(tempfile.mkdtemp(prefix="plunder-bench-"))
    log = folder / "bench.log"
    needs_pg = any(s.backend == "pg" for s, _ in work)
    cluster = pgcluster.create() if needs_pg else None  # no TEST_SETTINGS: fsync on
    results: dict[str, dict[str, list[dict[str, Any]]]] = {}
    pg_version = None
    try:
        if cluster is not None:
            import psycopg

            with psycopg.connect(cluster.url(), autocommit=True) as conn:
                pg_version = conn.execute("SHOW server_version").fetchone()[0]  # type: ignore[index]
        databases = Databases(cluster, folder)
        for number in range(options.repeat):
            for system, measurement in in_turn(work, number):
                if number > 0 and measurement in system.once:
                    continue
                url = databases.fresh(system, measurement)
                params = params_for(options, measurement, url, folder)
                params.extra.update(system.extra)
                started = time.monotonic()
                result = run_one(system, measurement, params, log)
                databases.drop(url)
                results.setdefault(system.name, {}).setdefault(measurement, []).append(result)
                echo(
                    f"run {number + 1}/{options.repeat} {system.name:15} {measurement:12} "
                    f"{summary(result)}  ({time.monotonic() - started:.0f}s)"
                )
    finally:
        if cluster is not None:
            cluster.destroy()
    medians = {
        system: {m: median_of(rs) for m, rs in by_measurement.items()}
        for system, by_measurement in results.items()
    }
    for system, by_measurement in medians.items():
        for measurement, m in by_measurement.items():
            if "error" in m:
                notes.append(f"{system} {measurement}: {m['error']}")
    for system in options.systems:
        if SYSTEMS[system].once:
            notes.append(
                f"{system}: {', '.join(sorted(SYSTEMS[system].once))} measured in the first run "
                "only (no automatic rescue at its defaults; see bench/RESULTS.md)"
            )
    report = {
        "command": "plunder bench " + shlex.join(sys.argv[2:] if len(sys.argv) > 2 else []),
        "when": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": machine(pg_version),
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
        "targets": targets(medians),
        "notes": notes,
        "log": str(log),
    }
    return report


def summary(result: dict[str, Any]) -> str:
    if "error" in result:
        return f"error: {result['error']}"
    if "p50" in result:
        return f"p50 {result['p50']:.1f} ms, p95 {result['p95']:.1f} ms, p99 {result['p99']:.1f} ms"
    if "rate" in result:
        return f"{result['rate']:,.0f} jobs/s in {result['seconds']:.2f}s"
    return f"{result.get('seconds', 0):.2f}s"


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
    report = run(options)
    print_tables(report)
    path = write(report, options.json_path)
    options.echo(f"results: {path} (and {path.with_suffix('.md').name})")
    return 0
