"""The PostgreSQL store's connections and the server's time zone: a server whose zone is
UTC under another name (``Etc/UTC``, a common default) is told "UTC", the name psycopg
knows, so that it reads timestamps without a zoneinfo conversion each; a server in any
other zone is left in it (a task's own transaction sees the zone the database set), and
the times plunder reads are the same instants either way, in UTC."""

from __future__ import annotations

from datetime import UTC, timedelta

import psycopg
import pytest

from plunder.model import JobSpec
from plunder.store import Store, open_store
from plunder.store.postgres.connections import UTC_NAMES
from tests.store.helpers import claim, open_session

pytestmark = pytest.mark.parametrize("backend", ["postgres"])


def _zone(store: Store) -> str:
    with store.transaction() as conn:
        row = conn.execute("SHOW TimeZone").fetchone()
    assert row is not None
    return str(row[0])


@pytest.mark.parametrize("zone", ["Etc/UTC", "UTC", "Europe/Paris", "America/New_York"])
def test_connections_name_utc_and_leave_other_zones_alone(store_url: str, zone: str) -> None:
    with psycopg.connect(store_url, autocommit=True) as conn:
        database = conn.info.dbname
        conn.execute(f"ALTER DATABASE \"{database}\" SET TimeZone = '{zone}'")
    store = open_store(store_url)
    try:
        assert _zone(store) == ("UTC" if zone in UTC_NAMES else zone)
        store.job_enqueue_many([JobSpec("t")])
        session = open_session(store)
        (job,) = claim(store, session)
        now = store.now()
        for moment in (job.created_at, job.started_at, job.run_at, now):
            assert moment is not None and moment.tzinfo is UTC
            assert abs(moment - now) < timedelta(minutes=1)
        with psycopg.connect(store_url) as conn:
            row = conn.execute(
                "SELECT started_at FROM plunder_jobs WHERE id = %s", (job.id,)
            ).fetchone()
        assert row is not None and row[0] == job.started_at  # the same instant
    finally:
        store.close()
