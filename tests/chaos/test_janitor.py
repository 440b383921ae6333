"""Janitor leadership under faults (RELIABILITY.md §5 E): the holder is killed again and
again (S21), and a paused holder resumes after another took over (S22a). Three standalone
``plunder janitor`` processes; workers run with ``--no-janitor`` so that only the janitors
are faulted."""

from __future__ import annotations

import re
import time

from plunder.janitor import LEASE_NAME
from plunder.model import Lease
from plunder.states import Outcome, Status
from tests.chaos.checker import DEFAULT, check
from tests.chaos.harness import Proc, System, witness


def _holder(system: System, janitors: list[Proc]) -> tuple[Lease, Proc]:
    def found() -> tuple[Lease, Proc] | None:
        lease = system.store.lease_get(LEASE_NAME)
        if lease is None or lease.expires_at <= system.store.now():
            return None
        for proc in janitors:
            if proc.alive and re.search(f"acquired by {re.escape(lease.holder)} ", proc.output()):
                return lease, proc
        return None

    result: tuple[Lease, Proc] = system.wait(found, what="a live janitor holding the lease")
    return result


def _timeout_load(system: System, count: int) -> None:
    system.load(
        rate=10,
        make=lambda i: witness(sleep_ms=1500 if i % 2 else 50, timeout=0.5, max_attempts=2),
        count=count,
    )


def test_s21_janitor_holder_killed_repeatedly(system: System) -> None:
    janitors = [system.start("janitor") for _ in range(3)]
    system.workers(2, concurrency=8, extra=["--no-janitor"])
    _timeout_load(system, 60)
    takeovers = []
    for _ in range(4):
        lease, holder = _holder(system, janitors)
        killed = time.monotonic()
        system.kill(holder)
        janitors.append(system.start("janitor"))
        new, _ = _holder(system, janitors)
        assert new.term > lease.term and new.holder != lease.holder
        takeovers.append(time.monotonic() - killed)
    system.wait_terminal(timeout=60)
    obs = system.observe()
    timed_out = [r for runs in obs.runs.values() for r in runs if r.outcome == Outcome.TIMED_OUT]
    assert timed_out, "the janitors had no timeouts to handle: the window was not hit"
    assert max(takeovers) <= system.timing.r_janitor, takeovers
    report = check(obs, (*DEFAULT, "I10"))
    print(report.summary())
    print(
        f"S21 {system.backend}: takeovers {', '.join(f'{t:.2f}s' for t in takeovers)}; "
        f"{len(timed_out)} timed-out runs; terms seen {sorted({t for _, _, t in obs.leases})}"
    )
    assert report.ok, report.summary()


def test_s22a_paused_holder_resumes_and_steps_down(system: System) -> None:
    janitors = [system.start("janitor") for _ in range(2)]
    system.workers(2, concurrency=8, extra=["--no-janitor"])
    _timeout_load(system, 30)
    lease, holder = _holder(system, janitors)
    with system.paused(holder):
        new, successor = _holder(system, [p for p in janitors if p is not holder])
        assert new.term > lease.term
        time.sleep(max(0.0, 2 * system.timing.lease - system.timing.lease))
    system.wait(
        lambda: f"janitor lease term {lease.term} " in holder.output(),
        what="the resumed holder to notice it lost the lease",
    )
    time.sleep(3 * system.timing.janitor)
    current = system.store.lease_get(LEASE_NAME)
    assert current is not None and current.holder == new.holder  # no flapping back
    system.wait_terminal(timeout=60)
    report = check(system.observe(), (*DEFAULT, "I10"))
    print(report.summary())
    assert report.ok, report.summary()
    assert successor.alive and all(j.status != Status.RUNNING for j in system.jobs())
