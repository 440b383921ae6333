"""The worker command's collector settings (plunder.execution.tune_gc)."""

from __future__ import annotations

import gc
import subprocess
import sys

import plunder
from plunder.execution import GC_YOUNG, tune_gc

app = plunder.App()  # loaded by the worker command below


@app.task(name="tests.gc.noop")
def noop() -> None:
    return None


def test_tune_gc_collects_the_young_generation_less_often_and_freezes_what_was_imported():
    before = gc.get_threshold()
    try:
        tune_gc()
        assert gc.get_threshold() == (GC_YOUNG, before[1], before[2])
        assert gc.get_freeze_count() > 0
        assert gc.isenabled()  # cycles are still collected
    finally:
        gc.unfreeze()
        gc.set_threshold(*before)


def test_a_cycle_made_after_tuning_is_still_collected():
    code = """
import gc, weakref
from plunder.execution import GC_YOUNG, tune_gc
tune_gc()
class Node: pass
a, b = Node(), Node()
a.other, b.other = b, a
gone = weakref.ref(a)
del a, b
kept = [[] for _ in range(3 * GC_YOUNG)]  # young collections happen meanwhile
print(gone() is None)
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "True"


def test_the_worker_command_tunes_the_collector_before_it_runs(monkeypatch, tmp_path):
    from click.testing import CliRunner

    from plunder import cli
    from plunder.cli import run

    called = []
    monkeypatch.setattr(run, "tune_gc", lambda: called.append(True))
    monkeypatch.setattr(run.Worker, "run", lambda self: called.append("run"))
    db = f"sqlite:///{tmp_path / 'gc.db'}"
    result = CliRunner().invoke(
        cli.main, ["--db", db, "worker", "-A", "tests.unit.test_gc_tuning:app"]
    )
    assert result.exit_code == 0, result.output
    assert called == [True, "run"]
