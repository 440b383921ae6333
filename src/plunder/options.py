"""A worker's options, as ``plunder worker``'s flags and ``Worker(app, options)`` take them."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from plunder import affinity, errors
from plunder.turns import MAX_DEPTH

if TYPE_CHECKING:
    from plunder.app import App

__all__ = ["WorkerOptions"]


@dataclass(frozen=True)
class WorkerOptions:
    queues: tuple[str, ...] | None = None  # None: every queue the app's tasks use
    concurrency: int = 4
    name: str | None = None
    janitor: bool = True
    grace: float = 30.0
    # key=value texts or a dict (docs/guide/affinity.md)
    labels: tuple[str, ...] | Mapping[str, str] = ()
    pool: str | None = None  # "process" runs every plain-function task in a process
    # turns in flight at most (plunder.turns): 1, one at a time; more where the link has
    # a pipe (PostgreSQL), on a connection the worker holds, idle or busy
    depth: int = MAX_DEPTH

    @property
    def connections(self) -> int:
        """The pooled connections the worker's own calls need (the hub's is the app's)."""
        return 2 if self.depth > 1 else 1

    def checked(self, app: App) -> WorkerOptions:
        """These options, once sound for this app (before a store is opened for them)."""
        if self.concurrency < 1:
            raise errors.ConfigError("concurrency must be at least 1")
        if not 1 <= self.depth <= MAX_DEPTH:
            raise errors.ConfigError(f"depth must be from 1 to {MAX_DEPTH}, not {self.depth!r}")
        try:
            affinity.labels(self.labels)
        except ValueError as exc:
            raise errors.ConfigError(f"worker labels: {exc}") from None
        if not len(app.registry):
            raise errors.ConfigError("the app has no tasks: nothing to work on")
        return self
