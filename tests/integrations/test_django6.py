"""The Django tests again on Django 6 (its own ``django.tasks``, no backport), which needs
Python >= 3.12: run by pytest in the venv that ``scripts/python313`` makes, this checkout's
plunder first on its path. Skipped, saying so, where that venv does not exist."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
VENV = Path(os.environ.get("PLUNDER_PY313_VENV", "/opt/plunder-py313/venv"))
PYTHON = VENV / "bin" / "python"
TESTS = ["tests/integrations/test_django_backend.py", "tests/integrations/test_django_shop.py"]

pytestmark = [
    pytest.mark.skipif(
        not PYTHON.exists(),
        reason=f"no Django 6 venv at {VENV} (run scripts/python313, or set PLUNDER_PY313_VENV)",
    ),
    pytest.mark.skipif(sys.version_info >= (3, 12), reason="this is the Django 6 run already"),
]


def run(*args: str, timeout: float) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    env.pop("PYTEST_XDIST_WORKER", None)
    return subprocess.run(
        [str(PYTHON), *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


@pytest.mark.timeout(1500)  # the shop's tests start real processes: minutes on a loaded machine
def test_the_django_tests_pass_on_django_6() -> None:
    probe = "import django, django.tasks, plunder; print(django.VERSION[0], plunder.__file__)"
    version, plunder_file = run("-c", probe, timeout=60).stdout.split()
    assert int(version) >= 6 and plunder_file.startswith(str(ROOT / "src")), (version, plunder_file)
    done = run("-m", "pytest", "-q", "-n", "0", "-p", "no:cacheprovider", *TESTS, timeout=1200)
    report = done.stdout[-4000:] + done.stderr[-2000:]
    assert done.returncode == 0, report
    last = done.stdout.strip().splitlines()[-1]
    # every test ran there: none skipped for a missing Django or backend
    assert "passed" in last and "skipped" not in last and "failed" not in last, report
