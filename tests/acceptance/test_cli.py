"""The command line: every command, ``--json`` parses, user mistakes are one line."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from plunder.cli import main
from plunder.model import JobSpec
from plunder.store import Store, queries
from tests.support.procs import run_group
from tests.worker import tasks
from tests.worker.conftest import worker_in_thread

ROOT = Path(__file__).resolve().parents[2]


def plunder(url: str, *args: str) -> Result:
    return CliRunner().invoke(main, ["--db", url, *args], catch_exceptions=False)


def one_line_error(result: Result) -> str:
    assert result.exit_code != 0
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    assert "Traceback" not in result.stderr and "Traceback" not in result.stdout
    return lines[0]


@pytest.fixture
def worker_thread(store_url: str) -> Iterator[None]:
    with worker_in_thread(store_url, concurrency=2):
        yield


def test_init_creates_the_schema(empty_url: str) -> None:
    result = plunder(empty_url, "init")
    latest = len(queries.migrations("sqlite" if empty_url.startswith("sqlite") else "postgres"))
    assert result.exit_code == 0 and f"schema version {latest}" in result.stdout
    assert plunder(empty_url, "init").exit_code == 0  # idempotent


def test_commands_before_init_say_what_to_do(empty_url: str) -> None:
    assert "plunder init" in one_line_error(plunder(empty_url, "status"))


def test_enqueue_list_show_cancel_retry_with_json(store_url: str) -> None:
    made = plunder(
        store_url,
        "enqueue",
        "add",
        "[2, 3]",
        "--queue",
        "math",
        "--priority",
        "5",
        "--key",
        "k1",
        "--unregistered",
        "--json",
    )
    assert made.exit_code == 0, made.stderr
    job = json.loads(made.stdout)
    assert job["task"] == "add" and job["args"] == [2, 3] and job["queue"] == "math"
    same = json.loads(
        plunder(
            store_url,
            *("enqueue", "add", "[9, 9]", "--key", "k1", "--queue", "math"),
            *("--unregistered", "--json"),
        ).stdout
    )
    assert same["id"] == job["id"]
    kw = json.loads(
        plunder(store_url, "enqueue", "add", '{"a": 1, "b": 2}', "--unregistered", "--json").stdout
    )
    assert kw["kwargs"] == {"a": 1, "b": 2}
    listed = json.loads(plunder(store_url, "jobs", "--json").stdout)
    assert [j["id"] for j in listed["jobs"]] == [kw["id"], job["id"]]
    assert listed["next_after"] is None
    paged = json.loads(plunder(store_url, "jobs", "--limit", "1", "--json").stdout)
    assert paged["next_after"] == kw["id"]
    shown = json.loads(plunder(store_url, "job", str(job["id"]), "--json").stdout)
    assert shown["job"]["status"] == "pending" and shown["runs"] == []
    cancelled = json.loads(plunder(store_url, "cancel", str(job["id"]), "--json").stdout)
    assert cancelled["status"] == "cancelled"
    retried = json.loads(plunder(store_url, "retry", str(job["id"]), "--json").stdout)
    assert retried["status"] == "pending"
    status = json.loads(plunder(store_url, "status", "--json").stdout)
    assert {q["queue"] for q in status["queues"]} == {"math", "default"}
    for human in (["jobs"], ["job", str(job["id"])], ["status"]):
        result = plunder(store_url, *human)
        assert result.exit_code == 0 and result.stdout.strip()


def test_expired_jobs_are_listed_counted_and_retried(store: Store, store_url: str) -> None:
    t0 = store.now()
    (job,) = store.job_enqueue_many([JobSpec("add", [1, 2], expires_in=1)], now=t0)
    lease = store.lease_acquire("janitor", "j", 60, now=t0)
    assert lease is not None
    store.job_expire_many(lease, now=t0 + timedelta(seconds=2))
    listed = json.loads(plunder(store_url, "jobs", "--status", "expired", "--json").stdout)
    assert [j["id"] for j in listed["jobs"]] == [job.id]
    (queue,) = json.loads(plunder(store_url, "status", "--json").stdout)["queues"]
    assert queue["counts"]["expired"] == 1
    table = plunder(store_url, "status").stdout.splitlines()
    row = next(line for line in table if line.startswith("default "))  # the queue's counts
    assert row.split()[1:] == [*"0000001", "-"]  # expired last
    retried = json.loads(plunder(store_url, "retry", str(job.id), "--json").stdout)
    assert retried["status"] == "pending" and retried["expires_at"] is None


def test_enqueue_wait_prints_the_result(store_url: str, worker_thread: None) -> None:
    result = plunder(store_url, "enqueue", "add", "[20, 22]", "--wait", "--wait-timeout", "20")
    assert result.exit_code == 0, result.stderr
    assert result.stdout.strip() == "42"
    failed = plunder(store_url, "enqueue", "fails", '["key"]', "--wait", "--wait-timeout", "20")
    assert "KeyError" in one_line_error(failed)


def test_enqueue_refuses_a_task_no_worker_ever_registered(store_url: str) -> None:
    refused = one_line_error(plunder(store_url, "enqueue", "nobody.runs", "[1]"))
    assert "no worker has registered a task named 'nobody.runs'" in refused
    assert "--unregistered" in refused
    assert json.loads(plunder(store_url, "jobs", "--json").stdout)["jobs"] == []
    made = plunder(store_url, "enqueue", "nobody.runs", "[1]", "--unregistered", "--json")
    assert made.exit_code == 0, made.stderr
    job = json.loads(made.stdout)  # the defaults: nothing says otherwise
    assert (job["queue"], job["max_attempts"], job["timeout"]) == ("default", 4, None)


def test_enqueue_takes_the_published_options_and_flags_override_them(
    store_url: str, worker_thread: None
) -> None:
    """This process's CLI has no task code: the options come from what the worker
    published when its session opened (slow_llm: queue llm, timeout 1, retries 0)."""
    made = plunder(store_url, "enqueue", "slow_llm", "[0]", "--json")
    assert made.exit_code == 0, made.stderr
    job = json.loads(made.stdout)
    assert (job["queue"], job["timeout"], job["max_attempts"]) == ("llm", 1.0, 1)
    assert job["priority"] == 3
    flags = ("--queue", "other", "--timeout", "5", "--retries", "2", "--priority", "0")
    made = plunder(store_url, "enqueue", "slow_llm", "[0]", *flags, "--json")
    assert made.exit_code == 0, made.stderr
    job = json.loads(made.stdout)
    assert (job["queue"], job["timeout"], job["max_attempts"]) == ("other", 5.0, 3)
    assert job["priority"] == 0


def test_status_shows_pending_jobs_no_live_worker_can_run(
    store_url: str, worker_thread: None
) -> None:
    for args in (
        ("nobody.runs", "[1]", "--unregistered"),
        ("nobody.runs", "[2]", "--unregistered"),
        ("add", "[1, 2]", "--queue", "nowhere"),  # a task the worker runs, not its queue
    ):
        assert plunder(store_url, "enqueue", *args).exit_code == 0
    status = json.loads(plunder(store_url, "status", "--json").stdout)
    assert status["unrunnable"] == [
        {"task": "add", "queue": "nowhere", "pending": 1, "require": None, "cost": 1},
        {"task": "nobody.runs", "queue": "default", "pending": 2, "require": None, "cost": 1},
    ]
    human = plunder(store_url, "status")
    assert human.exit_code == 0 and "no live worker can run" in human.stdout
    assert "nobody.runs" in human.stdout


def test_job_follow_prints_the_stream(store_url: str, worker_thread: None) -> None:
    job = tasks.streamer.enqueue(5)
    result = plunder(store_url, "job", str(job.id), "--follow")
    assert result.exit_code == 0
    assert result.stdout.startswith("chunk 0chunk 1")
    assert "succeeded" in result.stderr


def _retried_stream(store_url: str) -> int:
    """A finished job whose first attempt streamed and failed, then its retry streamed."""
    with worker_in_thread(store_url):
        job = tasks.flaky_streamer.enqueue(2)
        assert job.result(timeout=20) == 2
    return job.id


def test_job_follow_prints_clean_text_and_notes_a_new_attempt(store_url: str) -> None:
    job_id = _retried_stream(store_url)
    result = plunder(store_url, "job", str(job_id), "--follow")
    assert result.exit_code == 0, result.stderr
    assert result.stdout == (
        "attempt 1 chunk 0attempt 1 chunk 1\nattempt 2 chunk 0attempt 2 chunk 1\n"
    )
    assert result.stderr.splitlines() == [  # stderr is no terminal: no progress
        "attempt 2 starts over (attempt 1 did not succeed)",
        f"job {job_id} succeeded",
    ]


def test_job_follow_json_is_one_object_per_event(store_url: str) -> None:
    job_id = _retried_stream(store_url)
    result = plunder(store_url, "job", str(job_id), "--follow", "--json")
    assert result.exit_code == 0, result.stderr
    lines = [json.loads(line) for line in result.stdout.splitlines()]
    assert [(e["kind"], e["attempt"]) for e in lines] == [
        *[("chunk", 1), ("chunk", 1), ("progress", 1)],
        ("attempt", 2),
        *[("chunk", 2), ("chunk", 2), ("progress", 2)],
    ]
    assert lines[0]["data"] == "attempt 1 chunk 0"
    assert lines[2]["data"] == {"current": 2, "total": 2}
    assert lines[3]["data"] == {"attempt": 2, "previous": 1}


def _follow_on_a_terminal(url: str, *args: str) -> tuple[str, str]:
    """``plunder job --follow`` with its stderr on a pseudo-terminal: (stdout, stderr)."""
    import os
    import pty

    main_fd, terminal = pty.openpty()
    proc = subprocess.Popen(
        [sys.executable, "-m", "plunder", "--db", url, "job", *args, "--follow"],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=terminal,
        stdin=subprocess.DEVNULL,
    )
    os.close(terminal)
    seen = b""
    while True:
        try:
            chunk = os.read(main_fd, 4096)
        except OSError:  # EIO: the process closed the terminal
            break
        if not chunk:
            break
        seen += chunk
    os.close(main_fd)
    stdout, _ = proc.communicate(timeout=30)
    assert proc.returncode == 0, seen
    return stdout.decode(), seen.decode().replace("\r\n", "\n")


def test_job_follow_shows_progress_as_a_status_on_a_terminal(store_url: str) -> None:
    job_id = _retried_stream(store_url)
    stdout, stderr = _follow_on_a_terminal(store_url, str(job_id))
    assert stdout == "attempt 1 chunk 0attempt 1 chunk 1\nattempt 2 chunk 0attempt 2 chunk 1\n"
    erased = "\b" * len(" [2/2]") + "\x1b[K"
    assert stderr == (
        f" [2/2]{erased}attempt 2 starts over (attempt 1 did not succeed)\n"
        f" [2/2]{erased}job {job_id} succeeded\n"
    )
    quiet = _follow_on_a_terminal(store_url, str(job_id), "--no-progress")
    assert quiet == (
        stdout,
        f"attempt 2 starts over (attempt 1 did not succeed)\njob {job_id} succeeded\n",
    )


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["job", "999999"], "no job 999999"),
        (["cancel", "999999"], "no job 999999"),
        (["enqueue", "add", "[1, 2"], "not valid JSON"),
        (["enqueue", "add", "[NaN]"], "NaN"),
        (["enqueue", "add", "42"], "list or object"),
        (["enqueue", "bad task name!"], "invalid task name"),
        (["enqueue", "add", "[]", "--queue", "a/../b"], "invalid queue name"),
        (["jobs", "--status", "bogus"], "unknown job status"),
        (["worker", "-A", "no_such_module:app"], "cannot import no_such_module"),
        (["worker", "-A", "tests.worker.tasks:add"], "is not a plunder.App"),
    ],
)
def test_user_mistakes_are_one_clear_line(store_url: str, args: list[str], expected: str) -> None:
    assert expected in one_line_error(plunder(store_url, *args))


def test_bad_or_unreachable_databases_are_one_clear_line(tmp_path: Path) -> None:
    assert "invalid database URL" in one_line_error(plunder("nonsense", "status"))
    assert "unsupported database URL scheme" in one_line_error(plunder("mysql://x/y", "status"))
    missing_dir = f"sqlite:///{tmp_path}/no/such/dir/x.db"
    assert "error:" in one_line_error(plunder(missing_dir, "init"))
    refused = "postgresql://nobody@127.0.0.1:1/none?connect_timeout=1"
    assert "error:" in one_line_error(plunder(refused, "status"))


def test_help_lists_every_command() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "plunder", "--help"],
        capture_output=True,
        text=True,
        check=True,
        cwd=ROOT,
    )
    for command in (
        "init",
        "worker",
        "janitor",
        "enqueue",
        "status",
        "jobs",
        "job",
        "cancel",
        "retry",
        "demo",
    ):
        assert command in result.stdout


def test_demo_rescues_the_killed_workers_jobs(store_url: str) -> None:
    result = run_group(
        [sys.executable, "-m", "plunder", "--db", store_url, "demo", "--jobs", "60", "--json"],
        cwd=ROOT,
        timeout=100,  # within the test's own 120 s: a hang shows what the demo wrote
    )
    assert result.returncode == 0, result.stderr
    summary = json.loads(result.stdout)
    assert summary["killed_worker_jobs"] >= 1
    assert summary["rescued"] + summary["lost_on_last_attempt"] == summary["killed_worker_jobs"]
    assert summary["rescued"] >= 1
    assert sum(summary["statuses"].values()) == summary["jobs"] == 60
    assert summary["statuses"].get("pending", 0) == summary["statuses"].get("running", 0) == 0
