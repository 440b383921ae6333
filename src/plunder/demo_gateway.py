"""``plunder demo --gateway``: the setup plunder grew from — GPU boxes anywhere pull jobs
from a central service with an API key, never the database's credentials.

A gateway (``plunder serve``) in front of one database; three remote workers with worker
keys of two groups ("gpu" owns the queue ``llm``, "batch" the queue ``batch``) and no
database URL in their environment; a producer with a key of each group that streams one
answer's tokens as they are written; one gpu worker SIGKILLed while it holds jobs, and
its jobs rescued by the other. The tasks live here (``-A plunder.demo_gateway:app``).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rich.console import Console

from plunder import errors
from plunder.app import App
from plunder.context import Context
from plunder.model import JobRecord
from plunder.states import Outcome, Status, is_terminal
from plunder.store import Store, open_store

app = App()  # PLUNDER_URL names the gateway, PLUNDER_KEY the worker's key

WORDS = (
    "idle", "workers", "anywhere", "pull", "their", "jobs", "through", "one", "gateway",
    "and", "nobody", "pushes",
)  # fmt: skip


@app.task(name="gw.generate", queue="llm", retries=2)
def generate(ctx: Context, prompt: str) -> str:
    """A stand-in for a model: one token every 60 ms, streamed."""
    tokens = [*prompt.split(), "->", *WORDS[: 4 + len(prompt) % 5]]
    for token in tokens:
        ctx.stream(token + " ")
        time.sleep(0.06)
    return " ".join(tokens)


@app.task(name="gw.index", queue="batch")
def index(n: int) -> int:
    time.sleep(0.05)
    return n * 2


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _remote_env(gateway: str, key: str) -> dict[str, str]:
    """A remote worker's environment: the gateway and a key, no database."""
    env = {k: v for k, v in os.environ.items() if k not in ("PLUNDER_URL", "PLUNDER_KEY")}
    return env | {"PLUNDER_URL": gateway, "PLUNDER_KEY": key}


def _spawn(argv: list[str], env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    with log.open("wb") as output:
        return subprocess.Popen(
            [sys.executable, "-m", "plunder", "--log-level", "WARNING", *argv],
            env=env, stdout=output, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
        )  # fmt: skip


def _wait_healthy(url: str, gateway: subprocess.Popen[bytes], deadline: float) -> None:
    import httpx

    while time.monotonic() < deadline:
        if gateway.poll() is not None:
            raise errors.StoreUnavailable(f"the gateway exited ({gateway.returncode})")
        try:
            if httpx.get(url + "/v1/health", timeout=1).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.05)
    raise errors.StoreUnavailable("the gateway did not answer in time")


def run(
    url: str | None, *, console: Console | None = None, quiet: bool = False,
    deadline: float = 120.0,
) -> dict[str, Any]:  # fmt: skip
    console = console or Console()

    def say(text: str) -> None:
        if not quiet:
            console.print(text)

    folder = Path(tempfile.mkdtemp(prefix="plunder-demo-gateway-"))
    url = url or f"sqlite:///{folder / 'demo.db'}"
    store = open_store(url)
    store.migrate()
    keys = _keys(store)
    gateway_url = f"http://127.0.0.1:{_free_port()}"
    port = gateway_url.rsplit(":", 1)[1]
    gateway = _spawn(["--db", url, "serve", "--port", port], dict(os.environ), folder / "gw.log")
    workers: list[subprocess.Popen[bytes]] = []
    started = time.monotonic()
    try:
        _wait_healthy(gateway_url, gateway, started + 30)
        say(f"database: {url} (only the gateway and the key commands use it)")
        say(f"gateway: {gateway_url}; logs in {folder}")
        admin = store.key_create(role="admin", name="demo dashboard")[1]
        say(f"dashboard: {gateway_url}/ (while the demo runs; log in with {admin})")
        workers += _remote_workers(gateway_url, keys, folder)
        say("3 remote workers: two of group gpu (queue llm), one of group batch; "
            "no database URL in their environment")  # fmt: skip
        return _produce(store, gateway_url, keys=keys, workers=workers, say=say,
                        deadline=started + deadline)  # fmt: skip
    finally:
        for proc in [*workers, gateway]:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in [*workers, gateway]:
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        store.close()


def _keys(store: Store) -> dict[str, str]:
    """A worker key and a producer key for each group: gpu owns llm, batch owns batch."""
    return {
        name: store.key_create(role=role, group=group, queues=[queue], name=f"demo {name}")[1]
        for name, role, group, queue in (
            ("gpu-worker", "worker", "gpu", "llm"),
            ("batch-worker", "worker", "batch", "batch"),
            ("gpu-producer", "producer", "gpu", "llm"),
            ("batch-producer", "producer", "batch", "batch"),
        )
    }


def _remote_workers(
    gateway_url: str, keys: dict[str, str], folder: Path
) -> list[subprocess.Popen[bytes]]:
    """Two workers of group gpu, one of group batch; none has a database URL."""
    workers = []
    for i, (key, queue) in enumerate(
        (("gpu-worker", "llm"), ("gpu-worker", "llm"), ("batch-worker", "batch"))
    ):
        argv = ["worker", "-A", "plunder.demo_gateway:app", "-q", queue, "-c", "3",
                "--name", f"remote-{queue}-{i}"]  # fmt: skip
        workers.append(_spawn(argv, _remote_env(gateway_url, keys[key]), folder / f"w{i}.log"))
    return workers


def _produce(
    store: Store, gateway_url: str, *, keys: dict[str, str],
    workers: list[subprocess.Popen[bytes]], say: Callable[[str], None], deadline: float,
) -> dict[str, Any]:  # fmt: skip
    gpu = App(gateway_url, key=keys["gpu-producer"])
    batch = App(gateway_url, key=keys["batch-producer"])
    try:
        _wait_for(lambda: len(store.session_list()) >= 3, deadline, "three remote sessions")
        answers = [gpu.enqueue("gw.generate", [f"question {i}"]) for i in range(12)]
        indexed = [batch.enqueue("gw.index", [i]) for i in range(30)]
        say(f"enqueued 12 generations (group gpu) and 30 index jobs (group batch); job "
            f"{answers[0].id}'s tokens as they stream:")  # fmt: skip
        say("  " + "".join(str(e.data) for e in answers[0].stream(timeout=30)))
        try:
            gpu.job(indexed[0].id)
            crossed = "read"
        except errors.JobNotFound:
            crossed = "refused"
        say(f"the gpu producer reading a batch job: {crossed} (404, as for a missing job)")
        killed, holder = _kill_a_holder(store, workers[:2], deadline)
        say(f"SIGKILLed remote worker pid {holder} holding {len(killed)} generation(s)")
        _wait_for(lambda: all(is_terminal(j.refresh().status) for j in answers + indexed),
                  deadline, "every job to finish")  # fmt: skip
        rescued = [i for i in killed if _rescued(store.job_get(i), store)]
        summary = {
            "generations": len(answers),
            "index_jobs": len(indexed),
            "succeeded": sum(j.status is Status.SUCCEEDED for j in answers + indexed),
            "killed_worker_jobs": len(killed),
            "rescued": len(rescued),
            "cross_group_read": crossed,
            "database_url_in_workers_env": any(
                store.url in v for v in _remote_env(gateway_url, "").values()
            ),
        }
        total = len(answers) + len(indexed)
        say(f"{summary['succeeded']} of {total} jobs succeeded; {len(rescued)} of the killed "
            f"worker's {len(killed)} rescued by the other")  # fmt: skip
        return summary
    finally:
        gpu.close()
        batch.close()


def _kill_a_holder(
    store: Store, procs: list[subprocess.Popen[bytes]], deadline: float
) -> tuple[list[int], int]:
    """SIGKILL the first of ``procs`` seen holding a generation; the jobs it held."""
    by_pid = {p.pid: p for p in procs}
    while time.monotonic() < deadline:
        for session in store.session_list():
            if session.pid in by_pid:
                running = store.job_list(status=Status.RUNNING.value, limit=1000).jobs
                held = [j.id for j in running if j.session_id == session.id]
                if held:
                    by_pid[session.pid].send_signal(signal.SIGKILL)
                    by_pid[session.pid].wait()
                    return held, session.pid
        time.sleep(0.05)
    raise TimeoutError("no remote worker took a generation in time")


def _rescued(job: JobRecord, store: Store) -> bool:
    runs = store.job_runs(job.id)
    return job.status is Status.SUCCEEDED and any(r.outcome == Outcome.LOST for r in runs)


def _wait_for(check: Any, deadline: float, what: str) -> None:
    while not check():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out waiting for {what}")
        time.sleep(0.1)
