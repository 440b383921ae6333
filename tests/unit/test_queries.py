"""The named-query files: the operations both dialects share carry the same names and
parameters, neither keeps a stub of the other's own, the PostgreSQL SQL stays within what
CockroachDB and pgbouncer accept, and the parser is strict."""

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


def test_both_dialects_parse_and_name_the_operations_they_share_alike() -> None:
    """A name in one file only is declared that dialect's own (queries.DIALECT_ONLY), and
    every declared name is in its file: a shared operation misnamed in one dialect fails."""
    sqlite, postgres = queries.load("sqlite"), queries.load("postgres")
    assert len(sqlite) > 30
    assert set(sqlite) - set(postgres) == queries.DIALECT_ONLY["sqlite"]
    assert set(postgres) - set(sqlite) == queries.DIALECT_ONLY["postgres"]
    assert set(queries.DIALECT_ONLY) == set(DIALECTS)


def shared() -> list[str]:
    return sorted(set(queries.load("sqlite")) & set(queries.load("postgres")))


# Operations done differently, on purpose: SQLite has no LATERAL join, so its claim walks
# the queues and priority levels with statements of its own (job_claim_level,
# job_claim_walk, job_claim_rest) and then claims the ids they found; PostgreSQL's
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


@pytest.mark.parametrize("name", shared())
def test_each_shared_query_takes_the_same_parameters_in_both_dialects(name: str) -> None:
    sqlite, postgres = queries.load("sqlite")[name], queries.load("postgres")[name]
    if name in DIFFERENT_PARAMETERS:
        assert (sqlite_params(sqlite), pg_params(postgres)) == DIFFERENT_PARAMETERS[name]
    else:
        assert sqlite_params(sqlite) == pg_params(postgres)


# A stub: a SELECT that can return no row, or only constants, or documentation saying the
# store never sends it. (SQLite's write_lock is an UPDATE that matches no row on purpose: it
# takes the write lock.)
EMPTY_SELECT = re.compile(r"^SELECT\b.*\bWHERE\s+(?:0|false)$", re.IGNORECASE | re.DOTALL)
CONSTANT = r"(?:-?\d+|NULL|'[^']*')(?:::\w+)?(?:\s+AS\s+\w+)?"
CONSTANT_SELECT = re.compile(rf"^SELECT\s+{CONSTANT}(?:\s*,\s*{CONSTANT})*$", re.IGNORECASE)
NEVER_SENT = re.compile(r"never sen(?:t|ds)\b|both dialects name", re.IGNORECASE)


def stub(sql: str) -> bool:
    body = code(sql).strip().rstrip(";").strip()
    return bool(EMPTY_SELECT.match(body) or CONSTANT_SELECT.match(body) or NEVER_SENT.search(sql))


def test_the_stub_check_finds_stubs() -> None:
    assert stub("-- docs\nSELECT :levels WHERE 0")
    assert stub("SELECT NULL::bigint AS id\nWHERE false;")
    assert stub("SELECT 0 AS seen, 0 AS pages, NULL AS live")
    assert stub("-- the store never sends this\nSELECT x FROM t")
    assert not stub("UPDATE plunder_schema SET version = version WHERE 0")
    assert not stub("SELECT statement_timestamp() AS now")
    assert not stub("SELECT id FROM t WHERE a = 0")


@pytest.mark.parametrize(
    ("dialect", "name"), [(d, n) for d in DIALECTS for n in sorted(queries.load(d))]
)
def test_no_query_is_a_stub_kept_for_parity(dialect: str, name: str) -> None:
    """An operation one dialect does not have is left out of its file, not stubbed."""
    assert not stub(queries.load(dialect)[name])


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
    elif where in ("schema.sql", "0019_workflows.sql"):
        # the one trigger, settling a workflow's children (decision 0011): its wake-ups,
        # like the queries' above, are sent where the database delivers them
        assert {word.lower() for word, _ in found} == {"trigger", "pg_notify"}
        made = re.findall(r"CREATE TRIGGER (\w+)", code(postgres_sql()[where]))
        assert made == ["plunder_jobs_settle"]
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


# psycopg 3 caches the conversion of queries shorter than this many bytes (its documented
# behaviour, kept here as a number: the constant itself is not a public name of psycopg)
MAX_CACHED_STATEMENT_LENGTH = 4096


def test_postgres_queries_as_sent_fit_psycopg_query_cache() -> None:
    """Above this length psycopg converts a query's placeholders at every execution (a
    regular expression over the whole text): the hot path's queries must stay under it
    once compacted, and compacting keeps every statement and parameter."""
    for name, sql in queries.load("postgres").items():
        sent = queries.compact(sql)
        if name not in OVER_THE_CACHE:
            assert len(sent.encode("utf-8")) < MAX_CACHED_STATEMENT_LENGTH, name
        assert pg_params(sent) == pg_params(sql), name
        assert _tokens(code(sent)) == _tokens(code(sql)), name


# The turn in one statement, past the cache since affinity (docs/decisions/0014): a worker
# sends it through its pipe, prepared once, where no conversion is made per execution. The
# claim alone, past it since slot cost (docs/decisions/0019), is a worker's at depth 1 only;
# job_claim_steps is a fragment of both, never sent alone.
OVER_THE_CACHE = {"job_exchange", "job_claim_many", "job_claim_steps"}


def _tokens(sql: str) -> list[str]:
    return re.sub(r"\s*([(),=<>])\s*", r" \1 ", sql).split()


def test_compact_drops_comment_lines_indentation_and_blank_lines() -> None:
    sql = "-- doc\nSELECT 1\n\n    -- a note\n    FROM t  -- why\n"
    assert queries.compact(sql) == "SELECT 1\nFROM t  -- why"


def test_compact_drops_spaces_after_commas_outside_string_literals() -> None:
    sql = "SELECT a, b, 'x, y', 'it''s, so', f(c,  d)\nFROM t"
    assert queries.compact(sql) == "SELECT a,b,'x, y','it''s, so',f(c,d)\nFROM t"


# Two operations both dialects share whose SQL one dialect writes alike: SQLite's
# BEGIN IMMEDIATE already holds the lock PostgreSQL's schema_version_lock takes.
SAME_SQL = {"sqlite": [["schema_version_get", "schema_version_lock"]], "postgres": []}


@pytest.mark.parametrize("dialect", DIALECTS)
def test_no_query_is_another_under_a_second_name(dialect: str) -> None:
    """An alias (a query that is another one whole, included) is a stub too."""
    by_code: dict[str, list[str]] = {}
    for name, sql in queries.load(dialect).items():
        by_code.setdefault(" ".join(code(sql).split()), []).append(name)
    assert [names for names in by_code.values() if len(names) > 1] == SAME_SQL[dialect]
