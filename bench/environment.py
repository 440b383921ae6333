"""Where ``plunder bench`` runs: the peers' virtualenv, and the machine's facts for the report."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import venv
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.common import ROOT

VENV = ROOT / "bench" / ".venv"
PEER_PACKAGES = ["pgqueuer", "procrastinate", "dbos", "psycopg[binary]", "asyncpg", "uvloop"]


# -- environment --------------------------------------------------------------------------
def ensure_venv(echo: Callable[[str], None]) -> str | None:
    """Create bench/.venv with the peers on first use; None when it works, else why not."""
    python = VENV / "bin" / "python"
    marker = VENV / ".peers-installed"
    if marker.exists():
        return None
    echo(f"installing the peers into {VENV} (first use): {' '.join(PEER_PACKAGES)}")
    try:
        if not python.exists():
            venv.create(VENV, with_pip=True)
        subprocess.run(
            [str(python), "-m", "pip", "install", "--quiet", *PEER_PACKAGES],
            check=True,
            timeout=900,
        )
    except (OSError, subprocess.SubprocessError) as exc:
        return f"could not install the peers into {VENV}: {exc}"
    marker.write_text("\n".join(PEER_PACKAGES) + "\n")
    return None


def peer_versions() -> dict[str, str]:
    python = VENV / "bin" / "python"
    if not python.exists():
        return {}
    out = subprocess.run(
        [str(python), "-m", "pip", "list", "--format", "json"],
        capture_output=True,
        text=True,
        check=False,
    )
    try:
        listed = {p["name"].lower(): p["version"] for p in json.loads(out.stdout)}
    except json.JSONDecodeError:
        return {}
    return {n: listed[n] for n in ("pgqueuer", "procrastinate", "dbos", "asyncpg") if n in listed}


def machine(pg_version: str | None) -> dict[str, Any]:
    cpu = "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
        mem_kb = int(Path("/proc/meminfo").read_text().split()[1])
    except (OSError, ValueError, IndexError):
        mem_kb = 0
    import plunder

    def git(*args: str) -> str:
        done = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=False)
        return done.stdout.strip()

    return {
        "commit": git("rev-parse", "--short", "HEAD")
        + (
            " (+ uncommitted changes)"
            if git("status", "--porcelain", "--untracked-files=no")
            else ""
        ),
        "nproc": os.cpu_count(),
        "cpu": cpu,
        "ram_gib": round(mem_kb / 1024 / 1024, 1),
        "kernel": platform.release(),
        "python": platform.python_version(),
        "postgresql": pg_version,
        "plunder": getattr(plunder, "__version__", "?"),
        "peers": peer_versions(),
    }
