"""API keys and what each may do, for the gateway (plunder.gateway): workers and producers
that hold a key instead of the database's credentials.

A group owns queues: a key of a group other than "default" makes the queues it names its
group's (``plunder keys create --group gpu --queues llm``), and from then on only keys of
that group (and admin keys) claim, enqueue and read there; every other queue is the
default group's. A job is of its queue's group.

A key's secret is ``plk_<id>_<secret>``: the id (public, in ``plunder keys list``) finds
the key, the whole secret's SHA-256 is compared in constant time with the hash stored. The
secret has 256 random bits, so a fast hash is enough (nothing to guess by brute force), and
only its hash is ever stored.

```
 role       claims and completes   enqueues, cancels, retries   reads jobs   manages keys
 worker     its group's queues     -                            -            -
 producer   -                      its group's queues           its group's  -
 reader     -                      -                            its group's  -
 admin      every group            every group                  every group  yes
```
"""

from __future__ import annotations

import enum
import hashlib
import hmac
import re
import secrets
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime

from plunder import errors, payload

PREFIX = "plk"
DEFAULT_GROUP = "default"
_ID = re.compile(r"^[0-9a-f]{12}$")
_GROUP = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,99}$")
_SPAN = re.compile(r"^(\d{1,12}(?:\.\d{1,9})?)([smhdw]?)$")
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
MAX_LIFETIME = 100 * 365 * 86400.0  # seconds: the longest a key may be made to last


class Role(enum.StrEnum):
    WORKER = "worker"
    PRODUCER = "producer"
    READER = "reader"
    ADMIN = "admin"


@dataclass(frozen=True, slots=True)
class ApiKey:
    """A key as stored (never its secret). ``queues`` empty: every queue."""

    id: str
    name: str
    role: Role
    group: str
    queues: tuple[str, ...]
    created_at: datetime
    expires_at: datetime | None
    revoked_at: datetime | None
    secret_hash: str = field(default="", repr=False)

    def usable(self, now: datetime) -> bool:
        """Neither revoked nor expired at ``now`` (the database's clock)."""
        return self.revoked_at is None and (self.expires_at is None or now < self.expires_at)

    def serves(self, queue: str, groups: Mapping[str, str]) -> bool:
        """Whether this key may use ``queue``, given the queues' groups (``groups``: the
        queues of groups other than the default one): a queue of its group, and one of
        its queues if it names any. Admin keys use every queue."""
        if self.role is Role.ADMIN:
            return True
        queue = payload.base_queue(queue)  # a partition's queue ("q~3") is of its queue
        group = groups.get(queue, DEFAULT_GROUP)
        return group == self.group and (not self.queues or queue in self.queues)

    def may(self, action: str) -> bool:
        """``action``: "work", "write" (enqueue, cancel, retry), "read" or "admin"."""
        allowed = {
            Role.WORKER: {"work"},
            Role.PRODUCER: {"write", "read"},
            Role.READER: {"read"},
            Role.ADMIN: {"work", "write", "read", "admin"},
        }
        return action in allowed[self.role]

    def public(self) -> dict[str, object]:
        """What ``plunder keys list`` shows: everything but the hash."""
        return {
            "id": self.id,
            "name": self.name,
            "role": self.role.value,
            "group": self.group,
            "queues": list(self.queues),
            "created_at": self.created_at.isoformat(),
            "expires_at": self.expires_at.isoformat() if self.expires_at else None,
            "revoked_at": self.revoked_at.isoformat() if self.revoked_at else None,
        }


def new_secret() -> tuple[str, str, str]:
    """A fresh key: (id, secret, hash of the secret)."""
    key_id = secrets.token_hex(6)
    secret = f"{PREFIX}_{key_id}_{secrets.token_urlsafe(32)}"
    return key_id, secret, digest(secret)


def digest(secret: str) -> str:
    return hashlib.sha256(secret.encode("utf-8")).hexdigest()


def key_id_of(secret: str) -> str | None:
    """The id a secret names, or None if it is not shaped like one of plunder's."""
    parts = secret.split("_", 2)
    if len(parts) != 3 or parts[0] != PREFIX or not _ID.match(parts[1]) or not parts[2]:
        return None
    return parts[1]


def matches(secret: str, key: ApiKey) -> bool:
    """Whether ``secret`` is ``key``'s, compared in constant time."""
    return hmac.compare_digest(digest(secret), key.secret_hash)


def check_role(role: str) -> Role:
    try:
        return Role(role)
    except ValueError:
        names = ", ".join(r.value for r in Role)
        raise errors.ConfigError(f"unknown role {role!r}: use one of {names}") from None


def check_group(group: str) -> str:
    if not isinstance(group, str) or not _GROUP.match(group):
        raise errors.InvalidName(
            f"invalid group {group!r}: 1-100 letters, digits, '_', '.', ':' or '-', "
            "starting with a letter or digit"
        )
    return group


def check_key_id(key_id: str) -> str:
    if not isinstance(key_id, str) or not _ID.match(key_id):
        raise errors.InvalidName(f"invalid key id {key_id!r}: 12 hexadecimal digits")
    return key_id


def lifetime(value: object) -> float:
    """A key's lifetime in seconds, from ``30d``, ``12h``, ``15m``, ``90s``, ``2w`` or a
    number of seconds: positive and at most MAX_LIFETIME; ConfigError otherwise."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        seconds = float(value)
    elif isinstance(value, str) and (match := _SPAN.match(value.strip().lower())):
        seconds = float(match.group(1)) * _UNITS[match.group(2) or "s"]
    else:
        raise errors.ConfigError(
            f"invalid lifetime {str(value)[:40]!r}: a positive number with s, m, h, d or w "
            "(30d), or seconds"
        )
    if not 0 < seconds <= MAX_LIFETIME:  # NaN too
        raise errors.ConfigError(
            f"invalid lifetime {str(value)[:40]!r}: more than 0 and at most 100 years"
        )
    return seconds


def parse_queues(text: str | Sequence[str] | None) -> tuple[str, ...]:
    """``a,b`` (or a list) as queue names, without repeats; empty: every queue."""
    if text is None:
        return ()
    names = text.split(",") if isinstance(text, str) else list(text)
    return tuple(dict.fromkeys(n.strip() for n in names if n.strip()))
