"""The workflows guide's samples run as written, with a real worker, on both backends."""

from __future__ import annotations

import sys
from pathlib import Path

from plunder.store import open_store
from tests.docs.helpers import ROOT, commands, fenced, named_samples, plunder_argv, run, worker
from tests.support import gateway as support

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


def test_the_workflows_guide_runs_as_written_through_a_gateway(
    store_url: str, tmp_path: Path
) -> None:
    """The same samples, unchanged, with PLUNDER_URL naming a gateway and PLUNDER_KEY a
    key: a remote worker runs them, the producers enqueue and read the workflows there."""
    samples = named_samples(GUIDE)
    for name, body in samples.items():
        (tmp_path / name).write_text(body)
    store = open_store(store_url)
    try:
        worker_key = store.key_create(role="worker")[1]
        producer_key = store.key_create(role="producer")[1]
    finally:
        store.close()
    gateway = support.start(store_url, tmp_path)
    try:
        url = gateway.url
        with worker(["plunder", "worker", "-A", "tasks:app"], tmp_path, url, tmp_path,
                    PLUNDER_KEY=worker_key):  # fmt: skip
            diamond = run([sys.executable, "diamond.py"], tmp_path, url, PLUNDER_KEY=producer_key)
            assert diamond.splitlines() == ["report: [6, 60]", str(["succeeded"] * 4)]
            shapes = run([sys.executable, "shapes.py"], tmp_path, url, PLUNDER_KEY=producer_key)
            assert shapes == "chord: [6, 12, 18]\n"
            failures = run([sys.executable, "failures.py"], tmp_path, url,
                           PLUNDER_KEY=producer_key)  # fmt: skip
            assert failures.splitlines() == ["ran: [None]", "skipped", "failed"]
        _, show = fenced(GUIDE, "console")
        (command,) = commands(show)
        shown = run(plunder_argv(command), tmp_path, url, PLUNDER_KEY=producer_key)
        assert "workflow of job 1" in shown and shown.count("succeeded") == 4
    finally:
        gateway.stop()
    assert "Traceback" not in gateway.output()
