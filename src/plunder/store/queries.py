"""Load a dialect's named-query file: ``-- name: NAME`` starts a query; comment lines that
follow it are its documentation; everything up to the next name is its SQL. A query may
contain another one whole: ``/* include: NAME */`` stands for that query's SQL (its own
includes resolved; a query that would contain itself is an error)."""

from __future__ import annotations

import re
from functools import cache
from importlib import resources
from importlib.resources.abc import Traversable

# The operations only one dialect has: its own strategy, kept in its own file and driver.
# Every other name is in both files (tests/unit/test_queries.py checks), never stubbed.
DIALECT_ONLY: dict[str, frozenset[str]] = {
    "sqlite": frozenset(
        {
            "write_lock",  # a caller's deferred transaction takes the database's write lock
            "job_id_next",  # writers take turns, so an enqueue numbers its jobs itself
            # no LATERAL join: the claim and the next-due reading walk a queue's levels
            "job_claim_level",
            "job_claim_walk",
            "job_claim_rest",
            "job_next_due_level",
            "job_next_due_rest",
        }
    ),
    "postgres": frozenset(
        {
            "settings_set",  # per-transaction timeouts behind a transaction pooler
            # NOTIFY and its listeners (Store.notifies)
            "notify",
            "listener_set",
            "listener_drop",
            "job_insert_notify",
            "job_insert_mixed_notify",
            "job_complete_notify",
            # one statement where SQLite runs a loop or a transaction of several
            "job_exchange",
            "job_next_due",
            "job_claim_levels",  # fragments of those statements, never sent alone
            "job_claim_steps",
            "job_complete_update",
            # cached generic plans, made for the table's statistics of the moment
            "plans_by_index",
            "plans_reset",
            "job_table_pages",
            "job_table_analyze",
            "job_table_vacuum",  # dead index entries stay until a VACUUM
            "fair_claim",  # SQLite's job_claim_many claims the ids it is given already
        }
    ),
}

_NAME = re.compile(r"^-- name: ([a-z_][a-z0-9_]*)\s*$", re.MULTILINE)
_INCLUDE = re.compile(r"/\* include: ([a-z_][a-z0-9_]*) \*/")


def parse(text: str) -> dict[str, str]:
    """Map each query name to its SQL (comments kept, trailing semicolon removed)."""
    parts = _NAME.split(text)
    queries: dict[str, str] = {}
    for name, body in zip(parts[1::2], parts[2::2], strict=True):
        if name in queries:
            raise ValueError(f"query {name!r} is defined twice")
        sql = body.strip().rstrip(";").strip()
        code = [line for line in sql.splitlines() if not line.lstrip().startswith("--")]
        if not "".join(code).strip(" \t;"):  # documentation alone is not a query
            raise ValueError(f"query {name!r} is empty")
        queries[name] = sql
    return {name: _include(name, sql, queries) for name, sql in queries.items()}


def compact(sql: str) -> str:
    """``sql`` as sent to the database: without its comment lines, indentation, blank lines
    and the spaces after commas outside string literals (no query spans a string literal
    over lines). psycopg converts a query's ``%(name)s`` placeholders on every execution
    unless the text is shorter than its cache's limit (4 KiB); the documentation alone would
    push the claim past it, and the conversion, a regular expression over the whole text,
    then costs as much as parsing its rows."""
    lines = (line.strip() for line in sql.splitlines())
    return "\n".join(_tight(line) for line in lines if line and not line.startswith("--"))


def _tight(line: str) -> str:
    """``line`` without the spaces around its commas, parentheses and comparisons outside
    quotes (no token of plunder's SQL needs them): the parts between single quotes
    alternate outside and inside a literal (a doubled quote inside one leaves an empty part
    outside). A line with an inline comment is left as it is."""
    if "--" in line:
        return line
    parts = line.split("'")
    parts[::2] = [_SPACED.sub(r"\1", part) for part in parts[::2]]
    return "'".join(parts)


_SPACED = re.compile(r" *([(),=<>]) *")


def _include(name: str, sql: str, queries: dict[str, str], within: tuple[str, ...] = ()) -> str:
    def text(match: re.Match[str]) -> str:
        other = match.group(1)
        if other not in queries:
            raise ValueError(f"query {name!r} includes {other!r}, which is not defined")
        if other in within or other == name:
            chain = " -> ".join((*within, name, other))
            raise ValueError(f"query {other!r} would include itself ({chain})")
        return _include(other, _body(queries[other]), queries, (*within, name))

    return _INCLUDE.sub(text, sql)


def _body(sql: str) -> str:
    """A query's SQL without its documentation (the comment lines it starts with), as an
    include inserts it: text may stand before it on the same line."""
    lines = sql.splitlines()
    while lines and lines[0].lstrip().startswith("--"):
        lines.pop(0)
    return "\n".join(lines)


def _sql(dialect: str) -> Traversable:
    """The SQL folder of a dialect's driver package (``plunder/store/<dialect>/sql``),
    reached from ``plunder.store``: reading SQL text never imports the driver."""
    if dialect not in DIALECT_ONLY:
        raise ValueError(f"unknown dialect {dialect!r}: use one of {sorted(DIALECT_ONLY)}")
    return resources.files("plunder.store").joinpath(dialect, "sql")


@cache
def load(dialect: str) -> dict[str, str]:
    return parse(_sql(dialect).joinpath("queries.sql").read_text(encoding="utf-8"))


def schema(dialect: str) -> str:
    """The fresh schema: what applying every migration in order produces."""
    return _sql(dialect).joinpath("schema.sql").read_text(encoding="utf-8")


def migrations(dialect: str) -> list[tuple[int, str, str]]:
    """Every migration as (version, file name, SQL), in version order."""
    folder = _sql(dialect).joinpath("migrations")
    found: list[tuple[int, str, str]] = []
    for entry in folder.iterdir():
        match = re.fullmatch(r"(\d{4})_[a-z0-9_]+\.sql", entry.name)
        if match:
            found.append((int(match.group(1)), entry.name, entry.read_text(encoding="utf-8")))
    found.sort()
    versions = [version for version, _, _ in found]
    if versions != list(range(1, len(found) + 1)):
        raise ValueError(f"{dialect} migrations are not numbered 1..n: {versions}")
    return found


def statements(script: str) -> list[str]:
    """Split a DDL script into statements: each ends with ';' at the end of a line.

    Migrations hold plain DDL, but for the one function body (between ``$$`` lines) and
    trigger body (``BEGIN`` to ``END;``, SQLite) of migration 19, whose inner statements
    do not end theirs.
    """
    lines = [line for line in script.splitlines() if not line.lstrip().startswith("--")]
    out: list[str] = []
    current: list[str] = []
    quoted = body = False  # within a function's $$ quotes, within a trigger's body
    for line in lines:
        current.append(line)
        word = line.strip().upper()
        quoted ^= line.count("$$") % 2 == 1
        body = (body or word == "BEGIN") and not quoted and word != "END;"
        if not (quoted or body) and line.rstrip().endswith(";"):
            out.append("\n".join(current).strip().rstrip(";"))
            current = []
    rest = "\n".join(current).strip()
    if rest:
        out.append(rest)
    return [stmt for stmt in out if stmt]
