"""Keys over HTTP (an admin key's): made, listed and revoked through a real gateway; every
other key refused; bad input a 4xx with one line and no key made; a client that leaves
mid-body is one log line, not a server error."""

from __future__ import annotations

import socket
import time
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path

import httpx

from plunder.store import Store
from tests.gateway.conftest import HELLO, Keys, client
from tests.gateway.test_security import open_session, refused
from tests.support import gateway as support
from tests.support.gateway import Gateway
from tests.worker.conftest import wait_for

LEFT = "the client left before its body ended"


def key_id(secret: str) -> str:
    return secret.split("_")[1]


def test_an_admin_key_makes_lists_and_revokes_keys(
    gateway: Gateway, keys: Keys, store: Store
) -> None:
    new = {"role": "worker", "group": "farm", "queues": ["q1", "q2", "q1"], "expires": "30d",
           "name": "box-7"}  # fmt: skip
    with client(gateway, keys.admin) as admin:
        made = admin.post("/v1/keys", json=new)
        assert made.status_code == 201, made.text
        assert made.headers["cache-control"] == "no-store"
        secret, record = made.json()["secret"], made.json()["key"]
        assert record["id"] == key_id(secret) and record["queues"] == ["q1", "q2"]
        assert (record["role"], record["group"], record["name"]) == ("worker", "farm", "box-7")
        stored = store.key_get(record["id"])
        assert stored is not None and stored.expires_at is not None
        assert stored.expires_at - stored.created_at == timedelta(days=30)
        assert store.queue_groups() == {"llm": "gpu", "q1": "farm", "q2": "farm"}
        listed = admin.get("/v1/keys").json()["keys"]
        assert record in listed and len(listed) == 7
        assert not any("secret" in k or "secret_hash" in k for k in listed)
        short = admin.post("/v1/keys", json={"role": "reader", "expires": 90}).json()["key"]
        stored = store.key_get(short["id"])
        assert stored is not None and stored.expires_at is not None
        assert stored.expires_at - stored.created_at == timedelta(seconds=90)
    task = {"name": "t.echo", "queue": "q1", "pool": "thread", "options": {}}
    farm_hello = {**HELLO, "queues": ["q1"], "tasks": [task]}
    with client(gateway, secret) as worker:
        session = open_session(worker, farm_hello)
        with client(gateway, keys.admin) as admin:
            revoked = admin.post(f"/v1/keys/{record['id']}/revoke")
            assert revoked.status_code == 200, revoked.text
            assert revoked.json()["sessions_ended"] == [session]
            assert revoked.json()["key"]["revoked_at"] is not None
            refused(admin.post("/v1/keys/000000000000/revoke"), 404)
            refused(admin.post("/v1/keys/not-a-key/revoke"), 404)
        # refused at once by the gateway that revoked it (elsewhere: within a second)
        refused(worker.post(f"/v1/sessions/{session}/heartbeat", json={}), 401)
    assert not store.session_heartbeat(session).alive


def test_only_admin_keys_manage_keys(gateway: Gateway, keys: Keys, store: Store) -> None:
    before = store.key_list()
    target = key_id(keys.worker)
    for key in (keys.worker, keys.producer, keys.reader, keys.gpu_producer, keys.gpu_worker):
        with client(gateway, key) as http:
            for answer in (
                http.get("/v1/keys"),
                http.post("/v1/keys", json={"role": "admin"}),
                http.post(f"/v1/keys/{target}/revoke"),
            ):
                assert "manage keys" in refused(answer, 403)
    with client(gateway, None) as http:
        refused(http.post("/v1/keys", json={"role": "admin"}), 401)
    assert store.key_list() == before


def test_a_bad_new_key_is_a_4xx_with_one_line_and_makes_nothing(
    gateway: Gateway, keys: Keys, store: Store
) -> None:
    before, groups = store.key_list(), store.queue_groups()
    bodies = [
        b'{"role": "boss"}',
        b'{"role": "worker", "expires": "soon"}',
        b'{"role": "worker", "expires": -1}',
        b'{"role": "worker", "expires": 0}',
        b'{"role": "worker", "expires": "0d"}',
        b'{"role": "worker", "expires": 1e300}',
        b'{"role": "worker", "expires": "99999999999w"}',
        b'{"role": "worker", "expires": true}',
        b'{"role": "worker", "expires": NaN}',
        b'{"role": "worker", "queues": ["a b"]}',
        b'{"role": "worker", "queues": "a"}',
        b'{"role": "worker", "queues": [1]}',
        b'{"role": "worker", "group": "x y"}',
        b'{"role": "worker", "group": "farm", "queues": ["llm"]}',  # the gpu group's
        b'{"role": "worker", "role": "admin"}',
        b'{"role": "worker", "colour": "red"}',
        b'{"role": "worker", "name": "' + b"n" * 201 + b'"}',
        b'{"role": "worker", "name": "a\\u0000b"}',
        b'{"role": "worker", "name": "a\\ud800b"}',
        b'{"role": "worker", "name": "a\\nb"}',
        b'{"group": "farm"}',
        b'["worker"]',
        b"{",
        b"",
    ]
    with client(gateway, keys.admin) as admin:
        for raw in bodies:
            answer = admin.post(
                "/v1/keys", content=raw, headers={"Content-Type": "application/json"}
            )
            assert answer.status_code == 400, (raw, answer.text)
            refused(answer, 400)
    assert store.key_list() == before and store.queue_groups() == groups


def test_a_key_revoked_on_one_gateway_stops_working_on_another_within_a_second(
    gateway: Gateway, keys: Keys, store: Store, tmp_path: Path
) -> None:
    other = support.start(gateway.db, tmp_path)
    try:
        with client(other, keys.worker) as worker:
            session = open_session(worker)  # the other gateway holds the key now
            with client(gateway, keys.admin) as admin:
                answer = admin.post(f"/v1/keys/{key_id(keys.worker)}/revoke")
                assert answer.json()["sessions_ended"] == [session]
            revoked_at = time.monotonic()

            def refused_there() -> bool:
                beat = worker.post(f"/v1/sessions/{session}/heartbeat", json={})
                return beat.status_code == 401

            wait_for(refused_there, timeout=3, what="the revoked key refused")
            assert time.monotonic() - revoked_at < 1.5
    finally:
        other.stop()


def left_mid_body(gateway: Gateway, path: str, key: str) -> None:
    """A request that announces 1000 bytes of body, sends 10, and closes."""
    host, port = gateway.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as raw:
        raw.sendall(
            f"POST {path} HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer {key}\r\n"
            "Content-Type: application/json\r\nContent-Length: 1000\r\n\r\n"
            '{"jobs": ['.encode()
        )


def logged(gateway: Gateway, text: str) -> Callable[[], bool]:
    return lambda: text in gateway.output()


def test_a_client_that_leaves_mid_body_is_one_log_line_not_a_server_error(
    gateway: Gateway, keys: Keys, store: Store
) -> None:
    for path, key in (("/v1/jobs", keys.producer), ("/v1/keys", keys.admin),
                      ("/v1/sessions", keys.worker)):  # fmt: skip
        left_mid_body(gateway, path, key)
        wait_for(logged(gateway, f"POST {path}: {LEFT}"), what="the log line")
    log = gateway.output()
    assert log.count(LEFT) == 3, log
    assert "Traceback" not in log and " failed" not in log, log
    assert httpx.get(gateway.url + "/v1/health").status_code == 200
    assert store.job_list().jobs == () and store.session_list() == []
