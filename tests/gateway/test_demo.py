"""``plunder demo --gateway`` as a user runs it: a gateway, three remote workers of two
groups with no database URL, a producer streaming tokens, a worker killed and rescued."""

from __future__ import annotations

import json
import sys

from tests.support.gateway import ROOT, env_without_database
from tests.support.procs import run_group


def test_the_gateway_demo_runs_and_rescues() -> None:
    done = run_group(
        [sys.executable, "-m", "plunder", "demo", "--gateway", "--json"],
        timeout=100, cwd=ROOT, env=env_without_database(),  # within the test's own 120 s
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stdout)
    assert summary["succeeded"] == summary["generations"] + summary["index_jobs"] == 42
    assert summary["cross_group_read"] == "refused"
    assert summary["database_url_in_workers_env"] is False
    assert summary["killed_worker_jobs"] >= 1 and summary["rescued"] >= 1
