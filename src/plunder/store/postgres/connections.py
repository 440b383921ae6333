"""How plunder connects to PostgreSQL: the connection class the pool and the listening
connections share, per-call deadlines, what a refused login says, and the settings sent
in the ``options`` startup parameter."""

from __future__ import annotations

import logging
import re
import select
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import psycopg

from plunder import errors
from plunder.store.deadlines import Deadlines

log = logging.getLogger("plunder.store")


CANCEL_TIMEOUT = 0.5  # seconds to deliver a cancel request: a halt waits no longer


def socket_of(conn: psycopg.Connection[Any]) -> int:
    return int(conn.pgconn.socket)  # OperationalError once the connection is closed


def cancel_statement(conn: psycopg.Connection[Any]) -> None:
    """Have the server cancel the statement running on ``conn``, if any (its transaction
    is then rolled back); a server out of reach is given CANCEL_TIMEOUT seconds."""
    cancel = getattr(conn, "cancel_safe", None)  # psycopg 3.2 and later
    try:
        if cancel is not None:
            cancel(timeout=CANCEL_TIMEOUT)
        else:
            conn.cancel()
    except psycopg.Error as exc:  # the cut that follows ends the call all the same
        log.warning("could not cancel a statement given up: %s", first_line(exc))


@contextmanager
def call_deadline(
    deadlines: Deadlines, conn: psycopg.Connection[Any], timeout: float | None, url: str
) -> Iterator[None]:
    """Run the block as one call on ``conn`` that is cut after ``timeout`` seconds (never,
    for None: only ``cut_all``); a cut call raises StoreBusy, which is retried on a fresh
    connection like any lost connection, or StoreUnavailable, not retried, where the cut
    gave it up for good (``cut_all(final=True)``)."""
    with deadlines.watch(conn, timeout) as call:
        try:
            yield
        except (psycopg.Error, errors.StoreBusy) as exc:
            if call.reason is None:
                raise
            if call.final:
                raise errors.StoreUnavailable(
                    f"{url}: {call.reason}; the connection was cut, the call given up"
                ) from exc
            raise errors.StoreBusy(f"{url}: {call.reason}; the connection was cut") from exc


def answer_lost(exc: BaseException | None) -> bool:
    """Whether a failed call may have committed unseen: a lost connection (no SQLSTATE, or
    class 08), or a server that ended the backend (57P01-57P03: it may have committed just
    before); the answer never came. Not 57P05, idle_session_timeout: the server ends only a
    session that was idle, so the statement in flight never ran."""
    if not isinstance(exc, psycopg.OperationalError):
        return False
    state = exc.sqlstate
    return state is None or (state.startswith(("08", "57P")) and state != "57P05")


def first_line(exc: BaseException) -> str:
    """libpq's messages go on with hints on further lines; a log line needs the first."""
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


# A login the server refuses whatever the moment: failed authentication (28000, 28P01), no
# such database (3D000) or role (28000). libpq keeps no SQLSTATE for a refused login, only
# the server's message (English unless the server's lc_messages says otherwise): hence
# the words, beside the states for a driver that does keep them.
REFUSED_STATES = frozenset({"28000", "28P01", "3D000"})
REFUSED_WORDS = re.compile(
    r'FATAL:\s+(?:(?:database|role) "[^"]*" does not exist|.*authentication failed'
    r"|no pg_hba\.conf entry|pg_hba\.conf rejects|.*is not permitted to log in"
    r"|permission denied for database)|no password supplied"
)


def refused_for_good(exc: psycopg.Error) -> bool:
    """Whether a failed connection attempt was a refusal that trying again cannot change
    (a refused port or a server starting up is worth another try)."""
    if exc.sqlstate is not None:
        return exc.sqlstate in REFUSED_STATES
    return REFUSED_WORDS.search(str(exc)) is not None


def server_reason(exc: psycopg.Error) -> str:
    """The server's own words for a refused login (``database "farm" does not exist``),
    without libpq's framing; else the first line of the message."""
    line = first_line(exc)
    _, fatal, said = line.rpartition("FATAL:")
    return " ".join(said.split()) if fatal else line


class PgConnection(psycopg.Connection[Any]):
    """A connection that knows the settings its transactions must make themselves.

    plunder's server settings (statement and idle-in-transaction timeouts) normally travel
    in the ``options`` startup parameter, once per connection. A transaction pooler refuses
    that parameter ("unsupported startup parameter: options", pgbouncer), and a
    session-level SET would stay on a server connection the pooler then lends to another
    client; there, each transaction makes them with ``set_config(name, value, true)`` (the
    form of SET LOCAL), which ends with the transaction. Milliseconds by name, or None."""

    per_transaction: dict[str, int] | None = None
    # the statements prepared here at a first run planned by their indexes (tx.INDEX_PLANNED)
    index_planned: frozenset[str] = frozenset()


def redact(url: str) -> str:
    """The URL without its password, for messages and ``store.url``."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.replace(f":{parts.password}@", ":***@", 1)
    return urlunsplit(parts._replace(netloc=netloc))


def spoken_to(conn: psycopg.Connection[Any]) -> bool:
    """Whether the server sent something to this idle pooled connection. Most often it
    closed it (a restart, ``idle_session_timeout``): a statement that commits on its own
    would then fail, and for an enqueue nobody could tell whether before or after it
    committed. In a transaction BEGIN fails first instead, surely before anything was
    written, and the store retries on a fresh connection. (Anything else the server says
    unasked, a changed setting say, only costs this call the two round trips.) poll, not
    select: a process with many files open has descriptors past select's limit."""
    try:
        descriptor = conn.fileno()
    except psycopg.Error:  # lost already
        return True
    poller = select.poll()
    poller.register(descriptor, select.POLLIN)
    return bool(poller.poll(0))


# PostgreSQL's names for UTC (its tz database's aliases; GMT is left out: a format's TZ
# field would print it differently)
UTC_NAMES = frozenset(
    ("UTC", "Etc/UTC", "UCT", "Etc/UCT", "Universal", "Etc/Universal", "Zulu", "Etc/Zulu")
)


def startup_options(settings: dict[str, int]) -> str:
    """Settings as the ``options`` startup parameter takes them."""
    return " ".join(f"-c {name}={value}" for name, value in settings.items())


def connection_kwargs(
    application_name: str, connect_timeout: float, tcp_user_timeout: float
) -> dict[str, Any]:
    """psycopg's arguments for every connection of a store's, pooled or not."""
    return {
        "autocommit": True,
        "application_name": application_name,
        "connect_timeout": max(1, int(connect_timeout)),
        "keepalives": 1,
        "keepalives_idle": 10,
        "keepalives_interval": 5,
        "keepalives_count": 3,
        # a peer that stops acknowledging is dropped after this, instead
        # of hanging a call for the kernel's ~15 minutes
        "tcp_user_timeout": int(tcp_user_timeout * 1000),
        # pooled connections prepare (see PgDriver._prepare_threshold); the others
        # run few statements, or are short-lived
        "prepare_threshold": None,
    }


def server_settings(statement_timeout: float | None, idle_timeout: float | None) -> dict[str, int]:
    """Settings for our backends, in milliseconds. ``idle_in_transaction_session_timeout``:
    when this client hangs or is cut off in the middle of a transaction, the server
    would hold that transaction, and its row locks (a job, a session, the janitor's
    lease), for as long as the connection looks alive, which behind a hung peer is
    forever: nobody could rescue those rows. The server ends such a transaction after
    this long."""
    values = {
        "statement_timeout": statement_timeout,
        "idle_in_transaction_session_timeout": idle_timeout,
    }
    return {name: int(value * 1000) for name, value in values.items() if value}


def pool_options(settings: dict[str, int], *, generic_plans: bool, utc: bool) -> str:
    """The pooled connections' ``options`` startup parameter, on a server that takes it."""
    # JIT-compiling plunder's short statements costs far more than running them (the
    # claim's estimate passes jit_above_cost on a deep queue; see
    # docs/decisions/0006-statistics-and-plans.md)
    options = ["-c jit=off"]
    if settings:
        options.append(startup_options(settings))
    if generic_plans:
        # A prepared statement is planned afresh at every run while the server expects
        # a custom plan to beat its generic one, which for the claim it always does:
        # planning it then costs more than running it (decision record 0006). plunder's
        # statements are written for their indexes whatever the values, so they are
        # planned once per connection. A task's own transaction prepares nothing (see
        # PgDriver.task_transaction), so this never touches a user's queries.
        options.append("-c plan_cache_mode=force_generic_plan")
    if utc:
        # The same zone, named so that psycopg knows it for UTC: a claim's timestamps
        # are then read without a conversion each (through zoneinfo for "Etc/UTC", a
        # common default), which cost a tenth of the worker's CPU per job. A server in
        # any other zone is left in it: a task's own transaction sees the zone it set.
        options.append("-c TimeZone=UTC")
    return " ".join(options)
