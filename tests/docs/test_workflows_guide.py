"""The workflows guide's samples run as written, with a real worker, on both backends."""

from __future__ import annotations

import sys
from pathlib import Path

from tests.docs.helpers import ROOT, commands, fenced, named_samples, plunder_argv, run, worker

GUIDE = ROOT / "docs" / "guide" / "workflows.md"


def test_the_workflows_guide_runs_as_written(store_url: str, tmp_path: Path) -> None:
    samples = named_samples(GUIDE)
    assert set(samples) == {"tasks.py", "diamond.py", "shapes.py", "failures.py"}
    for name, body in samples.items():
        (tmp_path / name).write_text(body)
    start, show = fenced(GUIDE, "console")
    assert commands(start) == [["plunder", "init"], ["plunder", "worker", "-A", "tasks:app", "&"],
                               ["python", "diamond.py"]]  # fmt: skip
    run(plunder_argv(["plunder", "init"]), tmp_path, store_url)
    with worker(["plunder", "worker", "-A", "tasks:app"], tmp_path, store_url, tmp_path):
        diamond = run([sys.executable, "diamond.py"], tmp_path, store_url)
        assert diamond.splitlines() == ["report: [6, 60]", str(["succeeded"] * 4)]
        assert run([sys.executable, "shapes.py"], tmp_path, store_url) == "chord: [6, 12, 18]\n"
        failures = run([sys.executable, "failures.py"], tmp_path, store_url)
        assert failures.splitlines() == ["ran: [None]", "skipped", "failed"]
    (command,) = commands(show)
    shown = run(plunder_argv(command), tmp_path, store_url)
    assert "workflow of job 1" in shown and shown.count("succeeded") == 4
