"""What the documentation tests share: the fenced samples of a Markdown file, and real
``plunder worker`` processes started the way a reader would start them."""

from __future__ import annotations

import os
import re
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FENCE = re.compile(r"^```(\w+)\n(.*?)^```$", re.MULTILINE | re.DOTALL)
OPENED = re.compile(r"INFO plunder\.worker: session \S+ opened$", re.MULTILINE)
STARTUP = 60.0  # seconds a worker may take to open its session on a loaded machine


def fenced(path: Path, lang: str) -> list[str]:
    """The bodies of the ``lang`` fenced blocks of a Markdown file, in order."""
    return [body for kind, body in FENCE.findall(path.read_text()) if kind == lang]


def named_samples(path: Path) -> dict[str, str]:
    """The python blocks by the file name their first line gives (``# tasks.py``)."""
    samples = {}
    for body in fenced(path, "python"):
        first = body.splitlines()[0]
        match = re.match(r"# (\w+\.py)\b", first)
        assert match, f"a python sample of {path.name} does not start with '# name.py': {first}"
        samples[match.group(1)] = body
    return samples


def commands(block: str) -> list[list[str]]:
    """The commands of a shell block: comments dropped, ``a ; b`` split in two."""
    found: list[list[str]] = []
    for line in block.splitlines():
        words = shlex.split(line, comments=True)
        current: list[str] = []
        for word in [*words, ";"]:
            if word == ";":
                if current:
                    found.append(current)
                current = []
            else:
                current.append(word)
    return found


def environment(url: str | None) -> dict[str, str]:
    """The test's environment (its PYTHONPATH included), with PLUNDER_URL set to ``url``
    or removed, so that a sample's own URL holds."""
    env = dict(os.environ)
    env.pop("PLUNDER_URL", None)
    if url is not None:
        env["PLUNDER_URL"] = url
    return env


def plunder_argv(command: list[str]) -> list[str]:
    """``plunder ...`` as this interpreter runs it (the tree under test, not an install)."""
    assert command[0] == "plunder", command
    return [sys.executable, "-m", "plunder", *command[1:]]


def run(argv: list[str], cwd: Path, url: str | None, timeout: float = 90, **env: str) -> str:
    """Run a command to its end; its stdout, or an AssertionError with everything it said."""
    done = subprocess.run(
        argv,
        cwd=cwd,
        env={**environment(url), **env},
        capture_output=True,
        text=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
        check=False,
    )
    assert done.returncode == 0, f"{argv} exited {done.returncode}:\n{done.stdout}\n{done.stderr}"
    return done.stdout


@contextmanager
def worker(
    command: list[str], cwd: Path, url: str | None, logs: Path | None = None, **env: str
) -> Iterator[subprocess.Popen[str]]:
    """A real ``plunder worker`` process, yielded once its session is open (as a reader
    starts one and waits for it), stopped with SIGTERM (as an operator would) at the end;
    one that exited early fails the test with its log (written to ``logs``)."""
    logs = logs or cwd
    path = logs / f"worker-{len(list(logs.glob('worker-*.log')))}.log"
    log = path.open("w")
    proc = subprocess.Popen(
        plunder_argv(command),
        cwd=cwd,
        env={**environment(url), **env},
        stdout=log,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        text=True,
    )
    try:
        wait_opened(proc, path)
        yield proc
        assert proc.poll() is None, f"the worker exited early:\n{path.read_text()}"
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=40)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            log.close()


def wait_opened(proc: subprocess.Popen[str], log: Path) -> None:
    """Until the worker logs its open session (its signal handlers are installed by then);
    an AssertionError with its log if it exits first or takes longer than STARTUP."""
    deadline = time.monotonic() + STARTUP
    while not OPENED.search(log.read_text()):
        assert proc.poll() is None, f"the worker exited while starting:\n{log.read_text()}"
        assert time.monotonic() < deadline, f"no session in {STARTUP:.0f}s:\n{log.read_text()}"
        time.sleep(0.05)  # a poll of the log, bounded by the deadline
