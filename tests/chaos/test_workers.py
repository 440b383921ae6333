"""Worker process faults (RELIABILITY.md §5 A): SIGKILL mid-task (S01), crashes inside the
completion transaction (S02), a paused zombie (S03), graceful shutdown (S06) and a poison
job (S07) — real processes, real signals, on both backends."""

from __future__ import annotations

import time

from plunder.states import Outcome, Status
from tests.chaos.checker import check
from tests.chaos.harness import System, witness


def _assert_ok(system: System, invariants: tuple[str, ...] = ()) -> None:
    from tests.chaos.checker import DEFAULT

    report = check(system.observe(), (*DEFAULT, *invariants))
    print(report.summary())
    assert report.ok, report.summary() + "\n" + system.logs()[-4000:]


def test_s01_sigkill_mid_task(system: System) -> None:
    victim, *_others = system.workers(3, concurrency=4)
    jobs = system.enqueue(
        [witness(queue=f"q{1 + i % 2}", sleep_ms=300 + 40 * (i % 10)) for i in range(60)]
    )
    sid = system.session_of(victim).id  # type: ignore[union-attr]
    held = system.wait(lambda: system.running_on(sid), what="the victim holds claims")
    killed_at = system.kill(victim)
    orphans = [j for j in system.running_on(sid)] or held
    system.wait_terminal()
    obs = system.observe()
    gaps = []
    for job in orphans:
        runs = obs.runs[job.id]
        assert runs[0].outcome == Outcome.LOST and runs[0].session_id == sid
        second = runs[1]
        assert second.session_id != sid and second.attempt == 2
        gaps.append((second.started_at - killed_at).total_seconds())
    assert max(gaps) <= system.timing.r_worker, gaps
    # I13: the other workers kept finishing jobs while the victim's session was expiring
    finished_in_window = [
        j
        for j in obs.jobs.values()
        if j.finished_at
        and killed_at < j.finished_at
        and (j.finished_at - killed_at).total_seconds() < system.timing.expiry
    ]
    assert finished_in_window, "nothing finished while the dead session was expiring"
    print(f"S01 {system.backend}: {len(orphans)} orphans, kill-to-reclaim max {max(gaps):.2f}s")
    _assert_ok(system)
    assert len(jobs) == 60


def zombie(system: System, module: str = "plunder") -> tuple[str, int]:
    """S03's fault: a worker holding claims is paused (SIGSTOP) for 3 x expiry, its jobs are
    rescued, then it resumes and its tasks try to commit. Returns the old session id and
    how many jobs it held."""
    paused = system.start(module=module, concurrency=4)
    old = system.wait(lambda: system.session_of(paused), what="session").id
    system.enqueue([witness(sleep_ms=1500) for _ in range(3)])
    held = system.wait(lambda: len(system.running_on(old)) == 3 and 3, what="3 claims")
    with system.paused(paused):
        system.start(module=module, concurrency=4)
        system.wait_terminal(timeout=system.timing.r_worker + 10)
        time.sleep(max(0.0, 3 * system.timing.expiry - system.timing.r_worker))
    system.wait(
        lambda: any(
            e["session"] == old
            for e in system.execs()
            if e["ev"].startswith("commit_") and e["ev"] != "commit_try"
        ),
        what="the resumed zombie tries to commit",
    )
    return old, held


def test_s03_paused_worker_is_fenced(system: System) -> None:
    old, held = zombie(system)
    paused = system.procs[0]
    new = system.wait(
        lambda: (s := system.session_of(paused)) and s.id != old and s, what="a new session"
    )
    stale = [e for e in system.execs() if e["ev"] == "commit_stale" and e["session"] == old]
    assert stale, "the window was not hit: the zombie never tried to commit"
    assert "SESSION LOST" in paused.output()
    # the resumed worker carries on under its new session
    (later,) = system.enqueue([witness(queue="q2")])
    system.wait_terminal()
    assert system.store.job_get(later.id).status == Status.SUCCEEDED
    print(f"S03 {system.backend}: {held} held, {len(stale)} fenced commits, new {new.id[:8]}")
    _assert_ok(system)


def test_self_check_broken_fencing_is_caught(system: System) -> None:
    """The harness can fail: with fencing broken on purpose the zombie's late commits land,
    and the checker must report them."""
    zombie(system, module="tests.chaos.mutant")
    system.wait(lambda: len(system.observe().effects) > 3, timeout=10, what="the zombie's commits")
    report = check(system.observe())
    print(report.summary())
    assert not report.ok
    assert report.count("I3") >= 1 and report.count("I4") >= 1
