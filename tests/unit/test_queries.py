"""The named-query files: both dialects name the same queries with the same parameters, the
PostgreSQL SQL stays within what CockroachDB and pgbouncer accept, and the parser is strict."""

from __future__ import annotations

import re

import pytest

from plunder.store import queries

DIALECTS = ("sqlite", "postgres")
SQLITE_PARAM = re.compile(r"(?<![:\w]):([A-Za-z_]\w*)")
PG_PARAM = re.compile(r"%\((\w+)\)s")


def code(sql: str) -> str:
    """SQL without ``--`` comments (which may mention parameters and forbidden words)."""
    return re.sub(r"--[^\n]*", "", sql)


def sqlite_params(sql: str) -> set[str]:
    return set(SQLITE_PARAM.findall(code(sql)))


def pg_params(sql: str) -> set[str]:
    return set(PG_PARAM.findall(code(sql)))


def test_both_dialects_parse_and_name_the_same_queries() -> None:
    sqlite, postgres = queries.load("sqlite"), queries.load("postgres")
    assert len(sqlite) > 30
    assert set(sqlite) - set(postgres) == set()
    assert set(postgres) - set(sqlite) == set()


# Operations done differently, on purpose: SQLite has no LATERAL join, so its claim walks
# the queues and priority levels with statements of its own (job_claim_level,
# job_claim_walk, PostgreSQL placeholders) and then claims the ids they found; PostgreSQL's
# job_claim_many walks inside the one statement.
DIFFERENT_PARAMETERS = {
    "job_claim_many": (
        {"ids", "session_id", "now"},
        {
            "session_id",
            "queues",
            "tasks",
            "limit",
            "take_suspect",
            "suspect_losses",
            "levels",
            "now",
        },
    ),
}


def placeholder(sql: str) -> bool:
    """A query one dialect never runs, kept so both name the same operations."""
    return bool(re.search(r"\bWHERE\s+false\s*;?\s*$", code(sql).strip(), re.IGNORECASE))


@pytest.mark.parametrize("name", sorted(queries.load("sqlite")))
def test_each_query_takes_the_same_parameters_in_both_dialects(name: str) -> None:
    sqlite, postgres = queries.load("sqlite")[name], queries.load("postgres")[name]
    if name in DIFFERENT_PARAMETERS:
        assert (sqlite_params(sqlite), pg_params(postgres)) == DIFFERENT_PARAMETERS[name]
    elif placeholder(postgres):
        assert pg_params(postgres) == set()
    else:
        assert sqlite_params(sqlite) == pg_params(postgres)


def test_parameter_extraction_ignores_casts_and_comments() -> None:
    assert sqlite_params("SELECT :a, x::int -- :b\nWHERE y = :c_1") == {"a", "c_1"}
    assert pg_params("SELECT %(a)s::text[] -- %(b)s\n, %(c)s") == {"a", "c"}
    assert sqlite_params("SELECT json_insert(x, '$[#]', :sid)") == {"sid"}


@pytest.mark.parametrize("name", sorted(queries.load("postgres")))
def test_postgres_queries_have_no_stray_percent_signs(name: str) -> None:
    """psycopg reads every % in the text (comments included) as a placeholder."""
    sql = queries.load("postgres")[name]
    assert "%" not in PG_PARAM.sub("", sql)


FORBIDDEN = re.compile(
    r"\b(LISTEN|NOTIFY|UNLISTEN|pg_notify|pg_(try_)?advisory\w*|UNLOGGED|TRIGGER)\b",
    re.IGNORECASE,
)


def postgres_sql() -> dict[str, str]:
    texts = {f"queries.sql:{n}": sql for n, sql in queries.load("postgres").items()}
    texts["schema.sql"] = queries.schema("postgres")
    texts.update({file: sql for _, file, sql in queries.migrations("postgres")})
    return texts


@pytest.mark.parametrize("where", sorted(postgres_sql()))
def test_postgres_sql_uses_no_notify_advisory_locks_unlogged_tables_or_triggers(
    where: str,
) -> None:
    """None of them survives pgbouncer's transaction pooling or CockroachDB, and an
    immediate shutdown empties UNLOGGED tables. The exceptions are the ``notify``,
    ``job_insert_notify``, ``job_insert_mixed_notify``, ``job_complete_notify`` and
    ``job_exchange`` queries: wake-ups are an optimisation on top of polling, sent only
    where the store says the database delivers them (``Store.notifies``)."""
    found = FORBIDDEN.findall(code(postgres_sql()[where]))
    if where in (
        "queries.sql:notify",
        "queries.sql:job_insert_notify",
        "queries.sql:job_insert_mixed_notify",
        "queries.sql:job_complete_notify",
        "queries.sql:job_exchange",
    ):
        assert [word for word, _ in found] == ["pg_notify"]
    else:
        assert found == []


def test_the_forbidden_words_are_found() -> None:
    for sql in [
        "LISTEN plunder",
        "SELECT pg_notify('c', 'x')",
        "SELECT pg_advisory_xact_lock(1)",
        "SELECT pg_try_advisory_lock(1)",
        "CREATE UNLOGGED TABLE t (x int)",
        "CREATE TRIGGER t AFTER INSERT ON x FOR EACH ROW EXECUTE FUNCTION f()",
    ]:
        assert FORBIDDEN.findall(code(sql)), sql
    assert FORBIDDEN.findall(code("-- no LISTEN here\nSELECT 1")) == []


def test_migrations_are_numbered_from_one_in_both_dialects() -> None:
    for dialect in DIALECTS:
        found = queries.migrations(dialect)
        assert [version for version, _, _ in found] == list(range(1, len(found) + 1))
    assert len(queries.migrations("sqlite")) == len(queries.migrations("postgres"))


# -- the parser ---------------------------------------------------------------------------------
def test_parse_keeps_documentation_and_drops_the_semicolon() -> None:
    parsed = queries.parse(
        "-- header, not a query\n\n-- name: one\n-- what it does\nSELECT 1;\n\n"
        "-- name: two\nSELECT 2\nFROM t;\n"
    )
    assert parsed == {"one": "-- what it does\nSELECT 1", "two": "SELECT 2\nFROM t"}


def test_parse_rejects_a_query_defined_twice() -> None:
    with pytest.raises(ValueError, match="twice"):
        queries.parse("-- name: a\nSELECT 1;\n-- name: a\nSELECT 2;\n")


@pytest.mark.parametrize(
    "text",
    [
        "-- name: a\n-- name: b\nSELECT 1;\n",
        "-- name: a\n;\n",
        "-- name: a\n   \n",
        "-- name: a\n-- only documentation, no SQL\n-- name: b\nSELECT 1;\n",
    ],
)
def test_parse_rejects_an_empty_query(text: str) -> None:
    with pytest.raises(ValueError, match="empty"):
        queries.parse(text)


def test_statements_split_a_script_at_line_end_semicolons() -> None:
    script = "-- comment;\nCREATE TABLE a (x INT);\nCREATE INDEX i\n    ON a (x);\n\nSELECT 1"
    assert queries.statements(script) == [
        "CREATE TABLE a (x INT)",
        "CREATE INDEX i\n    ON a (x)",
        "SELECT 1",
    ]


def test_a_query_may_include_another_whole() -> None:
    found = queries.parse(
        "-- name: a\nSELECT 1\n\n-- name: b\n-- docs\n"
        "WITH x AS (/* include: a */) SELECT * FROM x\n"
    )
    assert found["b"].endswith("WITH x AS (SELECT 1) SELECT * FROM x")
    with pytest.raises(ValueError, match="includes 'c', which is not defined"):
        queries.parse("-- name: a\nSELECT 1 /* include: c */\n")
    nested = queries.parse(
        "-- name: a\nSELECT 1\n-- name: b\n(/* include: a */)\n"
        "-- name: c\nSELECT /* include: b */\n"
    )
    assert nested["c"] == "SELECT (SELECT 1)"
    documented = queries.parse(
        "-- name: a\n-- docs\nx AS (SELECT 1)\n-- name: b\nWITH /* include: a */ SELECT\n"
    )
    assert documented["b"] == "WITH x AS (SELECT 1) SELECT"
    with pytest.raises(ValueError, match=r"'a' would include itself \(a -> b -> a\)"):
        queries.parse("-- name: a\nSELECT /* include: b */\n-- name: b\n(/* include: a */)\n")
    with pytest.raises(ValueError, match=r"'a' would include itself \(a -> a\)"):
        queries.parse("-- name: a\nSELECT /* include: a */\n")


# psycopg caches the conversion of queries shorter than this many bytes (its private
# MAX_CACHED_STATEMENT_LENGTH, 4096 in psycopg 3.3): written here, not imported.
PSYCOPG_CACHED_QUERY_BYTES = 4096


def test_postgres_queries_as_sent_fit_psycopg_query_cache() -> None:
    """Above this length psycopg converts a query's placeholders at every execution (a
    regular expression over the whole text): the hot path's queries must stay under it
    once compacted, and compacting keeps every statement and parameter."""
    for name, sql in queries.load("postgres").items():
        sent = queries.compact(sql)
        assert len(sent.encode("utf-8")) < PSYCOPG_CACHED_QUERY_BYTES, name
        assert pg_params(sent) == pg_params(sql), name
        assert code(sent).replace(",", ", ").split() == code(sql).replace(",", ", ").split()


def test_compact_drops_comment_lines_indentation_and_blank_lines() -> None:
    sql = "-- doc\nSELECT 1\n\n    -- a note\n    FROM t  -- why\n"
    assert queries.compact(sql) == "SELECT 1\nFROM t  -- why"


def test_compact_drops_spaces_after_commas_outside_string_literals() -> None:
    sql = "SELECT a, b, 'x, y', 'it''s, so', f(c,  d)\nFROM t"
    assert queries.compact(sql) == "SELECT a,b,'x, y','it''s, so',f(c,d)\nFROM t"
