"""The table of task options in Options' docstring (the documentation's source) names every
option with its real default, and the policies reach each job's spec."""

from __future__ import annotations

import dataclasses
import re

from plunder.task import Options

ROW = re.compile(r"^\s*\| `(\w+)` \| (.+) \| `(.+)` \|$")


def table() -> dict[str, str]:
    rows = [ROW.match(line) for line in (Options.__doc__ or "").splitlines()]
    return {m.group(1): m.group(3) for m in rows if m}


def test_the_table_lists_every_option_with_its_default() -> None:
    documented = table()
    fields = {f.name: f.default for f in dataclasses.fields(Options)}
    assert set(documented) == set(fields) | {"no_retry"}
    for name, default in fields.items():
        assert documented[name] == repr(default), name
    assert documented["no_retry"] == "()"


def test_the_policies_reach_the_spec() -> None:
    spec = Options(retries=2, retry_on_lost=False, expires_in=30.0).spec("t", [1], {})
    assert (spec.max_attempts, spec.retry_on_lost, spec.expires_in) == (3, False, 30.0)
    default = Options().spec("t", [], {})
    assert default.retry_on_lost and default.retry_on_timeout and default.expires_in is None
