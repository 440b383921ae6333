"""A gateway (``plunder serve``) as a real process on a free loopback port, for tests."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

from tests.support.pgcluster import free_port

ROOT = Path(__file__).resolve().parents[2]


@dataclass
class Gateway:
    url: str
    db: str
    process: subprocess.Popen[bytes]
    log: Path

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()

    def output(self) -> str:
        return self.log.read_text(errors="replace")


def env_without_database() -> dict[str, str]:
    """This process's environment without a database URL or key (a remote process's)."""
    env = {k: v for k, v in os.environ.items() if k not in ("PLUNDER_URL", "PLUNDER_KEY")}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "src"), str(ROOT), env.get("PYTHONPATH", "")])
    return env


def start(db: str, folder: Path, *, port: int | None = None) -> Gateway:
    """``plunder serve --db db`` on a free port, once its health check answers."""
    port = port or free_port()
    log = folder / f"gateway-{port}.log"
    with log.open("wb") as output:  # the child holds its own copy
        process = subprocess.Popen(
            [sys.executable, "-m", "plunder", "--db", db, "serve", "--port", str(port)],
            stdout=output,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env_without_database(),
            cwd=ROOT,
        )
    gateway = Gateway(f"http://127.0.0.1:{port}", db, process, log)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"the gateway exited: {gateway.output()}")
        try:
            if httpx.get(gateway.url + "/v1/health", timeout=1).status_code == 200:
                return gateway
        except httpx.TransportError:
            pass
        time.sleep(0.05)
    gateway.stop()
    raise RuntimeError(f"the gateway did not answer within 30 s: {gateway.output()}")
