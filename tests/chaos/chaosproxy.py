"""A userspace TCP proxy whose behaviour a test switches at run time, for faults the kernel
of this machine cannot make (it has no ``netem``): latency, a hung peer, resets.

```
 client ──▶ 127.0.0.1:<port> ──▶ ChaosProxy (asyncio, a thread of its own) ──▶ target
 modes:  pass       forward both ways
         delay:MS   deliver every chunk MS milliseconds after it was read (order kept)
         blackhole  read and drop everything; the kernel still ACKs, so the client sees a
                    hung peer, not a dead one: keepalives and tcp_user_timeout never fire
         reset      abort every connection with a RST, and every new one at once
```

A connection that lost bytes to a blackhole stays a hung peer for good: its protocol
stream is broken (a request or an answer is missing), and nothing in the network repairs
that. Healing (back to ``pass``) serves new connections, and those that lost nothing.

Used in-process (``with ChaosProxy(host, port) as proxy: proxy.mode = "blackhole"``) or
from the command line: ``python -m tests.chaos.chaosproxy TARGET_HOST TARGET_PORT
[LISTEN_PORT]`` reads one mode per line on stdin.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
import sys
import threading
import time
from collections.abc import Awaitable
from dataclasses import dataclass, field
from typing import TypeVar

T = TypeVar("T")
CHUNK = 65536
MODES = ("pass", "blackhole", "reset")


def parse_mode(mode: str) -> tuple[str, float]:
    """``"delay:300"`` → ``("delay", 0.3)``; the other modes carry no value."""
    name, _, value = mode.partition(":")
    if name == "delay":
        try:
            ms = float(value)
        except ValueError:
            raise ValueError(f"delay needs milliseconds, e.g. delay:300, not {mode!r}") from None
        if ms < 0:
            raise ValueError("delay must not be negative")
        return name, ms / 1000
    if name not in MODES or value:
        raise ValueError(f"unknown proxy mode {mode!r}: use pass, delay:MS, blackhole or reset")
    return name, 0.0


@dataclass
class Stats:
    connections: int = 0  # accepted
    forwarded: int = 0  # bytes delivered, both ways
    dropped: int = 0  # bytes swallowed by a blackhole
    resets: int = 0  # connections aborted with a RST
    poisoned: int = 0  # connections that lost bytes (hung for good)
    mode_changes: list[tuple[float, str]] = field(default_factory=list)  # monotonic, mode


class _Link:
    """One client connection and its upstream."""

    def __init__(self, client: asyncio.StreamWriter) -> None:
        self.client = client
        self.upstream: asyncio.StreamWriter | None = None
        self.poisoned = False
        self.tasks: list[asyncio.Task[None]] = []

    def writers(self) -> list[asyncio.StreamWriter]:
        return [w for w in (self.client, self.upstream) if w is not None]


def _abort_with_reset(writer: asyncio.StreamWriter) -> None:
    """Close at once with a RST (linger 0), not a FIN: the peer's next read fails."""
    sock = writer.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()


class ChaosProxy:
    def __init__(
        self, target_host: str, target_port: int, *, host: str = "127.0.0.1", port: int = 0
    ) -> None:
        self.target = (target_host, target_port)
        self.host = host
        self.port = port
        self.stats = Stats()
        self._mode = ("pass", 0.0)
        self._links: set[_Link] = set()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._server: asyncio.Server | None = None
        self._thread: threading.Thread | None = None

    # -- control, from any thread ---------------------------------------------------------
    @property
    def mode(self) -> str:
        name, value = self._mode
        return f"delay:{value * 1000:g}" if name == "delay" else name

    @mode.setter
    def mode(self, mode: str) -> None:
        parsed = parse_mode(mode)
        self._call(self._switch(parsed))

    def url_for(self, url: str) -> str:
        """``url`` (postgresql://user@host:port/db) with host and port replaced by ours."""
        scheme, rest = url.split("://", 1)
        user, _, location = rest.rpartition("@")
        _, _, path = location.partition("/")
        prefix = f"{user}@" if user else ""
        return f"{scheme}://{prefix}{self.host}:{self.port}/{path}"

    def start(self) -> ChaosProxy:
        ready = threading.Event()

        def run() -> None:
            loop = asyncio.new_event_loop()
            self._loop = loop
            asyncio.set_event_loop(loop)
            self._server = loop.run_until_complete(
                asyncio.start_server(self._accept, self.host, self.port)
            )
            self.port = self._server.sockets[0].getsockname()[1]
            ready.set()
            loop.run_forever()
            loop.close()

        self._thread = threading.Thread(target=run, name="chaosproxy", daemon=True)
        self._thread.start()
        if not ready.wait(10):
            raise RuntimeError("the chaos proxy did not start")
        self.stats.mode_changes.append((time.monotonic(), self.mode))
        return self

    def close(self) -> None:
        loop, thread = self._loop, self._thread
        if loop is None or thread is None:
            return
        with contextlib.suppress(RuntimeError):
            self._call(self._shutdown())
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=10)
        self._loop = self._thread = None

    def __enter__(self) -> ChaosProxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _call(self, coro: Awaitable[T]) -> T:
        if self._loop is None:
            raise RuntimeError("the chaos proxy is not running")
        future = asyncio.run_coroutine_threadsafe(coro, self._loop)  # type: ignore[arg-type]
        return future.result(timeout=10)

    # -- on the proxy's loop ----------------------------------------------------------------
    async def _switch(self, mode: tuple[str, float]) -> None:
        self._mode = mode
        self.stats.mode_changes.append((time.monotonic(), self.mode))
        if mode[0] == "reset":
            for link in list(self._links):
                self._reset(link)

    async def _shutdown(self) -> None:
        if self._server is not None:
            self._server.close()
        for link in list(self._links):
            for writer in link.writers():
                writer.transport.abort()
        current = asyncio.current_task()
        tasks = [t for t in asyncio.all_tasks() if t is not current]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    def _reset(self, link: _Link) -> None:
        for writer in link.writers():
            _abort_with_reset(writer)
        self.stats.resets += 1

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        # cancelled only by close(): end quietly (asyncio logs a handler that ends cancelled)
        with contextlib.suppress(asyncio.CancelledError):
            await self._serve(reader, writer)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.stats.connections += 1
        link = _Link(writer)
        self._links.add(link)
        try:
            if self._mode[0] == "reset":
                self._reset(link)
                return
            if self._mode[0] == "blackhole":  # a hung peer from the first byte
                self._poison(link)
                await self._swallow(reader)
                await self._healed()
                return
            try:
                up_reader, link.upstream = await asyncio.open_connection(*self.target)
            except OSError:
                self._reset(link)
                return
            link.tasks = [
                asyncio.ensure_future(self._pump(link, reader, link.upstream)),
                asyncio.ensure_future(self._pump(link, up_reader, writer)),
            ]
            # one side closed (the PostgreSQL protocol never half-closes): close both; a
            # close that a blackhole swallowed arrives once the network heals
            await asyncio.wait(link.tasks, return_when=asyncio.FIRST_COMPLETED)
            if link.poisoned:
                await self._healed()
        finally:
            self._links.discard(link)
            for task in link.tasks:
                task.cancel()
            for w in link.writers():
                w.close()

    def _poison(self, link: _Link) -> None:
        if not link.poisoned:
            link.poisoned = True
            self.stats.poisoned += 1

    async def _healed(self) -> None:
        while self._mode[0] == "blackhole":
            await asyncio.sleep(0.05)

    async def _swallow(self, reader: asyncio.StreamReader) -> None:
        with contextlib.suppress(ConnectionError, OSError):
            while chunk := await reader.read(CHUNK):
                self.stats.dropped += len(chunk)

    async def _pump(
        self, link: _Link, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        """Copy one direction until its end. Delayed chunks go through a queue to a sender,
        so a delay is latency, not lower throughput."""
        pending: asyncio.Queue[tuple[float, bytes] | None] = asyncio.Queue()
        sender = asyncio.ensure_future(self._send(pending, writer))
        try:
            while True:
                try:
                    chunk = await reader.read(CHUNK)
                except (ConnectionError, OSError):
                    return
                if not chunk:
                    return
                mode, delay = self._mode
                if link.poisoned or mode == "blackhole":
                    self._poison(link)
                    self.stats.dropped += len(chunk)
                    continue
                if mode == "reset":
                    self._reset(link)
                    return
                pending.put_nowait((time.monotonic() + delay, chunk))
        finally:
            pending.put_nowait(None)
            with contextlib.suppress(Exception):
                await sender

    async def _send(
        self, pending: asyncio.Queue[tuple[float, bytes] | None], writer: asyncio.StreamWriter
    ) -> None:
        while (item := await pending.get()) is not None:
            due, chunk = item
            wait = due - time.monotonic()
            if wait > 0:
                await asyncio.sleep(wait)
            if writer.is_closing():
                return
            writer.write(chunk)
            self.stats.forwarded += len(chunk)
            try:
                await writer.drain()
            except (ConnectionError, OSError):
                return


def main(argv: list[str]) -> None:
    host, port = argv[0], int(argv[1])
    listen = int(argv[2]) if len(argv) > 2 else 0
    with ChaosProxy(host, port, port=listen) as proxy:
        print(f"listening on {proxy.host}:{proxy.port}", flush=True)
        for line in sys.stdin:
            if line.strip():
                try:
                    proxy.mode = line.strip()
                except ValueError as exc:
                    print(exc, flush=True)
                    continue
                print(f"mode {proxy.mode}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
