"""The programs tier T1's scenarios run beside plunder, and the skip of a scenario whose
programs this machine lacks. ``scripts/t1-prereqs`` installs them all on Debian (run it as
root); ``scripts/t1-prereqs --check`` lists what is missing."""

from __future__ import annotations

import shutil

import pytest

SCRIPT = "scripts/t1-prereqs"
# command -> the Debian package that has it, with the scenarios that run it
TOOLS = {
    "ip": "iproute2",  # S08: the network namespace
    "nft": "nftables",  # S08: the partition
    "mount": "mount",  # S15: the tmpfs
    "umount": "mount",  # S15
    "prlimit": "util-linux",  # S15: the file size limit
    "runuser": "util-linux",  # as root: the servers run as an unprivileged user
    "pgbouncer": "pgbouncer",  # S19
}
SBIN = "/usr/sbin:/sbin"  # where Debian puts some of them, off a user's PATH


def find(command: str) -> str | None:
    """Where ``command`` is: on PATH, else in the sbin folders; None if nowhere."""
    return shutil.which(command) or shutil.which(command, path=SBIN)


def require(scenario: str, *commands: str) -> dict[str, str]:
    """The paths of the scenario's ``commands``; skips the scenario, naming the missing
    programs, their packages and the script that installs them, if any is missing."""
    found = {command: find(command) for command in commands}
    missing = [f"{c} ({TOOLS[c]})" for c, path in found.items() if path is None]
    if missing:
        pytest.skip(f"{scenario} needs {', '.join(missing)}: run {SCRIPT} as root")
    return {command: path for command, path in found.items() if path is not None}
