"""The gateway's OpenAPI schema, fuzzed (schemathesis): whatever a client sends, the
answer is never a server error. Run with keys of two roles against a real gateway."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import hypothesis
import pytest
import schemathesis
from schemathesis.checks import not_a_server_error

from plunder.store import open_store
from tests.support import gateway as support

KEY: dict[str, str] = {}


@pytest.fixture(scope="module")
def fuzzed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[support.Gateway]:
    folder: Path = tmp_path_factory.mktemp("fuzz")
    url = f"sqlite:///{folder / 'fuzz.db'}"
    store = open_store(url)
    store.migrate()
    KEY["admin"] = store.key_create(role="admin")[1]
    store.close()
    started = support.start(url, folder)
    try:
        yield started
    finally:
        started.stop()
        assert "Traceback" not in started.output(), started.output()


@pytest.fixture(scope="module")
def api(fuzzed: support.Gateway) -> schemathesis.schemas.BaseSchema:
    return schemathesis.openapi.from_url(fuzzed.url + "/openapi.json")


schema = schemathesis.pytest.from_fixture("api")


@schema.parametrize()
@hypothesis.settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=list(hypothesis.HealthCheck),
    derandomize=True,
)
def test_no_request_makes_the_gateway_fail(case: schemathesis.Case) -> None:
    case.call_and_validate(
        headers={"Authorization": f"Bearer {KEY['admin']}"}, checks=[not_a_server_error]
    )
