"""The guarded updates in both dialects' SQL encode exactly the source states of
plunder.states.TRANSITIONS."""

from __future__ import annotations

import re

import pytest

from plunder import states
from plunder.states import Status
from plunder.store import queries

# operation in TRANSITIONS -> the query whose WHERE clause guards it
GUARDED = {
    "claim": "job_claim_many",
    "complete": "job_complete",
    "fail": "job_fail",
    "lose": "job_lose_many",
    "time_out": "job_timeout_many",
    "release": "job_release",
    "abandon": "job_abandon",
    "cancel": "job_cancel",
    "expire": "job_expire_many",
    "retry": "job_retry",
}

# a condition on the status column after WHERE or AND: status = 'x' or status IN ('x', 'y'),
# the column perhaps qualified, or behind SQLite's unary + or PostgreSQL's (status || '')
# (which only steer the planner away from an index); a SET clause (status = CASE …,
# status = 'running') never follows WHERE or AND
GUARD = re.compile(
    r"\b(?:WHERE|AND)\s+(?:\+?(?:\w+\.)?status|\((?:\w+\.)?status\s*\|\|\s*''\))"
    r"\s*(?:=\s*'(\w+)'|IN\s*\(([^)]*)\))",
    re.IGNORECASE,
)


def guard_states(sql: str) -> frozenset[str]:
    """The states a query's status conditions allow. A query may test the status in more
    than one place (PostgreSQL's claim probes each priority level of the claim index, whose
    predicate is the status); every one of them must name the same states."""
    sql = re.sub(r"--[^\n]*", "", sql)
    found = GUARD.findall(sql)
    assert found, "expected a status guard"
    guards = {
        frozenset([single] if single else re.findall(r"'(\w+)'", listed))
        for single, listed in found
    }
    assert len(guards) == 1, f"status guards that disagree: {found}"
    return guards.pop()


def test_every_transition_has_a_guarded_query() -> None:
    assert set(GUARDED) == set(states.TRANSITIONS)


@pytest.mark.parametrize("dialect", ["sqlite", "postgres"])
@pytest.mark.parametrize("operation", sorted(GUARDED))
def test_the_sql_guard_matches_the_transition_table(dialect: str, operation: str) -> None:
    sql = queries.load(dialect)[GUARDED[operation]]
    sources, _ = states.TRANSITIONS[operation]
    assert guard_states(sql) == {s.value for s in sources}


def test_the_guard_parser_refuses_guards_that_disagree() -> None:
    assert guard_states("SELECT 1 WHERE status = 'pending' AND (SELECT 1 WHERE status = 'pending')")
    with pytest.raises(AssertionError, match="disagree"):
        guard_states(
            "UPDATE j SET x = 1 WHERE status = 'pending' AND (SELECT 1 WHERE status = 'running')"
        )


def test_the_guard_parser_reads_a_guard_behind_a_planner_hint() -> None:
    assert guard_states(
        "UPDATE j SET status = 'x' WHERE id = 1 AND (j.status || '') = 'running'"
    ) == {"running"}
    assert guard_states("UPDATE j SET status = 'x' WHERE +status IN ('a', 'b')") == {"a", "b"}


def test_the_guard_parser_reads_single_and_listed_states_and_skips_set_clauses() -> None:
    sql = (
        "UPDATE j SET status = 'running' -- WHERE status = 'nope'\n"
        "WHERE id = 1 AND j.status IN ('failed', 'cancelled')"
    )
    assert guard_states(sql) == {"failed", "cancelled"}
    assert guard_states("UPDATE j SET status = 'x' WHERE status = 'pending'") == {"pending"}
    assert guard_states("UPDATE j SET status = 'x' WHERE id = 1 AND +j.status = 'a'") == {"a"}
    with pytest.raises(AssertionError):
        guard_states("UPDATE j SET status = 'x' WHERE id = 1")  # an unguarded update


def test_terminal_and_active_states_partition_the_states() -> None:
    assert set(Status) == states.TERMINAL | states.ACTIVE
    assert set() == states.TERMINAL & states.ACTIVE
    assert all(states.is_terminal(s) for s in states.TERMINAL)
    assert not any(states.is_terminal(s) for s in states.ACTIVE)


def test_every_transition_starts_outside_the_terminal_states_except_retry() -> None:
    for operation, (sources, target) in states.TRANSITIONS.items():
        if operation == "retry":
            assert sources <= states.TERMINAL and target == Status.PENDING
        else:
            assert sources <= states.ACTIVE, operation


def test_allowed_reads_the_table() -> None:
    assert states.allowed("cancel", "pending") and states.allowed("cancel", Status.RUNNING)
    assert not states.allowed("cancel", "succeeded")
    assert states.allowed("retry", "timed_out") and not states.allowed("retry", "running")
    with pytest.raises(ValueError):
        states.allowed("claim", "bogus")
