"""Who is calling: the API key a request bears (``Authorization: Bearer plk_…``), looked
up in the database and kept for a second at most, so that a revoked or expired key stops
working within one heartbeat interval; and a limit on failed attempts per client address.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta

from plunder import access
from plunder.access import ApiKey
from plunder.store.base import Store

KEY_TTL = 1.0  # seconds a key read from the database is trusted without reading it again
FAILURES_ALLOWED = 10  # failed authentications per address within FAILURE_WINDOW
FAILURE_WINDOW = 60.0
MAX_ADDRESSES = 10_000  # addresses whose failures are counted at once (the oldest go first)
MAX_KEYS = 10_000  # keys held in the cache at once (then it starts afresh)


class Refused(Exception):
    """The request is refused: ``status`` and a one-line ``reason``."""

    def __init__(self, status: int, reason: str, *, retry_after: float | None = None) -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason
        self.retry_after = retry_after


class MustRead(Exception):
    """What a check needs is not known recently enough: it must read the database."""


@dataclass
class _Cached:
    key: ApiKey | None
    read_at: float


class Keys:
    """The keys requests bear, checked against the store (see the module docstring)."""

    def __init__(self, store: Store, *, ttl: float = KEY_TTL) -> None:
        self.store = store
        self.ttl = ttl
        self._lock = threading.Lock()
        self._cache: dict[str, _Cached] = {}
        self._failures: OrderedDict[str, list[float]] = OrderedDict()
        self._clock: tuple[datetime, float] | None = None  # the database's, and when read

    def check(self, header: str | None, address: str, *, read: bool = True) -> ApiKey:
        """The key of an ``Authorization`` header, usable now; Refused (401, or 429 for an
        address that failed too often) otherwise. ``read=False`` (on the event loop):
        MustRead instead of reading the database, where what is known is too old."""
        self._throttle(address)
        secret = _bearer(header)
        key_id = access.key_id_of(secret) if secret else None
        key = self._key(key_id, read) if key_id else None
        if secret is None or key is None or not access.matches(secret, key):
            self._failed(address)
            raise Refused(401, "a valid API key is required (Authorization: Bearer plk_…)")
        if not key.usable(self._now(read)):
            self._failed(address)
            raise Refused(401, "this API key is revoked or expired")
        return key

    def forget(self, key_id: str) -> None:
        """Read ``key_id`` again at its next use (it was revoked here)."""
        with self._lock:
            self._cache.pop(key_id, None)

    def _key(self, key_id: str, read: bool) -> ApiKey | None:
        now = time.monotonic()
        with self._lock:
            cached = self._cache.get(key_id)
        if cached is not None and now - cached.read_at < self.ttl:
            return cached.key
        if not read:
            raise MustRead
        key = self.store.key_get(key_id)
        with self._lock:
            if len(self._cache) > MAX_KEYS:
                self._cache.clear()
            self._cache[key_id] = _Cached(key, now)
        return key

    def _now(self, read: bool) -> datetime:
        """The database's clock (it decides expiry), read at most once per ``ttl``."""
        with self._lock:
            clock = self._clock
        if clock is not None and time.monotonic() - clock[1] < self.ttl:
            return clock[0] + timedelta(seconds=time.monotonic() - clock[1])
        if not read:
            raise MustRead
        now = self.store.now()
        with self._lock:
            self._clock = (now, time.monotonic())
        return now

    def _throttle(self, address: str) -> None:
        now = time.monotonic()
        with self._lock:
            recent = [t for t in self._failures.get(address, ()) if now - t < FAILURE_WINDOW]
            if recent:
                self._failures[address] = recent
            else:
                self._failures.pop(address, None)
        if len(recent) >= FAILURES_ALLOWED:
            wait = FAILURE_WINDOW - (now - recent[0])
            raise Refused(429, "too many failed authentications; try later", retry_after=wait)

    def _failed(self, address: str) -> None:
        with self._lock:
            self._failures.setdefault(address, []).append(time.monotonic())
            self._failures.move_to_end(address)
            while len(self._failures) > MAX_ADDRESSES:
                self._failures.popitem(last=False)


def _bearer(header: str | None) -> str | None:
    if not header:
        return None
    scheme, _, value = header.partition(" ")
    if scheme.lower() != "bearer" or not value.strip():
        return None
    return value.strip()


def require(key: ApiKey, action: str, what: str = "do this") -> None:
    """Refused (403) unless ``key``'s role allows ``action`` (see ApiKey.may), saying that
    it may not ``what``."""
    if not key.may(action):
        raise Refused(403, f"a {key.role.value} key may not {what}")


def require_queues(
    key: ApiKey, queues: tuple[str, ...] | list[str], groups: Mapping[str, str]
) -> None:
    """Refused (403) unless ``key`` may use every one of ``queues`` (see ApiKey.serves)."""
    refused = [q for q in queues if not key.serves(q, groups)]
    if refused:
        raise Refused(403, f"this key may not use the queue(s) {', '.join(refused)}")
