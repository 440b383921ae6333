"""Fixtures of the unit tests."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from plunder.store import Store
from plunder.store.connect import open_store


@pytest.fixture
def sqlite_store(tmp_path: Path) -> Iterator[Store]:
    """A migrated store on a fresh SQLite file (the runners' tests claim real jobs)."""
    opened = open_store(f"sqlite:///{tmp_path / 'runner.db'}")
    opened.migrate()
    yield opened
    opened.close()
