"""The one declaration of the job's options and columns (plunder.store.columns): it agrees
with the records (JobSpec, JobRecord, plunder.task.Options) and with every list of job
columns and insert parameters in both dialects' SQL."""

from __future__ import annotations

import dataclasses
import random
import re
from datetime import UTC, datetime

import pytest

from plunder import errors
from plunder.model import JobRecord, JobSpec
from plunder.states import Status
from plunder.store import columns, queries
from plunder.task import SPEC_OPTIONS, Options

DIALECTS = ("sqlite", "postgres")
# a list of job columns in the SQL: what a SELECT or a RETURNING reads of a job
JOB_LIST = re.compile(
    r"\b(?:SELECT|RETURNING)\s+(id\s*,\s*queue\s*,\s*task\s*,\s*args(?:\s*,\s*\w+)*)"
)
INSERT = re.compile(r"INSERT INTO plunder_jobs \(([^)]*)\)")
PARAM = {
    "sqlite": re.compile(r"(?<![:\w]):([A-Za-z_]\w*)"),
    "postgres": re.compile(r"%\((\w+)\)s"),
}


def code(sql: str) -> str:
    return re.sub(r"--[^\n]*", "", sql)


def names(text: str) -> list[str]:
    return [name.strip() for name in text.split(",")]


def test_the_columns_are_the_records_fields_of_the_kinds_their_types_say() -> None:
    kinds = {c.name: (c.kind, c.nullable) for c in columns.COLUMNS}
    assert list(kinds) == [f.name for f in dataclasses.fields(JobRecord)]
    assert {name for name, (kind, _) in kinds.items() if kind == columns.JSON} == {
        "args", "kwargs", "result", "error",
    }  # fmt: skip
    assert {name for name, (kind, _) in kinds.items() if kind == columns.TIME} == {
        "run_at", "created_at", "started_at", "finished_at", "deadline_at", "expires_at",
    }  # fmt: skip
    assert kinds["retry_on_lost"] == kinds["retry_on_timeout"] == (columns.FLAG, False)
    assert kinds["failed_sessions"] == (columns.NAMES, False)
    assert kinds["status"] == (columns.STATUS, False)
    assert kinds["timeout"] == (columns.PLAIN, True) and kinds["id"] == (columns.PLAIN, False)
    with pytest.raises(TypeError, match=r"JobRecord\.odd: no column kind"):
        columns._column("odd", set[int])


def test_the_options_are_the_specs_and_the_tasks() -> None:
    spec_fields = [f.name for f in dataclasses.fields(JobSpec)]
    declared = {o.name for o in columns.OPTIONS} | set(columns.OWN) | set(columns.ROUTING)
    assert declared == set(spec_fields)
    assert spec_fields[:3] == ["task", "args", "kwargs"]
    # a task's limit and rate make one Limit, the spec's limit
    task_fields = [f.name for f in dataclasses.fields(Options) if f.name != "rate"]
    assert [("max_attempts" if n == "retries" else n) for n in task_fields] == list(SPEC_OPTIONS)
    record = {f.name for f in dataclasses.fields(JobRecord)}
    assert all(o.column in record or o.column in columns.UNSHOWN for o in columns.OPTIONS)
    assert [o.column for o in columns.RELATIVE] == ["run_at", "expires_at"]


@pytest.mark.parametrize("dialect", DIALECTS)
def test_every_list_of_job_columns_in_the_sql_is_the_declaration(dialect: str) -> None:
    found = {}
    for name, sql in queries.load(dialect).items():
        for listed in JOB_LIST.findall(code(sql)):
            found.setdefault(name, []).append(names(listed))
    # every read of jobs: a job by id or key, a page, cancel, retry and the claim
    assert {"job_get", "job_get_active_by_keys", "job_list", "job_cancel", "job_retry"} <= set(
        found
    )
    assert any(name.startswith("job_claim") for name in found)
    for name, lists in found.items():
        for listed in lists:
            assert listed == list(columns.NAMES_OF_COLUMNS), name


@pytest.mark.parametrize("dialect", DIALECTS)
@pytest.mark.parametrize("query", ["job_insert", "job_insert_mixed"])
def test_the_inserts_bind_the_declared_options_into_their_columns(dialect: str, query: str) -> None:
    sql = code(queries.load(dialect)[query])
    params = set(PARAM[dialect].findall(sql))
    assert params == {o.name for o in columns.OPTIONS} | set(columns.OWN) | {"seq", "now"}
    (inserted,) = INSERT.findall(sql)
    assigned = {"created_at"} | ({"id"} if dialect == "sqlite" else set())
    assert set(names(inserted)) == {o.column for o in columns.OPTIONS} | set(columns.OWN) | assigned
    if dialect == "postgres":  # what it returns: what _fresh reads besides the inputs
        (returned,) = re.findall(r"RETURNING\s+(\w+(?:\s*,\s*\w+)*)", sql)
        assert set(columns.ASSIGNED) <= set(names(returned))


def row(job_id: int) -> dict[str, object]:
    now = datetime(2026, 1, 1, tzinfo=UTC)
    return {
        "id": job_id, "queue": "q", "task": "t", "args": "[1]", "kwargs": '{"a":2}',
        "priority": 3, "status": "running", "attempt": 1, "max_attempts": 4, "timeout": 9.5,
        "backoff_base": 1.0, "backoff_cap": 2.0, "retry_on_timeout": False, "key": "k",
        "run_at": now, "created_at": now, "started_at": now, "finished_at": None,
        "deadline_at": None, "session_id": "s", "result": None, "error": '{"type":"E"}',
        "failed_sessions": ["x"], "losses": 1, "retry_on_lost": True, "expires_at": None,
        "limit_key": "openai", "affinity": "{gpu=a100}", "require": None, "cost": 2,
    }  # fmt: skip


def read(order: list[str], rows: list[dict[str, object]]) -> list[JobRecord]:
    def fail(value: object) -> datetime:
        raise AssertionError(f"{value!r} was read as a datetime already")

    return columns.read_jobs(order, [[r[n] for n in order] for r in rows], fail, list)


def test_rows_are_read_by_column_name_in_any_order() -> None:
    rows = [row(1), row(2)]
    order = list(rows[0])
    decoded = {"args": [1], "kwargs": {"a": 2}, "status": Status.RUNNING,
               "error": {"type": "E"}, "failed_sessions": ("x",)}  # fmt: skip
    expected = [JobRecord(**{**r, **decoded}) for r in rows]  # type: ignore[arg-type]
    assert read(order, rows) == expected
    shuffled = order[:]
    random.Random(7).shuffle(shuffled)
    assert read([*shuffled, "run_worker"], [{**r, "run_worker": "w"} for r in rows]) == expected
    with pytest.raises(errors.StoreError, match=r"lack the column\(s\) cost"):
        read(order[:-1], rows)


def test_sqlite_values_are_converted_by_kind() -> None:
    sqlite = {**row(1), "run_at": 0.5, "created_at": 0.5, "started_at": 1.0,
              "retry_on_timeout": 0, "retry_on_lost": 1, "failed_sessions": '["x"]'}  # fmt: skip
    order = list(sqlite)

    def time(value: object) -> datetime:
        assert isinstance(value, float)
        return datetime.fromtimestamp(value, UTC)

    (job,) = columns.read_jobs(order, [list(sqlite.values())], time, lambda v: ["x"])
    assert job.run_at == job.created_at == datetime.fromtimestamp(0.5, UTC)
    assert job.finished_at is None and job.retry_on_timeout is False
    assert job.retry_on_lost is True and job.failed_sessions == ("x",)
