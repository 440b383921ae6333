"""The SQL store is composed, not stacked: each part is a class of its own that holds what
it needs, and the stores of both dialects expose the Store protocol by methods of the
facade itself (no part reached through attribute magic)."""

from __future__ import annotations

import inspect

import pytest

from plunder.store import base
from plunder.store.acks import Acks
from plunder.store.claims import Claims
from plunder.store.engine import Engine
from plunder.store.enqueue import Enqueue
from plunder.store.maintenance import Maintenance
from plunder.store.reads import Reads
from plunder.store.sessions import Sessions
from plunder.store.sqlbase import SQLStore
from plunder.store.sqlfeatures import FeatureOps
from plunder.store.sqlite import SqliteStore
from plunder.store.sqlite.driver import SqliteDriver

PARTS = [Acks, Claims, Engine, Enqueue, Maintenance, Reads, Sessions, SqliteDriver]


@pytest.mark.parametrize("part", PARTS, ids=lambda part: part.__name__)
def test_each_part_stands_alone(part: type) -> None:
    assert part.__bases__ == (object,)


def protocol_members() -> list[str]:
    return [
        name
        for name, member in vars(base.Store).items()
        if not name.startswith("_") and inspect.isfunction(member)
    ]


def test_the_facade_defines_every_protocol_method_itself() -> None:
    names = protocol_members()
    assert len(names) > 30
    missing = [name for name in names if name not in vars(SQLStore)]
    assert not missing
    assert "__getattr__" not in vars(SQLStore)


def test_a_store_is_the_facade_over_its_driver(tmp_path: object) -> None:
    store = SqliteStore(f"sqlite:///{tmp_path}/compose.db")
    try:
        assert type(store).__mro__ == (SqliteStore, SQLStore, FeatureOps, object)
        assert isinstance(store.driver, SqliteDriver)
        assert store.engine.driver is store.driver
        assert store.claims.acks is store.acks is store.sessions.acks
        assert store.sessions.maintenance is store.maintenance
        assert store.migrate() == store.latest_version
        store.notifies = True  # the facade's flag is the driver's
        assert store.driver.notifies is True
    finally:
        store.close()
