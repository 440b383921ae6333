"""``plunder limits`` and the limits in ``plunder status``: listed with their reason, set,
paused and resumed, with ``--json``; a bad limit is one line."""

from __future__ import annotations

import json

from plunder.model import JobSpec, Limit
from plunder.store import Store
from tests.acceptance.test_cli import one_line_error, plunder


def test_limits_are_listed_set_paused_and_resumed(store_url: str, store: Store) -> None:
    store.job_enqueue_many([JobSpec("t", [i], limit=Limit("openai", 2)) for i in range(5)])
    listed = plunder(store_url, "limits", "--json")
    assert listed.exit_code == 0, listed.stderr
    (row,) = json.loads(listed.stdout)
    assert (row["key"], row["ceiling"], row["admitted"], row["held"]) == ("openai", 2, 2, 3)
    assert row["reason"] == "at its ceiling of 2"
    table = plunder(store_url, "status")
    assert table.exit_code == 0 and "at its ceiling" in table.stdout
    status = json.loads(plunder(store_url, "status", "--json").stdout)
    assert status["limits"][0]["key"] == "openai"

    raised = plunder(store_url, "limits", "set", "openai", "4", "--rate", "10/s", "--json")
    (row,) = json.loads(raised.stdout)
    assert (row["ceiling"], row["rate"], row["admitted"], row["held"]) == (4, "10/s", 4, 1)

    paused = plunder(store_url, "limits", "pause", "openai", "--seconds", "60")
    assert paused.exit_code == 0 and "paused until" in paused.stdout
    (row,) = json.loads(plunder(store_url, "limits", "--json").stdout)
    assert row["held"] == 5 and row["reason"].startswith("paused until")
    assert plunder(store_url, "limits", "resume", "openai").exit_code == 0
    (row,) = json.loads(plunder(store_url, "limits", "--json").stdout)
    assert row["paused_until"] is None and row["admitted"] == 4


def test_a_bad_limit_is_one_line(store_url: str) -> None:
    assert "ceiling" in one_line_error(plunder(store_url, "limits", "set", "k", "0"))
    assert "COUNT/UNIT" in one_line_error(
        plunder(store_url, "limits", "set", "k", "3", "--rate", "lots")
    )
    assert "no limit named" in one_line_error(plunder(store_url, "limits", "resume", "nobody"))
