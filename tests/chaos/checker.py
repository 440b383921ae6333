"""The invariants of the chaos suite (RELIABILITY.md §4.4), checked on what the harness
observed through plunder's public API, the witness's exec logs and its effects table.

Each ``check_*`` returns its violations as readable strings; :func:`check` runs the set a
scenario asks for and returns a :class:`Report` with counts and the first examples.
"""

from __future__ import annotations

import itertools
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from plunder.model import JobRecord, Run
from plunder.states import Outcome, Status, is_terminal

EXAMPLES = 5


@dataclass(frozen=True)
class Op:
    """One client call in Jepsen's terms: ``invoke`` then ``ok``, ``fail`` (it surely did
    not happen) or ``info`` (unknown: a timeout or a lost connection)."""

    op: str
    uid: str
    type: str
    t: float
    error: str | None = None


@dataclass
class Observation:
    jobs: dict[str, JobRecord]  # witness jobs by uid
    runs: dict[int, list[Run]]
    effects: list[tuple[str, int, int, str, int]]  # uid, job id, attempt, session, pid
    execs: list[dict[str, Any]]  # the witness's exec-log lines
    history: list[Op]
    samples: list[tuple[float, dict[int, Status]]] = field(default_factory=list)
    leases: list[tuple[float, str, int]] = field(default_factory=list)  # t, holder, term

    def events(self, kind: str) -> list[dict[str, Any]]:
        return [line for line in self.execs if line["ev"] == kind]


@dataclass
class Report:
    violations: dict[str, list[str]]
    stats: dict[str, int]

    @property
    def ok(self) -> bool:
        return not any(self.violations.values())

    def count(self, invariant: str) -> int:
        return len(self.violations.get(invariant, []))

    def summary(self) -> str:
        lines = [", ".join(f"{k}={v}" for k, v in self.stats.items())]
        for name, found in self.violations.items():
            lines.append(f"{name}: {len(found)} violation(s)")
            lines += [f"    {example}" for example in found[:EXAMPLES]]
        return "\n".join(lines)


def check_i1_durable_enqueue(obs: Observation) -> list[str]:
    """Every enqueue that returned ok is stored; one that surely failed is not."""
    out = []
    for op in obs.history:
        if op.op != "enqueue":
            continue
        if op.type == "ok" and op.uid not in obs.jobs:
            out.append(f"{op.uid}: enqueue returned ok but the job is not stored")
        if op.type == "fail" and op.uid in obs.jobs:
            out.append(f"{op.uid}: enqueue failed ({op.error}) yet the job is stored")
    return out


def check_i2_terminal(obs: Observation) -> list[str]:
    return [
        f"{uid}: job {job.id} is still {job.status} (attempt {job.attempt}, "
        f"session {job.session_id})"
        for uid, job in obs.jobs.items()
        if not is_terminal(job.status)
    ]


def _effects_by_uid(obs: Observation) -> dict[str, list[tuple[str, int, int, str, int]]]:
    grouped: dict[str, list[tuple[str, int, int, str, int]]] = defaultdict(list)
    for row in obs.effects:
        grouped[row[0]].append(row)
    return grouped


def check_i3_exactly_once(obs: Observation) -> list[str]:
    """A succeeded job has exactly one committed effects row; any other job has none."""
    out = []
    grouped = _effects_by_uid(obs)
    for uid, job in obs.jobs.items():
        rows = grouped.get(uid, [])
        want = 1 if job.status == Status.SUCCEEDED else 0
        if len(rows) != want:
            attempts = sorted((r[2], r[3][:8]) for r in rows)
            out.append(f"{uid}: {job.status} with {len(rows)} effects rows {attempts}")
    for uid in set(grouped) - set(obs.jobs):
        out.append(f"{uid}: effects rows for a job that is not stored")
    return out


def check_i4_fencing(obs: Observation) -> list[str]:
    """Effects, result and the succeeded run carry the job's final claim; no commit that a
    worker believed accepted came from any other claim."""
    out = []
    grouped = _effects_by_uid(obs)
    for uid, job in obs.jobs.items():
        final = (job.attempt, job.session_id)
        for row in grouped.get(uid, []):
            if (row[2], row[3]) != final:
                out.append(f"{uid}: effects of attempt {row[2]} but the final claim is {final}")
        if job.status == Status.SUCCEEDED:
            expected = {"uid": uid, "attempt": job.attempt, "session": job.session_id}
            if job.result != expected:
                out.append(f"{uid}: result {job.result} is not from the final claim {final}")
        won = [r.attempt for r in obs.runs.get(job.id, []) if r.outcome == Outcome.SUCCEEDED]
        if won and (len(won) > 1 or won[0] != job.attempt):
            out.append(f"{uid}: succeeded runs {won}, final attempt {job.attempt}")
    by_job = {job.id: job for job in obs.jobs.values()}
    for line in obs.events("commit_ok"):
        job = by_job.get(line["job"])
        if job is not None and (line["attempt"], line["session"]) != (
            job.attempt,
            job.session_id,
        ):
            out.append(
                f"{job.id}: a worker committed attempt {line['attempt']} "
                f"(session {line['session'][:8]}) but the final claim is attempt {job.attempt}"
            )
    return out


def check_i5_disjoint_claims(obs: Observation) -> list[str]:
    """A job's claims never overlap in database time."""
    out = []
    for job_id, runs in obs.runs.items():
        ordered = sorted(runs, key=lambda r: r.attempt)
        for earlier, later in itertools.pairwise(ordered):
            if earlier.finished_at is None or earlier.finished_at > later.started_at:
                out.append(
                    f"job {job_id}: attempt {earlier.attempt} ({earlier.outcome}, ended "
                    f"{earlier.finished_at}) overlaps attempt {later.attempt} "
                    f"(started {later.started_at})"
                )
    return out


def check_i6_attempts(obs: Observation) -> list[str]:
    """One run per claim, attempts 1..n with no gap, n ≤ max_attempts, and at most one
    execution per claim (executions ≥ 1 for a succeeded job)."""
    out = []
    execs = Counter((line["job"], line["attempt"]) for line in obs.events("exec"))
    for uid, job in obs.jobs.items():
        attempts = sorted(r.attempt for r in obs.runs.get(job.id, []))
        if attempts != list(range(1, job.attempt + 1)):
            out.append(f"{uid}: runs {attempts} for attempt {job.attempt}")
        if job.attempt > job.max_attempts:
            out.append(f"{uid}: attempt {job.attempt} > max_attempts {job.max_attempts}")
        for attempt in range(1, job.attempt + 1):
            if execs[(job.id, attempt)] > 1:
                out.append(f"{uid}: attempt {attempt} executed {execs[(job.id, attempt)]} times")
        if job.status == Status.SUCCEEDED and not execs[(job.id, job.attempt)]:
            out.append(f"{uid}: succeeded without an execution of attempt {job.attempt}")
    known = {(job.id, a) for job in obs.jobs.values() for a in range(1, job.attempt + 1)}
    for job_id, attempt in execs:
        if (job_id, attempt) not in known:
            out.append(f"job {job_id}: executed attempt {attempt} that was never claimed")
    return out


def check_i7_absorbing(obs: Observation) -> list[str]:
    """Once a sample saw a job terminal, it stays in that state (no admin retries here)."""
    out = []
    seen: dict[int, Status] = {}
    for t, statuses in obs.samples:
        for job_id, status in statuses.items():
            first = seen.get(job_id)
            if first is not None and status != first:
                out.append(f"job {job_id}: {first} then {status} at t={t:.2f}")
            elif first is None and is_terminal(status):
                seen[job_id] = status
    final = {job.id: job.status for job in obs.jobs.values()}
    out += [
        f"job {job_id}: sampled {status}, ends {final[job_id]}"
        for job_id, status in seen.items()
        if job_id in final and final[job_id] != status
    ]
    return out


def check_i9_no_spurious_rescue(obs: Observation) -> list[str]:
    return [
        f"job {r.job_id}: attempt {r.attempt} ended {r.outcome} (session {r.session_id[:8]})"
        for runs in obs.runs.values()
        for r in runs
        if r.outcome == Outcome.LOST
    ]


def check_i10_single_janitor(obs: Observation) -> list[str]:
    """Terms never go back, and each term has exactly one holder."""
    out = []
    holders: dict[int, str] = {}
    last = 0
    for t, holder, term in obs.leases:
        if term < last:
            out.append(f"t={t:.2f}: term went back from {last} to {term}")
        last = max(last, term)
        if holders.setdefault(term, holder) != holder:
            out.append(f"term {term} held by both {holders[term]} and {holder}")
    return out


CHECKS: dict[str, Callable[[Observation], list[str]]] = {
    "I1": check_i1_durable_enqueue,
    "I2": check_i2_terminal,
    "I3": check_i3_exactly_once,
    "I4": check_i4_fencing,
    "I5": check_i5_disjoint_claims,
    "I6": check_i6_attempts,
    "I7": check_i7_absorbing,
    "I9": check_i9_no_spurious_rescue,
    "I10": check_i10_single_janitor,
}
DEFAULT = ("I1", "I2", "I3", "I4", "I5", "I6", "I7")


def check(obs: Observation, invariants: Iterable[str] = DEFAULT) -> Report:
    violations = {name: CHECKS[name](obs) for name in invariants}
    execs = obs.events("exec")
    stats = {
        "jobs": len(obs.jobs),
        "succeeded": sum(j.status == Status.SUCCEEDED for j in obs.jobs.values()),
        "claims": sum(len(r) for r in obs.runs.values()),
        "executions": len(execs),
        "effects": len(obs.effects),
        "fenced_commits": len(obs.events("commit_stale")),
        "lost_runs": sum(r.outcome == Outcome.LOST for runs in obs.runs.values() for r in runs),
        "enqueue_info": sum(op.type == "info" for op in obs.history if op.op == "enqueue"),
    }
    return Report(violations, stats)
