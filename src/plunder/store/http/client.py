"""Requests to one or more gateways (``https://a:8700,https://b:8700``) with an API key.

A gateway that is down or busy (connection refused or lost, 502, 503, 429) is left for the
next at once; once every gateway failed in a round, the client waits the fixed busy
interval (150 ms, jittered; it never grows) and goes round again, until the call's budget
is spent. A request that is not safe to send twice (an enqueue without keys) is sent again
only when the gateway surely did not take it (it refused the connection, or answered 429
or 503 before doing anything).
"""

from __future__ import annotations

import contextlib
import itertools
import json as jsonlib
import ssl
import threading
import time
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlencode

import httpx

from plunder import errors, policy
from plunder.store.http.lines import Answer, Lines, Lost, Request, Unreached
from plunder.wire import WireError

RETRYABLE = frozenset({429, 502, 503, 504})
NOT_TAKEN = frozenset({429, 503})  # the gateway refused before doing anything
CONNECT_TIMEOUT = 5.0
CALL_TIMEOUT = 30.0  # seconds for an answer, beyond what a long-poll asks to wait


def split_urls(url: str) -> list[str]:
    """``https://a:8700,https://b:8700`` as its gateways, each without a trailing slash."""
    urls = [u.strip().rstrip("/") for u in url.split(",") if u.strip()]
    for one in urls:
        if not one.lower().startswith(("http://", "https://")):
            raise errors.ConfigError(f"a gateway URL must start with http:// or https://: {one!r}")
    if not urls:
        raise errors.ConfigError("no gateway URL given")
    return urls


class Client:
    """One process's connections to its gateways, kept alive (plunder.store.http.lines;
    httpx for streams); thread-safe."""

    def __init__(
        self,
        url: str,
        key: str | None,
        *,
        busy_total: float = policy.BUSY_TOTAL,
        verify: bool | str | ssl.SSLContext = True,
        call_timeout: float = CALL_TIMEOUT,
    ) -> None:
        if not key:
            raise errors.ConfigError(
                "a gateway needs an API key: set PLUNDER_KEY, or pass --key (the command "
                "line) or key=... (Python); see `plunder keys create`"
            )
        self.urls = split_urls(url)
        self.url = ",".join(self.urls)
        self.busy_total = busy_total
        self.call_timeout = call_timeout  # seconds for an answer, beyond a long-poll's wait
        # check the certificate (True: as httpx does), or not, or trust a CA bundle's path
        # (given as a context: httpx takes no path now)
        if isinstance(verify, str):
            verify = ssl.create_default_context(cafile=verify)
        self.verify = verify
        self._key = key
        self._lines = Lines(self.verify)
        self._plain = self.headers()
        self._json = {**self._plain, "Content-Type": "application/json"}
        self._http: httpx.Client | None = None  # for streams, made at the first
        self._lock = threading.Lock()
        self._preferred = 0  # the gateway that answered last
        self._closed = False
        # cut(): calls between tries then give up; the count tells a call it was cut
        self._cuts = 0
        self._cut_reason = ""
        self._trying = 0  # calls in their loop of tries
        self._cut_wake = threading.Condition(self._lock)

    def __repr__(self) -> str:  # never the key
        return f"Client({self.url!r})"

    def headers(self) -> dict[str, str]:
        """The headers every request carries: the key, and who sends it."""
        return {"Authorization": f"Bearer {self._key}", "User-Agent": "plunder"}

    def close(self) -> None:
        self._closed = True
        self._lines.close()
        with self._lock:
            streams, self._http = self._http, None
        if streams is not None:
            streams.close()

    def cut(self, reason: str) -> int:
        """From any thread: every call in its loop of tries gives up before its next try
        (a lost session's calls would be refused anyway); how many calls there were."""
        with self._cut_wake:
            self._cuts += 1
            self._cut_reason = reason
            self._cut_wake.notify_all()
            return self._trying

    def call(
        self,
        method: str,
        path: str,
        *,
        json: Any = None,
        params: dict[str, Any] | None = None,
        wait: float = 0.0,
        idempotent: bool = True,
        timeout: float | None = None,
    ) -> Any:
        """The answer's JSON (None for 204), or plunder's error for a refusal. ``wait``:
        seconds the gateway may hold the request (a long-poll), added to the timeout
        (``timeout``, else the client's ``call_timeout``): a hung gateway holds no call
        longer, and the next is tried. A ``timeout`` given is the whole call's deadline,
        its tries and pauses included (a heartbeat must end by its own)."""
        deadline = None if timeout is None else time.monotonic() + timeout + wait
        total = self.busy_total if timeout is None else min(self.busy_total, timeout)
        backoff = policy.BusyBackoff(total=total)
        limit = (self.call_timeout if timeout is None else timeout) + wait
        # as httpx encoded them: compact UTF-8 JSON, no NaN; true/false in the query
        body = None
        if json is not None:
            text = jsonlib.dumps(json, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
            body = text.encode("utf-8")
        query = urlencode({k: _text(v) for k, v in params.items()}) if params else ""
        request = Request(method, path, query, body, self._plain if body is None else self._json)
        with self._trying_call() as cuts:
            return self._tries(request, idempotent, cuts, (deadline, limit, backoff))

    @contextlib.contextmanager
    def _trying_call(self) -> Iterator[int]:
        """Count a call as trying (for cut()); the cuts so far, which it compares."""
        with self._lock:
            self._trying += 1
            cuts = self._cuts
        try:
            yield cuts
        finally:
            with self._lock:
                self._trying -= 1

    def _tries(
        self, request: Request, idempotent: bool, cuts: int,
        budget: tuple[float | None, float, policy.BusyBackoff],
    ) -> Any:  # fmt: skip
        """The gateways in turn, round after round, until one answers, the budget (the
        deadline, each try's limit, the pauses) is spent, or the call is cut."""
        deadline, limit, backoff = budget
        failure: Exception | None = None
        while True:
            for index, base in self.gateways():
                self._check_cut(cuts)
                left = limit if deadline is None else deadline - time.monotonic()
                if left <= 0:
                    break
                response, failure = self._try(base, request, idempotent, left)
                if response is None:
                    continue
                self.prefer(index)
                if response.status >= 400:
                    raise _error(response, base)
                return None if response.status == 204 else response.json()
            pause = backoff.next_wait()
            if deadline is not None and pause is not None:
                pause = min(pause, deadline - time.monotonic())
            if pause is None or pause <= 0 or self._closed:
                if failure is None:
                    raise errors.StoreUnavailable(f"{self.url}: no answer within {limit:g}s")
                raise failure
            with self._cut_wake:
                self._cut_wake.wait_for(lambda: self._cuts != cuts, timeout=pause)

    def _check_cut(self, cuts: int) -> None:
        with self._lock:
            if self._cuts != cuts:
                raise errors.StoreUnavailable(f"{self.url}: call given up: {self._cut_reason}")

    def _try(
        self, base: str, request: Request, idempotent: bool, left: float
    ) -> tuple[Answer | None, Exception | None]:
        """One gateway's answer within ``left`` seconds, or (None, why) where the next one
        is to be tried."""
        try:
            response = self._lines.request(
                base, request, timeout=left, connect_timeout=min(CONNECT_TIMEOUT, left)
            )
        except Unreached as exc:  # never reached it: safe to send again
            return None, errors.StoreUnavailable(f"{base}: {exc}")
        except Lost as exc:
            if not idempotent:
                raise errors.OutcomeUnknown(
                    f"{base}: {exc}; the request may or may not have been carried out"
                ) from exc
            return None, errors.StoreUnavailable(f"{base}: {exc}")
        status = response.status
        if status in RETRYABLE and (idempotent or status in NOT_TAKEN):
            return None, _error(response, base)
        return response, None

    def gateways(self) -> Iterator[tuple[int, str]]:
        """Every gateway once (its place in ``urls``, its URL), the one that answered
        last first."""
        with self._lock:
            first = self._preferred
        count = len(self.urls)
        for i in itertools.islice(itertools.count(first), count):
            yield i % count, self.urls[i % count]

    def prefer(self, index: int) -> None:
        """The gateway at ``index`` (in ``urls``) answered: ask it first from now on."""
        with self._lock:
            self._preferred = index

    def rotate(self) -> None:
        """The preferred gateway failed a stream: prefer the next one."""
        with self._lock:
            self._preferred = (self._preferred + 1) % len(self.urls)

    def stream(self, path: str, *, headers: dict[str, str]) -> Any:
        """A streamed GET (server-sent events) on the preferred gateway: httpx's stream
        context manager, the caller reads its lines."""
        with self._lock:
            base = self.urls[self._preferred]
            if self._http is None:
                # directly, as every call goes (no proxy from the environment)
                self._http = httpx.Client(
                    headers=self.headers(), verify=self.verify, trust_env=False
                )
            streams = self._http
        timeout = httpx.Timeout(None, connect=CONNECT_TIMEOUT)
        return streams.stream("GET", base + path, headers=headers, timeout=timeout)


# the gateway's error types (the "type" of its answer) as plunder's errors
_TYPES: dict[str, type[Exception]] = {
    "JobNotFound": errors.JobNotFound,
    "SessionGone": errors.SessionGone,
    "InvalidTransition": errors.InvalidTransition,
    "StoreBusy": errors.StoreBusy,
    "StoreUnavailable": errors.StoreUnavailable,
    "StoreFull": errors.StoreFull,
    "OutcomeUnknown": errors.OutcomeUnknown,
    "PayloadError": errors.PayloadError,
    "InvalidName": errors.InvalidName,
    "UnknownTask": errors.UnknownTask,
    "StaleClaim": errors.StaleClaim,
    "WireError": WireError,
    "ConfigError": errors.ConfigError,
}
_BY_STATUS: dict[int, type[Exception]] = {
    401: errors.AccessDenied,
    403: errors.AccessDenied,
    404: errors.JobNotFound,
    410: errors.SessionGone,
    413: errors.PayloadError,
    429: errors.StoreBusy,
    502: errors.StoreUnavailable,
    503: errors.StoreBusy,
    504: errors.StoreUnavailable,
}


def error_of(status: int, data: Any, where: str) -> Exception:
    """The plunder error a gateway's refusal stands for."""
    reason = data.get("error") if isinstance(data, dict) else None
    kind = data.get("type") if isinstance(data, dict) else None
    message = f"{where}: {reason or f'HTTP {status}'}"
    if status in (401, 403):
        return errors.AccessDenied(message)
    cls = _TYPES.get(str(kind)) or _BY_STATUS.get(status)
    if cls is None:
        cls = errors.StoreError if status >= 500 else errors.PlunderError
    return cls(message)


def _error(response: Answer, base: str) -> Exception:
    try:
        data = response.json()
    except ValueError:
        data = None
    return error_of(response.status, data, base)


def _text(value: Any) -> str:
    """A query parameter's text, as httpx wrote it."""
    if value is True or value is False:
        return "true" if value else "false"
    return "" if value is None else str(value)
