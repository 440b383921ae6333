"""Settings: every interval is a keyword of ``App(...)``, a worker flag and a ``PLUNDER_*``
environment variable (seconds, floats). Explicit keywords win over the environment, the
environment wins over the defaults below."""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, fields, replace

from plunder import errors

DEFAULT_URL = "sqlite:///plunder.db"
HEARTBEAT_INTERVAL = 1.0
SESSION_EXPIRY = 5.0
POLL_INTERVAL = 1.0
JANITOR_INTERVAL = 1.0
RETENTION = 7 * 24 * 3600.0  # finished jobs are pruned after a week
GRACE = 30.0

ENVIRONMENT = {
    "url": "PLUNDER_URL",
    "heartbeat_interval": "PLUNDER_HEARTBEAT_INTERVAL",
    "session_expiry": "PLUNDER_SESSION_EXPIRY",
    "poll_interval": "PLUNDER_POLL_INTERVAL",
    "janitor_interval": "PLUNDER_JANITOR_INTERVAL",
    "retention": "PLUNDER_RETENTION",
    "listen": "PLUNDER_LISTEN",
}
FALSE = frozenset({"0", "false", "no", "off"})
TRUE = frozenset({"1", "true", "yes", "on"})


@dataclass(frozen=True, slots=True)
class Settings:
    url: str = DEFAULT_URL
    heartbeat_interval: float = HEARTBEAT_INTERVAL
    session_expiry: float = SESSION_EXPIRY
    poll_interval: float = POLL_INTERVAL
    janitor_interval: float = JANITOR_INTERVAL
    retention: float = RETENTION
    listen: bool = True  # LISTEN/NOTIFY (PostgreSQL) or data_version polling (SQLite)

    def __post_init__(self) -> None:
        if not isinstance(self.listen, bool):
            raise errors.ConfigError(f"listen must be true or false, not {self.listen!r}")
        for item in fields(self):
            if item.name in ("url", "listen"):
                continue
            value = getattr(self, item.name)
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise errors.ConfigError(f"{item.name} must be a number of seconds, not {value!r}")
            if not math.isfinite(value) or value <= 0:
                raise errors.ConfigError(f"{item.name} must be a positive number of seconds")
        if self.session_expiry <= self.heartbeat_interval:
            raise errors.ConfigError(
                f"session_expiry ({self.session_expiry}s) must be longer than "
                f"heartbeat_interval ({self.heartbeat_interval}s), or every session would "
                "expire between two heartbeats"
            )

    @property
    def lease_ttl(self) -> float:
        """How long the janitor's lease lasts without renewal: a successor takes over
        within this plus one janitor interval after the holder dies."""
        return max(self.session_expiry, 2 * self.janitor_interval)

    def with_overrides(self, **values: object) -> Settings:
        return replace(self, **{k: v for k, v in values.items() if v is not None})  # type: ignore[arg-type]


def load(environ: Mapping[str, str] | None = None, **overrides: object) -> Settings:
    """Defaults, then ``PLUNDER_*`` variables, then non-None keyword overrides."""
    env = os.environ if environ is None else environ
    values: dict[str, object] = {}
    for name, variable in ENVIRONMENT.items():
        raw = env.get(variable)
        if raw is None or raw == "":
            continue
        if name == "url":
            values[name] = raw
            continue
        if name == "listen":
            if raw.lower() not in FALSE | TRUE:
                raise errors.ConfigError(f"{variable}={raw!r}: use 1 or 0")
            values[name] = raw.lower() in TRUE
            continue
        try:
            values[name] = float(raw)
        except ValueError:
            raise errors.ConfigError(f"{variable}={raw!r} is not a number of seconds") from None
    values.update({k: v for k, v in overrides.items() if v is not None})
    unknown = set(values) - set(ENVIRONMENT)
    if unknown:
        raise errors.ConfigError(f"unknown setting(s): {', '.join(sorted(unknown))}")
    return Settings(**values)  # type: ignore[arg-type]


def worker_deadlines(settings: Settings) -> dict[str, float]:
    """Deadlines of the worker's own database calls (claims, acknowledgements, streams;
    heartbeats get theirs from the hub, the janitor's passes from the janitor): a peer
    that hangs instead of failing would otherwise hold the calling thread for good.
    Two session expiries are long for a database that still answers, however slowly
    (a session lost meanwhile cuts every call in flight anyway). A connection that
    takes longer than a session expiry to open is no use (the driver's minimum is 2 s):
    after an outage, a connect attempt that started while the database was out of reach
    must not hold up the recovery for long.

    On the server's side, a transaction of this worker left idle for two session
    expiries (its worker hung, or cut off in the middle of it) is ended, so that its
    row locks cannot keep its jobs from being rescued for good; RELIABILITY.md
    recommends the same for the server (10 s with the default 5 s expiry). A task's
    own ``ctx.transaction()`` must not sit idle that long either."""
    expiry = settings.session_expiry
    return {
        "call_timeout": 2 * expiry,
        "connect_timeout": max(2.0, expiry),
        "idle_timeout": 2 * expiry,
    }
