"""The integrations' tests: plunder's pytest plugin (registered here when the installed
plunder's entry point has not registered it already)."""

from __future__ import annotations

import pytest

from plunder import testing


def pytest_configure(config: pytest.Config) -> None:
    if not config.pluginmanager.is_registered(testing):
        config.pluginmanager.register(testing, "plunder-testing")
