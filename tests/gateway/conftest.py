"""A real gateway process per test, on each backend, and keys of every role."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from plunder.store import Store
from tests.support import gateway as support


@dataclass
class Keys:
    admin: str
    worker: str  # of the default group, every queue
    producer: str
    reader: str
    gpu_worker: str  # of the group "gpu", which owns the queue "llm"
    gpu_producer: str


@pytest.fixture
def gateway(store_url: str, tmp_path: Path) -> Iterator[support.Gateway]:
    started = support.start(store_url, tmp_path)
    try:
        yield started
    finally:
        started.stop()


@pytest.fixture
def keys(store: Store) -> Keys:
    def make(role: str, **options: object) -> str:
        return store.key_create(role=role, **options)[1]  # type: ignore[arg-type]

    return Keys(
        admin=make("admin"),
        worker=make("worker"),
        producer=make("producer"),
        reader=make("reader"),
        gpu_worker=make("worker", group="gpu", queues=["llm"]),
        gpu_producer=make("producer", group="gpu", queues=["llm"]),
    )


def client(gateway: support.Gateway, key: str | None) -> httpx.Client:
    headers = {} if key is None else {"Authorization": f"Bearer {key}"}
    return httpx.Client(base_url=gateway.url, headers=headers, timeout=30)


HELLO = {
    "name": "remote",
    "host": "elsewhere",
    "pid": 7,
    "queues": ["default"],
    "tasks": [{"name": "t.echo", "queue": "default", "pool": "thread", "options": {}}],
    "expiry": 5,
}
