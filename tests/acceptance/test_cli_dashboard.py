"""``plunder dashboard`` (the dashboard alone, local, admin) and ``plunder queues``."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time

import httpx

from plunder.store import Store, pauses
from tests.acceptance.test_cli import one_line_error, plunder
from tests.support.gateway import ROOT
from tests.support.pgcluster import free_port


def test_the_local_dashboard_needs_no_login_and_pauses_a_queue(
    store_url: str, store: Store
) -> None:
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "plunder", "--db", store_url, "dashboard", "--port", str(port)],
        cwd=ROOT, env=dict(os.environ), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        stdin=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30) as browser:
            deadline = time.monotonic() + 30
            while True:
                try:
                    page = browser.get("/")
                    break
                except httpx.TransportError:
                    assert time.monotonic() < deadline and proc.poll() is None
                    time.sleep(0.1)
            assert page.status_code == 200 and 'class="who">local' in page.text
            confirm = browser.get("/confirm?do=pause&queue=nightly")
            token = re.search(r'name="csrf" value="([0-9a-f]+)"', confirm.text)
            assert token is not None
            done = browser.post(
                "/act", data={"do": "pause", "queue": "nightly", "csrf": token.group(1)}
            )
            assert done.status_code == 303
            assert browser.post("/act", data={"do": "resume", "queue": "x"}).status_code == 403
        assert [p.queue for p in pauses.of(store).queue_pause_list()] == ["nightly"]
    finally:
        proc.terminate()
        proc.wait(timeout=20)


def test_the_dashboard_and_pauses_need_the_database_itself() -> None:
    url = "http://127.0.0.1:9/"
    assert "needs the database itself" in one_line_error(plunder(url, "dashboard"))
    assert "needs the database itself" in one_line_error(plunder(url, "queues", "pause", "q"))


def test_a_queue_name_no_job_can_have_is_one_line(store_url: str) -> None:
    assert "invalid queue name" in one_line_error(plunder(store_url, "queues", "pause", "a~1"))
