"""--log-format: one JSON object a line, a task's lines with its job's fields; text keeps
those fields after the message. A --metrics-port in use is one line of error."""

from __future__ import annotations

import json
import logging
import sys

import pytest
from click.testing import CliRunner

from plunder import cli, logs


def record(message: str, **fields: object) -> logging.LogRecord:
    made = logging.LogRecord("plunder.task.t", logging.INFO, __file__, 1, message, (), None)
    made.__dict__.update(fields)
    return made


def test_a_json_line_carries_the_jobs_fields_and_the_traceback() -> None:
    try:
        raise ValueError("bad")
    except ValueError:
        failed = logging.LogRecord(
            "plunder.task.t", logging.ERROR, __file__, 1, "oops %s", ("x",), sys.exc_info()
        )
    failed.__dict__.update(job_id=7, attempt=2, task="t", queue="q", session="s1")
    line = json.loads(logs.JsonFormatter().format(failed))
    assert line["message"] == "oops x" and line["level"] == "ERROR"
    assert (line["job_id"], line["attempt"], line["task"], line["session"]) == (7, 2, "t", "s1")
    assert "ValueError: bad" in line["exception"]
    assert "job_id" not in json.loads(logs.JsonFormatter().format(record("plain")))


def test_text_lines_name_the_job_after_the_message() -> None:
    text = logs.TextFormatter(logs.TEXT_FORMAT).format(
        record("hello", job_id=7, attempt=1, task="t", queue="q", session="s1")
    )
    assert text.endswith("hello [job_id=7 attempt=1 task=t queue=q session=s1]")


def test_an_unknown_log_format_is_refused_by_name() -> None:
    answer = CliRunner().invoke(cli.main, ["--log-format", "xml", "status"])
    assert answer.exit_code == 2 and "xml" in answer.output
    with pytest.raises(ValueError, match="--log-format must be one of text, json"):
        logs.configure("INFO", "xml")


def test_a_metrics_port_in_use_is_one_clear_error(tmp_path: object) -> None:
    import socket

    from tests.worker import tasks

    with socket.socket() as taken:
        taken.bind(("0.0.0.0", 0))
        taken.listen()
        port = taken.getsockname()[1]
        try:
            answer = CliRunner().invoke(
                cli.main,
                ["--db", f"sqlite:///{tmp_path}/x.db", "worker", "-A", "tests.worker.tasks:app",
                 "--metrics-port", str(port)],
            )  # fmt: skip
        finally:
            tasks.app.close()  # the in-process command opened the shared app's store
    assert answer.exit_code == 1, answer.output
    assert f"cannot serve metrics on 0.0.0.0:{port}" in answer.output


def test_a_busy_database_retried_is_counted(tmp_path: object) -> None:
    import sqlite3
    import threading

    from plunder import tally
    from plunder.model import JobSpec
    from plunder.store import open_store

    url = f"sqlite:///{tmp_path}/busy.db"
    store = open_store(url, busy_timeout=0.05)  # SQLite's own wait short: plunder's retries
    store.migrate()
    counts = tally.enable()
    before = counts.events.get("busy_retries", 0)
    holder = sqlite3.connect(f"{tmp_path}/busy.db", isolation_level=None, check_same_thread=False)
    holder.execute("BEGIN IMMEDIATE")  # the write lock, held for a moment
    release = threading.Timer(0.5, holder.execute, ("COMMIT",))
    release.start()
    try:
        (job_id,) = store.job_enqueue_ids([JobSpec("t", [1])])
    finally:
        release.join()
        holder.close()
        store.close()
    assert job_id >= 1
    assert counts.events.get("busy_retries", 0) > before
