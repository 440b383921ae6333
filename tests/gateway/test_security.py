"""The gateway's keys and scopes, tested as an attacker would: every refusal is a 4xx with
one line, and nothing is written."""

from __future__ import annotations

import time

import httpx

from plunder.model import JobSpec
from plunder.states import Status
from plunder.store import Store
from tests.gateway.conftest import HELLO, Keys, client
from tests.support.gateway import Gateway

CLAIM = {"claim": {"queues": ["default"], "tasks": ["t.echo"], "limit": 5}}


def open_session(http: httpx.Client, hello: dict[str, object] = HELLO) -> str:
    answer = http.post("/v1/sessions", json=hello)
    assert answer.status_code == 201, answer.text
    return str(answer.json()["id"])


def refused(answer: httpx.Response, status: int) -> str:
    assert answer.status_code == status, answer.text
    body = answer.json()
    assert set(body) == {"error", "type"} and "\n" not in body["error"]
    return str(body["error"])


def test_no_key_a_wrong_key_or_a_forged_one_is_refused(gateway: Gateway, keys: Keys) -> None:
    forged = keys.worker[:-4] + "AAAA"
    for key in (None, "plk_nothing", forged, "Basic abc"):
        with client(gateway, key) as http:
            refused(http.post("/v1/sessions", json=HELLO), 401)
    with httpx.Client(base_url=gateway.url, headers={"Authorization": keys.worker}) as http:
        refused(http.post("/v1/sessions", json=HELLO), 401)  # not "Bearer …"


def test_each_role_does_only_what_it_may(gateway: Gateway, keys: Keys, store: Store) -> None:
    job = {"jobs": [{"task": "t.echo", "args": [1]}]}
    with client(gateway, keys.worker) as http:
        refused(http.post("/v1/jobs", json=job), 403)
        refused(http.get("/v1/keys"), 403)
    with client(gateway, keys.reader) as http:
        refused(http.post("/v1/jobs", json=job), 403)
        refused(http.post("/v1/sessions", json=HELLO), 403)
    with client(gateway, keys.producer) as http:
        refused(http.post("/v1/sessions", json=HELLO), 403)
        created = http.post("/v1/jobs", json=job)
        assert created.status_code == 201
        (job_id,) = created.json()["ids"]
    with client(gateway, keys.reader) as http:
        assert http.get(f"/v1/jobs/{job_id}").json()["status"] == "pending"
        refused(http.post(f"/v1/jobs/{job_id}/cancel"), 403)
    with client(gateway, keys.admin) as http:
        assert len(http.get("/v1/keys").json()["keys"]) == 6
    assert store.job_list().jobs[0].id == job_id and len(store.job_list().jobs) == 1


def test_a_session_speaks_only_for_the_key_that_opened_it(
    gateway: Gateway, keys: Keys, store: Store
) -> None:
    (job_id,) = store.job_enqueue_ids([JobSpec("t.echo", [1])])
    with client(gateway, keys.worker) as owner:
        session = open_session(owner)
        jobs = owner.post(f"/v1/sessions/{session}/exchange", json=CLAIM).json()["jobs"]
        job_columns, (job,) = jobs["columns"], jobs["rows"]
    attempt = job[job_columns.index("attempt")]
    claim = {"job_id": job_id, "attempt": attempt, "session_id": session}
    done = {"done": [[job_id, attempt, "forged", []]]}
    other = store.key_create(role="worker")[1]
    for key in (other, keys.admin):  # the right ids, another key
        with client(gateway, key) as thief:
            refused(thief.post(f"/v1/sessions/{session}/exchange", json=done), 404)
            refused(thief.post(f"/v1/sessions/{session}/heartbeat", json={}), 404)
            refused(thief.post(f"/v1/sessions/{session}/close", json={}), 404)
            refused(
                thief.post(
                    f"/v1/sessions/{session}/events",
                    json={"claim": claim, "events": [{"kind": "chunk", "data": "x"}]},
                ),
                404,
            )
            # its own session: the claim it names is its own session's, which is not current
            mine = open_session(thief)
            answer = thief.post(f"/v1/sessions/{mine}/exchange", json=done).json()
            assert answer["completed"] == {"accepted": [], "stale": [[job_id, attempt]]}
    assert store.job_get(job_id).status is Status.RUNNING
    assert store.stream_read(job_id) == []


def test_a_group_owns_its_queues(gateway: Gateway, keys: Keys, store: Store) -> None:
    (default_job,) = store.job_enqueue_ids([JobSpec("t.echo", [1])])
    (llm_job,) = store.job_enqueue_ids([JobSpec("t.gen", [1], queue="llm")])
    gpu_hello = {**HELLO, "queues": ["llm"]}
    with client(gateway, keys.gpu_worker) as gpu:
        refused(gpu.post("/v1/sessions", json=HELLO), 403)  # the default group's queue
        session = open_session(gpu, gpu_hello)
        refused(gpu.post(f"/v1/sessions/{session}/exchange", json=CLAIM), 403)
        llm = {"claim": {"queues": ["llm"], "tasks": ["t.gen"], "limit": 5}}
        claimed = gpu.post(f"/v1/sessions/{session}/exchange", json=llm).json()["jobs"]["rows"]
        assert [row[0] for row in claimed] == [llm_job]
    with client(gateway, keys.worker) as plain:
        refused(plain.post("/v1/sessions", json=gpu_hello), 403)  # the gpu group's queue
    with client(gateway, keys.gpu_producer) as gpu:
        refused(gpu.get(f"/v1/jobs/{default_job}"), 404)  # as for a job that does not exist
        refused(gpu.get("/v1/jobs/999999"), 404)
        assert gpu.get(f"/v1/jobs/{llm_job}").status_code == 200
        refused(gpu.post("/v1/jobs", json={"jobs": [{"task": "t.echo"}]}), 403)
    with client(gateway, keys.producer) as plain:
        missing = refused(plain.get(f"/v1/jobs/{llm_job}"), 404)
        assert missing == refused(plain.get("/v1/jobs/999999"), 404).replace("999999", str(llm_job))
    assert store.job_get(default_job).status is Status.PENDING


def test_bad_input_is_a_4xx_and_writes_nothing(gateway: Gateway, keys: Keys, store: Store) -> None:
    with client(gateway, keys.producer) as http:
        headers = {"Content-Type": "application/json"}
        for body in (
            b"{",
            b'{"jobs": [{"task": "t.echo", "task": "x"}]}',
            b'{"jobs": [{"task": "t.echo", "priority": NaN}]}',
            b'{"jobs": [{"task": "t.echo\\u0000"}]}',
            b'{"jobs": [{"task": "t\x00echo"}]}',
            b'{"jobs": [{"task": "t.echo", "colour": "red"}]}',
            b'{"jobs": [{"task": "t.echo", "priority": "high"}]}',
            b'{"jobs": []}',
            b"[]",
            b"\xff\xfe",
            b"",
        ):
            refused(http.post("/v1/jobs", content=body, headers=headers), 400)
        big = b'{"jobs": [{"task": "t.echo", "args": ["' + b"x" * (17 * 1024 * 1024) + b'"]}]}'
        refused(http.post("/v1/jobs", content=big, headers=headers), 413)
        refused(http.get("/v1/jobs/abc"), 404)
        refused(http.get("/v1/jobs/1/result?wait=-1"), 400)
        refused(http.delete("/v1/jobs/1"), 405)
        refused(http.get("/v1/nothing"), 404)
    assert store.job_list().jobs == ()


def test_failed_authentication_is_rate_limited_per_address(gateway: Gateway, keys: Keys) -> None:
    with client(gateway, "plk_000000000000_wrong") as http:
        statuses = [http.get("/v1/jobs/1").status_code for _ in range(12)]
    assert statuses[:10] == [401] * 10 and statuses[10:] == [429, 429]
    with client(gateway, keys.reader) as http:  # a right key from there waits too
        answer = http.get("/v1/jobs/1")
        refused(answer, 429)
        assert int(answer.headers["Retry-After"]) > 0


def test_a_revoked_key_stops_working_within_a_second(
    gateway: Gateway, keys: Keys, store: Store
) -> None:
    key_id = keys.worker.split("_")[1]
    with client(gateway, keys.worker) as http:
        session = open_session(http)
        assert http.post(f"/v1/sessions/{session}/heartbeat", json={}).json()["alive"]
        _, ended = store.key_revoke(key_id)
        assert ended == [session]
        time.sleep(1.1)
        refused(http.post(f"/v1/sessions/{session}/heartbeat", json={}), 401)
    assert not store.session_heartbeat(session).alive


def test_a_job_list_shows_only_the_queues_a_key_may_read(
    gateway: Gateway, keys: Keys, store: Store
) -> None:
    default_ids = store.job_enqueue_ids([JobSpec("t.echo", [i]) for i in range(3)])
    (llm_job,) = store.job_enqueue_ids([JobSpec("t.gen", [1], queue="llm")])
    with client(gateway, keys.admin) as admin:
        page = admin.get("/v1/jobs", params={"limit": 2}).json()
        assert [j["id"] for j in page["jobs"]] == [llm_job, default_ids[2]]
        rest = admin.get("/v1/jobs", params={"after": page["next_after"]}).json()
        assert [j["id"] for j in rest["jobs"]] == default_ids[1::-1]
        assert rest["next_after"] is None
    with client(gateway, keys.reader) as reader:
        assert "name a queue" in refused(reader.get("/v1/jobs"), 400)
        listed = reader.get("/v1/jobs", params={"queue": "default", "status": "pending"})
        assert [j["id"] for j in listed.json()["jobs"]] == default_ids[::-1]
        refused(reader.get("/v1/jobs", params={"queue": "llm"}), 403)  # the gpu group's
        refused(reader.get("/v1/jobs", params={"queue": "default", "status": "sleepy"}), 400)
        refused(reader.get("/v1/jobs", params={"queue": "default", "limit": 0}), 400)
    with client(gateway, keys.gpu_producer) as gpu:
        assert [j["id"] for j in gpu.get("/v1/jobs?queue=llm").json()["jobs"]] == [llm_job]
        refused(gpu.get("/v1/jobs?queue=default"), 403)
    with client(gateway, keys.worker) as worker:
        refused(worker.get("/v1/jobs?queue=default"), 403)
