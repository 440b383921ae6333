"""Every sample of the README runs as written: its python blocks are written to files in a
temporary directory, a real ``plunder worker`` is started on them with the README's own
command, and the producers run against it, on both backends where the sample names both
(the first app reads PLUNDER_URL; the shop sample names SQLite)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from tests.docs.helpers import ROOT, commands, fenced, named_samples, plunder_argv, run, worker

README = ROOT / "README.md"
SAMPLES = named_samples(README)
FIRST_APP = ["tasks.py", "producer.py"]
SHOP = ["shop.py", "checkout.py"]
# the async producer APIs, on the README's first app: in the guide's results page
RESULTS = ROOT / "docs" / "guide" / "results.md"
ASYNC = [b for b in fenced(RESULTS, "python") if b.startswith("# async_producer.py")]


def write(tmp_path: Path, *names: str) -> None:
    for name in names:
        (tmp_path / name).write_text(SAMPLES[name])


def shell_block(containing: str) -> list[list[str]]:
    blocks = [b for b in fenced(README, "bash") if containing in b]
    assert len(blocks) == 1, f"one bash block of the README has {containing!r}"
    return commands(blocks[0])


def worker_command(app: str) -> list[str]:
    """The README's command that starts a worker on ``app``."""
    every = [c for block in fenced(README, "bash") for c in commands(block)]
    found = [c for c in every if c[:2] == ["plunder", "worker"]]
    assert found and found[0][2:4] == ["-A", "tasks:app"], found
    return [*found[0][:3], app, *found[0][4:]]


def test_every_python_sample_is_run_by_a_test() -> None:
    assert sorted(SAMPLES) == sorted(FIRST_APP + SHOP)
    assert len(ASYNC) == 1, "one sample of the results page is async_producer.py"


def test_the_two_commands_are_the_ones_the_project_runs() -> None:
    install, demo, check = shell_block("plunder demo")
    assert install[:3] == ["python3", "-m", "venv"]
    assert demo == ["pip", "install", "-e", ".", "&&", "plunder", "demo"]
    assert check == ["pip", "install", "-e", ".[dev]", "&&", "bash", "scripts/check"]
    assert "bash scripts/check" in (ROOT / ".ci" / "run").read_text()


def test_the_benchmark_command_names_systems_the_harness_has() -> None:
    (bench,) = shell_block("plunder bench")
    assert bench[:4] == ["plunder", "bench", "--repeat", "3"] and bench[4] == "--systems"
    from bench import runner

    systems = set(runner.MODULES)
    assert set(bench[5].split(",")) <= systems, set(bench[5].split(",")) - systems


def test_the_first_app_and_its_producer(store_url: str, tmp_path: Path) -> None:
    write(tmp_path, "tasks.py", "producer.py")
    with worker(worker_command("tasks:app"), tmp_path, store_url):
        out = run([sys.executable, "producer.py"], tmp_path, store_url)
    assert out.splitlines() == [
        "5",
        "[2, 8, 3, 7]",
        "once upon a time -> ONCE UPON A TIME",
        "42 succeeded 1",
    ]


def test_the_command_line_block(store_url: str, tmp_path: Path) -> None:
    write(tmp_path, "tasks.py")
    said: dict[str, str] = {}
    with worker(worker_command("tasks:app"), tmp_path, store_url):
        for command in shell_block("plunder init"):
            said[" ".join(command)] = run(plunder_argv(command), tmp_path, store_url)
    assert said["plunder enqueue tasks.add [2, 3] --wait"].strip().splitlines()[-1] == "5"
    assert "hello there" in said["plunder job 2 --follow --no-progress"]
    listed = json.loads(said["plunder jobs --status succeeded --json"])
    assert {1, 2} <= {job["id"] for job in listed["jobs"]}  # 3 too, once its retry ran
    assert {job["status"] for job in listed["jobs"]} == {"succeeded"}


def test_the_shop_commits_order_and_job_together(tmp_path: Path) -> None:
    write(tmp_path, "shop.py", "checkout.py")
    with worker(worker_command("shop:app"), tmp_path, None):
        out = run([sys.executable, "checkout.py"], tmp_path, None)
    assert out.splitlines() == ["(1,)"]
    assert (tmp_path / "shop.db").exists() and not (tmp_path / "plunder.db").exists()


def test_the_async_producer(store_url: str, tmp_path: Path) -> None:
    write(tmp_path, "tasks.py")
    (tmp_path / "async_producer.py").write_text(ASYNC[0])
    with worker(worker_command("tasks:app"), tmp_path, store_url):
        out = run([sys.executable, "async_producer.py"], tmp_path, store_url)
    # a first attempt that succeeds has no mark: one comes only before a retry's events
    assert out.splitlines() == ["streams are per attempt -> STREAMS ARE PER ATTEMPT", "3"], out
