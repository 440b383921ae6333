"""Every example in examples/ runs: each with real worker processes, the streaming one on
both backends, the web app on its SQLite file, the deployment on the PostgreSQL cluster."""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import pytest

import plunder
from tests.docs.helpers import ROOT, environment, run, worker

EXAMPLES = ROOT / "examples"


def test_every_example_is_run_by_a_test() -> None:
    # fastapi_orders.py: by tests/integrations/test_fastapi.py
    ran = {"streaming_llm.py", "web_orders.py", "pg_workers.py", "fastapi_orders.py"}
    assert {p.name for p in EXAMPLES.glob("*.py")} == ran


def test_the_streaming_worker_and_its_follower(store_url: str, tmp_path: Path) -> None:
    with worker(["plunder", "worker", "-A", "streaming_llm:app"], EXAMPLES, store_url, tmp_path):
        out = run([sys.executable, "streaming_llm.py", "one two three"], EXAMPLES, store_url)
    assert out.splitlines() == ["three two one ", "result: three two one"]
    app = plunder.App(store_url)
    try:
        (job,) = app.store.job_list(limit=10).jobs
        events = app.store.stream_read(job.id, after=0)
        assert [e.data for e in events if e.kind == "chunk"] == ["three ", "two ", "one "]
    finally:
        app.close()


def request(url: str, data: bytes | None = None) -> tuple[int, dict[str, object]]:
    try:
        with urllib.request.urlopen(url, data=data, timeout=10) as answer:
            return answer.status, json.loads(answer.read())
    except urllib.error.HTTPError as refused:
        return refused.code, json.loads(refused.read())


def test_the_web_app_commits_the_order_and_its_job_together(tmp_path: Path) -> None:
    db = tmp_path / "shop.db"
    shop = {"SHOP_DB": str(db), "PORT": "0"}
    server = subprocess.Popen(
        [sys.executable, "web_orders.py"],
        cwd=EXAMPLES,
        env={**environment(None), **shop},
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        assert server.stdout is not None
        base = server.stdout.readline().split()[-1]  # "serving on http://127.0.0.1:PORT"
        status, made = request(f"{base}/orders", b"item=teapot")  # before any worker runs
        assert status == 201, made
        assert request(f"{base}/orders", b"item=")[0] == 400
        with worker(
            ["plunder", "worker", "-A", "web_orders:app"], EXAMPLES, None, tmp_path, **shop
        ):
            app = plunder.App(f"sqlite:///{db}")
            try:
                assert app.job(int(str(made["job"]))).result(timeout=30) is None
                assert len(app.store.job_list(limit=10).jobs) == 1  # the refused order made none
            finally:
                app.close()
            assert request(f"{base}/orders/{made['order']}") == (
                200,
                {"id": made["order"], "item": "teapot", "paid": True},
            )
    finally:
        server.terminate()
        server.wait(timeout=10)
        if server.stdout is not None:
            server.stdout.close()


@pytest.mark.parametrize("backend", ["postgres"])
def test_several_workers_on_postgresql(store_url: str) -> None:
    out = run([sys.executable, "pg_workers.py", "3", "60"], EXAMPLES, store_url, timeout=120)
    done, exits = out.splitlines()[-2:]
    assert done.startswith("60 jobs done by ") and exits == "workers exited with [0, 0, 0]"
