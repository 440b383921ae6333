"""Kept HTTP/1.1 connections to the gateways (http.client), for the Client's calls; and
what the worker's pipe shares with them: connecting with Nagle's algorithm off, telling
a connection that the peer closed, certificates checked as the Client checks them.

A call takes a kept connection to its gateway, or makes one; any thread may call, each
call has a connection to itself while it lasts. http.client, not httpx's client: a call
costs a third of the CPU time, on the producer's and the remote worker's threads
(docs/decisions/0022-gateway-latency.md).

A kept connection idle for IDLE seconds is dropped before the gateway drops it (uvicorn
closes idle keep-alive connections after 5 s); one the gateway closed anyway is seen
before it is used, or fails as the request is written, and then nothing reached the
gateway: Unreached, as for a refused connection. Once written, a request whose answer
does not come whole is Lost: it may or may not have been carried out.
"""

from __future__ import annotations

import http.client
import json
import select
import socket
import ssl
import threading
import time
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote, urlsplit

import httpx

IDLE = 2.0  # seconds a kept connection may idle before it is dropped (uvicorn: 5)
MAX_IDLE = 16  # kept connections at most (more are closed once answered)
_PATH_SAFE = "/!$&'()*+,;=:@%"  # kept as they are in a request's path


class Unreached(Exception):
    """Nothing reached the gateway: sending the request again is safe."""


class Lost(Exception):
    """The request was written; its answer did not come whole."""


@dataclass(frozen=True)
class Request:
    method: str
    path: str  # under the gateway's URL, not yet quoted
    query: str  # encoded
    body: bytes | None
    headers: dict[str, str]


@dataclass(frozen=True)
class Answer:
    status: int
    body: bytes

    def json(self) -> Any:
        """The body's JSON (None for an empty body); ValueError if it is not JSON."""
        return json.loads(self.body) if self.body else None


@dataclass(frozen=True)
class _Gateway:
    secure: bool
    host: str
    port: int
    prefix: str  # the path of the gateway's URL, before /v1/…


class Lines:
    """The kept connections of one Client (see the module docstring); thread-safe."""

    def __init__(self, verify: bool | ssl.SSLContext) -> None:
        self._verify = verify
        self._context: ssl.SSLContext | None = None  # made at the first https connection
        self._lock = threading.Lock()
        self._idle: list[tuple[str, http.client.HTTPConnection, float]] = []
        self._gateways: dict[str, _Gateway] = {}
        self._closed = False

    def request(
        self, base: str, request: Request, *, timeout: float, connect_timeout: float
    ) -> Answer:
        """``request`` on the gateway at ``base``, its answer read whole within ``timeout``
        seconds; Unreached or Lost where none came."""
        gateway = self._gateway(base)
        query = f"?{request.query}" if request.query else ""
        path = quote(gateway.prefix + request.path, safe=_PATH_SAFE) + query
        method, body, headers = request.method, request.body, request.headers
        conn = self._take(base)
        if conn is None or not _written(conn, method, path, body, headers):
            conn = self._connect(gateway, connect_timeout)
            if not _written(conn, method, path, body, headers):
                raise Unreached("the connection was lost as it was made")
        try:
            conn.sock.settimeout(timeout)
            response = conn.getresponse()
            data = response.read()
        except TimeoutError as exc:
            conn.close()
            raise Lost(f"no answer within {timeout:g}s") from exc
        except (OSError, http.client.HTTPException) as exc:
            conn.close()
            raise Lost(f"the connection was lost before the answer ({type(exc).__name__})") from exc
        if response.will_close:
            conn.close()
        else:
            self._keep(base, conn)
        return Answer(response.status, data)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, []
        for _, conn, _ in idle:
            conn.close()

    def _gateway(self, base: str) -> _Gateway:
        gateway = self._gateways.get(base)
        if gateway is None:
            parts = urlsplit(base)
            secure = parts.scheme.lower() == "https"
            port = parts.port or (443 if secure else 80)
            gateway = _Gateway(secure, parts.hostname or "", port, parts.path.rstrip("/"))
            self._gateways[base] = gateway
        return gateway

    def _take(self, base: str) -> http.client.HTTPConnection | None:
        """A kept connection to ``base`` that the gateway has not closed, if any."""
        now = time.monotonic()
        stale: list[http.client.HTTPConnection] = []
        found = None
        with self._lock:
            for i in range(len(self._idle) - 1, -1, -1):
                kept_base, conn, used_at = self._idle[i]
                if now - used_at > IDLE:
                    stale.append(conn)
                    del self._idle[i]
                elif kept_base == base and found is None:
                    found = conn
                    del self._idle[i]
        for conn in stale:
            conn.close()
        if found is not None and (found.sock is None or readable(found.sock)):
            found.close()  # closed by the gateway (an idle connection is readable then)
            return None
        return found

    def _keep(self, base: str, conn: http.client.HTTPConnection) -> None:
        with self._lock:
            if not self._closed and len(self._idle) < MAX_IDLE:
                self._idle.append((base, conn, time.monotonic()))
                return
        conn.close()

    def _connect(self, gateway: _Gateway, timeout: float) -> http.client.HTTPConnection:
        conn: http.client.HTTPConnection
        if gateway.secure:
            if self._context is None:
                self._context = tls_context(self._verify)
            conn = http.client.HTTPSConnection(
                gateway.host, gateway.port, timeout=timeout, context=self._context
            )
        else:
            conn = http.client.HTTPConnection(gateway.host, gateway.port, timeout=timeout)
        try:
            connect(conn)
        except OSError as exc:  # refused, unreachable, no answer to the handshake
            conn.close()
            raise Unreached(f"{type(exc).__name__}: {exc}") from exc
        return conn


def _written(
    conn: http.client.HTTPConnection,
    method: str,
    path: str,
    body: bytes | None,
    headers: dict[str, str],
) -> bool:
    """Write the request; False (the connection closed) where it could not be: then
    nothing reached the gateway whole."""
    try:
        conn.request(method, path, body=body, headers=headers)
    except (OSError, http.client.HTTPException):
        conn.close()
        return False
    return True


def connect(conn: http.client.HTTPConnection) -> None:
    """Connect, with Nagle's algorithm off (as httpx does): http.client writes a request's
    headers and its body in two sends, and the body would otherwise wait for the peer to
    acknowledge the headers, which it may delay (40 ms on Linux, more elsewhere)."""
    conn.connect()
    conn.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


def readable(sock: socket.socket, timeout: float = 0.0) -> bool:
    """Whether ``sock`` has something to read (or has been closed by the peer), waiting
    ``timeout`` seconds at most."""
    if isinstance(sock, ssl.SSLSocket) and sock.pending():
        return True
    ready, _, _ = select.select([sock], [], [], timeout)
    return bool(ready)


def tls_context(verify: bool | ssl.SSLContext) -> ssl.SSLContext:
    """The Client's certificate checks (its ``verify``), as a context for http.client."""
    return verify if isinstance(verify, ssl.SSLContext) else httpx.create_ssl_context(verify)
