"""The dashboard in real headless Chromium (Debian's ``chromium``, driven by Playwright's
Python API; nothing downloads a browser): one gateway on a SQLite file and one worker
process for the module, a fresh browser context (its own cookies) per test."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from plunder.store import Store, open_store
from tests.support import gateway as support

CHROMIUM = os.environ.get("PLUNDER_CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"
ROOT = Path(__file__).resolve().parents[2]

if not Path(CHROMIUM).exists():
    pytest.skip(
        f"no chromium at {CHROMIUM}: apt-get install chromium (or set PLUNDER_CHROMIUM)",
        allow_module_level=True,
    )
sync_api = pytest.importorskip("playwright.sync_api", reason="pip install playwright")


@dataclass
class Farm:
    url: str  # the gateway's
    db: str
    store: Store
    admin: str
    reader: str
    gpu_reader: str
    folder: Path


@pytest.fixture(scope="module")
def farm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Farm]:
    folder = tmp_path_factory.mktemp("browser")
    db = f"sqlite:///{folder / 'plunder.db'}"
    store = open_store(db)
    store.migrate()
    secrets = {
        name: store.key_create(role=role, **options)[1]  # type: ignore[arg-type]
        for name, role, options in (
            ("admin", "admin", {}),
            ("reader", "reader", {}),
            ("gpu_reader", "reader", {"group": "gpu", "queues": ["llm"]}),
        )
    }
    gateway = support.start(db, folder)
    env = {**support.env_without_database(), "PLUNDER_URL": db}
    with (folder / "worker.log").open("wb") as log:
        worker = subprocess.Popen(
            [sys.executable, "-m", "plunder", "worker", "-A", "tests.browser.tasks:app",
             "-q", "drain,llm,default", "-c", "8"],
            env=env, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
        )  # fmt: skip
    try:
        yield Farm(gateway.url, db, store, folder=folder, **secrets)
    finally:
        worker.terminate()
        try:
            worker.wait(timeout=15)
        except subprocess.TimeoutExpired:
            worker.kill()
            worker.wait()
        gateway.stop()
        store.close()


@pytest.fixture(scope="module")
def chromium() -> Iterator[Any]:
    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=CHROMIUM, headless=True, args=["--no-sandbox"]
        )
        try:
            yield browser
        finally:
            browser.close()


@pytest.fixture
def browser(chromium: Any) -> Iterator[Any]:
    """A page in a context of its own (no cookies), phone-sized where a test asks."""
    context = chromium.new_context(viewport={"width": 1200, "height": 900})
    context.set_default_timeout(15_000)
    try:
        yield context.new_page()
    finally:
        context.close()


def log_in(page: Any, farm: Farm, secret: str) -> None:
    page.goto(farm.url + "/login")
    page.fill("#secret", secret)
    page.click("button[type=submit]")
    page.wait_for_url(farm.url + "/")
