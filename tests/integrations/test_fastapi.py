"""The FastAPI example on SQLite and PostgreSQL, driven with httpx through its ASGI
transport, inside the app's lifespan: an order and its job commit together or not at all, and
a job's stream comes back as server-sent events. Jobs run by plunder.testing."""

from __future__ import annotations

import asyncio
import importlib
import sys
from collections.abc import Iterator
from types import ModuleType

import pytest

pytest.importorskip("fastapi")

import httpx

from plunder import testing
from tests.docs.helpers import ROOT


@pytest.fixture
def example(empty_url: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[ModuleType]:
    monkeypatch.setenv("ORDERS_DB", empty_url)
    monkeypatch.syspath_prepend(str(ROOT / "examples"))
    sys.modules.pop("fastapi_orders", None)
    module = importlib.import_module("fastapi_orders")
    try:
        yield module
    finally:
        module.jobs.close()
        module.engine.dispose()
        sys.modules.pop("fastapi_orders", None)


def test_orders_and_their_jobs_commit_together_and_stream(example: ModuleType) -> None:
    asyncio.run(drive(example))


async def drive(example: ModuleType) -> None:
    transport = httpx.ASGITransport(app=example.api)
    async with (
        example.api.router.lifespan_context(example.api),
        httpx.AsyncClient(transport=transport, base_url="http://shop") as client,
    ):
        refused = await client.post("/orders", json={"item": "tea", "quantity": 2, "fail": True})
        assert refused.status_code == 402
        placed = await client.post("/orders", json={"item": "tea", "quantity": 2})
        assert placed.status_code == 201
        job_id = placed.json()["job"]
        pending = testing.enqueued(example.jobs)
        assert [(j.id, j.args) for j in pending] == [(job_id, [placed.json()["order"], "tea", 2])]
        ran = await asyncio.to_thread(testing.run_until_idle, example.jobs)
        assert ran.succeeded == [job_id]
        answer = await client.get(f"/jobs/{job_id}/events")
        assert answer.headers["content-type"].startswith("text/event-stream")
        data = [line for line in answer.text.splitlines() if line.startswith(("event:", "data:"))]
        assert data == [
            "event: chunk",
            'data: "tea 1/2"',
            "event: chunk",
            'data: "tea 2/2"',
            "event: end",
            'data: "succeeded"',
        ]
