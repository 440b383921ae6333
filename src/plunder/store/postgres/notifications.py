"""The listening connection each process keeps for wake-ups (and its owner's heartbeats),
beside the pool (the connection class and per-call deadlines they share: connections).

A NOTIFY costs more than its message: PostgreSQL serializes the commits of notifying
transactions (a notifying commit holds a database-wide lock until its WAL is flushed), so
every worker's turn that named its completed jobs waited for the others' flushes. plunder
therefore notifies only on channels someone listens on. Each listening connection names
itself and its channels in ``plunder_listeners`` before it LISTENs, refreshes that row while
it lives (it expires ``LISTENER_TTL`` seconds after the last refresh, by the database
clock, so a listener that died unannounced stops counting), and removes it when it stops;
the statements that notify check for a live row on their channel first.
"""

from __future__ import annotations

import logging
import secrets
import select
import socket
import time
from collections.abc import Collection, Iterator, Mapping
from contextlib import contextmanager, suppress
from typing import Any

import psycopg

from plunder import errors
from plunder.store.deadlines import Deadlines
from plunder.store.postgres.connections import PgConnection, call_deadline, first_line, socket_of

log = logging.getLogger("plunder.store")
CHANNELS = ("plunder_enqueued", "plunder_done", "plunder_stream")  # fixed names, never input
PROBE_CHANNEL = "plunder_probe"
# A listening connection's row in plunder_listeners lives this long after its last refresh
# (seconds, by the database clock), and is refreshed this often by its waits (the hub
# waits at most half a second at a time).
LISTENER_TTL = 60.0
LISTENER_REFRESH = 15.0


class PgNotifications:
    """One dedicated connection: LISTENs on the channels its owner asks for, and lends
    itself to the owner's light periodic calls (heartbeats) between waits.

    Notifications are lost while the connection is down, so after every reconnect it
    LISTENs first and then reports ``("*", "")``: "re-check everything once". A channel
    listened on anew reports ``(channel, "*")``: whatever it said before is lost, so
    everyone watching it re-checks once.

    The channels are the owner's to choose because every notification costs each listener:
    each worker's turn names the jobs it completed on ``plunder_done``, and a process that
    listened there whether or not it waited for a result would receive (and its server
    backend would send) the turns of every worker of the cluster.

    Before LISTENing it checks that notifications reach this connection at all: a probe
    NOTIFY is sent from a second, short-lived connection, and the waits that follow look
    for it (a wait never lasts longer than asked, so the owner's heartbeats are not held
    up). Behind a transaction pooler (pgbouncer) it never comes back: between
    transactions this client holds no server connection, and a LISTEN would stay behind
    on a server connection that the pooler lends to other clients, who would then receive
    our notifications (psycopg keeps them, unread, for as long as the connection lives).
    A probe sent from this same connection would come back whenever the pooler happened
    to reuse that server connection. When the probe does not come back within
    ``PROBE_TIMEOUT`` (or the database refuses LISTEN, as CockroachDB does), it stops
    listening and says so; polling carries on alone.
    """

    PROBE_TIMEOUT = 1.0

    def __init__(
        self,
        conninfo: str,
        kwargs: dict[str, Any],
        *,
        listen: bool,
        deadlines: Deadlines,
        url: str,
        queries: Mapping[str, str],
        per_transaction: dict[str, int] | None = None,
    ) -> None:
        self._conninfo = conninfo
        self._queries = queries
        self._kwargs = kwargs
        self.listen = listen
        self._per_transaction = per_transaction
        self._conn: PgConnection | None = None
        self._fresh = False
        self._deadlines = deadlines
        self._url = url
        self._down_since: float | None = None  # when reconnecting began to fail
        self._probe: tuple[str, float] | None = None  # token, deadline (monotonic)
        self._listening: frozenset[str] = frozenset()  # LISTENed on this connection
        # its row in plunder_listeners, and when (monotonic) that row is refreshed next
        name = self._kwargs.get("application_name", "plunder")
        self.listener_id = f"{name}:{secrets.token_hex(6)}"
        self._refresh_at = 0.0
        # interrupt() ends a wait from another thread: one byte on a socket it watches
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self._closed = False

    @contextmanager
    def connection_for(self, timeout: float | None) -> Iterator[psycopg.Connection[Any]]:
        """The connection, for one call that must end within ``timeout`` seconds: past
        that it is cut (the call raises StoreBusy) and the next use reconnects."""
        conn = self.connection
        with call_deadline(self._deadlines, conn, timeout, self._url):
            yield conn

    @property
    def connection(self) -> psycopg.Connection[Any]:
        """The connection, reconnected (and re-LISTENed) if it was lost."""
        if self._closed:
            raise errors.StoreBusy("the listening connection was closed")
        if self._conn is None or self._conn.closed or self._conn.broken:
            self._connect()
        assert self._conn is not None
        return self._conn

    def _connect(self) -> None:
        self._disconnect()
        try:
            conn = PgConnection.connect(self._conninfo, **self._kwargs)
        except psycopg.Error as exc:
            reason = first_line(exc)
            # tried again at every wait and every heartbeat, so said once per outage: a
            # database that is down for a minute must not fill the log
            if self._down_since is None:
                self._down_since = time.monotonic()
                log.warning(
                    "cannot open the listening connection (%s); trying again until it works",
                    reason,
                )
            raise errors.StoreBusy(f"cannot open the listening connection: {reason}") from exc
        if self._down_since is not None:
            log.info(
                "listening connection open again after %.1fs",
                time.monotonic() - self._down_since,
            )
            self._down_since = None
        conn.per_transaction = self._per_transaction
        self._conn = conn
        if not self.listen:
            self._fresh = True
            return
        try:  # a peer that hangs right after connecting must not hang us here
            with call_deadline(self._deadlines, conn, self._kwargs["connect_timeout"], self._url):
                conn.execute(f"LISTEN {PROBE_CHANNEL}")
        except psycopg.Error as exc:
            if conn.broken:
                self._disconnect()
                raise errors.StoreBusy(f"lost the listening connection: {exc}") from exc
            self._stop_listening()  # the database refuses LISTEN itself
            return
        except errors.StoreBusy:
            self._disconnect()
            raise
        self._send_probe()

    def _send_probe(self) -> None:
        """NOTIFY the probe from a second connection; the waits look for it (see the class
        docstring)."""
        token = secrets.token_hex(8)
        try:
            # a name of its own: it lives for a moment, beside the connection it probes
            name = f"{self._kwargs.get('application_name', 'plunder')}:probe"[:63]
            with psycopg.connect(
                self._conninfo, **{**self._kwargs, "application_name": name}
            ) as other:
                other.execute("SELECT pg_notify(%s, %s)", (PROBE_CHANNEL, token))
        except psycopg.Error as exc:  # tried again on the next reconnect
            self._disconnect()
            raise errors.StoreBusy(f"cannot probe LISTEN/NOTIFY: {exc}") from exc
        self._probe = (token, time.monotonic() + self.PROBE_TIMEOUT)

    def _await_probe(
        self, conn: psycopg.Connection[Any], timeout: float, channels: frozenset[str]
    ) -> None:
        """Wait up to ``timeout`` for the probe (an interrupt ends the wait, and the next
        one waits on): once it came back, LISTEN on ``channels``; once its time is up, poll
        only."""
        assert self._probe is not None
        token, deadline = self._probe
        self._sleep(min(timeout, deadline - time.monotonic()), conn)
        if any(n.channel == PROBE_CHANNEL and n.payload == token for n in self._notified(conn)):
            self._probe = None
            conn.execute(f"UNLISTEN {PROBE_CHANNEL}")
            self._relisten(conn, channels)
            self._fresh = True
        elif time.monotonic() >= deadline:
            self._probe = None
            conn.execute(f"UNLISTEN {PROBE_CHANNEL}")
            self._stop_listening()

    def _stop_listening(self) -> None:
        log.warning(
            "LISTEN/NOTIFY does not come back on this connection (a transaction-mode "
            "pooler?); falling back to polling only"
        )
        self.listen = False
        self._fresh = True

    def wait(
        self, timeout: float, channels: Collection[str] | None = None
    ) -> list[tuple[str, str]]:
        """Wait up to ``timeout`` seconds (less if interrupted), LISTENing on ``channels``
        (None: all of plunder's); return the notifications that arrived."""
        wanted = frozenset(CHANNELS if channels is None else channels)
        if not wanted <= set(CHANNELS):
            raise ValueError(f"not plunder's channels: {sorted(wanted - set(CHANNELS))}")
        if self._closed:  # an owner's thread that outlived close(): no new connection
            return []
        try:
            return self._wait(timeout, wanted)
        except psycopg.Error as exc:
            log.warning("listening connection lost (%s); reconnecting", str(exc).strip())
            self._disconnect()
            self._sleep(min(timeout, 0.5))
            return []
        except errors.StoreBusy as exc:  # _connect said so, once per outage
            log.debug("%s", exc)
            self._sleep(min(timeout, 0.5))
            return []

    def _wait(self, timeout: float, wanted: frozenset[str]) -> list[tuple[str, str]]:
        conn = self.connection
        if self._probe is not None:
            self._await_probe(conn, timeout, wanted)
        if self._fresh:
            self._fresh = False
            return [("*", "")]
        if self._probe is not None:
            return []
        if not self.listen:
            self._sleep(timeout)
            return []
        added = self._relisten(conn, wanted)
        if added:
            return [(channel, "*") for channel in added]
        got = self._arrived(conn)  # including any that came during a periodic call
        if not got and timeout > 0 and self._sleep(timeout, conn):
            got = self._arrived(conn)
        return got

    def interrupt(self) -> None:
        """End the wait in progress, or the next one, now (from any thread)."""
        if self._closed:
            return
        # BlockingIOError: a full socket holds wake-ups enough, the next wait ends at once;
        # OSError: closed meanwhile, and nothing waits any more
        with suppress(OSError):
            self._wake_w.send(b"\0")

    def _relisten(self, conn: psycopg.Connection[Any], wanted: frozenset[str]) -> list[str]:
        """LISTEN on what is wanted and UNLISTEN the rest, naming the channels in
        plunder_listeners first (a statement that notifies and sees the row finds the LISTEN
        in place when it commits), and refresh that row when it is due; return the channels
        added. A statement that began before the row was written and commits after the
        re-check its "*" asks for tells nobody: that one completion is found by polling."""
        gone, added = sorted(self._listening - wanted), sorted(wanted - self._listening)
        timeout = self._kwargs["connect_timeout"]
        if gone or added:
            with call_deadline(self._deadlines, conn, timeout, self._url):
                if added:
                    self._register(conn, wanted)
                for channel in gone:
                    conn.execute(f"UNLISTEN {channel}")
                for channel in added:
                    conn.execute(f"LISTEN {channel}")
                if not added:
                    self._register(conn, wanted)
            self._listening = wanted
        elif self._listening and time.monotonic() >= self._refresh_at:
            with call_deadline(self._deadlines, conn, timeout, self._url):
                self._register(conn, self._listening)
        return added

    def _register(self, conn: psycopg.Connection[Any], channels: frozenset[str]) -> None:
        """Name this connection's channels in plunder_listeners for LISTENER_TTL seconds
        (no channels: remove its row)."""
        if channels:
            params = {"id": self.listener_id, "channels": sorted(channels), "ttl": LISTENER_TTL}
            conn.execute(self._queries["listener_set"], params)
        else:
            conn.execute(self._queries["listener_drop"], {"id": self.listener_id})
        self._refresh_at = time.monotonic() + LISTENER_REFRESH

    def _unregister(self) -> None:
        """Remove this connection's row on the way out. A failure only leaves the row to
        expire (LISTENER_TTL): notifications go on meanwhile, to nobody."""
        conn = self._conn
        if not self._listening or conn is None or conn.closed or conn.broken:
            return
        try:
            with call_deadline(self._deadlines, conn, self._kwargs["connect_timeout"], self._url):
                self._register(conn, frozenset())
        except (psycopg.Error, errors.StoreBusy) as exc:
            log.info("could not remove listener %s (%s); it expires", self.listener_id, exc)

    def _arrived(self, conn: psycopg.Connection[Any]) -> list[tuple[str, str]]:
        return [(n.channel, n.payload) for n in self._notified(conn)]

    @staticmethod
    def _notified(conn: psycopg.Connection[Any]) -> list[psycopg.Notify]:
        """The notifications that have arrived, without waiting for more."""
        return list(conn.notifies(timeout=0.0))

    def _sleep(self, timeout: float, conn: psycopg.Connection[Any] | None = None) -> bool:
        """Until ``timeout`` passes, an interrupt() or (with ``conn``) something to read on
        the connection; True in that last case."""
        poller = select.poll()  # not select: descriptors past its limit (see connections.spoken_to)
        wake = self._wake_r.fileno()
        poller.register(wake, select.POLLIN)
        fd = None if conn is None else socket_of(conn)
        if fd is not None:
            poller.register(fd, select.POLLIN)
        ready = {ready_fd for ready_fd, _ in poller.poll(max(0.0, timeout) * 1000)}
        if wake in ready:
            with suppress(BlockingIOError):  # until none is left
                while self._wake_r.recv(4096):
                    pass
        return fd in ready

    def _disconnect(self) -> None:
        conn, self._conn = self._conn, None
        self._probe = None
        self._listening = frozenset()
        if conn is not None:
            conn.close()

    def close(self) -> None:
        self._closed = True
        self._unregister()
        self._disconnect()
        self._wake_r.close()
        self._wake_w.close()
