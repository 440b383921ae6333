"""Workflows through a real gateway (on each backend): a graph enqueued by a producer that
holds only a key, in one transaction, run by a remote worker; a workflow read, its edges
read and cancelled, each key seeing only its group's jobs; a parent the key may not see
refused exactly as an unknown one; bad graphs refused with nothing stored."""

from __future__ import annotations

import json
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

import plunder
from plunder import errors
from plunder.graph import Edge, Link
from plunder.model import JobSpec
from plunder.states import Status
from plunder.store import Store
from tests.gateway.conftest import Keys, client
from tests.gateway.test_cli import cli, ok, one_line_error
from tests.gateway.test_remote_worker import remote_worker, serving
from tests.support.flows import run_diamond
from tests.support.gateway import Gateway

UNKNOWN = 10**12  # an id no test reaches


def producer(gateway: Gateway, key: str) -> plunder.App:
    """An App on the gateway with ``key``, that knows the tasks' queues as a producer that
    imports them does (no worker need have published them)."""
    app = plunder.App(gateway.url, key=key)
    app.task(name="gather", queue="llm", retries=0)(lambda tag: tag)
    app.task(name="t.echo", queue="default")(lambda value: value)
    return app


@pytest.fixture
def gpu(gateway: Gateway, keys: Keys) -> Iterator[plunder.App]:
    """A producer of the group "gpu" (queue "llm"), with a key and no database."""
    app = producer(gateway, keys.gpu_producer)
    yield app
    app.close()


def _count(store: Store) -> int:
    return len(store.job_list(limit=1000).jobs)


def _reason(exc: pytest.ExceptionInfo[BaseException], job_id: int) -> str:
    """The refusal's one line without the gateway's URL, the job id made ``N``."""
    return str(exc.value).split(": ", 1)[1].replace(str(job_id), "N")


def test_a_diamond_enqueued_through_the_gateway_runs_on_a_remote_worker(
    gateway: Gateway, keys: Keys, store: Store, gpu: plunder.App, tmp_path: Path
) -> None:
    log = tmp_path / "worker.log"
    worker = remote_worker(gateway, keys.gpu_worker, log, "-c", "4")
    try:
        serving(store, 1)
        ids = run_diamond(gpu, log.read_text)  # enqueued through the gateway
        state = gpu.workflow(ids[3])  # read through the gateway
        assert [job.id for job in state.jobs] == ids
        assert {job.status for job in state.jobs} == {Status.SUCCEEDED}
        assert state.parents(ids[3]) == [ids[1], ids[2]]
        assert state.children(ids[0]) == [ids[1], ids[2]]
        assert state == store.flow_get(ids[3])  # as the database has it
        assert set(gpu.store.edge_list([ids[1]])) == {
            Link(ids[0], ids[1], "skip"), Link(ids[1], ids[3], "skip"),
        }  # fmt: skip
        # a child after a job enqueued before (by id), through the gateway too
        later = plunder.Flow(gpu)
        e = later.add("gather", "e", after=ids[3], on_failure="run")
        assert later.enqueue().job(e).result(timeout=60)[1][0][0] == ids[3]
    finally:
        worker.send_signal(signal.SIGTERM)
        assert worker.wait(timeout=30) == 0, log.read_text()
    assert "Traceback" not in log.read_text()
    assert "Traceback" not in gateway.output()


def test_a_parent_the_key_may_not_see_is_refused_as_an_unknown_one(
    gateway: Gateway, keys: Keys, store: Store, gpu: plunder.App
) -> None:
    other = store.job_enqueue_ids([JobSpec("t.echo", [1], queue="default")])[0]
    before = _count(store)
    refusals = []
    for parent in (other, UNKNOWN):
        flow = plunder.Flow(gpu)
        root = flow.add("gather", "root")
        flow.add("gather", "child", after=[root, parent])
        with pytest.raises(errors.JobNotFound) as refused:
            flow.enqueue()
        refusals.append(_reason(refused, parent))
    assert refusals[0] == refusals[1] == "no job N to wait for (unknown parent)"
    # on the wire too: the same status, type and line
    body = {"jobs": [{"task": "gather", "args": ["x"], "queue": "llm"}],
            "edges": [{"parent": 0, "child": 0, "new": False}]}  # fmt: skip
    answers = []
    with client(gateway, keys.gpu_producer) as http:
        for parent in (other, UNKNOWN):
            body["edges"][0]["parent"] = parent  # type: ignore[index]
            answer = http.post("/v1/jobs", json=body)
            answers.append((answer.status_code, answer.json()["type"],
                            answer.json()["error"].replace(str(parent), "N")))  # fmt: skip
    assert answers[0] == answers[1] == (404, "JobNotFound", "no job N to wait for (unknown parent)")
    assert _count(store) == before  # nothing stored, the jobs before the refusal neither
    assert store.edge_list([other]) == []
    # the key of the parent's group may wait for it
    mine = producer(gateway, keys.producer)
    try:
        flow = plunder.Flow(mine)
        flow.add("t.echo", 2, after=other)
        (child,) = flow.enqueue().ids
        assert store.job_get(child).status is Status.WAITING
        assert store.flow_get(child).parents(child) == [other]
    finally:
        mine.close()


def test_keys_that_may_not_write_there_enqueue_no_workflow(
    gateway: Gateway, keys: Keys, store: Store
) -> None:
    before = _count(store)
    for key, why in ((keys.producer, r"may not use the queue\(s\) llm"),
                     (keys.reader, "a reader key may not"),
                     (keys.gpu_worker, "a worker key may not")):  # fmt: skip
        app = producer(gateway, key)
        try:
            flow = plunder.Flow(app)
            flow.chain(plunder.call("gather", "a"), plunder.call("gather", "b"))
            with pytest.raises(errors.AccessDenied, match=why):
                flow.enqueue()
        finally:
            app.close()
    assert _count(store) == before


@pytest.fixture
def mixed(store: Store) -> tuple[int, int, int, int]:
    """A workflow of two groups, enqueued on the database: A (llm) ─▶ C (llm) ◀─ B
    (default), and C ─▶ D (default). Nothing runs it."""
    specs = [
        JobSpec("gather", ["a"], queue="llm"),
        JobSpec("t.echo", ["b"], queue="default"),
        JobSpec("gather", ["c"], queue="llm"),
        JobSpec("t.echo", ["d"], queue="default"),
    ]
    a, b, c, d = store.flow_enqueue(specs, [Edge(0, 2), Edge(1, 2), Edge(2, 3, "run")])
    return a, b, c, d


def test_each_key_reads_the_part_of_a_workflow_it_may_see(
    gateway: Gateway, keys: Keys, store: Store, gpu: plunder.App, mixed: tuple[int, ...]
) -> None:
    a, b, c, d = mixed
    state = gpu.workflow(c)
    assert [job.id for job in state.jobs] == [a, c]
    assert state.links == (Link(a, c, "skip"),)
    assert gpu.store.edge_list([c]) == [Link(a, c, "skip")]
    admin = producer(gateway, keys.admin)
    reader = producer(gateway, keys.reader)
    try:
        assert admin.workflow(a) == store.flow_get(a)  # an admin key sees every group
        seen = reader.workflow(d)  # the default group's part: B and D, no edge between them
        assert [job.id for job in seen.jobs] == [b, d] and seen.links == ()
        assert reader.store.edge_list([b, d]) == []
        for asked in (a, c):  # a job of another group, as one that does not exist
            with pytest.raises(errors.JobNotFound) as hidden:
                reader.workflow(asked)
            with pytest.raises(errors.JobNotFound) as unknown:
                reader.workflow(UNKNOWN)
            assert _reason(hidden, asked) == _reason(unknown, UNKNOWN) == "no job N"
            with pytest.raises(errors.JobNotFound):
                reader.store.edge_list([asked])
        with pytest.raises(errors.JobNotFound):
            gpu.workflow(b)
    finally:
        admin.close()
        reader.close()


def test_a_workflow_cancelled_through_the_gateway_cancels_what_the_key_may_see(
    gateway: Gateway, keys: Keys, store: Store, gpu: plunder.App, mixed: tuple[int, ...]
) -> None:
    a, b, c, d = mixed
    reader, other = producer(gateway, keys.reader), producer(gateway, keys.producer)
    try:
        with pytest.raises(errors.AccessDenied, match="a reader key may not"):
            reader.cancel_workflow(b)
        with pytest.raises(errors.JobNotFound):  # a job of another group, as unknown
            other.cancel_workflow(a)
    finally:
        reader.close()
        other.close()
    with pytest.raises(errors.JobNotFound):
        gpu.cancel_workflow(b)  # a job of another group names no workflow for this key
    assert {store.job_get(i).status for i in (a, b, c, d)} == {Status.PENDING, Status.WAITING}
    assert gpu.cancel_workflow(c) == [a, c]
    assert gpu.cancel_workflow(a) == []  # nothing left that it may cancel
    assert store.job_get(b).status is Status.PENDING  # of another group: left alone
    # D waits for C with "run": C's cancel released it; B, left to run, ran nothing yet
    assert store.job_get(d).status is Status.PENDING
    assert [store.job_get(i).status for i in (a, c)] == [Status.CANCELLED] * 2


def test_bad_graphs_are_refused_whole_with_one_line(
    gateway: Gateway, keys: Keys, store: Store
) -> None:
    job = {"task": "gather", "args": ["x"], "queue": "llm"}
    cases = [
        ({"jobs": [job, job], "edges": [{"parent": 0, "child": 1}, {"parent": 1, "child": 0}]},
         "the workflow has a cycle"),
        ({"jobs": [job], "edges": [{"parent": 0, "child": 0}]}, "waits for itself"),
        ({"jobs": [job], "edges": [{"parent": 0, "child": 3}]}, "names child 3"),
        ({"jobs": [job], "edges": [{"parent": 0, "child": 0, "why": 1}]}, "unknown field 'why'"),
        ({"jobs": [job], "edges": [{"parent": 2**64, "child": 0, "new": False}]},
         "from 0 to 2**63 - 1"),
        ({"jobs": [job, job], "edges": [{"parent": 0, "child": 1, "on_failure": "hope"}]},
         "on_failure must be one of"),
        ({"jobs": [job, {**job, "key": "k"}], "edges": [{"parent": 0, "child": 1}]},
         "cannot have an idempotency key"),
        ({"jobs": [job], "edges": [], "records": True}, "answers ids only"),
        ({"jobs": [job], "edges": {}}, "'edges' must be a list"),
    ]  # fmt: skip
    before = _count(store)
    with client(gateway, keys.gpu_producer) as http:
        for body, why in cases:
            answer = http.post("/v1/jobs", json=body)
            assert answer.status_code == 400, (body, answer.text)
            assert why in answer.json()["error"], (why, answer.text)
        # edges given, none of them: a workflow of jobs side by side
        made = http.post("/v1/jobs", json={"jobs": [job, job], "edges": []})
        assert made.status_code == 201 and len(made.json()["ids"]) == 2
    assert _count(store) == before + 2
    assert "Traceback" not in gateway.output()


def test_the_command_line_shows_and_cancels_a_workflow_through_the_gateway(
    gateway: Gateway, keys: Keys, store: Store, mixed: tuple[int, ...]
) -> None:
    a, b, c, d = mixed
    shown = json.loads(ok(cli(gateway.url, "job", str(c), "--json", key=keys.gpu_producer)))
    assert (shown["parents"], shown["children"]) == ([a], [])  # B and D: another group's
    shown = json.loads(ok(cli(gateway.url, "job", str(c), "--json", key=keys.admin)))
    assert (sorted(shown["parents"]), shown["children"]) == ([a, b], [d])
    table = ok(cli(gateway.url, "workflow", str(a), key=keys.gpu_producer))
    assert "gather" in table and "t.echo" not in table
    found = json.loads(ok(cli(gateway.url, "workflow", str(a), "--json", key=keys.admin)))
    assert [j["id"] for j in found["jobs"]] == [a, b, c, d] and len(found["edges"]) == 3
    hidden = one_line_error(cli(gateway.url, "workflow", str(b), key=keys.gpu_producer))
    assert f"no job {b}" in hidden
    done = json.loads(
        ok(cli(gateway.url, "workflow", str(a), "--cancel", "--json", key=keys.gpu_producer))
    )
    assert done["cancelled"] == [a, c]
    assert store.job_get(b).status is Status.PENDING


def test_the_workflow_routes_want_a_key_that_may_read_or_write(
    gateway: Gateway, keys: Keys, store: Store, mixed: tuple[int, ...]
) -> None:
    a = mixed[0]
    routes = [("GET", f"/v1/jobs/{a}/workflow"), ("GET", f"/v1/jobs/{a}/edges"),
              ("POST", f"/v1/jobs/{a}/workflow/cancel")]  # fmt: skip
    for key, status in ((None, 401), ("plk_000000000000_nothing", 401), (keys.gpu_worker, 403)):
        with client(gateway, key) as http:
            for method, path in routes:
                answer = http.request(method, path)
                assert answer.status_code == status, (key, path, answer.text)
    with client(gateway, keys.gpu_producer) as http:
        assert http.get("/v1/jobs/0/workflow").status_code == 404
        assert http.get("/v1/jobs/x/edges").status_code == 404
    assert store.job_get(a).status is Status.PENDING  # nothing cancelled
