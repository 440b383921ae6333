"""What every command shares: the database URL it was given and the store opened on it."""

from __future__ import annotations

from typing import Any

import click

from plunder import errors
from plunder.app import App
from plunder.store import Store, open_store

CLI_STORE: dict[str, Any] = {
    "busy_total": 5.0,
    "connect_timeout": 5.0,
    "pool_size": 2,
    "application_name": "plunder:cli",
    "create": False,  # a typo in a SQLite path is refused, not made an empty database
}


class State:
    """The URL (``explicit``: given by ``--db`` or PLUNDER_URL, not the default) and a store
    opened on it at first use, closed when the command ends."""

    def __init__(self, url: str, explicit: bool, key: str | None = None) -> None:
        self.url = url
        self.explicit = explicit
        self.key = key  # a gateway's API key (--key, PLUNDER_KEY)
        self._store: Store | None = None

    @property
    def remote(self) -> bool:
        """Whether the URL is a gateway's (http:// or https://)."""
        return self.url.lower().startswith(("http://", "https://"))

    def direct(self, command: str) -> None:
        """ConfigError (one line) where the URL is a gateway's: ``command`` needs the
        database itself."""
        if self.remote:
            raise errors.ConfigError(
                f"plunder {command} needs the database itself, not a gateway: give its URL "
                "(--db postgresql://… or sqlite:///…)"
            )

    def options(self, **overrides: Any) -> dict[str, Any]:
        """The CLI's store options, with the API key where the URL is a gateway's."""
        options = {**CLI_STORE, **overrides}
        if self.remote:
            options["key"] = self.key
        return options

    def app(self) -> App:
        """An App on the URL (with the key, for a gateway), for what a producer does; the
        caller closes it."""
        return App(self.url, **self.options())

    def store(self, *, migrate: bool = False) -> Store:
        if self._store is None:
            # only init (migrate) may create a SQLite file
            store = open_store(self.url, **self.options(create=migrate))
            store.migrate() if migrate else store.schema_check()
            self._store = store
        return self._store

    def close(self) -> None:
        if self._store is not None:
            self._store.close()


pass_state = click.make_pass_decorator(State)
