"""A remote worker's turns sent ahead through a gateway (``plunder.store.base.TurnPipe``
for HttpLink): each turn on a persistent HTTP connection of its own, written and read
on the worker's own thread.

```
 worker    send(N+1) ─▶ reads N's answer, starts N's jobs, collects outcomes ─ receive(N+1)
             │ (its own connection)                                             ▲
 gateway     └── exchange N+1, on a thread and a database connection of its own ┘
```

A turn is the exchange HttpLink.exchange makes (``POST /v1/sessions/{id}/exchange``, the
same headers and JSON), written with http.client's ``request()`` and read later with
``getresponse()``. Up to DEPTH are in flight, read oldest first; the gateway runs them
side by side, each committing on its own. Two, not three as on PostgreSQL: a turn through
a gateway costs more whatever its size, and halves of the slots drained faster than
thirds (docs/decisions/0009-the-gateway.md). Only the one turn a pipe has in flight may
wait at the gateway for work (its claim's ``wait``: an idle worker's long-poll). The
results it carries (the last jobs of a worker gone idle) are written before the wait, and
only their acknowledgement comes back with the answer: one request, not a turn for them
and another to wait. A claim sent while another turn is on its way never waits: the
worker has work coming, and the results of that work would wait with it.

Connections. A refused connection is left for the next gateway at once, as Client does.
A connection idle for IDLE seconds is dropped before the gateway drops it (uvicorn closes
idle keep-alive connections after 5 s); a kept one that the gateway closed anyway is
seen before it is used, or fails as the turn is written: then nothing reached the
gateway, and the turn is written again on a new connection. A failure once it was
written (a lost connection, no answer in time, a busy or failing gateway) raises
StoreUnavailable or StoreBusy and drops every turn in flight, whose connections are
closed: the caller sends their completions again (the store acknowledges a completion
once), and claims that committed unread are given back once the heartbeat reports them.
After such a failure the pipe rests for the busy interval: turns go the ordinary way
(Client, which waits between rounds of gateways) meanwhile.
"""

from __future__ import annotations

import collections
import http.client
import json
import socket
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from plunder import errors, policy, wire_exchange
from plunder.model import AckResult, Completion, JobRecord
from plunder.protocol import ClaimRequest, Reply
from plunder.store.http.client import CONNECT_TIMEOUT, Client, error_of
from plunder.store.http.lines import IDLE, connect, readable, tls_context

DEPTH = 2  # turns in flight at most, each on its own connection (decision 0009)
REST = policy.BUSY_INTERVAL  # seconds without turns sent ahead after one failed
GONE = 410  # the session is gone: the exchange did nothing


@dataclass
class _Line:
    """A kept connection to one gateway."""

    index: int  # the gateway's place in the client's urls
    base: str
    prefix: str  # the path of the gateway's URL, before /v1/…
    conn: http.client.HTTPConnection
    used_at: float  # time.monotonic() of its last answer


@dataclass
class _Flight:
    line: _Line
    completions: list[Completion]
    session_id: str
    limit: int
    take_suspect: bool
    sent_at: float  # time.monotonic()


class Answer:
    """A turn's answer (it committed at the gateway): its rows are made records, and its
    acknowledgements read, only when asked for."""

    def __init__(self, flight: _Flight, data: Any, gone: errors.SessionGone | None) -> None:
        self.limit = flight.limit  # how many it asked for
        self.take_suspect = flight.take_suspect  # whether it could bring a suspect
        self.completions = flight.completions  # the completions it carried
        self.claimed = _rows(data)  # how many jobs it claimed
        self._session_id = flight.session_id
        self._data = data
        self._gone = gone
        self._reply: Reply | None = None

    def reply(self) -> Reply:
        if self._reply is None:
            self._reply = wire_exchange.reply_in(self._data, self._session_id)
        return self._reply

    def jobs(self) -> list[JobRecord]:
        """The jobs it claimed, in claim order."""
        return [] if self._gone is not None else list(self.reply().claimed)

    @property
    def children(self) -> bool:
        """Whether a job it completed had children, which its claim could not see."""
        return self._gone is None and self.reply().children

    def settle(self, now: Any = None) -> AckResult:
        """What became of its completions; SessionGone if the gateway answered that the
        session is gone (the exchange then completed and claimed nothing)."""
        if self._gone is not None:
            raise self._gone
        return self.reply().completed


def _rows(data: Any) -> int:
    """How many jobs an answer holds, before its rows are read (0 if it is malformed:
    reading it says how)."""
    jobs = data.get("jobs") if isinstance(data, dict) else None
    rows = jobs.get("rows") if isinstance(jobs, dict) else None
    return len(rows) if isinstance(rows, list) else 0


class HttpPipe:
    """One worker's turns sent ahead through its gateways (see the module docstring). Only
    the worker's main thread uses it, but for ``cut``."""

    def __init__(self, client: Client, *, depth: int = DEPTH) -> None:
        self.client = client
        self._depth = depth
        self._headers = {**client.headers(), "Content-Type": "application/json"}
        self._context = tls_context(client.verify)
        self._idle: list[_Line] = []  # kept connections, none with a turn in flight
        self._flights: collections.deque[_Flight] = collections.deque()
        self._rest_until = 0.0  # time.monotonic() before which no turn is sent

    def __repr__(self) -> str:
        return f"HttpPipe({self.client.url!r})"

    @property
    def sent_at(self) -> float | None:
        """When the oldest turn in flight was sent (``time.monotonic()``); None: none is."""
        return self._flights[0].sent_at if self._flights else None

    @property
    def in_flight(self) -> int:
        return len(self._flights)

    @property
    def depth(self) -> int:
        return self._depth

    @property
    def claiming(self) -> int:
        """The slots the turns in flight may fill: the sum of their claim limits."""
        return sum(f.limit for f in self._flights)

    @property
    def suspect(self) -> bool:
        return any(f.take_suspect for f in self._flights)

    def completions(self) -> list[Completion]:
        """The completions of the turns in flight, oldest first."""
        return [c for f in self._flights for c in f.completions]

    def answered(self, timeout: float = 0.0) -> bool:
        """Whether the oldest turn's answer has begun to come back, waiting ``timeout``
        seconds at most. False with none in flight."""
        if not self._flights:
            return False
        sock = self._flights[0].line.conn.sock
        return sock is None or readable(sock, timeout)

    def ready(self, *, queues: Sequence[str], tasks: Sequence[str]) -> int:
        """Nothing to prepare at a gateway: connections are made by the first turns."""
        return 0

    def send(
        self,
        completions: Sequence[Completion],
        *,
        session_id: str,
        queues: Sequence[str],
        tasks: Sequence[str],
        limit: int,
        take_suspect: bool,
        wait: float = 0.0,
    ) -> bool:
        """Write a turn: these completions (plain, without effects) and a claim of up to
        ``limit`` jobs, which may wait ``wait`` seconds at the gateway for work only if
        no other turn is in flight (its completions are written before the wait). Raises the store's
        errors; after one, nothing is in flight (the turns that were are never read: their
        completions are the caller's to send again)."""
        if len(self._flights) >= self._depth:
            raise RuntimeError(f"{len(self._flights)} turns are in flight already: receive first")
        if any(c.effects is not None for c in completions):
            raise ValueError("completions with effects go through the ordinary exchange")
        alone = not self._flights
        claim = ClaimRequest(tuple(queues), tuple(tasks), limit, take_suspect,
                             wait if alone and limit else 0.0)  # fmt: skip
        data = wire_exchange.exchange_out(completions, claim)
        body = json.dumps(data, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
        try:
            line = self._write(f"/v1/sessions/{session_id}/exchange", body.encode())
            line.conn.sock.settimeout(self.client.call_timeout + claim.wait)  # as Client's
        except BaseException:
            self._drop()
            raise
        flight = _Flight(line, list(completions), session_id, limit, take_suspect,
                         time.monotonic())  # fmt: skip
        self._flights.append(flight)
        return True

    def receive(self) -> Answer:
        """The answer to the oldest turn in flight. Raises the store's errors (plunder's
        error for a refusal, as Client does); after one, nothing is in flight."""
        if not self._flights:
            raise RuntimeError("no turn is in flight")
        flight = self._flights[0]  # in flight while it is read: ``cut`` sees it
        line = flight.line
        try:
            status, data, reusable = self._read(line)
        except BaseException:
            self._fail()  # this turn's connection closed with the rest
            raise
        self._flights.popleft()
        if reusable:
            line.used_at = time.monotonic()
            self._idle.append(line)
        else:
            line.conn.close()
        if status == 200:
            self.client.prefer(line.index)
            return Answer(flight, data, None)
        if status == GONE:
            gone = error_of(status, data, line.base)
            if isinstance(gone, errors.SessionGone):
                return Answer(flight, None, gone)
        self._fail()
        raise error_of(status, data, line.base)

    def rest(self) -> None:
        """Kept connections stay for the next turns, but those idle too long."""
        now = time.monotonic()
        for line in [x for x in self._idle if now - x.used_at > IDLE]:
            self._idle.remove(line)
            line.conn.close()

    def close(self) -> list[Completion]:
        """The turns in flight are never read (their connections are closed); their
        completions are returned, to be sent again. Kept connections stay for the next
        turns, but those idle too long."""
        unread = self.completions()
        self._drop()
        self.rest()
        return unread

    def release(self) -> None:
        """Close every connection (the worker is done)."""
        self._drop()
        idle, self._idle = self._idle, []
        for line in idle:
            line.conn.close()

    def cut(self, reason: str) -> int:
        """From any thread: end the connections of the turns in flight, so that a read
        waiting on a gateway that hangs fails now; how many."""
        cut = 0
        for flight in tuple(self._flights):
            sock = flight.line.conn.sock
            if sock is not None:
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                    cut += 1
                except OSError:
                    pass  # closed already
        return cut

    # -- connections ------------------------------------------------------------------------
    def _write(self, path: str, body: bytes) -> _Line:
        """Write a request on a kept connection to the preferred gateway, or a new one (the
        next gateway where that is refused); the connection it went on."""
        if time.monotonic() < self._rest_until:
            raise errors.StoreBusy("a turn failed a moment ago: none is sent ahead for now")
        failure: Exception | None = None
        for index, base in self.client.gateways():
            kept = self._kept(base)
            if kept is not None and self._written(kept, path, body):
                return kept
            try:
                line = self._connect(index, base)
            except OSError as exc:  # never reached it: the next one
                failure = errors.StoreUnavailable(f"{base}: {type(exc).__name__}: {exc}")
                continue
            if self._written(line, path, body):
                return line
            failure = errors.StoreUnavailable(f"{base}: the connection was lost as it was made")
        assert failure is not None
        self._rest_until = time.monotonic() + REST
        raise failure

    def _kept(self, base: str) -> _Line | None:
        """A kept connection to ``base`` that the gateway has not closed, if any."""
        now = time.monotonic()
        while self._idle:
            line = self._idle.pop()
            sock = line.conn.sock
            fresh = line.base == base and now - line.used_at <= IDLE and sock is not None
            if fresh and not readable(sock):  # an idle connection is readable as it closes
                return line
            line.conn.close()
        return None

    def _connect(self, index: int, base: str) -> _Line:
        parts = urlsplit(base)
        timeout = min(CONNECT_TIMEOUT, self.client.call_timeout)
        conn: http.client.HTTPConnection
        if parts.scheme.lower() == "https":
            conn = http.client.HTTPSConnection(
                parts.hostname or "", parts.port or 443, timeout=timeout, context=self._context
            )
        else:
            conn = http.client.HTTPConnection(parts.hostname or "", parts.port or 80,
                                              timeout=timeout)  # fmt: skip
        connect(conn)
        return _Line(index, base, parts.path.rstrip("/"), conn, time.monotonic())

    def _read(self, line: _Line) -> tuple[int, Any, bool]:
        """The answer's status, JSON and whether its connection may be kept; the store's
        error where none came."""
        try:
            response = line.conn.getresponse()
            body = response.read()
        except TimeoutError as exc:
            raise errors.StoreUnavailable(
                f"{line.base}: no answer within {self.client.call_timeout:g}s"
            ) from exc
        except (OSError, http.client.HTTPException) as exc:
            raise errors.StoreUnavailable(
                f"{line.base}: the connection was lost before the answer ({type(exc).__name__})"
            ) from exc
        try:
            data = json.loads(body) if body else None
        except ValueError:
            data = None
        return response.status, data, not response.will_close

    def _written(self, line: _Line, path: str, body: bytes) -> bool:
        """Write the request; False (the connection closed) where it could not be: then
        nothing reached the gateway whole."""
        try:
            line.conn.request("POST", line.prefix + path, body=body, headers=self._headers)
        except (OSError, http.client.HTTPException):
            line.conn.close()
            return False
        return True

    def _fail(self) -> None:
        """A turn failed: the rest are dropped, and none is sent ahead for a while."""
        self._drop()
        self._rest_until = time.monotonic() + REST

    def _drop(self) -> None:
        flights, self._flights = self._flights, collections.deque()
        for flight in flights:
            flight.line.conn.close()
