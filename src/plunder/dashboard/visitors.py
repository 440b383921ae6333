"""Who is looking: a gateway's API key, pasted once and then carried by a signed cookie,
or the person at the machine (``plunder dashboard``: local, admin).

```
 POST /login  secret ─▶ the key (reader, producer or admin; usable by the database clock)
              ◀── cookie  plunder_dash = key id . expiry . nonce . HMAC(key's stored hash)
 each request: cookie ─▶ its key read again (a second's cache): revoked or expired ─▶ login
 each POST:    csrf field == HMAC(key's stored hash, "csrf" . nonce)   else 403
```

The cookie is signed with the hash the database keeps of the key's secret (never sent to
a browser): every gateway on the database checks it with no shared setting, and a revoked
key's cookies stop working within a second. The secret itself is never kept.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta

from plunder import access
from plunder.access import ApiKey, Role
from plunder.store.base import Store

COOKIE = "plunder_dash"
COOKIE_LIFETIME = 12 * 3600  # seconds a login lasts
TTL = 1.0  # seconds a key, the groups and the database clock are trusted once read
LOCAL = "local"  # the visitor of ``plunder dashboard``: no key, admin


@dataclass(frozen=True, slots=True)
class Visitor:
    """Who asks: their key (None: local), what it may see and do, and the CSRF token
    their forms carry."""

    key: ApiKey | None
    groups: Mapping[str, str]
    csrf: str

    @property
    def admin(self) -> bool:
        return self.key is None or self.key.role is Role.ADMIN

    @property
    def name(self) -> str:
        if self.key is None:
            return LOCAL
        label = f" {self.key.name}" if self.key.name else ""
        return f"{self.key.role.value} key {self.key.id}{label} ({self.key.group})"

    def sees(self, queue: str) -> bool:
        """Whether this visitor may see ``queue``'s jobs (see ApiKey.serves)."""
        return self.key is None or self.key.serves(queue, self.groups)

    def scope(self) -> tuple[tuple[str, ...] | None, tuple[str, ...] | None]:
        """The queues a job list is narrowed to (only, hide; None: no narrowing)."""
        key = self.key
        if key is None or key.role is Role.ADMIN:
            return None, None
        if key.group == access.DEFAULT_GROUP:
            hide = tuple(sorted(self.groups))
            return (key.queues or None), (hide or None)
        mine = tuple(sorted(q for q, g in self.groups.items() if g == key.group))
        if key.queues:
            mine = tuple(q for q in mine if q in key.queues)
        return mine, None


class Visitors:
    """Logins, cookies and CSRF tokens over ``store``'s keys; ``local``: no keys, every
    visitor is the local admin."""

    def __init__(self, store: Store, *, local: bool = False) -> None:
        self.store = store
        self.local = local
        self._local_secret = secrets.token_hex(32)  # local mode signs its CSRF with this
        self._lock = threading.Lock()
        self._keys: dict[str, tuple[ApiKey | None, float]] = {}
        self._groups: tuple[dict[str, str], float] | None = None
        self._clock: tuple[datetime, float] | None = None

    # -- login ---------------------------------------------------------------------------
    def login(self, secret: str) -> tuple[str, str | None]:
        """The cookie for a pasted secret, or (``""``, why not)."""
        secret = secret.strip()
        key_id = access.key_id_of(secret)
        key = self.store.key_get(key_id) if key_id else None
        if key is None or not access.matches(secret, key):
            return "", "that is not a valid API key"
        if not key.usable(self._now()):
            return "", "this API key is revoked or expired"
        if not key.may("read"):
            return "", f"a {key.role.value} key may not read jobs: use a reader or admin key"
        expiry = int(time.time()) + COOKIE_LIFETIME
        body = f"{key.id}.{expiry}.{secrets.token_hex(16)}"
        return f"{body}.{_sign(key.secret_hash, body)}", None

    def visitor(self, cookie: str | None) -> Visitor | None:
        """Who bears ``cookie`` (None: nobody logged in, or their key no longer works)."""
        if self.local:
            return Visitor(None, {}, _sign(self._local_secret, "csrf"))
        parts = (cookie or "").split(".")
        if len(parts) != 4 or not parts[1].isdigit() or int(parts[1]) < time.time():
            return None
        key = self._key(parts[0])
        if key is None or not hmac.compare_digest(
            _sign(key.secret_hash, ".".join(parts[:3])), parts[3]
        ):
            return None
        if not key.usable(self._now()) or not key.may("read"):
            return None
        return Visitor(key, self.groups(), _sign(key.secret_hash, f"csrf.{parts[2]}"))

    # -- what is read again every second -------------------------------------------------
    def _key(self, key_id: str) -> ApiKey | None:
        try:
            key_id = access.check_key_id(key_id)
        except Exception:
            return None
        with self._lock:
            cached = self._keys.get(key_id)
        if cached is not None and time.monotonic() - cached[1] < TTL:
            return cached[0]
        key = self.store.key_get(key_id)
        with self._lock:
            if len(self._keys) > 10_000:
                self._keys.clear()
            self._keys[key_id] = (key, time.monotonic())
        return key

    def groups(self) -> dict[str, str]:
        with self._lock:
            cached = self._groups
        if cached is not None and time.monotonic() - cached[1] < TTL:
            return cached[0]
        groups = self.store.queue_groups()
        with self._lock:
            self._groups = (groups, time.monotonic())
        return groups

    def _now(self) -> datetime:
        """The database's clock (it decides a key's expiry), read at most once per TTL."""
        with self._lock:
            clock = self._clock
        if clock is not None and time.monotonic() - clock[1] < TTL:
            return clock[0] + timedelta(seconds=time.monotonic() - clock[1])
        now = self.store.now()
        with self._lock:
            self._clock = (now, time.monotonic())
        return now


def _sign(secret: str, text: str) -> str:
    return hmac.new(secret.encode(), text.encode(), hashlib.sha256).hexdigest()


def csrf_ok(visitor: Visitor, token: str | None) -> bool:
    return bool(token) and hmac.compare_digest(visitor.csrf, str(token))
