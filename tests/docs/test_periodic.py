"""The periodic-jobs guide runs as written, on both backends: its app is written to a file,
a real worker is started with the guide's command (it declares the app's schedules), the
every-second schedule's jobs run once per tick, and the guide's ``plunder schedules``
commands pause, resume, add and remove schedules."""

from __future__ import annotations

import time
from pathlib import Path

from plunder.states import Status
from plunder.store import Store
from tests.docs.helpers import ROOT, commands, fenced, named_samples, plunder_argv, run, worker

GUIDE = ROOT / "docs" / "guide" / "periodic.md"


def test_the_guides_sample_and_commands(store_url: str, store: Store, tmp_path: Path) -> None:
    samples = named_samples(GUIDE)
    assert list(samples) == ["periodic.py"]
    (tmp_path / "periodic.py").write_text(samples["periodic.py"])
    (block,) = fenced(GUIDE, "bash")
    start, *others = commands(block)
    assert start[:4] == ["plunder", "worker", "-A", "periodic:app"]

    with worker(start, tmp_path, store_url):
        assert {s.name for s in store.schedule_list()} == {"periodic.heartbeat", "morning-report"}
        morning = store.schedule_get("morning-report")
        assert (morning.task, morning.timezone, morning.args) == (
            "periodic.report",
            "Europe/Paris",
            ["daily"],
        )
        assert morning.queue == "reports"
        deadline = time.monotonic() + 60
        while True:  # a poll of the store, bounded by the deadline
            done = [j for j in store.job_list(task="periodic.heartbeat", limit=100).jobs]
            if sum(j.status == Status.SUCCEEDED for j in done) >= 3:
                break
            assert time.monotonic() < deadline, f"no three heartbeats in 60 s: {done}"
            time.sleep(0.1)
        outputs = {" ".join(c[:3]): run(plunder_argv(c), tmp_path, store_url) for c in others}

    jobs = store.job_list(task="periodic.heartbeat", limit=1000).jobs
    keys = [j.key for j in jobs]
    assert len(keys) == len(set(keys)) and all(
        k and k.startswith("plunder.schedule:") for k in keys
    )
    assert {j.queue for j in jobs} == {"clock"}
    succeeded = [j for j in jobs if j.status == Status.SUCCEEDED]
    assert succeeded and all(store.job_get(j.id).result == "alive" for j in succeeded)
    assert "morning-report" in outputs["plunder schedules"]
    assert "paused" in outputs["plunder schedules pause"]
    assert not store.schedule_get("periodic.heartbeat").paused  # resumed by the next command
    assert "removed" in outputs["plunder schedules remove"]
    assert {s.name for s in store.schedule_list()} == {"periodic.heartbeat", "morning-report"}
    assert "weekly-report" in outputs["plunder schedules add"]
