"""S29: hostile and malformed input through the Python API and the command line, on both
backends.

Whatever is sent, plunder answers with its own clear error naming what was wrong (the
command line: a non-zero exit and one line on stderr, never a traceback), stores nothing of
a refused call, leaves the schema alone, runs none of the SQL it was handed (``pg_sleep``
would show in the call time), matches LIKE wildcards literally, and does the same on SQLite
and PostgreSQL. Every table below runs on both backends with one expected outcome.

Out of reach of the command line: NUL cannot be passed in an argument (the operating system
ends the string there), so NUL reaches it only as the JSON escape ``\\u0000``; and an
argument is at most 128 KiB, below the 1 MiB payload limit, so oversized payloads are
exercised through the Python API.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import plunder
from plunder import errors, payload
from plunder.model import Completion, JobSpec
from plunder.states import Status
from plunder.store import Store, open_store
from plunder.worker import Worker, WorkerOptions
from tests.conftest import _pg_database, _pg_drop
from tests.store.helpers import claim, complete, open_session, raw_connect
from tests.support import pgcluster

ROOT = Path(__file__).resolve().parents[2]
QUICK = 5.0  # seconds: every answer here is much faster; pg_sleep(5) could not be
TABLES = ("plunder_jobs", "plunder_runs", "plunder_events", "plunder_sessions", "plunder_leases")
MIB = 1024 * 1024

app = plunder.App()  # configured per test with the test's database


@app.task(name="hostile.echo")
def echo(*args: Any, **kwargs: Any) -> Any:
    return [list(args), kwargs]


def nested(depth: int) -> list[Any]:
    value: list[Any] = []
    for _ in range(depth - 1):
        value = [value]
    return value


RESULTS: dict[str, Any] = {
    "nan": math.nan,
    "infinity": [1.0, math.inf],
    "lone-surrogate": {"text": "a\ud800b"},
    "surrogate-key": {"\udcff": 1},
    "5000-digits": 10**5000,
    "deep": nested(100_000),
    "over-1-MiB": "x" * (MIB + 1),
    "object": {"x": object()},
}


@app.task(name="hostile.ret", retries=0)
def ret(kind: str) -> Any:
    if kind == "nul":
        return {"a\x00b": "c\x00d"}
    return RESULTS[kind]


class Hostile(Exception):
    pass


class Unprintable(Exception):
    def __str__(self) -> str:
        raise RuntimeError("no text for this exception")


@app.task(name="hostile.raise", retries=0)
def raise_(kind: str) -> None:
    if kind == "surrogate":
        raise Hostile("bad \udcff text")
    if kind == "nul":
        raise Hostile("a\x00b")
    if kind == "huge":
        raise Hostile("\x01" * (2 * MIB))
    if kind == "markup":
        raise Hostile("[/x] :thumbs_up: [red]")
    raise Unprintable()


@app.task(name="hostile.log", retries=0)
def log_(ctx: plunder.Context, kind: str) -> str:
    if kind == "surrogate":
        ctx.logger.info("bad \udcff text")
    else:  # 300 lines of control characters: six bytes of JSON each
        for _ in range(300):
            ctx.logger.info("\x01" * 5000)
    return kind


@app.task(name="hostile.stream", retries=0)
def stream_(ctx: plunder.Context, kind: str) -> str:
    data: list[Any] = [1]
    if kind == "nan":
        ctx.stream([math.nan])
    ctx.stream(data)
    data.append(object())  # changed after it was streamed
    return kind


# -- the store's state ----------------------------------------------------------------------
def snapshot(url: str) -> dict[str, Any]:
    """The schema (tables, columns, indexes), the row count of every table and a
    fingerprint of every job row."""
    conn = raw_connect(url)
    try:
        if url.startswith("sqlite"):
            schema = conn.execute(
                "SELECT m.type, m.name, p.name, p.type FROM sqlite_master m "
                "LEFT JOIN pragma_table_info(m.name) p ORDER BY m.name, p.cid"
            ).fetchall()
        else:
            schema = (
                conn.execute(
                    "SELECT table_name, column_name, data_type FROM information_schema.columns "
                    "WHERE table_schema = 'public' ORDER BY table_name, ordinal_position"
                ).fetchall()
                + conn.execute(
                    "SELECT indexname, indexdef FROM pg_indexes WHERE schemaname = 'public' "
                    "ORDER BY indexname"
                ).fetchall()
            )
        counts = [conn.execute(f"SELECT count(*) FROM {t}").fetchone()[0] for t in TABLES]
        rows = conn.execute("SELECT * FROM plunder_jobs ORDER BY id").fetchall()
        return {
            "schema": [tuple(r) for r in schema],
            "counts": counts,
            "jobs": hashlib.sha256(repr([tuple(r) for r in rows]).encode()).hexdigest(),
        }
    finally:
        conn.close()


def assert_ours(exc: BaseException) -> None:
    """Raised by plunder's own checks: never a driver's error, nor one translated from it."""
    assert type(exc).__module__ in ("builtins", "plunder.errors"), repr(exc)
    assert not isinstance(exc, UnicodeError | errors.StoreError), repr(exc)
    assert str(exc)


@contextmanager
def refused(url: str, error: type[BaseException], match: str) -> Iterator[None]:
    """The block raises ``error`` matching ``match``, quickly, and the store is unchanged."""
    before = snapshot(url)
    started = time.monotonic()
    with pytest.raises(error, match=match) as caught:
        yield
    assert time.monotonic() - started < QUICK
    assert_ours(caught.value)
    assert snapshot(url) == before


@pytest.fixture
def seeded_url(store_url: str) -> str:
    """A store holding a pending job, a finished one with its run, and a session."""
    store = open_store(store_url)
    try:
        store.job_enqueue_many(
            [
                JobSpec("hostile.echo", ["kept", "nul\x00inside"], {"k": 1}, key="seed"),
                JobSpec("hostile.echo", ["done"], queue="alpha"),
            ]
        )
        session = open_session(store, queues=["alpha"], tasks=["hostile.echo"])
        (job,) = claim(store, session, tasks=["hostile.echo"], queues=["alpha"])
        assert complete(store, job.claim, {"ok": True})
    finally:
        store.close()
    return store_url


@pytest.fixture
def hostile_app(seeded_url: str) -> Iterator[plunder.App]:
    app.configure(
        url=seeded_url,
        heartbeat_interval=0.1,
        session_expiry=1.0,
        poll_interval=0.05,
        janitor_interval=0.1,
    )
    try:
        assert app.store  # opened (and migrated) before anything is measured
        yield app
    finally:
        app.close()


# -- the corpus -----------------------------------------------------------------------------
INJECTION = {
    "or-1-1": "' OR '1'='1",
    "drop-table": "'; DROP TABLE plunder_jobs;--",
    "comment": "alpha' --",
    "notify": '"; NOTIFY x; --',
    "percent": "%",
    "underscore": "_",
    "pg-sleep": "1; SELECT pg_sleep(5)",
    "nul": "alpha\x00beta",
    "cyrillic-a": "\u0430lpha",
    "empty": "",
    "very-long": "q" * 5000,
    "lone-surrogate": "alpha\udcff",
    "newline": "alpha\nbeta",
    "markup": "[/x]",
}
LEGAL_TASK_NAMES = {"underscore"}  # "_" is a task name like any other; matched literally


@pytest.mark.parametrize("case", sorted(INJECTION))
def test_hostile_queue_names_are_refused_everywhere(
    hostile_app: plunder.App, seeded_url: str, case: str
) -> None:
    name = INJECTION[case]
    store = hostile_app.store
    calls: list[Callable[[], object]] = [
        lambda: store.job_enqueue_many([JobSpec("hostile.echo", [1]), JobSpec("t", queue=name)]),
        lambda: hostile_app.enqueue("hostile.echo", [1], queue=name),
        lambda: echo.options(queue=name).enqueue(1),
        lambda: echo.options(queue=name).enqueue_many([(1,), (2,)]),
    ]
    for call in calls:
        with refused(seeded_url, errors.InvalidName, "invalid queue name"):
            call()


@pytest.mark.parametrize("case", sorted(set(INJECTION) - LEGAL_TASK_NAMES))
def test_hostile_task_names_are_refused_everywhere(
    hostile_app: plunder.App, seeded_url: str, case: str
) -> None:
    name = INJECTION[case]
    store = hostile_app.store
    calls: list[Callable[[], object]] = [
        lambda: store.job_enqueue_many([JobSpec("hostile.echo", [1]), JobSpec(name)]),
        lambda: hostile_app.enqueue(name, [1]),
        lambda: plunder.App(seeded_url).task(name=name)(echo.fn),
    ]
    for call in calls:
        with refused(seeded_url, errors.InvalidName, "invalid task name"):
            call()


def test_wildcard_names_match_literally(hostile_app: plunder.App) -> None:
    store = hostile_app.store
    under = hostile_app.enqueue("_", [1], queue="a_b", allow_unregistered=True)
    other = hostile_app.enqueue("x", [2], queue="a1b", allow_unregistered=True)
    assert store.job_get(under.id).task == "_"
    assert [j.id for j in store.job_list(task="_").jobs] == [under.id]
    assert [j.id for j in store.job_list(queue="a_b").jobs] == [under.id]
    assert [j.id for j in store.job_list(queue="a1b").jobs] == [other.id]
    for pattern in ("%", "a%", "a_", "_", "%b", "' OR '1'='1"):
        assert store.job_list(queue=pattern).jobs == ()


PRINTABLE_KEYS = [v for k, v in INJECTION.items() if v.isprintable() and 0 < len(v) <= 256]
BAD_KEYS = {
    "empty": "",
    "nul": "k\x00",
    "newline": "k\nk",
    "lone-surrogate": "k\udcff",
    "257-chars": "k" * 257,
    "not-text": 42,
}


def test_hostile_keys_are_stored_as_literals(hostile_app: plunder.App) -> None:
    store = hostile_app.store
    ids = {}
    for key in PRINTABLE_KEYS:
        first = echo.options(key=key).enqueue(1)
        again = hostile_app.enqueue("hostile.echo", [2], key=key)
        (third,) = store.job_enqueue_many([JobSpec("hostile.echo", [3], key=key)])
        assert first.id == again.id == third.id, key  # one active job per key
        assert store.job_get(first.id).key == key
        assert store.job_get(first.id).args == [1]
        ids[key] = first.id
    assert len(set(ids.values())) == len(PRINTABLE_KEYS)  # no wildcard matched another key
    for lookalike in ("a", "x", "alpha", "alpha'", "alpha' -"):
        assert echo.options(key=lookalike).enqueue(0).id not in ids.values()


@pytest.mark.parametrize("case", sorted(BAD_KEYS))
def test_bad_keys_are_refused_everywhere(
    hostile_app: plunder.App, seeded_url: str, case: str
) -> None:
    key = BAD_KEYS[case]
    calls: list[Callable[[], object]] = [
        lambda: echo.options(key=key).enqueue(1),
        lambda: echo.options(key=key).enqueue_many([(1,), (2,)]),
        lambda: hostile_app.enqueue("hostile.echo", [1], key=key),
        lambda: hostile_app.store.job_enqueue_many([JobSpec("t", [1]), JobSpec("t", key=key)]),
    ]
    for call in calls:
        with refused(seeded_url, errors.InvalidName, "invalid idempotency key"):
            call()


PAYLOADS: dict[str, tuple[Any, str]] = {
    "nan": (math.nan, "JSON-serializable"),
    "infinity": (math.inf, "JSON-serializable"),
    "-infinity-deep-inside": ({"a": [1, {"b": -math.inf}]}, "JSON-serializable"),
    "lone-surrogate": ("a\ud800", "not valid Unicode"),
    "surrogate-key": ({"\udcff": 1}, "not valid Unicode"),
    "5000-digits": (10**5000, "JSON-serializable"),
    "100k-nesting": (nested(100_000), "nested"),
    "201-nesting": (nested(payload.MAX_NESTING + 1), "nested"),
    "over-1-MiB": ("x" * MIB, "limit"),
    "over-1-MiB-escaped": ("\x01" * (MIB // 6 + 1), "limit"),  # \u0001 is six bytes
    "bytes": (b"bytes", "JSON-serializable"),
    "set": ({1, 2}, "JSON-serializable"),
}


@pytest.mark.parametrize("case", sorted(PAYLOADS))
def test_hostile_payloads_are_refused_everywhere(
    hostile_app: plunder.App, seeded_url: str, case: str
) -> None:
    value, why = PAYLOADS[case]
    calls: list[Callable[[], object]] = [
        lambda: echo.enqueue(value),
        lambda: echo.enqueue(1, k=value),
        lambda: echo.options(priority=3, key="fresh").enqueue(value),
        lambda: echo.enqueue_many([(1,), (value,), {"k": 2}]),  # one bad call: none stored
        lambda: hostile_app.enqueue("hostile.echo", [value]),
        lambda: hostile_app.enqueue("hostile.echo", [], {"k": value}),
        lambda: hostile_app.store.job_enqueue_many(
            [JobSpec("hostile.echo", [1]), JobSpec("hostile.echo", [], {"k": [value]})]
        ),
    ]
    for call in calls:
        with refused(seeded_url, errors.PayloadError, why):
            call()


@pytest.mark.parametrize(
    ("args", "kwargs", "why"),
    [
        ({"a": 1}, None, "must be a list or tuple, not dict"),
        ("abc", None, "must be a list or tuple, not str"),
        (42, None, "must be a list or tuple, not int"),
        (None, None, "must be a list or tuple, not NoneType"),
        ([1], [("a", 1)], "must be a dict, not list"),
        ([1], "ab", "must be a dict, not str"),
    ],
)
def test_wrong_argument_types_are_refused_not_converted(
    hostile_app: plunder.App, seeded_url: str, args: Any, kwargs: Any, why: str
) -> None:
    with refused(seeded_url, errors.PayloadError, why):
        hostile_app.enqueue("hostile.echo", args, kwargs)


def test_nul_is_kept_and_stored_the_same_on_both_backends(
    hostile_app: plunder.App, seeded_url: str
) -> None:
    args = ["a\x00b", {"\x00": "\x00"}]
    jobs = [
        echo.enqueue(*args, **{"k\x00": "v\x00"}),
        hostile_app.enqueue("hostile.echo", args, {"k\x00": "v\x00"}),
    ]
    for job in jobs:
        record = hostile_app.job(job.id).record
        assert record.args == args and record.kwargs == {"k\x00": "v\x00"}
    conn = raw_connect(seeded_url)
    try:
        stored = conn.execute(
            "SELECT args, kwargs FROM plunder_jobs WHERE id = " + str(jobs[0].id)
        ).fetchone()
    finally:
        conn.close()
    assert tuple(stored) == ('["a\\u0000b",{"\\u0000":"\\u0000"}]', '{"k\\u0000":"v\\u0000"}')


ODD_IDS: dict[str, Any] = {
    "negative": -1,
    "zero": 0,
    "over-int64": 2**63,
    "20-digits": 99999999999999999999,
    "text": "abc",
    "numeric-text": "1",
    "injection": "1; SELECT pg_sleep(5)",
    "float": 1.5,
    "bool": True,
    "none": None,
}


@pytest.mark.parametrize("case", sorted(ODD_IDS))
def test_odd_job_ids_are_refused_everywhere(
    hostile_app: plunder.App, seeded_url: str, case: str
) -> None:
    job_id = ODD_IDS[case]
    store = hostile_app.store
    for call in (
        hostile_app.job,
        store.job_get,
        store.job_runs,
        store.job_cancel,
        store.job_retry,
        store.stream_read,
        # after=None is the first page, not an id
        *(() if job_id is None else (lambda i: store.job_list(after=i),)),
    ):
        with refused(seeded_url, ValueError, "job id must be an integer from 1 to"):
            call(job_id)


def test_unknown_ids_and_wrong_states_are_clear_errors(
    hostile_app: plunder.App, seeded_url: str
) -> None:
    store = hostile_app.store
    for call in (hostile_app.job, store.job_get, store.job_cancel, store.job_retry):
        with refused(seeded_url, errors.JobNotFound, "no job 9223372036854775807"):
            call(2**63 - 1)
    pending = store.job_list(status="pending").jobs[0]
    with refused(seeded_url, errors.InvalidTransition, str(pending.id)):
        store.job_retry(pending.id)


HOSTILE_LIMITS: dict[str, Any] = {
    "negative": -1,
    "zero": 0,
    "1001": 1001,
    "10**9": 10**9,
    "text": "10",
    "float": 1.5,
    "bool": True,
    "none": None,
}


@pytest.mark.parametrize("case", sorted(HOSTILE_LIMITS))
def test_hostile_limits_are_refused(hostile_app: plunder.App, seeded_url: str, case: str) -> None:
    limit = HOSTILE_LIMITS[case]
    store = hostile_app.store
    with refused(seeded_url, ValueError, "limit must be an integer from 1 to 1000"):
        store.job_list(limit=limit)
    if case != "1001":  # a page of stream events may be longer
        with refused(seeded_url, ValueError, "limit must be an integer from 1 to 10000"):
            store.stream_read(1, limit=limit)


@pytest.mark.parametrize("case", sorted(INJECTION))
def test_hostile_list_filters_match_nothing_or_are_refused(
    hostile_app: plunder.App, seeded_url: str, case: str
) -> None:
    value = INJECTION[case]
    store = hostile_app.store
    before = snapshot(seeded_url)
    started = time.monotonic()
    assert store.job_list(queue=value).jobs == ()  # a literal: no job is in such a queue
    assert store.job_list(task=value).jobs == ()
    assert store.job_list(queue="alpha", task=value).jobs == ()
    assert time.monotonic() - started < QUICK
    with refused(seeded_url, errors.InvalidName, "unknown job status"):
        store.job_list(status=value)
    assert snapshot(seeded_url) == before


# -- results, errors, logs and streams that cannot be stored -----------------------------------
@contextmanager
def running_worker() -> Iterator[threading.Thread]:
    worker = Worker(app, WorkerOptions(concurrency=2))
    thread = threading.Thread(target=worker.run, kwargs={"install_signals": False}, daemon=True)
    thread.start()
    try:
        yield thread
    finally:
        worker.stop()
        thread.join(timeout=15)
        assert not thread.is_alive()


@pytest.mark.timeout(90)
def test_unstorable_task_output_fails_that_job_only(
    hostile_app: plunder.App, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A result that cannot be stored fails its job with an error naming it; an exception,
    a log line or a stream event a database cannot take is still recorded; the worker keeps
    running throughout."""
    # The task's own lines stay in its run: pytest-xdist cannot ship a lone surrogate in a
    # captured log from its worker process (a stderr handler would print it escaped).
    monkeypatch.setattr(logging.getLogger("plunder.task"), "propagate", False)
    with running_worker() as thread:
        results = {kind: ret.enqueue(kind) for kind in RESULTS}
        kinds = ("surrogate", "nul", "huge", "markup", "x")
        raised = {kind: raise_.enqueue(kind) for kind in kinds}
        logged = {kind: log_.enqueue(kind) for kind in ("surrogate", "control")}
        streamed = {kind: stream_.enqueue(kind) for kind in ("nan", "changed")}
        nul = ret.enqueue("nul")
        for kind, job in results.items():
            with pytest.raises(plunder.JobFailed, match=r"result of hostile\.ret") as caught:
                job.result(timeout=30)
            assert caught.value.error_type == "plunder.errors.PayloadError", kind
            assert len(job.runs) == 1
        messages = {}
        for kind, job in raised.items():
            with pytest.raises(plunder.JobFailed) as caught:
                job.result(timeout=30)
            assert caught.value.status == "failed", kind
            messages[kind] = caught.value.error["message"]
        assert messages["surrogate"] == "bad \\udcff text"
        assert messages["nul"] == "a\x00b"
        assert messages["huge"].startswith("\x01" * 100) and "characters cut" in messages["huge"]
        assert messages["markup"] == "[/x] :thumbs_up: [red]"
        assert "str() failed" in messages["x"]
        for kind, job in logged.items():
            assert job.result(timeout=30) == kind
            logs = job.runs[0].logs
            assert logs and len(json.dumps(logs)) < MIB, kind
        assert "bad \\udcff text" in logged["surrogate"].runs[0].logs[-1]
        with pytest.raises(plunder.JobFailed, match="stream data is not JSON-serializable"):
            streamed["nan"].result(timeout=30)
        assert streamed["changed"].result(timeout=30) == "changed"
        assert [e.data for e in streamed["changed"].stream(timeout=10)] == [[1]]
        assert nul.result(timeout=30) == {"a\x00b": "c\x00d"}
        assert echo.enqueue("still", "working").result(timeout=30) == [["still", "working"], {}]
        assert thread.is_alive()


@pytest.mark.parametrize("kind", sorted(RESULTS))
def test_completing_with_an_unstorable_result_writes_nothing(
    seeded_url: str, store: Store, kind: str
) -> None:
    session = open_session(store)
    (job,) = claim(store, session, tasks=["hostile.echo"])
    with refused(seeded_url, errors.PayloadError, f"result of job {job.id}"):
        store.job_complete_many([Completion(job.claim, RESULTS[kind])])
    assert store.job_get(job.id).status == Status.RUNNING
    assert complete(store, job.claim, "fine")  # the claim is still good


# -- a short fuzz of enqueue payloads, both backends side by side -----------------------------
@pytest.fixture
def both_stores(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[list[Store]]:
    cluster: pgcluster.Cluster = request.getfixturevalue("pg_cluster")
    name = _pg_database(cluster, request.getfixturevalue("pg_template"))
    sqlite = open_store(f"sqlite:///{tmp_path / 'fuzz.db'}")
    sqlite.migrate()
    postgres = open_store(cluster.url(name))
    try:
        yield [sqlite, postgres]
    finally:
        sqlite.close()
        postgres.close()
        _pg_drop(cluster, name)


def huge(digits: int) -> int:
    return 10 ** abs(digits) * (1 if digits > 0 else -1)


text = st.text(st.characters(exclude_categories=()), max_size=20) | st.sampled_from(
    ["\x00", "a\x00b", "\ud800", "\udfff\ud83d", "\U0001f600", "\u0430lpha", "' OR '1'='1"]
)
json_ish = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.sampled_from([2**63, -(2**63) - 1])
    | st.sampled_from([4299, 4300, -5000]).map(huge)  # repr() of such an int fails
    | st.floats()
    | text,
    lambda children: st.lists(children, max_size=4) | st.dictionaries(text, children, max_size=4),
    max_leaves=12,
) | st.integers(payload.MAX_NESTING - 2, payload.MAX_NESTING + 2).map(nested)


def outcome(store: Store, value: Any) -> tuple[str, Any]:
    before = store.job_list(limit=1000).jobs
    try:
        (job,) = store.job_enqueue_many([JobSpec("hostile.echo", [value], {"k": value})])
    except errors.PayloadError as exc:
        assert store.job_list(limit=1000).jobs == before  # nothing half-stored
        return "refused", str(exc)
    record = store.job_get(job.id)
    assert record.args == [value] and record.kwargs == {"k": value}
    return "stored", payload.encode(record.args)


@pytest.mark.timeout(60)
@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(value=json_ish)
def test_fuzzed_payloads_are_stored_exactly_or_refused_alike(
    both_stores: list[Store], value: Any
) -> None:
    sqlite, postgres = both_stores
    assert outcome(sqlite, value) == outcome(postgres, value)


# -- the command line -----------------------------------------------------------------------
def cli(url: str, *args: str | bytes) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        [sys.executable, "-m", "plunder", "--db", url, *args],
        capture_output=True,
        stdin=subprocess.DEVNULL,
        cwd=ROOT,
        timeout=60,
        check=False,
    )


def one_line_error(result: subprocess.CompletedProcess[bytes]) -> str:
    stderr = result.stderr.decode("utf-8", "replace")
    assert result.returncode != 0, result.stdout
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert len(lines) == 1, stderr
    assert "Traceback" not in stderr and "Traceback" not in result.stdout.decode(errors="replace")
    return lines[0]


def cli_json(result: subprocess.CompletedProcess[bytes]) -> Any:
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


E = "hostile.echo"
CLI_REFUSED: dict[str, tuple[list[str | bytes], str]] = {
    # malformed JSON
    "truncated-list": (["enqueue", E, "[1, 2"], "ARGS_JSON is not valid JSON"),
    "truncated-object": (["enqueue", E, '{"a": '], "ARGS_JSON is not valid JSON"),
    "truncated-string": (["enqueue", E, '["abc'], "ARGS_JSON is not valid JSON"),
    "empty-json": (["enqueue", E, ""], "ARGS_JSON is not valid JSON"),
    "single-quotes": (["enqueue", E, "{'a': 1}"], "ARGS_JSON is not valid JSON"),
    "top-level-string": (["enqueue", E, '"text"'], "must be a JSON list or object"),
    "top-level-number": (["enqueue", E, "3.5"], "must be a JSON list or object"),
    "top-level-null": (["enqueue", E, "null"], "must be a JSON list or object"),
    "top-level-bool": (["enqueue", E, "true"], "must be a JSON list or object"),
    "nan": (["enqueue", E, "NaN"], "NaN is not allowed"),
    "infinity": (["enqueue", E, '{"x": Infinity}'], "Infinity is not allowed"),
    "-infinity": (["enqueue", E, "[1, [-Infinity]]"], "-Infinity is not allowed"),
    "duplicate-keys": (["enqueue", E, '{"queue": "a", "queue": "b"}'], "'queue' appears more"),
    "100k-nesting": (["enqueue", E, "[" * 100_000], "nested too deeply"),
    "60k-nesting": (["enqueue", E, "[" * 60_000 + "]" * 60_000], "nested too deeply"),
    "201-nesting": (["enqueue", E, "[" * 201 + "]" * 201], "nested more than 200 levels"),
    "5000-digits": (["enqueue", E, "[" + "9" * 5000 + "]"], "Exceeds the limit"),
    "invalid-utf-8": (["enqueue", E, b'["\xff\xfe"]'], "not valid Unicode"),
    "utf-8-surrogate": (["enqueue", E, b'["\xed\xa0\x80"]'], "not valid Unicode"),
    "escaped-surrogate": (["enqueue", E, '["\\ud800"]'], "not valid Unicode"),
    "surrogate-key": (["enqueue", E, '{"\\udfff": 1}'], "not valid Unicode"),
    "task-invalid-utf-8": (["enqueue", b"echo\xff", "[]"], "invalid task name"),
    "markup-task": (["enqueue", "[/x]", "[]"], "invalid task name '[/x]'"),
    "emoji-code-task": (["enqueue", ":thumbs_up:", "[]"], "invalid task name ':thumbs_up:'"),
    # options
    "bad-priority": (["enqueue", E, "[]", "--priority", "99999999999"], "priority must be"),
    "nan-delay": (["enqueue", E, "[]", "--delay", "nan"], "delay must be finite"),
    "inf-timeout": (["enqueue", E, "[]", "--timeout", "inf"], "timeout must be finite"),
    "key-too-long": (["enqueue", E, "[]", "--key", "k" * 257], "invalid idempotency key"),
    "key-empty": (["enqueue", E, "[]", "--key", ""], "invalid idempotency key"),
    "key-tab": (["enqueue", E, "[]", "--key", "a\tb"], "invalid idempotency key"),
    "key-invalid-utf-8": (["enqueue", E, "[]", "--key", b"k\xff"], "invalid idempotency key"),
    # listing
    "limit-negative": (["jobs", "--limit", "-1"], "Invalid value for '--limit'"),
    "limit-zero": (["jobs", "--limit", "0"], "Invalid value for '--limit'"),
    "limit-10**9": (["jobs", "--limit", "1000000000"], "Invalid value for '--limit'"),
    "limit-text": (["jobs", "--limit", "1; SELECT pg_sleep(5)"], "Invalid value for '--limit'"),
    "after-text": (["jobs", "--after", "abc"], "Invalid value for '--after'"),
    "after-negative": (["jobs", "--after", "-1"], "job id must be an integer"),
    "after-huge": (["jobs", "--after", "99999999999999999999"], "job id must be an integer"),
    "status-injection": (["jobs", "--status", "x' OR 1=1"], "unknown job status"),
    "status-wildcard": (["jobs", "--status", "%"], "unknown job status"),
    "status-sleep": (["jobs", "--status", "1; SELECT pg_sleep(5)"], "unknown job status"),
    "unknown-option": (["jobs", "--order", "id;DROP"], "No such option"),
}
for command in ("job", "cancel", "retry"):
    CLI_REFUSED |= {
        f"{command}-text": ([command, "abc"], "Invalid value for 'JOB_ID'"),
        f"{command}-negative": ([command, "-1"], "No such option"),
        f"{command}-zero": ([command, "0"], "job id must be an integer"),
        f"{command}-20-digits": ([command, "99999999999999999999"], "job id must be an integer"),
        f"{command}-sleep": ([command, "1; SELECT pg_sleep(5)"], "Invalid value for 'JOB_ID'"),
        f"{command}-missing": ([command, "424242"], "no job 424242"),
        f"{command}-none": ([command], "Missing argument 'JOB_ID'"),
    }
for case, value in INJECTION.items():
    if "\x00" in value:
        continue  # an argument cannot hold NUL
    CLI_REFUSED[f"queue-{case}"] = (["enqueue", E, "[]", "--queue", value], "invalid queue name")
    if case not in LEGAL_TASK_NAMES:
        CLI_REFUSED[f"task-{case}"] = (["enqueue", value, "[]"], "invalid task name")


@pytest.mark.parametrize("case", sorted(CLI_REFUSED))
def test_cli_refuses_hostile_input_in_one_line(seeded_url: str, case: str) -> None:
    args, expected = CLI_REFUSED[case]
    before = snapshot(seeded_url)
    started = time.monotonic()
    line = one_line_error(cli(seeded_url, *args))
    assert time.monotonic() - started < QUICK
    assert expected in line, line
    assert snapshot(seeded_url) == before


@pytest.mark.parametrize("case", sorted(INJECTION))
def test_cli_hostile_list_filters_match_nothing(seeded_url: str, case: str) -> None:
    value = INJECTION[case]
    if "\x00" in value:
        pytest.skip("an argument cannot hold NUL (the Python API test covers it)")
    before = snapshot(seeded_url)
    for option in ("--queue", "--task"):
        started = time.monotonic()
        listed = cli_json(cli(seeded_url, "jobs", option, value, "--json"))
        assert time.monotonic() - started < QUICK
        assert listed == {"jobs": [], "next_after": None}
    assert snapshot(seeded_url) == before


def test_cli_stores_odd_but_legal_input_exactly(seeded_url: str) -> None:
    """NUL as a JSON escape, the largest argument the system allows, a task named ``_`` and
    keys made of SQL and wildcards: accepted, stored exactly, matched literally."""
    nul = cli_json(cli(seeded_url, "enqueue", E, '["a\\u0000b", {"\\u0000": 1}]', "--json"))
    assert nul["args"] == ["a\x00b", {"\x00": 1}]
    big = "x" * 130_000  # an argument is at most 128 KiB
    assert cli_json(cli(seeded_url, "enqueue", E, json.dumps([big]), "--json"))["args"] == [big]
    under = cli_json(cli(seeded_url, "enqueue", "_", "[]", "--unregistered", "--json"))
    assert under["task"] == "_"
    listed = cli_json(cli(seeded_url, "jobs", "--task", "_", "--json"))
    assert [j["id"] for j in listed["jobs"]] == [under["id"]]
    ids = set()
    for key in PRINTABLE_KEYS:
        made = cli_json(cli(seeded_url, "enqueue", E, "[1]", "--key", key, "--json"))
        again = cli_json(cli(seeded_url, "enqueue", E, "[2]", "--key", key, "--json"))
        assert made["key"] == key and again["id"] == made["id"] and again["args"] == [1]
        ids.add(made["id"])
    assert len(ids) == len(PRINTABLE_KEYS)
    store = open_store(seeded_url)
    try:
        assert store.job_get(nul["id"]).args == ["a\x00b", {"\x00": 1}]
        assert store.job_get(under["id"]).task == "_"
    finally:
        store.close()


def test_cli_prints_stored_markup_and_emoji_codes_as_text(seeded_url: str) -> None:
    made = cli_json(
        cli(seeded_url, "enqueue", E, '["[/x]", ":thumbs_up:"]', "--key", "[red]k", "--json")
    )
    shown = cli(seeded_url, "job", str(made["id"]))
    assert shown.returncode == 0, shown.stderr
    out = shown.stdout.decode()
    assert "['[/x]', ':thumbs_up:']" in out and "[red]k" in out
