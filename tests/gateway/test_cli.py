"""The command line through a gateway, as real processes: ``--db http://… --key …`` (or
PLUNDER_KEY) reaches the gateway with the key for every command that can work there;
keys made, listed and revoked with an admin key; every other command one line saying it
needs the database."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from plunder.states import Status
from plunder.store import Store
from tests.gateway.conftest import Keys
from tests.gateway.test_remote_worker import remote_worker, serving
from tests.support.gateway import ROOT, Gateway, env_without_database


def cli(
    url: str, *args: str, key: str | None = None, env_key: str | None = None
) -> subprocess.CompletedProcess[str]:
    """``plunder --db url [--key key] ARGS`` in a process of its own; ``env_key``: the key
    in PLUNDER_KEY instead."""
    env = env_without_database()
    if env_key is not None:
        env["PLUNDER_KEY"] = env_key
    keyed = [] if key is None else ["--key", key]
    return subprocess.run(
        [sys.executable, "-m", "plunder", "--db", url, *keyed, *args],
        capture_output=True, text=True, cwd=ROOT, env=env, timeout=60, check=False,
    )  # fmt: skip


def ok(done: subprocess.CompletedProcess[str]) -> str:
    assert done.returncode == 0, (done.stdout, done.stderr)
    assert "Traceback" not in done.stderr
    return done.stdout


def one_line_error(done: subprocess.CompletedProcess[str]) -> str:
    assert done.returncode == 1, (done.returncode, done.stdout, done.stderr)
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), done.stderr
    return lines[0]


def test_an_admin_key_makes_lists_and_revokes_keys_through_a_gateway(
    gateway: Gateway, keys: Keys, store: Store
) -> None:
    create = ["keys", "create", "--role", "worker", "--group", "farm", "--queues", "q1,q2",
              "--expires", "12h", "--name", "box-7", "--json"]  # fmt: skip
    made = json.loads(ok(cli(gateway.url, *create, key=keys.admin)))
    assert made["secret"].startswith(f"plk_{made['id']}_")
    assert (made["role"], made["group"], made["queues"]) == ("worker", "farm", ["q1", "q2"])
    stored = store.key_get(made["id"])
    assert stored is not None and stored.name == "box-7" and stored.expires_at is not None
    plain = ok(cli(gateway.url, "keys", "create", "--role", "reader", env_key=keys.admin))
    assert plain.strip().startswith("plk_") and len(plain.splitlines()) == 1
    listed = json.loads(ok(cli(gateway.url, "keys", "list", "--json", env_key=keys.admin)))
    assert {k["id"] for k in listed} == {k.id for k in store.key_list()}
    assert made["id"] in ok(cli(gateway.url, "keys", "list", key=keys.admin))
    revoked = json.loads(
        ok(cli(gateway.url, "keys", "revoke", made["id"], "--json", key=keys.admin))
    )
    assert revoked["revoked_at"] is not None and revoked["sessions_ended"] == []
    assert "revoked" in ok(cli(gateway.url, "keys", "revoke", made["id"], key=keys.admin))
    stored = store.key_get(made["id"])
    assert stored is not None and stored.revoked_at is not None
    missing = one_line_error(cli(gateway.url, "keys", "revoke", "0" * 12, key=keys.admin))
    assert "no key" in missing


def test_keys_with_another_key_or_none_are_one_line(
    gateway: Gateway, keys: Keys, store: Store
) -> None:
    before = store.key_list()
    for key in (keys.producer, keys.worker, keys.reader):
        for command in (["list"], ["create", "--role", "admin"], ["revoke", key.split("_")[1]]):
            line = one_line_error(cli(gateway.url, "keys", *command, key=key))
            assert "may not manage keys (only an admin key may)" in line
    assert "needs an API key" in one_line_error(cli(gateway.url, "keys", "list"))
    assert store.key_list() == before


def test_a_producer_through_a_gateway_with_its_key(
    gateway: Gateway, keys: Keys, store: Store, tmp_path: Path
) -> None:
    """enqueue (--wait), job (--follow), cancel, retry, jobs: the key reaches the gateway from
    --key and from PLUNDER_KEY, and the gateway store takes every option the CLI gives."""
    worker = remote_worker(gateway, keys.gpu_worker, tmp_path / "worker.log", "-c", "2")
    try:
        serving(store, 1)
        words = ["enqueue", "words", '["a b c"]', "--wait"]
        answer = ok(cli(gateway.url, *words, key=keys.gpu_producer))
        assert json.loads(answer) == "A B C"
        words = ["enqueue", "words", '["x y"]', "--json"]
        made = json.loads(ok(cli(gateway.url, *words, env_key=keys.gpu_producer)))
        followed = cli(gateway.url, "job", str(made["id"]), "--follow", key=keys.gpu_producer)
        assert ok(followed) == "xy\n" and f"job {made['id']} succeeded" in followed.stderr
        shown = json.loads(
            ok(cli(gateway.url, "job", str(made["id"]), "--json", env_key=keys.gpu_producer))
        )
        assert shown["job"]["result"] == "X Y" and len(shown["runs"]) == 1
    finally:
        worker.terminate()
        worker.wait(timeout=30)
    hold = ["enqueue", "hold", "[0]", "--json"]
    later = json.loads(ok(cli(gateway.url, *hold, key=keys.gpu_producer)))
    job_id = str(later["id"])
    assert "cancelled" in ok(cli(gateway.url, "cancel", job_id, key=keys.gpu_producer))
    assert "pending" in ok(cli(gateway.url, "retry", job_id, env_key=keys.gpu_producer))
    ok(cli(gateway.url, "cancel", job_id, "--json", key=keys.gpu_producer))
    assert store.job_get(int(job_id)).status is Status.CANCELLED
    denied = one_line_error(cli(gateway.url, "cancel", job_id, key=keys.reader))
    assert "reader key may not" in denied
    listed = json.loads(ok(cli(gateway.url, "jobs", "--json", key=keys.admin)))
    assert [j["id"] for j in listed["jobs"]] == [int(job_id), made["id"], made["id"] - 1]
    mine = ok(cli(gateway.url, "jobs", "--queue", "llm", env_key=keys.gpu_producer))
    assert "hold" in mine and "words" in mine
    assert "name a queue" in one_line_error(cli(gateway.url, "jobs", key=keys.gpu_producer))
    other = one_line_error(cli(gateway.url, "jobs", "--queue", "default", key=keys.gpu_producer))
    assert "may not use the queue(s) default" in other


@pytest.mark.parametrize(
    "command",
    [["status"], ["init"], ["janitor"], ["serve"], ["demo"]],
    ids=lambda c: c[0],
)
def test_what_needs_the_database_says_so_in_one_line(command: list[str]) -> None:
    line = one_line_error(cli("http://127.0.0.1:9", *command, key="plk_000000000000_x"))
    assert f"plunder {command[0]} needs the database itself, not a gateway" in line
