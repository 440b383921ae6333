"""``plunder demo --gateway`` as a user runs it: a gateway, three remote workers of two
groups with no database URL, a producer streaming tokens, a worker killed and rescued."""

from __future__ import annotations

import json
import subprocess
import sys

from tests.support.gateway import ROOT, env_without_database


def test_the_gateway_demo_runs_and_rescues() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "plunder", "demo", "--gateway", "--json"],
        capture_output=True, text=True, timeout=180, cwd=ROOT, env=env_without_database(),
        stdin=subprocess.DEVNULL, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stdout)
    assert summary["succeeded"] == summary["generations"] + summary["index_jobs"] == 42
    assert summary["cross_group_read"] == "refused"
    assert summary["database_url_in_workers_env"] is False
    assert summary["killed_worker_jobs"] >= 1 and summary["rescued"] >= 1
