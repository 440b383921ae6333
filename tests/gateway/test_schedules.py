"""Schedules over HTTP (an admin key's): listed, paused and resumed through a real gateway
on both backends; every other key refused; an unknown schedule a 404 with one line."""

from __future__ import annotations

from plunder.cron import ScheduleSpec
from plunder.store import Store
from tests.gateway.conftest import Keys, client
from tests.gateway.test_security import refused
from tests.support.gateway import Gateway


def test_an_admin_key_lists_pauses_and_resumes_schedules(
    gateway: Gateway, keys: Keys, store: Store
) -> None:
    store.schedule_upsert(
        ScheduleSpec("nightly", "report", "30 2 * * *", timezone="Europe/Paris", args=[1])
    )
    with client(gateway, keys.admin) as admin:
        (listed,) = admin.get("/v1/schedules").json()["schedules"]
        assert (listed["name"], listed["cron"], listed["timezone"], listed["args"]) == (
            "nightly", "30 2 * * *", "Europe/Paris", [1],
        )  # fmt: skip
        assert listed["paused"] is False and listed["next_at"].endswith("+00:00")
        paused = admin.post("/v1/schedules/nightly/pause")
        assert paused.status_code == 200, paused.text
        assert paused.json()["schedule"]["paused"] is True
        assert store.schedule_get("nightly").paused
        resumed = admin.post("/v1/schedules/nightly/resume").json()["schedule"]
        assert resumed["paused"] is False and not store.schedule_get("nightly").paused
        assert "no schedule 'nobody'" in refused(admin.post("/v1/schedules/nobody/pause"), 404)
        assert "no schedule" in refused(admin.post("/v1/schedules/a%20b/resume"), 404)
    for key in (keys.worker, keys.producer, keys.reader):
        with client(gateway, key) as other:
            assert "manage schedules" in refused(other.get("/v1/schedules"), 403)
            refused(other.post("/v1/schedules/nightly/pause"), 403)
    assert not store.schedule_get("nightly").paused
