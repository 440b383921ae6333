"""``plunder schedules``: add, list, pause, resume and remove schedules in the database on
every backend, with ``--json``; a bad cron, zone or argument is one line; the janitor's next
pass sees a change made here."""

from __future__ import annotations

import json

from plunder.config import Settings
from plunder.janitor import Janitor
from plunder.store import Store
from tests.acceptance.test_cli import one_line_error, plunder
from tests.store.helpers import later


def test_schedules_are_added_listed_paused_resumed_and_removed(
    store_url: str, store: Store
) -> None:
    added = plunder(
        store_url, "schedules", "add", "nightly", "report.build", "30 2 * * *",
        "--timezone", "Europe/Paris", "--args", "[1, \"x\"]", "--queue", "reports",
        "--catch-up", "all", "--json",
    )  # fmt: skip
    assert added.exit_code == 0, added.stderr
    (row,) = json.loads(added.stdout)
    assert (row["name"], row["task"], row["cron"], row["timezone"]) == (
        "nightly", "report.build", "30 2 * * *", "Europe/Paris",
    )  # fmt: skip
    assert (row["args"], row["queue"], row["catch_up"], row["paused"]) == (
        [1, "x"],
        "reports",
        "all",
        False,
    )
    assert row["next_at"].endswith(("01:30:00+00:00", "00:30:00+00:00"))  # 02:30 in Paris

    table = plunder(store_url, "schedules")
    assert table.exit_code == 0 and "nightly" in table.stdout and "Europe/Paris" in table.stdout
    assert plunder(store_url, "schedules", "list").stdout == table.stdout

    paused = plunder(store_url, "schedules", "pause", "nightly", "--json")
    assert json.loads(paused.stdout)[0]["paused"] is True
    assert store.schedule_get("nightly").paused
    assert "paused" in plunder(store_url, "schedules", "list").stdout
    resumed = plunder(store_url, "schedules", "resume", "nightly", "--json")
    assert json.loads(resumed.stdout)[0]["paused"] is False

    removed = plunder(store_url, "schedules", "remove", "nightly")
    assert removed.exit_code == 0 and "removed" in removed.stdout
    assert json.loads(plunder(store_url, "schedules", "--json").stdout) == []


def test_a_schedule_added_here_is_ticked_by_the_janitor(store_url: str, store: Store) -> None:
    added = plunder(store_url, "schedules", "add", "beat", "t", "* * * * * *", "--args", "[5]")
    assert added.exit_code == 0, added.stderr
    next_at = store.schedule_get("beat").next_at
    assert next_at is not None
    done = Janitor(store, Settings(url="sqlite:///unused.db")).run_once(now=later(next_at, 0.5))
    (tick,) = done.ticks
    assert tick.at == next_at and store.job_get(tick.job_id).args == [5]


def test_bad_schedules_are_one_line(store_url: str) -> None:
    def error(*argv: str) -> str:
        return one_line_error(plunder(store_url, "schedules", *argv))

    assert "invalid cron expression '61 * * * *': Bad minute" in error(
        "add", "x", "t", "61 * * * *"
    )
    assert "it has 3 fields" in error("add", "x", "t", "* * *")
    assert "unknown time zone 'Nowhere/City'" in error(
        "add", "x", "t", "* * * * *", "--timezone", "Nowhere/City"
    )
    assert "--args is not JSON" in error("add", "x", "t", "* * * * *", "--args", "[1,")
    assert "--kwargs must be a JSON dict" in error("add", "x", "t", "* * * * *", "--kwargs", "[]")
    assert "invalid schedule name 'a b'" in error("add", "a b", "t", "* * * * *")
    assert "no schedule named 'nobody'" in error("pause", "nobody")
    assert "no schedule named 'nobody'" in error("resume", "nobody")
    assert "no schedule named 'nobody'" in error("remove", "nobody")
