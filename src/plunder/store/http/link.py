"""The worker protocol (plunder.protocol) spoken to a gateway: a remote worker's link.

An exchange that claims and finds nothing waits at the gateway (as long as its claim
request's ``wait`` says) until a job arrives in one of its queues; the worker's loop sees
a slow exchange, not a poll. A busy worker sends its turns ahead (``pipe()``: two in
flight, each on a connection of its own; plunder.store.http.pipe); the rest of the
protocol goes through the Client, one call at a time on each thread.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from plunder import wire, wire_exchange
from plunder.graph import ParentResult
from plunder.model import Claim, Heartbeat, Session
from plunder.protocol import Beat, ClaimRequest, Hello, Outcome, Reply
from plunder.store.http.client import Client
from plunder.store.http.pipe import HttpPipe


class HttpLink:
    """A worker's protocol over a gateway (see plunder.protocol.WorkerProtocol)."""

    long_polls = True

    def __init__(self, client: Client, *, heartbeat_timeout: float | None = None) -> None:
        """``heartbeat_timeout``: a heartbeat's own deadline (the worker's: half its
        session expiry), so that a hung gateway cannot hold it past the session."""
        self.client = client
        self.heartbeat_timeout = heartbeat_timeout
        self._session: str | None = None  # the last session opened: next_due asks under it
        self._pipes: list[HttpPipe] = []

    def open(self, hello: Hello) -> Session:
        data = self.client.call("POST", "/v1/sessions", json=wire.hello_out(hello))
        session = wire.session_in(data)
        self._session = session.id
        return session

    def heartbeat(self, beat: Beat, *, via: Any = None) -> Heartbeat:
        path = f"/v1/sessions/{beat.session_id}/heartbeat"
        # asks for the session's queues and partitions (a gateway older than that ignores
        # the parameters)
        answer = self.client.call(
            "POST",
            path,
            json=wire.beat_out(beat),
            params={"queues": "1", "partitions": "1"},
            timeout=self.heartbeat_timeout,
        )
        return wire.heartbeat_in(answer)

    def exchange(
        self, session_id: str, outcomes: Sequence[Outcome], claim: ClaimRequest | None
    ) -> Reply:
        # the worker says how long the gateway may hold it (ClaimRequest.wait); results
        # sent with it are written at once, before any wait
        wait = claim.wait if claim is not None and claim.limit else 0.0
        data = self.client.call(
            "POST",
            f"/v1/sessions/{session_id}/exchange",
            json=wire_exchange.exchange_out(outcomes, claim),
            wait=wait,
        )
        return wire_exchange.reply_in(data, session_id)

    def append(self, claim: Claim, events: Sequence[tuple[str, Any]]) -> None:
        self.client.call(
            "POST",
            f"/v1/sessions/{claim.session_id}/events",
            json={
                "claim": wire.claim_out(claim),
                "events": [{"kind": kind, "data": data} for kind, data in events],
            },
        )

    def pause_limit(self, claim: Claim, key: str, seconds: float) -> datetime:
        data = self.client.call(
            "POST",
            f"/v1/sessions/{claim.session_id}/pause-limit",
            json={"claim": wire.claim_out(claim), "key": key, "seconds": seconds},
        )
        return wire.time_in(data["until"], "a pause's end")

    def parent_results(self, claim: Claim) -> tuple[ParentResult, ...]:
        data = self.client.call(
            "POST",
            f"/v1/sessions/{claim.session_id}/parent-results",
            json={"claim": wire.claim_out(claim)},
        )
        return wire.parents_in(data)

    def change_queues(
        self, session_id: str, *, add: Sequence[str] = (), remove: Sequence[str] = ()
    ) -> tuple[str, ...]:
        data = self.client.call(
            "POST",
            f"/v1/sessions/{session_id}/queues",
            json={"add": list(add), "remove": list(remove)},
        )
        return wire.Fields(data, "a session's queues").strings("queues")

    def watch(self, session_id: str, queues: Sequence[str], wait: float) -> bool:
        data = self.client.call(
            "POST",
            f"/v1/sessions/{session_id}/watch",
            json={"queues": list(queues), "wait": wait},
            wait=wait,
        )
        return bool(data["work"])

    def next_due(self, request: ClaimRequest) -> float | None:
        if self._session is None:
            return None
        path = f"/v1/sessions/{self._session}/next-due"
        seconds = self.client.call("POST", path, json=wire.request_out(request))["seconds"]
        return None if seconds is None else float(seconds)

    def close(
        self, session_id: str, *, started: Sequence[Claim] = (), lost: bool = False
    ) -> list[int]:
        # worth trying as long as a heartbeat is: past that, the session expires anyway
        data = self.client.call(
            "POST",
            f"/v1/sessions/{session_id}/close",
            json={"started": [wire.claim_out(c) for c in started], "lost": lost},
            timeout=self.heartbeat_timeout,
        )
        return [int(i) for i in data["released"]]

    def cut(self, reason: str, *, final: bool = False) -> int:
        """Give up the calls in flight: the turns on the pipes now, the others before
        their next try (a gateway that is down would hold them until their deadline);
        never tried again, ``final`` or not."""
        return sum(pipe.cut(reason) for pipe in self._pipes) + self.client.cut(reason)

    def pipe(self) -> HttpPipe:
        """Turns sent ahead, each on a connection of its own (a worker asks for one where
        its depth is over 1)."""
        pipe = HttpPipe(self.client)
        self._pipes.append(pipe)
        return pipe

    def close_client(self) -> None:
        """Close the connections to the gateways, the pipes' too (after the worker closed
        its session)."""
        for pipe in self._pipes:
            pipe.release()
        self.client.close()
