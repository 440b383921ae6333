"""The integration guides' samples run: testing.md's tests under pytest with plunder's
plugin, sqlalchemy.md's scripts (sync and async) and fastapi.md's app on both backends, and
django.md's samples are the tested sample project's code."""

from __future__ import annotations

import asyncio
import importlib
import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from plunder import testing
from tests.docs.helpers import ROOT, named_samples

GUIDE = ROOT / "docs" / "guide"


def test_the_testing_guide_s_tests_pass_under_the_plugin(tmp_path: Path) -> None:
    (tmp_path / "test_orders.py").write_text(named_samples(GUIDE / "testing.md")["test_orders.py"])
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}
    plugins = ["-p", "plunder.testing", "-p", "no:cacheprovider"]
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", *plugins, "-W", "error", "test_orders.py"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "2 passed" in done.stdout


@pytest.mark.parametrize("script", ["notes.py", "notes_async.py"])
def test_the_sqlalchemy_guide_s_scripts(store_url: str, tmp_path: Path, script: str) -> None:
    pytest.importorskip("sqlalchemy")
    (tmp_path / script).write_text(named_samples(GUIDE / "sqlalchemy.md")[script])
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "NOTES_DB": store_url}
    done = subprocess.run(
        [sys.executable, script],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["[[1]]"]


def test_the_fastapi_guide_s_app(
    store_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("fastapi")
    (tmp_path / "api.py").write_text(named_samples(GUIDE / "fastapi.md")["api.py"])
    monkeypatch.setenv("API_DB", store_url)
    monkeypatch.syspath_prepend(str(tmp_path))
    sys.modules.pop("api", None)
    api = importlib.import_module("api")
    try:

        async def drive() -> list[str]:
            transport = httpx.ASGITransport(app=api.api)
            async with (
                api.api.router.lifespan_context(api.api),
                httpx.AsyncClient(transport=transport, base_url="http://api") as client,
            ):
                job = (await client.post("/shout/hey")).json()["job"]
                await asyncio.to_thread(testing.run_until_idle, api.jobs)
                answer = await client.get(f"/jobs/{job}/events")
                return [line for line in answer.text.splitlines() if line.startswith("data:")]

        assert asyncio.run(drive()) == ['data: "H"', 'data: "E"', 'data: "Y"', 'data: "succeeded"']
    finally:
        api.jobs.close()
        api.engine.dispose()
        sys.modules.pop("api", None)


def test_the_django_guide_s_samples_are_the_sample_project_s_code() -> None:
    samples = named_samples(GUIDE / "django.md")
    shop = ROOT / "examples" / "django_shop"
    settings = (shop / "shop" / "settings.py").read_text()
    assert '"plunder.contrib.django",  # manage.py plunder_worker' in settings
    assert samples["tasks.py"].split("\n", 1)[1] in (shop / "orders" / "tasks.py").read_text()
    assert samples["views.py"].split("\n", 1)[1] in (shop / "orders" / "views.py").read_text()
