"""``plunder bench`` at tiny sizes, so that the benchmark cannot rot: plunder on both
backends and the raw bounds (no peers, no virtualenv), every scenario they have, one run.
The real measurement is ``plunder bench`` itself (bench/RESULTS.md)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from bench import harness  # noqa: E402

SYSTEMS = [
    "plunder_pg",
    "plunder_pg_serial",
    "plunder_pg_process",
    "raw_pg",
    "plunder_sqlite",
    "raw_sqlite",
]


@pytest.mark.alone  # two PostgreSQL clusters' worth of processes: it starves its neighbours
@pytest.mark.timeout(180)
def test_bench_produces_numbers_for_plunder_and_the_raw_bounds(tmp_path: Path) -> None:
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
    lines: list[str] = []
    options = harness.Options(
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
    assert harness.main(options) == 0
    report = json.loads((tmp_path / "bench.json").read_text())
    medians = report["medians"]
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
        latency = medians[system]["latency"]
        assert "error" not in latency, (system, latency)
        assert 0 <= latency["p50"] <= latency["p95"] <= latency["p99"]
    for system in ("plunder_pg", "plunder_sqlite"):
        rescue = medians[system]["rescue"]
        assert "error" not in rescue, (system, rescue)
        assert 0 < rescue["seconds"] < 20
    assert {row["target"] for row in report["targets"]}
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
