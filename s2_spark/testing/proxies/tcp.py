"""A TCP proxy that treats connections the way flaky networks do, for fault-injection tests.

Put it between a client and a server (the local S2 server, a Durable Streams server) and
point the client at `proxy.url`. It forwards bytes both ways and can:

* cut every connection after a random number of bytes (`cut_after=(lo, hi)`, counted in
  both directions, drawn per connection from a seeded generator), resetting both sides as
  a dying load balancer or a network partition would;
* reset connections the next time their client sends on them (`poison_open()`), which is
  what a client sees when a server, a proxy or a NAT dropped an idle pooled connection
  without telling it: the connection looks open until the next request fails;
* cut every live connection at once (`sever()`).

`connections`, `cuts` and `resets` count what happened, so a test can check that its
faults really occurred.
"""

from __future__ import annotations

import contextlib
import random
import socket
import struct
import threading
from urllib.parse import urlsplit

from s2_spark._closeable import Closeable

__all__ = ["TcpProxy"]

_LINGER_RESET = struct.pack("ii", 1, 0)  # close() sends RST instead of FIN


class _Link:
    """One proxied connection: the client side, the server side and its fault state."""

    __slots__ = ("budget", "down", "poisoned", "pumps", "up")

    def __init__(self, down: socket.socket, up: socket.socket, budget: int | None) -> None:
        self.down = down
        self.up = up
        self.budget = budget  # bytes left before the cut; None: never cut
        self.poisoned = False
        self.pumps = 2  # directions still forwarding

    def reset(self) -> None:
        """Close both sides abruptly (RST); wakes the pump threads blocked on them."""
        _reset(self.down)
        _reset(self.up)


def _reset(sock: socket.socket) -> None:
    """RST, not FIN: SHUT_RD wakes a thread blocked reading it without sending anything, and
    closing with a zero linger time resets the connection."""
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _LINGER_RESET)
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RD)
    sock.close()


class TcpProxy(Closeable):
    """Forwards `host:port` (`url`) to the server at `upstream` (a URL or "host:port"),
    from construction until `close()` (or the end of a `with` block)."""

    def __init__(
        self,
        upstream: str,
        *,
        cut_after: tuple[int, int] | None = None,
        seed: int = 0,
        host: str = "127.0.0.1",
        port: int = 0,
    ) -> None:
        parts = urlsplit(upstream if "://" in upstream else f"tcp://{upstream}")
        if parts.hostname is None or parts.port is None:
            raise ValueError(f"upstream must name a host and a port (got {upstream!r})")
        if cut_after is not None and not 1 <= cut_after[0] <= cut_after[1]:
            raise ValueError(f"cut_after must be (lo, hi) with 1 <= lo <= hi (got {cut_after})")
        self._upstream = (parts.hostname, parts.port)
        self._scheme = parts.scheme if parts.scheme in ("http", "https") else "http"
        self._cut_after = cut_after
        self._random = random.Random(seed)
        self._listener = socket.create_server((host, port))
        self.host = host
        self.port: int = self._listener.getsockname()[1]
        self._lock = threading.Lock()
        self._links: list[_Link] = []
        self._closed = False
        self.connections = 0
        self.cuts = 0
        self.resets = 0
        threading.Thread(target=self._accept, name="tcp-proxy", daemon=True).start()

    def __repr__(self) -> str:
        return f"TcpProxy({self.url!r} -> {self._upstream}, cut_after={self._cut_after})"

    @property
    def url(self) -> str:
        return f"{self._scheme}://{self.host}:{self.port}"

    def close(self) -> None:
        self._closed = True
        self._listener.close()
        self.sever()

    def sever(self) -> None:
        """Reset every live connection now."""
        with self._lock:
            links, self._links = self._links, []
        for link in links:
            link.reset()

    def poison_open(self) -> int:
        """Make every connection open now fail when its client next sends on it (RST,
        nothing forwarded); responses already on their way still arrive. Returns how many
        connections were poisoned."""
        with self._lock:
            for link in self._links:
                link.poisoned = True
            return len(self._links)

    def _accept(self) -> None:
        while not self._closed:
            try:
                down, _ = self._listener.accept()
            except OSError:
                return
            try:
                up = socket.create_connection(self._upstream, timeout=10)
                up.settimeout(None)
            except OSError:
                _reset(down)
                continue
            for s in (down, up):
                s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            with self._lock:
                budget = None
                if self._cut_after is not None:
                    budget = self._random.randint(*self._cut_after)
                link = _Link(down, up, budget)
                self._links.append(link)
                self.connections += 1
            for src, dst, from_client in ((down, up, True), (up, down, False)):
                threading.Thread(
                    target=self._pump, args=(link, src, dst, from_client), daemon=True
                ).start()

    def _pump(self, link: _Link, src: socket.socket, dst: socket.socket, from_client: bool) -> None:
        try:
            while True:
                data = src.recv(65536)
                if not data:
                    with contextlib.suppress(OSError):
                        dst.shutdown(socket.SHUT_WR)
                    return
                allowed = self._admit(link, len(data), from_client)
                if allowed:
                    dst.sendall(data[:allowed])
                if allowed < len(data):
                    link.reset()
                    return
        except OSError:
            link.reset()
        finally:
            with self._lock:
                link.pumps -= 1
                done = link.pumps == 0
                if done and link in self._links:
                    self._links.remove(link)
            if done:
                link.down.close()
                link.up.close()

    def _admit(self, link: _Link, size: int, from_client: bool) -> int:
        """How many of `size` bytes may pass before the connection is cut or reset."""
        with self._lock:
            if from_client and link.poisoned:
                self.resets += 1
                return 0
            if link.budget is None:
                return size
            allowed = min(size, link.budget)
            link.budget -= allowed
            if allowed < size:
                self.cuts += 1
            return allowed
