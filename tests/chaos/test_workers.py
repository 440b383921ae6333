"""Worker process faults (RELIABILITY.md §5 A): SIGKILL mid-task (S01), crashes inside the
completion transaction (S02), a paused zombie (S03), graceful shutdown (S06) and a poison
job (S07) — real processes, real signals, on both backends."""

from __future__ import annotations

import signal
import subprocess
import time

from plunder.states import Outcome, Status
from tests.chaos.checker import check
from tests.chaos.harness import System, witness
from tests.support import procs


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


ENDS = ("commit_stale", "commit_ok", "commit_error")


def zombie_ends(system: System, session: str) -> list[dict[str, object]]:
    """How the tasks of ``session`` ended their completion transactions."""
    return [e for e in system.execs() if e["session"] == session and e["ev"] in ENDS]


def zombie(system: System, module: str = "plunder") -> tuple[str, int]:
    """S03's fault: a worker holding claims is paused (SIGSTOP) for 3 x expiry, its jobs are
    rescued, then it resumes and its tasks try to commit. Returns the old session id and
    how many jobs it held, once every one of its tasks has ended its transaction.

    The tasks sleep longer than it takes to see their claims and pause the worker, and
    shorter than the pause lasts (the rescue, then the same sleep again elsewhere): each
    reaches its commit after the worker resumes. A task that reached it before the pause
    (a machine so slow that the window was missed) fails the scenario, saying so."""
    paused = system.start(module=module, concurrency=4)
    old = system.wait(lambda: system.session_of(paused), what="session").id
    system.enqueue([witness(sleep_ms=2500) for _ in range(3)])
    held = system.wait(lambda: len(system.running_on(old)) == 3 and 3, what="3 claims")
    # and running: a claim whose task had not started yet when the worker froze is dropped
    # on waking, before its task could try to commit
    system.wait(
        lambda: len({e["job"] for e in system.execs() if e["session"] == old}) == held,
        what="the 3 tasks started",
    )
    with system.paused(paused):
        early = [e for e in system.execs() if e["session"] == old and e["ev"] == "commit_try"]
        assert not early, f"the window was missed: the zombie committed before its pause {early}"
        system.start(module=module, concurrency=4)
        system.wait_terminal(timeout=system.timing.r_worker + 10)
        time.sleep(max(0.0, 3 * system.timing.expiry - system.timing.r_worker))
    try:
        system.wait(
            lambda: len(zombie_ends(system, old)) == held,
            what="the resumed zombie tries to commit",
        )
    except AssertionError as exc:  # what the zombie said and did, to tell why
        events = [e for e in system.execs() if e["session"] == old]
        tail = paused.output()[-4000:]
        raise AssertionError(f"{exc}\nits events: {events}\nits output:\n{tail}") from exc
    return old, held


def test_s03_paused_worker_is_fenced(system: System) -> None:
    """Every late commit of the zombie is refused: by the database (StaleClaim); by the
    worker itself, which on waking finds its session's lease run out by its own clock and
    cuts its calls in flight (a task's transaction among them) before the database is
    asked; or, on PostgreSQL, by the server, which ended the task's transaction while it
    sat idle through the pause (3 expiries, longer than ``idle_timeout``'s 2). Which comes
    first is a race inside the resumed process; all three refuse."""
    old, held = zombie(system)
    paused = system.procs[0]
    new = system.wait(
        lambda: (s := system.session_of(paused)) and s.id != old and s, what="a new session"
    )
    ends = zombie_ends(system, old)
    assert not [e for e in ends if e["ev"] == "commit_ok"], ends
    stale = [e for e in ends if e["ev"] == "commit_stale"]
    cut = [e for e in ends if e["ev"] == "commit_error"]
    own = [e for e in cut if "the worker's session was lost" in str(e["error"])]
    if own:
        assert "gave up" in paused.output(), own
    ended = [e for e in cut if e not in own]
    if ended:  # the server's idle-transaction timeout closed the task's connection
        assert system.backend == "postgres", ended
        said = ("server closed the connection", "idle-in-transaction timeout")
        assert all(any(w in str(e["error"]) for w in said) for e in ended), ended
    assert "SESSION LOST" in paused.output()
    # the resumed worker carries on under its new session
    (later,) = system.enqueue([witness(queue="q2")])
    system.wait_terminal()
    assert system.store.job_get(later.id).status == Status.SUCCEEDED
    print(
        f"S03 {system.backend}: {held} held, {len(stale)} commits fenced by the database, "
        f"{len(cut)} cut by the worker, new {new.id[:8]}"
    )
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


def test_s02_crash_inside_the_completion_transaction(system: System) -> None:
    system.workers(2, concurrency=1)
    system.supervise()
    system.restart_with(concurrency=1)
    points = ["before_effects", "after_effects_before_return", "after_commit"]
    jobs = system.enqueue([witness(kill_point=p) for p in points for _ in range(4)])
    system.wait_terminal(timeout=60)
    obs = system.observe()
    kills = [e for e in obs.execs if e["ev"] == "kill"]
    assert len(kills) == 12, f"{len(kills)} kills: the window was not hit every time"
    by_id = {j.id: j for j in obs.jobs.values()}
    for job in jobs:
        final = by_id[job.id]
        point = job.kwargs["kill_point"]
        rows = [r for r in obs.effects if r[1] == job.id]
        assert final.status == Status.SUCCEEDED, (point, final)
        assert [r[2] for r in rows] == [final.attempt], (point, rows)
        if point == "after_commit":  # committed before the crash: never run again
            assert final.attempt == 1
            assert [r.outcome for r in obs.runs[job.id]] == [Outcome.SUCCEEDED]
            assert not [e for e in obs.execs if e.get("job") == job.id and e["attempt"] > 1]
        else:  # the open transaction died with the process: rolled back, run again
            assert final.attempt == 2
            assert obs.runs[job.id][0].outcome == Outcome.LOST
    print(f"S02 {system.backend}: 12 kills, {system.restarts} restarts")
    _assert_ok(system)


def test_s06_graceful_shutdown_releases_at_once(system: System) -> None:
    leaving = system.start(concurrency=4, extra=["--grace", "1.0"])
    sid = system.wait(lambda: system.session_of(leaving), what="session").id
    # outlive the grace period however long the second worker takes to start; run again
    # by the other worker once released, they end at once
    system.enqueue([witness(first_sleep_ms=10_000) for _ in range(2)])
    system.enqueue([witness(sleep_ms=300) for _ in range(2)])  # finish within it
    system.wait(lambda: len(system.running_on(sid)) == 4, what="4 claims")
    system.workers(1, concurrency=4)
    system.enqueue([witness(sleep_ms=200) for _ in range(20)])
    system.signal(leaving, signal.SIGTERM)
    # Read after the signal was sent: a turn (acknowledge + claim, one transaction) that
    # was already under way when it arrived may still stamp its claim a moment later.
    delivered = system.store.now()
    assert leaving.popen.wait(timeout=10) == 0
    assert all(s.id != sid for s in system.store.session_list()), "session not closed"
    system.wait_terminal()
    obs = system.observe()
    mine = [r for runs in obs.runs.values() for r in runs if r.session_id == sid]
    late = [(r.job_id, (r.started_at - delivered).total_seconds()) for r in mine]
    after = {gap for _, gap in late if gap > 0}
    # at most the one turn that was in flight, stamped within moments of the signal
    assert len(after) <= 1 and all(gap < 0.1 for gap in after), f"claimed after SIGTERM: {late}"
    released = [r for r in mine if r.outcome == Outcome.RELEASED]
    finished = [r for r in mine if r.outcome == Outcome.SUCCEEDED]
    assert len(released) == 2 and len(finished) >= 2, [r.outcome for r in mine]
    for run in released:
        nxt = next(r for r in obs.runs[run.job_id] if r.attempt == run.attempt + 1)
        assert run.finished_at is not None
        wait = (nxt.started_at - run.finished_at).total_seconds()
        assert wait <= system.timing.poll + 1.0, f"released job waited {wait:.2f}s"
    print(f"S06 {system.backend}: {len(finished)} finished in grace, 2 released at once")
    _assert_ok(system)


def test_s06_second_signal_stops_at_once(system: System) -> None:
    """The tasks sleep longer than it takes to see their claims, start a second worker
    and signal twice; one that reached its commit before the second signal (a machine so
    slow that the window was missed) fails the scenario, saying so."""
    leaving = system.start(concurrency=4, extra=["--grace", "30"])
    sid = system.wait(lambda: system.session_of(leaving), what="session").id
    system.enqueue([witness(first_sleep_ms=6000) for _ in range(3)])  # run again at once
    system.wait(lambda: len(system.running_on(sid)) == 3, what="3 claims")
    system.workers(1, concurrency=4)
    system.signal(leaving, signal.SIGTERM)
    time.sleep(0.3)
    os_signal_sent = time.monotonic()
    system.signal(leaving, signal.SIGTERM)
    early = [e for e in system.execs() if e["session"] == sid and e["ev"] == "commit_try"]
    assert not early, f"the window was missed: a task committed before the second signal {early}"
    try:
        leaving.popen.wait(timeout=5)
    except subprocess.TimeoutExpired:  # what the worker last wrote says where it stands
        output = procs.stacks(leaving.popen, leaving.log)
        raise AssertionError(f"no exit 5 s after the second signal:\n{output}") from None
    assert time.monotonic() - os_signal_sent < 3.0, "the second signal did not stop at once"
    system.wait_terminal()
    obs = system.observe()
    mine = [r for runs in obs.runs.values() for r in runs if r.session_id == sid]
    assert len(mine) == 3 and all(r.outcome != Outcome.SUCCEEDED for r in mine)
    _assert_ok(system)


def test_s07_poison_job_ends_after_max_attempts(system: System) -> None:
    system.workers(3, concurrency=2)
    system.supervise()
    system.restart_with(concurrency=2)
    (poison,) = system.enqueue([witness(poison=True, max_attempts=3)])
    normal = system.enqueue([witness(queue="q2", sleep_ms=20) for _ in range(100)])
    system.wait_terminal(timeout=60)
    obs = system.observe()
    runs = obs.runs[poison.id]
    assert system.store.job_get(poison.id).status == Status.TIMED_OUT
    assert [r.outcome for r in runs] == [Outcome.LOST] * 3
    assert len([e for e in obs.execs if e.get("job") == poison.id]) == 3
    unfinished = {
        j.id: (j.status, [(r.attempt, r.outcome, r.session_id[:8]) for r in obs.runs[j.id]])
        for j in (obs.jobs[str(spec.kwargs["uid"])] for spec in normal)
        if j.status != Status.SUCCEEDED
    }
    poison_runs = [(r.attempt, r.outcome, r.session_id[:8]) for r in runs]
    assert not unfinished, f"normal jobs not succeeded: {unfinished}; poison: {poison_runs}"
    assert system.restarts == 3
    print(f"S07 {system.backend}: poison ended after 3 claims, {len(normal)} others succeeded")
    _assert_ok(system)
