"""``plunder partitions Q N --ordered`` and ``plunder ordered``: a queue declared ordered,
its keys listed, a key stopped by a failed job released; a bad key is one line."""

from __future__ import annotations

import json

from plunder.model import ErrorInfo, Failure, JobSpec
from plunder.store import Store
from tests.acceptance.test_cli import one_line_error, plunder
from tests.store.helpers import open_session


def test_an_ordered_queue_is_declared_and_a_stopped_key_released(
    store_url: str, store: Store
) -> None:
    declared = plunder(store_url, "partitions", "q", "2", "--ordered", "stop")
    assert declared.exit_code == 0, declared.stderr
    store.partition_counts(fresh=0)
    made = store.job_enqueue_many(
        [JobSpec("t", [i], queue="q", partition_key="a") for i in range(3)]
    )
    session = open_session(store)
    (head,) = store.job_claim_many(session.id, queues=["q~0", "q~1"], tasks=["t"], limit=5)
    store.job_fail_many([Failure(head.claim, ErrorInfo("E", "boom"), None)])
    (row,) = json.loads(plunder(store_url, "ordered", "--json").stdout)
    assert (row["key"], row["stopped"], row["failed_job"], row["pending"]) == (
        "q~a",
        True,
        made[0].id,
        2,
    )
    assert "stopped by failed job" in plunder(store_url, "ordered").stdout
    released = plunder(store_url, "ordered", "release", "q~a")
    assert released.exit_code == 0 and "released" in released.stdout
    (row,) = json.loads(plunder(store_url, "ordered", "--json").stdout)
    assert row["stopped"] is False
    (admitted,) = store.job_claim_many(session.id, queues=["q~0", "q~1"], tasks=["t"], limit=5)
    assert admitted.id == made[1].id


def test_a_bad_ordered_key_or_mode_is_one_line(store_url: str) -> None:
    assert "no ordered key" in one_line_error(plunder(store_url, "ordered", "release", "x"))
    refused = plunder(store_url, "partitions", "--ordered", "stop")
    assert "QUEUE and COUNT" in one_line_error(refused)
