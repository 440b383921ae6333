"""``worker-queues``: a running worker's session joins and leaves queues; the worker follows
at its next heartbeat (see plunder.membership)."""

from __future__ import annotations

import click

from plunder import errors
from plunder.cli.output import emit_json, json_option, literal, out, user_errors
from plunder.cli.state import State, pass_state
from plunder.model import Session
from plunder.store import Store

MIN_PREFIX = 6  # characters of a session id that may stand for it (status shows 12)


def _names(values: tuple[str, ...]) -> list[str]:
    """``--add a --add b,c``: each name once, in order."""
    names = [n.strip() for value in values for n in value.split(",") if n.strip()]
    return list(dict.fromkeys(names))


@click.command("worker-queues")
@click.argument("session")
@click.option("--add", multiple=True, help="Queues to join (repeat, or comma-separated).")
@click.option("--remove", multiple=True, help="Queues to leave (repeat, or comma-separated).")
@json_option
@pass_state
def worker_queues(
    state: State, /, session: str, add: tuple[str, ...], remove: tuple[str, ...], as_json: bool
) -> None:
    """Show or change the queues of a live worker's SESSION (its id, or the start of it as
    `plunder status` shows it). The worker claims from a joined queue within a heartbeat;
    a left queue's running jobs have the worker's grace period to finish, then go back."""
    with user_errors():
        if state.remote:
            raise errors.ConfigError(
                "worker-queues changes a session in the database: give the database URL "
                "(--db); a worker behind a gateway changes its own (worker.join, worker.leave)"
            )
        store = state.store()
        found = _live_session(store, session)
        added, removed = _names(add), _names(remove)
        changed = found
        if added or removed:
            changed = store.session_queues(found.id, add=added, remove=removed)
        if as_json:
            emit_json(changed)
            return
        out.print(literal(f"session {changed.id} ({changed.name}): {_listed(changed)}"))


def _live_session(store: Store, given: str) -> Session:
    """The live session whose id is ``given``, or starts with it (a prefix of at least
    MIN_PREFIX characters that names one session only)."""
    sessions = store.session_list()
    exact = [s for s in sessions if s.id == given]
    if exact:
        return exact[0]
    if len(given) < MIN_PREFIX:
        raise errors.SessionGone(f"no live session {given!r} (an id, or {MIN_PREFIX}+ of it)")
    matches = [s for s in sessions if s.id.startswith(given)]
    if not matches:
        raise errors.SessionGone(f"no live session {given!r}")
    if len(matches) > 1:
        raise errors.SessionGone(f"{len(matches)} live sessions start with {given!r}: give more")
    return matches[0]


def _listed(session: Session) -> str:
    return "queues " + ",".join(session.queues) if session.queues else "no queues"
