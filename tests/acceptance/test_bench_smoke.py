"""``plunder bench`` at tiny sizes, so that the benchmark cannot rot: plunder on both
backends and the raw bounds (no peers, no virtualenv), every scenario they have by default,
one run, and one process count of scenario 9 (which runs only when named). The real
measurement is ``plunder bench`` itself (bench/RESULTS.md)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from bench import harness, report  # noqa: E402

SYSTEMS = [
    "plunder_pg",
    "plunder_pg_serial",
    "plunder_pg_process",
    "raw_pg",
    "plunder_sqlite",
    "raw_sqlite",
]


def tiny_run(tmp_path: Path, lines: list[str]) -> harness.Options:
    """Every default scenario of SYSTEMS, one run, at tiny sizes."""
    sizes = harness.Sizes(
        jobs=300,
        rate=50.0,
        seconds=0.6,
        depth_jobs=100,
        deep_small=100,
        deep_large=1_000,
        hold_jobs=2,
        rescue_cap=20.0,
        timeout=60.0,
        pool_jobs=100,
    )
    return harness.Options(
        quick=True,
        repeat=1,
        systems=SYSTEMS,
        sizes=sizes,
        json_path=tmp_path / "bench.json",
        # a short session expiry keeps the rescue scenario quick here; the benchmark
        # itself always runs plunder with its defaults
        extra={
            "env": {
                "PLUNDER_HEARTBEAT_INTERVAL": "0.2",
                "PLUNDER_SESSION_EXPIRY": "1",
                "PLUNDER_JANITOR_INTERVAL": "0.2",
            }
        },
        echo=lines.append,
    )


@pytest.mark.alone  # two PostgreSQL clusters' worth of processes: it starves its neighbours
@pytest.mark.timeout(180)
def test_bench_produces_numbers_for_plunder_and_the_raw_bounds(tmp_path: Path) -> None:
    lines: list[str] = []
    options = tiny_run(tmp_path, lines)
    assert harness.main(options) == 0
    results = json.loads((tmp_path / "bench.json").read_text())
    medians = results["medians"]
    expected = {
        "plunder_pg": ["enqueue", "drain_1", "drain_2", "depth_small", "depth_large", "pool"],
        "plunder_pg_process": ["pool"],
        "plunder_pg_serial": ["drain_1", "drain_2"],
        "raw_pg": ["enqueue", "drain_1", "drain_2", "depth_small", "depth_large"],
        "plunder_sqlite": ["enqueue", "drain_1", "drain_4", "depth_small", "depth_large"],
        "raw_sqlite": ["enqueue", "drain_1", "drain_4"],
    }
    for system, measurements in expected.items():
        for measurement in measurements:
            result = medians[system][measurement]
            assert "error" not in result, (system, measurement, result, lines)
            assert result["rate"] > 0
    for system in ("plunder_pg", "raw_pg", "plunder_sqlite"):
        for measurement in ("latency", "first_line"):
            latency = medians[system][measurement]
            assert "error" not in latency, (system, measurement, latency)
            assert 0 <= latency["p50"] <= latency["p95"] <= latency["p99"]
    assert not any(m.startswith("fleet_") for m in medians["plunder_pg"])
    for system in ("plunder_pg", "plunder_sqlite"):
        rescue = medians[system]["rescue"]
        assert "error" not in rescue, (system, rescue)
        assert 0 < rescue["seconds"] < 20
    assert {row["target"] for row in results["targets"]}
    assert (tmp_path / "bench.md").read_text().startswith("| system |")


def test_each_run_goes_measurement_by_measurement_and_turns_the_systems() -> None:
    """Peers compared in a measurement run close together in time, and no system always
    runs first (this machine's speed drifts over minutes)."""
    systems = [harness.SYSTEMS[name] for name in ("plunder_pg", "raw_pg", "plunder_sqlite")]
    work = [(s, m) for s in systems for m in ("enqueue", "drain_1")]
    firsts = []
    for number in range(3):
        turn = harness.in_turn(work, number)
        assert sorted(turn, key=id) == sorted(work, key=id)  # every measurement, once
        assert [m for _, m in turn] == ["enqueue"] * 3 + ["drain_1"] * 3
        names = [s.name for s, _ in turn]
        assert names[:3] == names[3:]
        firsts.append(names[0])
    assert firsts == ["plunder_pg", "raw_pg", "plunder_sqlite"]


@pytest.mark.parametrize("backend", ["postgres"])
@pytest.mark.timeout(120)
def test_the_fleet_scenario_measures_drain_idle_cpu_and_connections(
    empty_url: str, tmp_path: Path
) -> None:
    """One process count of scenario 9, through the runner as the harness starts it: two
    real idle workers, then jobs in batches."""
    sizes = harness.Sizes(fleet_jobs=400, fleet_batch=100, fleet_idle=0.5, timeout=60.0)
    params = harness.params_for(harness.Options(sizes=sizes), "fleet_2", empty_url, tmp_path)
    log = tmp_path / "bench.log"
    result = harness.run_one(harness.SYSTEMS["plunder_pg"], "fleet_2", params, log)
    assert "error" not in result, (result, log.read_text())
    assert (result["workers"], result["jobs"], result["concurrency"]) == (2, 400, 50)
    assert result["rate"] > 0
    assert result["enqueue_seconds"] < result["seconds"]  # the drain ends after the enqueue
    assert 0 <= result["idle_cpu"] <= result["idle_cpu_max"]
    # each worker holds at least a connection for its work and one for its wake-ups
    assert result["conns_idle"] >= 2
    assert result["conns_drain_mean"] >= 2


def test_the_fleet_scenario_runs_only_when_named() -> None:
    default = harness.plan(harness.Options(systems=["plunder_pg"]))
    assert default
    assert not any(m.startswith("fleet_") for _, m in default)
    named = harness.plan(harness.Options(systems=["plunder_pg"], scenarios=["9"]))
    assert [m for _, m in named] == ["fleet_1", "fleet_2", "fleet_4", "fleet_8", "fleet_16"]


def test_a_scenario_no_chosen_system_has_is_refused() -> None:
    lines: list[str] = []
    options = harness.Options(systems=["raw_pg"], scenarios=["9"], echo=lines.append)
    assert harness.main(options) == 2
    assert lines == ["unknown scenario(s) for these systems: 9; choose from 1, 2, 3, 4, 6"]


def test_the_fleet_targets_compare_each_count_with_the_best() -> None:
    def count(workers: int, rate: float, idle_most: float, conns: int) -> dict[str, float]:
        return {
            "workers": workers,
            "rate": rate,
            "idle_cpu": idle_most / 2,
            "idle_cpu_max": idle_most,
            "conns_idle": conns,
            "conns_drain": conns,
        }

    medians = {
        "plunder_pg": {
            "fleet_1": count(1, 10_000, 0.4, 3),
            "fleet_2": count(2, 8_500, 0.6, 3),
            "fleet_16": count(16, 7_000, 0.8, 3),
        }
    }
    rows = {row["target"]: row for row in report.targets(medians, {})}
    fleet = {name: row for name, row in rows.items() if name.startswith("fleet:")}
    assert [(r["value"], r["met"]) for r in fleet.values()] == [
        (1.0, True),
        (0.85, True),
        (0.7, False),
        (0.8, True),  # the idle CPU: the most of any process, any count
        (3.0, True),  # connections per worker
    ]
    medians["plunder_pg"]["fleet_2"] |= {"idle_cpu_max": 1.0, "conns_drain": 4}
    rows = {row["target"]: row for row in report.targets(medians, {})}
    assert [r["met"] for n, r in rows.items() if n.startswith("fleet:")][-2:] == [False, False]


@pytest.mark.alone  # gateways and remote workers beside a PostgreSQL cluster
@pytest.mark.timeout(240)
def test_bench_measures_the_gateway(tmp_path: Path) -> None:
    lines: list[str] = []
    options = tiny_run(tmp_path, lines)
    options.systems = ["plunder_gw"]
    options.extra["sessions"] = 20
    assert harness.main(options) == 0
    medians = json.loads((tmp_path / "bench.json").read_text())["medians"]["plunder_gw"]
    for measurement in ("drain_1", "drain_2", "drain_2gw"):
        assert "error" not in medians[measurement], (measurement, medians, lines)
        assert medians[measurement]["rate"] > 0
    latency = medians["first_line"]
    assert "error" not in latency, (latency, lines)
    assert 0 <= latency["p50"] <= latency["p95"] <= latency["p99"]
    sessions = medians["sessions"]
    assert "error" not in sessions, (sessions, lines)
    assert sessions["live"] == 20 and 1 <= sessions["connections"] <= 10


def test_the_workflows_scenario_measures_children_and_a_fan(
    empty_url: str, tmp_path: Path, backend: str
) -> None:
    """Scenario 15 at a tiny size, through the runner as the harness starts it: a real
    worker, children timed from their parent's acknowledgement, and a fan-out/in."""
    system = "plunder_pg" if backend == "postgres" else "plunder_sqlite"
    sizes = harness.Sizes(rate=20.0, seconds=0.5, timeout=60.0)
    options = harness.Options(sizes=sizes, extra={"fan": 50})
    params = harness.params_for(options, "flows", empty_url, tmp_path)
    log = tmp_path / "bench.log"
    result = harness.run_one(harness.SYSTEMS[system], "flows", params, log)
    assert "error" not in result, (result, log.read_text())
    assert result["fan"] == 50 and result["rate"] > 0
    assert result["child_samples"] == result["plain_samples"] == 10
    assert 0 <= result["child_p50"] <= result["child_p99"]
    assert result["enqueue_seconds"] < result["seconds"]
    assert "flows" not in [m for _, m in harness.plan(harness.Options(systems=[system]))]


@pytest.mark.parametrize("backend", ["postgres"])
@pytest.mark.timeout(120)
def test_the_metrics_system_scrapes_its_worker_while_it_runs(
    empty_url: str, tmp_path: Path
) -> None:
    """plunder_pg_metrics: its worker serves /metrics (--metrics-port), read once a second
    during a short latency run."""
    sizes = harness.Sizes(rate=20.0, seconds=3.0, timeout=60.0)
    params = harness.params_for(harness.Options(sizes=sizes), "latency", empty_url, tmp_path)
    system = harness.SYSTEMS["plunder_pg_metrics"]
    params.extra.update(system.extra)  # as the harness's run adds them
    log = tmp_path / "bench.log"
    result = harness.run_one(system, "latency", params, log)
    assert "error" not in result, (result, log.read_text())
    assert result["p50"] > 0
    scrapes = (Path(params.workdir) / "scrapes.txt").read_text()
    answered = int(scrapes.split("'answered': ")[1].split(",")[0])
    assert answered >= 2, scrapes


def test_the_limits_scenario_compares_drains_round_by_round(
    empty_url: str, tmp_path: Path, backend: str
) -> None:
    """Scenario 11 at a tiny size, through the runner as the harness starts it: real
    workers, each round's three drains on the same table (the last one's jobs deleted),
    the ratio a median of the rounds' ratios, and the limit checked in every drain."""
    system = "plunder_pg" if backend == "postgres" else "plunder_sqlite"
    options = harness.Options(
        sizes=harness.Sizes(jobs=300, timeout=120.0), extra={"rounds": 3, "limited": 60}
    )
    params = harness.params_for(options, "limits", empty_url, tmp_path)
    log = tmp_path / "bench.log"
    result = harness.run_one(harness.SYSTEMS[system], "limits", params, log)
    assert "error" not in result, (result, log.read_text())
    assert [len(result["rates"][kind]) for kind in ("alone", "beside", "unlimited")] == [3] * 3
    assert len(result["ratios"]) == len(result["ratios_unlimited"]) == 3
    assert sorted(result["ratios"])[1] == result["ratio"]
    alone, beside = result["rates"]["alone"][0], result["rates"]["beside"][0]
    assert result["ratios"][0] == beside / alone
    assert 1 <= result["most_at_once"] <= 10
    assert "the median of the rounds' ratios" in report.summary(result)
    assert "limits" not in [m for _, m in harness.plan(harness.Options(systems=[system]))]
