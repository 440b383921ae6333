"""The gateway's plumbing: one ``Gateway`` per process (the database, the keys, the
sessions' owners), requests read strictly, errors answered as one line of JSON.

```
 request ─▶ key (auth.Keys) ─▶ role and scope ─▶ body read (size-capped, strict JSON)
         ─▶ the store, on a worker thread ─▶ JSON answer   (any refusal: 4xx, nothing written)
```

Every error answer is ``{"error": "<one line>", "type": "<plunder error name>"}``; the
clients (plunder.store.http) raise the same plunder error from it.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

from starlette.concurrency import run_in_threadpool
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from plunder import errors, payload, wire
from plunder.access import ApiKey
from plunder.app import App
from plunder.gateway.auth import KEY_TTL, Keys, MustRead, Refused, require, require_queues
from plunder.store.base import Store
from plunder.store.link import StoreLink

log = logging.getLogger("plunder.gateway")
T = TypeVar("T")
MAX_BODY = 16 * 1024 * 1024  # bytes in one request body
MAX_WAIT = 60.0  # seconds a long-poll may ask to wait
MAX_SESSIONS_KNOWN = 100_000  # sessions whose key is remembered (then forgotten, re-read)

# plunder's errors as HTTP statuses (the first that matches, in this order)
_STATUS: list[tuple[type[BaseException], int]] = [
    (errors.JobNotFound, 404),
    (errors.SessionGone, 410),
    (errors.InvalidTransition, 409),
    (errors.StoreBusy, 503),
    (errors.StoreUnavailable, 503),
    (errors.StoreFull, 507),
    (errors.OutcomeUnknown, 502),
    (errors.StoreError, 500),
    (errors.PayloadError, 400),
    (errors.InvalidName, 400),
    (errors.UnknownTask, 400),
    (errors.ConfigError, 400),
    (errors.StaleClaim, 409),
    (wire.WireError, 400),
    (ValueError, 400),
]


class Gateway:
    """What every request handler shares: the app on the database, its store, the keys,
    and which key opened which session."""

    def __init__(self, app: App, *, max_body: int = MAX_BODY) -> None:
        self.app = app
        self.store: Store = app.store
        self.link = StoreLink(self.store)
        self.keys = Keys(self.store)
        self.max_body = max_body
        self._owners: dict[str, str | None] = {}  # session id -> the key that opened it
        self._groups: tuple[dict[str, str], float] | None = None  # and when read
        self._lock = threading.Lock()

    def groups(self, *, read: bool = True) -> dict[str, str]:
        """The queues of groups other than the default one (see plunder.access), read
        again at most once per KEY_TTL: a key made for a new group is in use at once.
        ``read=False`` (on the event loop): MustRead where that would read."""
        with self._lock:
            cached = self._groups
        if cached is not None and time.monotonic() - cached[1] < KEY_TTL:
            return cached[0]
        if not read:
            raise MustRead
        groups = self.store.queue_groups()
        with self._lock:
            self._groups = (groups, time.monotonic())
        return groups

    async def require_queues(self, key: ApiKey, queues: Sequence[str]) -> None:
        require_queues(key, list(queues), await self.known_groups())

    async def known_groups(self) -> dict[str, str]:
        """``groups()``, on the event loop while recent, else read on a worker thread."""
        try:
            return self.groups(read=False)
        except MustRead:
            return await run_in_threadpool(self.groups)

    def remember(self, session_id: str, key_id: str) -> None:
        with self._lock:
            if len(self._owners) >= MAX_SESSIONS_KNOWN:
                self._owners.clear()
            self._owners[session_id] = key_id

    def owner(self, session_id: str, *, read: bool = True) -> str | None:
        """The key that opened a session (None: no such session, or a direct one). A
        session's key never changes, so it is read from the database once. ``read=False``
        (on the event loop): MustRead where that would read."""
        with self._lock:
            if session_id in self._owners:
                return self._owners[session_id]
        if not read:
            raise MustRead
        session = self.store.session_get(session_id)
        if session is None:
            return None  # not remembered: it may be opened by then, on another gateway
        self.remember(session_id, session.key_id or "")
        return session.key_id


async def key_of(gateway: Gateway, request: Request, action: str, what: str = "do this") -> ApiKey:
    """The request's key, allowed ``action`` (see ApiKey.may); Refused otherwise, saying
    that it may not ``what``."""
    address = request.client.host if request.client else "?"
    header = request.headers.get("authorization")
    try:  # mostly known already: no thread, no database
        key = gateway.keys.check(header, address, read=False)
    except MustRead:
        key = await run_in_threadpool(gateway.keys.check, header, address)
    require(key, action, what)
    return key


async def own_session(gateway: Gateway, key: ApiKey, session_id: str) -> None:
    """Refused (404, as for a session that does not exist) unless ``key`` opened it."""
    try:  # mostly known already: no thread, no database
        owner = gateway.owner(session_id, read=False)
    except MustRead:
        owner = await run_in_threadpool(gateway.owner, session_id)
    if owner is None or owner != key.id:
        raise Refused(404, f"no session {session_id[:40]!r} of this key")


async def body(gateway: Gateway, request: Request) -> Any:
    """The request's JSON body: at most ``max_body`` bytes, UTF-8, strict JSON."""
    length = request.headers.get("content-length")
    if length is not None and (not length.isdigit() or int(length) > gateway.max_body):
        raise Refused(413, f"the body is larger than {gateway.max_body} bytes")
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > gateway.max_body:
            raise Refused(413, f"the body is larger than {gateway.max_body} bytes")
        chunks.append(chunk)
    try:
        text = b"".join(chunks).decode("utf-8")
    except UnicodeDecodeError:
        raise Refused(400, "the body is not UTF-8") from None
    if "\x00" in text:
        raise Refused(400, "the body holds a NUL character")
    if not text.strip():
        raise Refused(400, "the body is empty: a JSON object is expected")
    return payload.parse(text, what="the body")


def number(request: Request, name: str, default: float, *, high: float) -> float:
    """A query parameter as a number from 0 to ``high``."""
    raw = request.query_params.get(name)
    if raw is None:
        return default
    try:
        value = float(raw)
    except ValueError:
        raise Refused(400, f"?{name}= must be a number, not {raw[:20]!r}") from None
    if not math.isfinite(value) or not 0 <= value <= high:
        raise Refused(400, f"?{name}= must be from 0 to {high:g}")
    return value


def integer(request: Request, name: str, default: int | None, *, high: int) -> int | None:
    raw = request.query_params.get(name)
    if raw is None:
        return default
    if not raw.isdigit() or int(raw) > high:
        raise Refused(400, f"?{name}= must be an integer from 0 to {high}")
    return int(raw)


def job_id(request: Request) -> int:
    raw = request.path_params["job_id"]
    if not raw.isdigit() or len(raw) > 19 or int(raw) < 1:
        raise Refused(404, f"no job {raw[:20]!r}")
    return int(raw)


def refusal(status: int, reason: str, kind: str = "Refused", **headers: str) -> JSONResponse:
    return JSONResponse({"error": reason, "type": kind}, status_code=status, headers=headers)


Endpoint = Callable[["Gateway", Request], Awaitable[Response]]


def routes(gateway: Gateway, table: Sequence[tuple[str, str, Endpoint]]) -> list[Route]:
    """The routes of ``table`` (path, method, endpoint), each answered by ``handler``."""
    return [
        Route(path, handler(gateway, endpoint), methods=[method], name=endpoint.__name__)
        for path, method, endpoint in table
    ]


def handler(
    gateway: Gateway, endpoint: Callable[[Gateway, Request], Awaitable[Response]]
) -> Callable[[Request], Awaitable[Response]]:
    """A route's endpoint, with every refusal and plunder error answered as one line."""

    async def handle(request: Request) -> Response:
        try:
            return await endpoint(gateway, request)
        except ClientDisconnect:  # it left mid-body: no one reads the answer, nothing done
            log.info("%s %s: the client left before its body ended", request.method,
                     request.url.path)  # fmt: skip
            return refusal(400, "the request's body ended early")
        except Refused as exc:
            headers = {} if exc.retry_after is None else {"Retry-After": f"{exc.retry_after:.0f}"}
            return refusal(exc.status, exc.reason, **headers)
        except Exception as exc:
            status = next((code for kind, code in _STATUS if isinstance(exc, kind)), None)
            if status is None:
                raise  # a bug: Starlette answers 500 and logs the traceback
            if status >= 500:
                log.warning("%s %s: %s", request.method, request.url.path, exc)
            headers = {"Retry-After": "1"} if status == 503 else {}
            reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            return refusal(status, reason, type(exc).__name__, **headers)

    return handle
