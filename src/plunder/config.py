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


@dataclass(frozen=True, slots=True)
class WorkerDeadlines:
    """Every deadline a worker keeps, derived from its settings here and nowhere else.

    ```
     sent ─ heartbeat ─ heartbeat ─ ··· (interval apart)
       │        ├─ renewal: a busy answer is sent again until the next heartbeat is due
       │        └─ heartbeat_timeout (expiry / 2): the heartbeat call is cut
       ├─ slow_after (2 intervals): "database slow or unreachable", said once
       ├─ session_expiry: no renewal sent since: the session is judged lost
       └─ call_timeout, idle_timeout (2 expiries): any other call, an idle transaction
    ```

    - ``heartbeat_interval``: how often the session is renewed (a setting).
    - ``renewal_window`` (one interval): a heartbeat answered "busy" is sent again until
      the next one is due; a few busy answers must not cost a healthy worker its session.
    - ``heartbeat_timeout`` (half the expiry; also the server's ``statement_timeout`` on
      the hub's connection): time enough on a slow database, and half an expiry left to
      renew on a fresh connection when the peer hangs.
    - ``session_expiry``: the database judges a session dead when not renewed for this
      long by its clock; the watchdog judges the same by this process's clock, counted
      from when the last renewal was *sent*, so the worker gives up first.
    - ``watch_period`` (half an interval): how often the watchdog looks.
    - ``slow_after`` (two intervals): renewals missing this long are news.
    - ``call_timeout`` (two expiries): claims, acknowledgements and streams of a database
      that still answers, however slowly, finish; a peer that hangs cannot hold a thread
      for good (a lost session cuts every call in flight sooner anyway).
    - ``idle_timeout`` (two expiries): the server ends a transaction of this worker left
      idle that long (worker hung, or cut off in it), so its row locks cannot keep its
      jobs from being rescued; a task's ``ctx.transaction()`` must not idle that long.
    - ``connect_timeout`` (one expiry, at least the driver's 2 s): a connect attempt
      started during an outage must not hold up the recovery.
    - ``janitor_timeout`` (the lease TTL): a janitor's call or idle transaction past it is
      ended; by then its lease has run out and a successor must not wait on it.
    """

    heartbeat_interval: float
    renewal_window: float
    heartbeat_timeout: float
    session_expiry: float
    watch_period: float
    slow_after: float
    call_timeout: float
    idle_timeout: float
    connect_timeout: float
    janitor_timeout: float

    @classmethod
    def of(cls, settings: Settings) -> WorkerDeadlines:
        interval, expiry = settings.heartbeat_interval, settings.session_expiry
        return cls(
            heartbeat_interval=interval,
            renewal_window=interval,
            heartbeat_timeout=expiry / 2,
            session_expiry=expiry,
            watch_period=interval / 2,
            slow_after=2 * interval,
            call_timeout=2 * expiry,
            idle_timeout=2 * expiry,
            connect_timeout=max(2.0, expiry),
            janitor_timeout=settings.lease_ttl,
        )

    def store_options(self) -> dict[str, float]:
        """The deadlines of the worker's store (PostgreSQL; SQLite ignores them)."""
        return {
            "call_timeout": self.call_timeout,
            "connect_timeout": self.connect_timeout,
            "idle_timeout": self.idle_timeout,
        }

    def janitor_store_options(self) -> dict[str, float]:
        """The deadlines of a janitor's own store: every pass checks its lease with ``FOR
        SHARE``, so a takeover waits on a pass left open by a holder that never returns."""
        return {
            "call_timeout": self.janitor_timeout,
            "connect_timeout": self.connect_timeout,
            "idle_timeout": self.janitor_timeout,
        }
