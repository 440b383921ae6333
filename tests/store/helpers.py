"""Small helpers shared by the store contract tests."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Callable, Sequence
from datetime import datetime, timedelta
from typing import Any

import pytest

from plunder.model import Claim, Completion, JobRecord, JobSpec, Session, TaskInfo
from plunder.store import Store
from plunder.store.driver import CLAIM_LEVELS


def open_session(
    store: Store,
    *,
    queues: Sequence[str] = ("default",),
    expiry: float = 30.0,
    name: str = "worker-1",
    tasks: Sequence[str] = ("t",),
    free_slots: int = 4,
    now: datetime | None = None,
) -> Session:
    """A session as a worker opens one: serving ``tasks`` (published on its first queue)
    with ``free_slots``."""
    queue = queues[0] if queues else "default"
    return store.session_open(
        name=name,
        host="host-a",
        pid=4242,
        queues=list(queues),
        expiry=expiry,
        tasks=[TaskInfo(task, queue, "thread", {}) for task in tasks],
        free_slots=free_slots,
        now=now,
    )


def enqueue(store: Store, *specs: JobSpec, now: datetime | None = None) -> list[JobRecord]:
    return store.job_enqueue_many(list(specs), now=now)


def claim(
    store: Store,
    session: Session,
    *,
    limit: int = 10,
    tasks: Sequence[str] = ("t",),
    queues: Sequence[str] = ("default",),
    now: datetime | None = None,
) -> list[JobRecord]:
    return store.job_claim_many(
        session.id, queues=list(queues), tasks=list(tasks), limit=limit, now=now
    )


def complete(store: Store, claim_: Claim, result: Any = None, now: datetime | None = None) -> bool:
    """True when the completion was accepted."""
    ack = store.job_complete_many([Completion(claim_, result)], now=now)
    return claim_ in ack.accepted


def later(t: datetime, seconds: float) -> datetime:
    return t + timedelta(seconds=seconds)


def raw_connect(url: str) -> Any:
    """A plain driver connection to the same database, as a user's app would hold."""
    if url.startswith("sqlite:///"):
        return sqlite3.connect(url[len("sqlite:///") :], isolation_level=None)
    import psycopg

    return psycopg.connect(url)


def user_table(url: str) -> None:
    conn = raw_connect(url)
    try:
        conn.execute("CREATE TABLE orders (note TEXT NOT NULL)")
        if not url.startswith("sqlite"):
            conn.commit()
    finally:
        conn.close()


def count_orders(url: str) -> int:
    conn = raw_connect(url)
    try:
        return int(conn.execute("SELECT count(*) FROM orders").fetchone()[0])
    finally:
        conn.close()


# URLs the test cluster refuses for good (by the cluster), and the cause each names
refused_logins = pytest.mark.parametrize(
    ("url_of", "cause"),
    [
        (lambda c: c.url("no_such_farm"), 'database "no_such_farm" does not exist'),
        (
            lambda c: c.url().replace("postgres@", "no_such_role@", 1),
            'role "no_such_role" does not exist',
        ),
    ],
    ids=["missing-database", "missing-role"],
)


def database_work(
    store: Store, store_url: str, run: Callable[[], object], query: str, params: dict[str, Any]
) -> int:
    """How much the database did for ``run()``: SQLite's virtual machine steps (counted in
    hundreds), PostgreSQL's buffer accesses (from EXPLAIN of the same ``query`` with
    ``params``, rolled back)."""
    if store_url.startswith("sqlite:"):
        conn: Any = store.driver.connection()  # type: ignore[attr-defined]
        steps = [0]

        def count() -> int:
            steps[0] += 1
            return 0

        conn.set_progress_handler(count, 100)
        try:
            run()
        finally:
            conn.set_progress_handler(None, 0)
        return steps[0]
    import psycopg

    with psycopg.connect(store_url) as conn:
        plan = conn.execute(
            "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + store.driver.queries[query],  # type: ignore[attr-defined]
            {"now": None, "levels": CLAIM_LEVELS, **params},
        ).fetchone()[0]  # type: ignore[index]
        conn.rollback()
    top = (plan if isinstance(plan, list) else json.loads(plan))[0]["Plan"]
    return int(top["Shared Hit Blocks"]) + int(top["Shared Read Blocks"])
