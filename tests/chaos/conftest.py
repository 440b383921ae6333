"""Fixtures of the chaos suite: a :class:`System` per test on a fresh database of either
backend, cleaned up (faults undone, processes killed) whatever the test did."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.chaos.harness import SEED, System


@pytest.fixture
def system(store_url: str, tmp_path: Path) -> Iterator[System]:
    print(f"chaos seed {SEED} (PLUNDER_CHAOS_SEED={SEED} repeats the random choices)")
    under_test = System(store_url, tmp_path)
    under_test.sample()
    try:
        yield under_test
    finally:
        under_test.close()
