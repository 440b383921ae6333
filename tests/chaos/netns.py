"""Network namespaces for tier T1 (root): a namespace joined to this machine by a veth
pair, cut off by nftables and healed (S08, G6); the leftovers of a crashed run found by the
pid in their names and removed. Each step's undo goes on the caller's ExitStack as soon as
the step is done; deleting the namespace removes its end of the pair and its nft table."""

from __future__ import annotations

import os
import re
import subprocess
from contextlib import ExitStack
from dataclasses import dataclass


def alive(pid: int) -> bool:
    """Whether a process ``pid`` exists (the test process that named a leftover)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def run(*args: str) -> subprocess.CompletedProcess[str]:
    """Run a program; its outcome, failed or not (an undo that finds nothing to undo)."""
    return subprocess.run(args, capture_output=True, text=True, timeout=60, check=False)


def must(*args: str) -> str:
    """Run a program; its output, or RuntimeError with its error output if it failed."""
    done = run(*args)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(args)} failed: {done.stderr.strip()}")
    return done.stdout


NS_PREFIX, LINK_PREFIX = "plw", "plv"  # + <pid of the test process>
NFT_TABLE = "plunder_chaos"


@dataclass(frozen=True)
class Namespace:
    """A network namespace joined to this machine by a veth pair on a private /30; the
    namespace can reach the host's end of the pair and nothing else."""

    name: str
    host_link: str
    host_addr: str
    ns_addr: str

    def exec(self) -> list[str]:
        return ["ip", "netns", "exec", self.name]

    def partition(self) -> None:
        """Drop every packet in and out of the namespace (loopback aside)."""
        rules = (
            f"table inet {NFT_TABLE} {{\n"
            "  chain input { type filter hook input priority 0; policy drop; iif lo accept; }\n"
            "  chain output { type filter hook output priority 0; policy drop; oif lo accept; }\n"
            "}\n"
        )
        done = subprocess.run(
            [*self.exec(), "nft", "-f", "-"],
            input=rules,
            text=True,
            capture_output=True,
            timeout=60,
            check=False,
        )
        if done.returncode != 0:
            raise RuntimeError(f"nft failed: {done.stderr.strip()}")

    def heal(self) -> None:
        run(*self.exec(), "nft", "delete", "table", "inet", NFT_TABLE)


def pids_of(names: list[str], prefix: str, suffix: str = "") -> dict[str, int]:
    pattern = re.compile(rf"^{prefix}(\d+){suffix}$")
    return {n: int(m.group(1)) for n in names if (m := pattern.match(n))}


def stale_network() -> tuple[list[str], list[str]]:
    """Namespaces and host links of ours whose test process is gone."""
    spaces = [line.split()[0] for line in must("ip", "netns", "list").splitlines() if line]
    links = [line.split()[0].split("@")[0] for line in must("ip", "-br", "link").splitlines()]
    return (
        [n for n, pid in pids_of(spaces, NS_PREFIX).items() if not alive(pid)],
        [n for n, pid in pids_of(links, LINK_PREFIX, "h").items() if not alive(pid)],
    )


def clear_stale_network() -> list[str]:
    """Remove the namespaces and host links of crashed runs (their nft tables go with
    their namespaces); the names removed, also printed."""
    spaces, links = stale_network()
    for name in spaces:
        run("ip", "netns", "del", name)
    for name in links:
        run("ip", "link", "del", name)
    if spaces or links:
        print(f"removed leftovers of a crashed run: {spaces + links}")
    return spaces + links


def network_left(ns: Namespace) -> list[str]:
    """What is left of ``ns`` (its namespace, its host link): nothing once undone."""
    spaces = [line.split()[0] for line in must("ip", "netns", "list").splitlines() if line]
    links = [line.split()[0].split("@")[0] for line in must("ip", "-br", "link").splitlines()]
    return [name for name in (ns.name, ns.host_link) if name in spaces + links]


def free_subnet() -> tuple[str, str]:
    """Host and namespace addresses in a /30 of 10.239.0.0/16 no interface here uses."""
    used = set(re.findall(r"inet (10\.239\.\d+\.\d+)/", must("ip", "-4", "-o", "addr")))
    start = os.getpid() % (1 << 14)
    for step in range(1 << 14):
        block = ((start + step) % (1 << 14)) * 4
        base = f"10.239.{block >> 8}.{block & 0xFF}"
        host, ns = (f"10.239.{block >> 8}.{(block & 0xFF) + k}" for k in (1, 2))
        if not {base, host, ns} & used:
            return host, ns
    raise RuntimeError("no free /30 in 10.239.0.0/16")


def namespace(undo: ExitStack) -> Namespace:
    pid = os.getpid()
    host_addr, ns_addr = free_subnet()
    ns = Namespace(f"{NS_PREFIX}{pid}", f"{LINK_PREFIX}{pid}h", host_addr, ns_addr)
    inner = f"{LINK_PREFIX}{pid}n"
    must("ip", "netns", "add", ns.name)
    undo.callback(run, "ip", "netns", "del", ns.name)  # its nft rules and its end go too
    must("ip", "link", "add", ns.host_link, "type", "veth", "peer", "name", inner)
    undo.callback(run, "ip", "link", "del", ns.host_link)
    must("ip", "link", "set", inner, "netns", ns.name)
    must("ip", "addr", "add", f"{host_addr}/30", "dev", ns.host_link)
    must("ip", "link", "set", ns.host_link, "up")
    must("ip", "-n", ns.name, "addr", "add", f"{ns_addr}/30", "dev", inner)
    must("ip", "-n", ns.name, "link", "set", inner, "up")
    must("ip", "-n", ns.name, "link", "set", "lo", "up")
    return ns
