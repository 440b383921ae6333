"""The worker's admitter (plunder.admitter): it admits the keys it is given on a thread of
its own, and an error on the way — the store's or not — never ends that thread."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from plunder.admitter import Admitter
from plunder.model import JobSpec, Limit
from plunder.store import Store
from tests.store.helpers import claim, complete, open_session
from tests.worker.conftest import wait_for


def test_the_admitter_survives_an_error_and_admits_the_next_keys(
    store: Store, caplog: pytest.LogCaptureFixture
) -> None:
    store.job_enqueue_many([JobSpec("t", [i], limit=Limit("k", 1)) for i in range(3)])
    session = open_session(store)
    (first,) = claim(store, session)
    assert complete(store, first.claim)  # its place is free; nothing admits on its own
    assert (store.limit_list()[0].admitted, store.limit_list()[0].held) == (0, 2)
    stop = threading.Event()
    admitter = Admitter(store, stop)
    bad: Any = {"x", 3}  # keys that cannot be sorted: a TypeError in the admission
    try:
        admitter.add(bad)
        thread = admitter._thread  # the thread under test
        assert thread is not None
        wait_for(
            lambda: any(r.name == "plunder.admitter" for r in caplog.records),
            what="the error, logged",
        )
        admitter.add(["k"])
        wait_for(lambda: store.limit_list()[0].admitted == 1, what="the admission")
        assert thread.is_alive() and store.limit_list()[0].held == 1
    finally:
        stop.set()
        admitter.wake()
    thread.join(timeout=5)
    assert not thread.is_alive()
