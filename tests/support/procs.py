"""A command run in a process group of its own, killed whole when it ends or times out:
a demo that is killed (by a test's timeout) leaves no gateway or worker of its own running."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path


def run_group(
    argv: Sequence[str], *, timeout: float, cwd: Path, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """``subprocess.run(argv, capture_output=True, text=True)`` in a new session; whatever
    of its group still runs afterwards (even after a TimeoutExpired) is SIGKILLed."""
    proc = subprocess.Popen(
        list(argv), cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True, start_new_session=True,
    )  # fmt: skip
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:  # what it wrote says where it hung
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        stdout, stderr = proc.communicate()
        raise AssertionError(
            f"{' '.join(argv)} did not end within {timeout}s\n"
            f"stderr:\n{stderr[-6000:]}\nstdout:\n{stdout[-2000:]}"
        ) from None
    finally:
        with contextlib.suppress(ProcessLookupError):  # gone already: nothing left behind
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    return subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr)


def stacks(proc: subprocess.Popen[bytes], log: Path, *, within: float = 3.0) -> str:
    """A ``plunder worker`` that outlived what was asked of it: SIGUSR1 has it print every
    thread's stack (faulthandler) to its log; the log, once they are there."""
    with contextlib.suppress(ProcessLookupError):
        proc.send_signal(signal.SIGUSR1)
    deadline = time.monotonic() + within
    while "most recent call first" not in log.read_text(errors="replace"):
        if proc.poll() is not None or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    return log.read_text(errors="replace")
