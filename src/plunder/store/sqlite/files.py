"""Where a SQLite store's file is: its URL, and the filesystem it lives on (WAL needs shared
memory on one host, so a network filesystem is refused)."""

from __future__ import annotations

from pathlib import Path
from urllib.parse import parse_qs, urlsplit

from plunder import errors

SYNCHRONOUS = ("FULL", "NORMAL", "EXTRA")
NETWORK_FILESYSTEMS = frozenset(
    {
        "nfs",
        "nfs4",
        "cifs",
        "smb3",
        "smbfs",
        "9p",
        "afs",
        "ceph",
        "glusterfs",
        "lustre",
        "fuse.sshfs",
        "fuse.s3fs",
        "fuse.rclone",
        "fuse.gcsfuse",
        "davfs",
    }
)


def parse_url(url: str) -> tuple[Path, dict[str, str]]:
    """``sqlite:///relative.db``, ``sqlite:////absolute/path.db``, optional
    ``?synchronous=NORMAL``."""
    parts = urlsplit(url)
    if parts.scheme != "sqlite" or parts.netloc:
        raise errors.ConfigError(f"not a SQLite URL: {url!r} (use sqlite:///path/to/file.db)")
    path = parts.path[1:] if parts.path.startswith("/") else parts.path
    if not path or path == ":memory:":
        raise errors.ConfigError(
            f"{url!r} names no file; plunder needs a database file that every worker process "
            "can open (e.g. sqlite:///plunder.db)"
        )
    options = {key: values[-1] for key, values in parse_qs(parts.query).items()}
    unknown = set(options) - {"synchronous"}
    if unknown:
        raise errors.ConfigError(f"unknown SQLite URL option(s): {', '.join(sorted(unknown))}")
    sync = options.get("synchronous", "FULL").upper()
    if sync not in SYNCHRONOUS:
        raise errors.ConfigError(f"synchronous must be one of {', '.join(SYNCHRONOUS)}")
    options["synchronous"] = sync
    return Path(path), options


def filesystem_type(path: Path, mounts: str | None = None) -> str | None:
    """The type of the filesystem holding ``path``, from /proc/mounts (None if unknown)."""
    if mounts is None:
        try:
            mounts = Path("/proc/mounts").read_text(encoding="utf-8")
        except OSError:
            return None
    target = str(path.resolve())
    best, best_type = "", None
    for line in mounts.splitlines():
        fields = line.split()
        if len(fields) < 3:
            continue
        point = fields[1].replace("\\040", " ")
        inside = target == point or target.startswith(point.rstrip("/") + "/")
        if inside and len(point) >= len(best):
            best, best_type = point, fields[2]
    return best_type


def check_local(path: Path, mounts: str | None = None) -> None:
    kind = filesystem_type(path.parent if not path.exists() else path, mounts)
    if kind in NETWORK_FILESYSTEMS:
        raise errors.ConfigError(
            f"{path} is on a network filesystem ({kind}); SQLite's WAL mode needs a local "
            "disk. Put the file on a local disk, or use PostgreSQL for workers on many machines"
        )
