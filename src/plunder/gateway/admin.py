"""The keys over HTTP, for admin keys only: list them, make one (its secret answered this
once), revoke one (it stops working within a second on every gateway, at once on this
one, and the worker sessions it opened end now).

```
 GET  /v1/keys               every key (never a secret)
 POST /v1/keys               {"role", "group"?, "queues"?, "expires"?, "name"?}
                             -> 201 {"secret": "plk_…", "key": {…}}
 POST /v1/keys/{id}/revoke   -> {"key": {…}, "sessions_ended": [session ids]}
```

A request is read and checked whole before anything is written: an unknown role or
field, a bad lifetime, group or queue name is a 400 and makes no key.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from plunder import access, errors, payload, wire
from plunder.gateway.auth import Refused
from plunder.gateway.server import Gateway, body, key_of

MAX_NAME = 200  # characters in a key's name (a note shown in the list)
MANAGE = "manage keys (only an admin key may)"


@dataclass(frozen=True)
class NewKey:
    """A key to make, as a request asked for it (checked: see ``new_key``)."""

    role: str
    group: str
    queues: tuple[str, ...]
    expires_in: float | None
    name: str


def new_key(data: Any) -> NewKey:
    """The body of ``POST /v1/keys``, every field checked; WireError, ConfigError or
    InvalidName (each a 400) for the first that is wrong."""
    fields = wire.Fields(data, "a new key")
    role = access.check_role(fields.take("role", str)).value
    group = access.check_group(fields.take("group", str, access.DEFAULT_GROUP))
    queues = tuple(payload.check_queue(q) for q in dict.fromkeys(fields.strings("queues", ())))
    expires = fields.take("expires", (int, float, str), None)
    name = fields.take("name", str, "")
    fields.done()
    if len(name) > MAX_NAME or not name.isprintable():
        raise wire.WireError(f"a new key: 'name' must be at most {MAX_NAME} printable characters")
    lifetime = None if expires is None else access.lifetime(expires)
    return NewKey(role, group, queues, lifetime, name)


def _key_id(request: Request) -> str:
    raw = str(request.path_params["key_id"])
    try:
        return access.check_key_id(raw)
    except errors.InvalidName:
        raise Refused(404, f"no key {raw[:40]!r}") from None


async def keys_list(gateway: Gateway, request: Request) -> Response:
    await key_of(gateway, request, "admin", MANAGE)
    found = await run_in_threadpool(gateway.store.key_list)
    return JSONResponse({"keys": [k.public() for k in found]})


async def keys_create(gateway: Gateway, request: Request) -> Response:
    await key_of(gateway, request, "admin", MANAGE)
    wanted = new_key(await body(gateway, request))
    key, secret = await run_in_threadpool(_create, gateway, wanted)
    return JSONResponse(
        {"secret": secret, "key": key.public()},
        status_code=201,
        headers={"Cache-Control": "no-store"},  # the secret: kept by no cache on the way
    )


def _create(gateway: Gateway, wanted: NewKey) -> tuple[access.ApiKey, str]:
    return gateway.store.key_create(
        role=wanted.role,
        group=wanted.group,
        queues=wanted.queues,
        name=wanted.name,
        expires_in=wanted.expires_in,
    )


async def keys_revoke(gateway: Gateway, request: Request) -> Response:
    await key_of(gateway, request, "admin", MANAGE)
    key_id = _key_id(request)
    if await run_in_threadpool(gateway.store.key_get, key_id) is None:
        raise Refused(404, f"no key {key_id!r}")
    key, sessions = await run_in_threadpool(gateway.store.key_revoke, key_id)
    gateway.keys.forget(key_id)  # refused here at once; elsewhere within KEY_TTL
    return JSONResponse({"key": key.public(), "sessions_ended": sessions})


ROUTES = [
    ("/v1/keys", "GET", keys_list),
    ("/v1/keys", "POST", keys_create),
    ("/v1/keys/{key_id}/revoke", "POST", keys_revoke),
]
