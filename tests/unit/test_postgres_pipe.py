"""The turn pipe's statement as libpq takes it: ``%(name)s`` placeholders numbered once
per name, ``%%`` kept as one ``%``, and parameters written as the text PostgreSQL reads."""

from __future__ import annotations

import pytest

from plunder.store import queries
from plunder.store.postgres import pipe, turns


def test_placeholders_are_numbered_once_per_name_in_order_of_first_use() -> None:
    sql, names = pipe.numbered("SELECT %(b)s, %(a)s::int, %(b)s || '100%%', %(c)s")
    assert sql == "SELECT $1, $2::int, $1 || '100%', $3"
    assert names == ("b", "a", "c")


def test_a_lone_percent_is_refused_with_where_it_is() -> None:
    with pytest.raises(ValueError, match="a lone % in a query at 9"):
        pipe.numbered("SELECT 5 % 2")


def test_parameters_are_the_text_postgresql_reads() -> None:
    assert [pipe.text_value(v) for v in (None, "a", True, False, 7, 1.5)] == [
        None, "a", "t", "f", "7", "1.5",
    ]  # fmt: skip
    assert pipe.text_value(["x", 'q"'.strip()]) == '{"x","q\\""}'
    assert pipe.text_value([]) == "{}"
    with pytest.raises(TypeError, match="a turn parameter cannot be a dict"):
        pipe.text_value({"a": 1})


def test_the_turn_statements_take_exactly_the_parameters_a_turn_sends() -> None:
    params = turns.turn_params([], "s", queues=["q"], tasks=["t"], limit=1, take_suspect=False)
    statements = [
        pipe.Statement.of(name, queries.compact(queries.load("postgres")[query]))
        for name, query in (turns.ACK, turns.SETTLE, turns.CLAIM)
    ]
    assert set().union(*(s.params for s in statements)) == {*params, "now"}
    for statement in statements:
        assert b"%(" not in statement.sql
    ack, _, claim = statements
    values = claim.values({**params, "now": None}, "utf-8")
    assert values[claim.params.index("now")] is None
    assert values[claim.params.index("take_suspect")] == b"f"
    assert ack.values({**params, "now": None}, "utf-8")[ack.params.index("job_id")] == b"{}"
