"""The sample Django project on SQLite and PostgreSQL, as its users run it: manage.py
migrate, runserver and plunder_worker as real processes; a worker SIGKILLed mid-task."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest

pytest.importorskip("django")

from tests.integrations import shop
from tests.support import pgcluster

EXPIRY = 2.0  # the shop's session expiry in these tests (PLUNDER_SESSION_EXPIRY)
JANITOR = 1.0  # the default janitor interval


def test_a_killed_worker_s_task_finishes_once_elsewhere(empty_url: str, tmp_path: Path) -> None:
    outcome = shop.kill_test(empty_url, tmp_path, expiry=EXPIRY, limit=60)
    assert outcome.finished and outcome.status == "succeeded", outcome
    assert outcome.starts == 2 and outcome.running_left == 0, outcome
    # rescued within the session expiry plus one janitor interval, with room for a loaded
    # machine's scheduling (the figure itself is in docs/guide/django.md)
    assert outcome.seconds < EXPIRY + JANITOR + 5, outcome


def test_the_shop_s_views(empty_url: str, tmp_path: Path) -> None:
    env = shop.shop_env(empty_url)
    shop.manage(env, "migrate", "--verbosity", "0")
    port = pgcluster.free_port()
    log = tmp_path / "shop.log"
    server = shop.start(env, "runserver", "--noreload", f"127.0.0.1:{port}", log=log)
    worker = None
    try:
        base = f"http://127.0.0.1:{port}"
        with httpx.Client(base_url=base, timeout=30) as client:

            def up() -> bool:
                try:
                    return client.get("/jobs/0/").status_code >= 0
                except httpx.TransportError:
                    return False

            shop.wait_for(up, 60, "runserver answers")
            refused = client.post("/orders/", json={"item": "tea", "quantity": 1, "fail": True})
            assert refused.status_code == 402
            placed = client.post("/orders/", json={"item": "tea", "quantity": 2})
            assert placed.status_code == 201
            job = placed.json()["job"]
            # the refused order's job rolled back with it: only the placed order's exists
            out = shop.manage(env, "plunder", "jobs", "--json")
            assert [str(j["id"]) for j in json.loads(out)["jobs"]] == [job]
            counting = shop.enqueue(
                env, "from orders.tasks import count_to\nresult = count_to.enqueue(3)"
            )
            worker = shop.start(env, "plunder_worker", "-c", "2", log=log)
            with client.stream("GET", f"/jobs/{counting}/stream") as response:
                lines = [line for line in response.iter_lines() if line.startswith("data: ")]
            assert lines == ["data: 1", "data: 2", "data: 3", 'data: "succeeded"']
            shop.wait_for(
                lambda: client.get(f"/jobs/{job}/").json()["status"] == "SUCCESSFUL", 60, "receipt"
            )
            body = client.get(f"/jobs/{job}/").json()
            assert body == {
                "status": "SUCCESSFUL",
                "attempts": 1,
                "return_value": "receipt for 2 x tea (attempt 1)",
            }
    finally:
        for process in (server, worker):
            if process is not None:
                process.terminate()
                process.wait(30)
