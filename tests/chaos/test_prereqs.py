"""Tier T1's prerequisites: a scenario whose programs are missing is skipped with a reason
that names the script installing them, and that script knows every program."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from tests.chaos import prereqs

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / prereqs.SCRIPT


def test_a_missing_program_skips_the_scenario_naming_the_script(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(prereqs.TOOLS, "plunder-chaos-absent", "plunder-absent-package")
    with pytest.raises(pytest.skip.Exception) as skipped:
        prereqs.require("S99", "plunder-chaos-absent")
    reason = str(skipped.value)
    assert "S99 needs plunder-chaos-absent (plunder-absent-package)" in reason
    assert "run scripts/t1-prereqs as root" in reason


def test_a_program_on_path_is_found(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    program = tmp_path / "plunder-chaos-present"
    program.write_text("#!/bin/sh\n")
    program.chmod(0o755)
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setitem(prereqs.TOOLS, program.name, "plunder-present-package")
    assert prereqs.require("S99", program.name) == {program.name: str(program)}


@pytest.mark.parametrize("path", ["this machine's", "empty"])
def test_the_script_checks_what_require_checks(
    path: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """``--check`` names, by command and package, exactly the programs ``require`` finds
    missing: on this machine's PATH, and on an empty one (where only the sbin folders
    are left to look in)."""
    if path == "empty":
        monkeypatch.setenv("PATH", str(tmp_path))
    done = subprocess.run(
        ["/bin/bash", str(SCRIPT), "--check"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    expected = {(c, p) for c, p in prereqs.TOOLS.items() if prereqs.find(c) is None}
    listed = {(w[0], w[1]) for line in done.stdout.splitlines() if len(w := line.split()) == 2}
    assert done.returncode == (1 if expected else 0), done.stdout + done.stderr
    assert listed == expected
    if path == "empty":
        assert ("mount", "mount") in listed  # /usr/bin is not looked in


def test_the_script_lists_the_same_programs() -> None:
    """Its table (command:package) is the one in prereqs.TOOLS."""
    text = SCRIPT.read_text()
    table = text.split("TOOLS=(", 1)[1].split(")", 1)[0].split()
    assert dict(entry.split(":") for entry in table) == prereqs.TOOLS
    assert os.access(SCRIPT, os.X_OK)
