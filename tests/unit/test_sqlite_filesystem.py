"""SQLite URLs and the refusal to put a database on a network filesystem (WAL needs shared
memory on one host), read from a fake /proc/mounts."""

from __future__ import annotations

from pathlib import Path

import pytest

from plunder import errors
from plunder.store.sqlite import files

MOUNTS = """\
sysfs /sys sysfs rw,nosuid,nodev,noexec,relatime 0 0
/dev/sda1 / ext4 rw,relatime 0 0
tmpfs /run tmpfs rw,nosuid,nodev 0 0
server:/export /srv/shared nfs4 rw,relatime,vers=4.2 0 0
/dev/sdb1 /srv/shared/local ext4 rw,relatime 0 0
//nas/share /mnt/my\\040share cifs rw 0 0
/dev/sdc1 /srv/sharedness xfs rw 0 0
sshfs#me@host: /home/me/remote fuse.sshfs rw 0 0
"""


@pytest.mark.parametrize(
    ("path", "kind"),
    [
        ("/var/lib/plunder.db", "ext4"),
        ("/srv/shared/plunder.db", "nfs4"),
        ("/srv/shared/deep/er/plunder.db", "nfs4"),
        ("/srv/shared/local/plunder.db", "ext4"),  # the longest mount prefix wins
        ("/srv/shared/local", "ext4"),
        ("/srv/sharedness/plunder.db", "xfs"),  # a prefix of the name is not a parent
        ("/mnt/my share/plunder.db", "cifs"),  # \040 in /proc/mounts is a space
        ("/home/me/remote/q.db", "fuse.sshfs"),
        ("/run/plunder.db", "tmpfs"),
    ],
)
def test_filesystem_type_uses_the_longest_mount_prefix(path: str, kind: str) -> None:
    assert files.filesystem_type(Path(path), MOUNTS) == kind


def test_filesystem_type_is_none_without_a_matching_mount() -> None:
    assert files.filesystem_type(Path("/var/x.db"), "garbage\n\n/dev/sda1 /srv ext4 rw\n") is None


@pytest.mark.parametrize(
    "path",
    [
        "/srv/shared/plunder.db",
        "/srv/shared/sub/dir/plunder.db",
        "/mnt/my share/plunder.db",
        "/home/me/remote/q.db",
    ],
)
def test_a_database_on_a_network_filesystem_is_refused(path: str) -> None:
    with pytest.raises(errors.ConfigError, match="network filesystem") as caught:
        files.check_local(Path(path), MOUNTS)
    assert path in str(caught.value) and "PostgreSQL" in str(caught.value)


@pytest.mark.parametrize(
    "path", ["/var/lib/plunder.db", "/srv/shared/local/plunder.db", "/srv/sharedness/p.db"]
)
def test_a_database_on_a_local_filesystem_is_accepted(path: str) -> None:
    files.check_local(Path(path), MOUNTS)


def test_check_local_looks_at_an_existing_file_itself(tmp_path: Path) -> None:
    db = tmp_path / "here.db"
    db.touch()
    mounts = f"/dev/sda1 / ext4 rw 0 0\nserver:/x {db} nfs rw 0 0\n"  # a file bind mount
    with pytest.raises(errors.ConfigError, match="nfs"):
        files.check_local(db, mounts)
    files.check_local(tmp_path / "not-yet.db", mounts)  # judged by its directory


def test_the_real_mounts_are_read_when_none_are_given(tmp_path: Path) -> None:
    files.check_local(tmp_path / "plunder.db")  # the test's tmp_path is local


# -- URLs ---------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("url", "path", "synchronous"),
    [
        ("sqlite:///rel.db", "rel.db", "FULL"),
        ("sqlite:///dir/rel.db", "dir/rel.db", "FULL"),
        ("sqlite:////abs/path.db", "/abs/path.db", "FULL"),
        ("sqlite:////abs/path.db?synchronous=NORMAL", "/abs/path.db", "NORMAL"),
        ("sqlite:///rel.db?synchronous=extra", "rel.db", "EXTRA"),
        ("sqlite:///rel.db?synchronous=full", "rel.db", "FULL"),
    ],
)
def test_parse_url_accepts_files_and_synchronous(url: str, path: str, synchronous: str) -> None:
    assert files.parse_url(url) == (Path(path), {"synchronous": synchronous})


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("sqlite:///:memory:", "names no file"),
        ("sqlite://", "names no file"),
        ("sqlite:///", "names no file"),
        ("sqlite://host/x.db", "not a SQLite URL"),
        ("postgresql:///x.db", "not a SQLite URL"),
        ("sqlite:///x.db?journal_mode=DELETE", "unknown SQLite URL option"),
        ("sqlite:///x.db?synchronous=OFF", "synchronous must be one of"),
        ("sqlite:///x.db?synchronous=0", "synchronous must be one of"),
        ("sqlite:///x.db?synchronous=NORMAL&cache=shared", "unknown SQLite URL option"),
    ],
)
def test_parse_url_rejects_memory_unknown_options_and_bad_synchronous(
    url: str, message: str
) -> None:
    with pytest.raises(errors.ConfigError, match=message):
        files.parse_url(url)
