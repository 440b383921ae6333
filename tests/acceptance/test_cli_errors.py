"""The errors a newcomer meets first, as the command line shows them: one line naming the
cause, at once; ``--db`` on either side of the command; no database made by a typo."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from plunder.cli import main
from tests.store.helpers import refused_logins
from tests.support import pgcluster

ROOT = Path(__file__).resolve().parents[2]


def run_cli(*args: str, timeout: float = 60) -> tuple[subprocess.CompletedProcess[str], float]:
    """``plunder ARGS`` in a process of its own (its logging as a user would see it), and
    how long it took."""
    env = {k: v for k, v in os.environ.items() if k != "PLUNDER_URL"}
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "plunder", *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=env,
        timeout=timeout,
        check=False,
    )
    return done, time.monotonic() - started


def lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.strip()]


def cli(*args: str) -> Result:
    return CliRunner().invoke(main, list(args), catch_exceptions=False)


def one_line_error(result: Result) -> str:
    assert result.exit_code == 1, (result.exit_code, result.stdout, result.stderr)
    found = lines(result.stderr)
    assert len(found) == 1, result.stderr
    assert found[0].startswith("error: ")
    return found[0]


@refused_logins
def test_a_refused_login_is_one_line_naming_the_cause_at_once(
    pg_cluster: pgcluster.Cluster, url_of: object, cause: str
) -> None:
    url = url_of(pg_cluster)  # type: ignore[operator]
    commands = (
        ["status"],
        ["enqueue", "add", "[1, 2]"],
        ["init"],
        ["worker", "-A", "tests.worker.tasks:app"],
        ["janitor"],
        ["demo", "--jobs", "20"],
    )
    for command in commands:
        done, took = run_cli("--db", url, *command)
        assert done.returncode == 1, done.stderr
        assert lines(done.stderr) == [lines(done.stderr)[0]], done.stderr
        assert lines(done.stderr)[0].startswith("error: ") and cause in done.stderr
        assert took < 4.0, (command, took)  # a process start and one refused login


def test_a_refused_port_is_retried_a_bounded_time_one_line_per_attempt() -> None:
    url = f"postgresql://postgres@127.0.0.1:{pgcluster.free_port()}/postgres"
    done, took = run_cli("--db", url, "status")
    assert done.returncode == 1
    said = lines(done.stderr)
    assert said[-1].startswith("error: ") and "refused" in said[-1], done.stderr
    # the CLI's budget is its connect timeout (5 s), tried about once a second
    assert len(said) <= 8, done.stderr
    assert all("plunder" in line for line in said[:-1]), done.stderr  # no driver chatter
    assert took < 15.0


def test_enqueue_wait_timeout_is_one_line(store_url: str) -> None:
    result = cli(
        "--db",
        store_url,
        "enqueue",
        "add",
        "[1, 2]",
        "--unregistered",
        "--wait",
        "--wait-timeout",
        "0.5",
    )
    assert "still pending" in one_line_error(result)


def test_usage_mistakes_are_clicks_one_line_with_status_2(store_url: str) -> None:
    result = cli("--db", store_url, "jobs", "--limit", "-1")
    assert result.exit_code == 2
    assert lines(result.stderr) == [lines(result.stderr)[0]]
    assert lines(result.stderr)[0].startswith("Error: ")


def test_help_says_how_errors_look() -> None:
    text = " ".join(cli("--help").stdout.split())
    assert "error: " in text and "exit status 1" in text and "exit status 2" in text


@pytest.mark.parametrize(
    "command",
    [["status"], ["jobs"], ["job", "1"], ["cancel", "1"], ["retry", "1"], ["init"]],
    ids=lambda c: c[0],
)
def test_db_is_taken_after_the_command_too(
    store_url: str, tmp_path: Path, command: list[str]
) -> None:
    """After the command as before it; the command's own value wins."""
    decoy = f"sqlite:///{tmp_path / 'decoy.db'}"
    reaches_the_database = command[0] in ("status", "jobs", "init")
    for result in (
        cli(*command, "--db", store_url),
        cli("--db", decoy, *command, "--db", store_url),
    ):
        if reaches_the_database:
            assert result.exit_code == 0, result.stderr
        else:  # it looked in the real database, which has no job 1
            assert "no job 1" in one_line_error(result)
    assert not (tmp_path / "decoy.db").exists()


def test_enqueue_takes_db_after_the_command(store_url: str, tmp_path: Path) -> None:
    decoy = f"sqlite:///{tmp_path / 'decoy.db'}"
    made = cli("--db", decoy, "enqueue", "add", "[1, 2]", "--unregistered", "--db", store_url)
    assert made.exit_code == 0, made.stderr
    listed = cli("jobs", "--db", store_url)
    assert "add" in listed.stdout
    assert not (tmp_path / "decoy.db").exists()


@pytest.mark.parametrize(
    "command",
    [
        ["status"],
        ["jobs"],
        ["job", "1"],
        ["job", "1", "--follow"],
        ["cancel", "1"],
        ["retry", "1"],
        ["enqueue", "add", "[1, 2]"],
        ["janitor"],
    ],
    ids="-".join,
)
def test_commands_that_do_not_create_refuse_a_missing_file(
    tmp_path: Path, command: list[str]
) -> None:
    path = tmp_path / "typo.db"
    result = cli("--db", f"sqlite:///{path}", *command)
    line = one_line_error(result)
    assert f"no database at {path}" in line and "plunder init" in line
    assert list(tmp_path.iterdir()) == []


def test_init_creates_a_missing_file(tmp_path: Path) -> None:
    path = tmp_path / "new.db"
    result = cli("--db", f"sqlite:///{path}", "init")
    assert result.exit_code == 0, result.stderr
    assert path.exists()
    assert cli("--db", f"sqlite:///{path}", "status").exit_code == 0
