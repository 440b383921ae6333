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


def test_the_turn_statement_takes_exactly_the_parameters_a_turn_sends() -> None:
    sql = queries.compact(queries.load("postgres")["job_exchange"])
    statement = pipe.Statement.of(turns.STATEMENT, sql)
    params = turns.turn_params([], "s", queues=["q"], tasks=["t"], limit=1, take_suspect=False)
    assert set(statement.params) == {*params, "now"}
    assert b"%(" not in statement.sql
    values = statement.values({**params, "now": None}, "utf-8")
    assert values[statement.params.index("now")] is None
    assert values[statement.params.index("take_suspect")] == b"f"
