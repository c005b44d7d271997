"""The connections a tail watch's long-polls go over: one HTTP/1.1 connection per stream
(`AsyncConnection`) for as many streams as the process may open files for
(`watch_limit`), and past that, where the origin speaks it, HTTP/2 shared by the rest
(`Http2Origin`: a few connections for any number of streams).

Why HTTP/1.1 first: a long-poll over HTTP/2 costs more CPU on both sides, h2's framing
and header coding being Python (measured with `benchmarks/watch_polls.py` against the
local server: 0.42 ms of client CPU where HTTP/1.1 takes 0.17 ms, and 2.5 ms of the
server's where it takes 0.9 ms, so 25,000 streams over HTTP/2 alone saturate its core);
a connection each is what stops at the open-files limit, and HTTP/2 is there for the
streams past it."""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Awaitable
from dataclasses import dataclass, field

from s2_spark._http import AsyncConnection, AsyncTimeouts, Response
from s2_spark._http._h2_origin import Http2Origin, NotHttp2, alpn_context
from s2_spark._tls import TlsConfig, ssl_context_for

from ._limits import watch_limit

__all__ = ["CONNECTS_AT_ONCE", "ClientSettings", "PollConnections"]

#: HTTP/1.1 connections a watch opens at the same time (a new watch of 10,000 streams
#: would otherwise flood the service's accept queue and time out).
CONNECTS_AT_ONCE = 128


@dataclass(frozen=True)
class ClientSettings:
    """How the watch's connections reach the service, taken from the protocol client's
    own settings so both talk to it alike: timeouts (the read timeout must exceed the
    longest long-poll wait), the headers every poll carries (credentials: kept out of
    repr) and TLS."""

    timeout: AsyncTimeouts
    headers: list[tuple[bytes, bytes]] = field(default_factory=list, repr=False)
    tls: TlsConfig | None = None


class PollConnections:
    """GETs on behalf of watched streams. Loop thread only."""

    def __init__(self, settings: ClientSettings, own_connections: int | None = None) -> None:
        """`own_connections`: streams polled on an HTTP/1.1 connection of their own
        before HTTP/2 carries the rest (None: `watch_limit()`)."""
        self._settings = settings
        self._own = watch_limit() if own_connections is None else own_connections
        self._origins: dict[str, Http2Origin] = {}  # base URL -> its HTTP/2 connections
        self._h1: dict[str, AsyncConnection] = {}  # stream -> its own HTTP/1.1 connection
        self._connects = asyncio.Semaphore(CONNECTS_AT_ONCE)
        self._ssl: dict[bool, ssl.SSLContext] = {}  # ALPN offering h2? -> the context

    def get(self, stream: str, base_url: str, target: str, *,
            head_only: bool = False) -> Awaitable[Response]:
        """GET `base_url` + `target` for `stream`, with the settings' headers and timeouts
        (see `AsyncConnection.request`): on the stream's own HTTP/1.1 connection, or over
        HTTP/2 once `own_connections` streams have one (where the origin speaks it).
        Where the origin is known to speak HTTP/2 this is the origin's request itself, not
        a coroutine around it: a waiting poll holds every frame of its chain, per stream."""
        origin = self._origin(base_url)
        if (stream not in self._h1 and len(self._h1) >= self._own
                and origin.speaks_h2 is True):
            settings = self._settings
            return origin.request(b"GET", target, settings.headers, settings.timeout,
                                  head_only=head_only)
        return self._get(origin, stream, base_url, target, head_only)

    async def _get(self, origin: Http2Origin, stream: str, base_url: str, target: str,
                   head_only: bool) -> Response:
        settings = self._settings
        if (stream not in self._h1 and len(self._h1) >= self._own
                and origin.speaks_h2 is not False):
            try:
                return await origin.request(b"GET", target, settings.headers,
                                            settings.timeout, head_only=head_only)
            except NotHttp2:
                pass
        conn = self._h1.get(stream)
        if conn is None:
            conn = self._h1[stream] = AsyncConnection(base_url, self._h1_context)
        if not conn.connected:
            async with self._connects:
                await conn.connect(settings.timeout)
        return await conn.request(b"GET", target, settings.headers, settings.timeout,
                                  head_only=head_only)

    async def speaks_h2(self, base_url: str) -> bool:
        """Whether the origin of `base_url` speaks HTTP/2 (connecting to learn it)."""
        return await self._origin(base_url).probe(self._settings.timeout)

    def h2_connections(self) -> int:
        """HTTP/2 connections open now, over every origin."""
        return sum(origin.connections for origin in self._origins.values())

    def h1_connections(self) -> int:
        """HTTP/1.1 connections: one per stream polled that way (open now, or opened
        again by its next poll)."""
        return len(self._h1)

    def forget(self, stream: str) -> None:
        """`stream` is not watched any more: close its HTTP/1.1 connection, if it has one."""
        conn = self._h1.pop(stream, None)
        if conn is not None:
            conn.close()

    def close(self) -> None:
        for conn in self._h1.values():
            conn.close()
        for origin in self._origins.values():
            origin.close()

    def _origin(self, base_url: str) -> Http2Origin:
        origin = self._origins.get(base_url)
        if origin is None:
            origin = self._origins[base_url] = Http2Origin(base_url, self._h2_context)
        return origin

    def _h1_context(self) -> ssl.SSLContext:
        return self._context(alpn=False)

    def _h2_context(self) -> ssl.SSLContext:
        return self._context(alpn=True)

    def _context(self, *, alpn: bool) -> ssl.SSLContext:
        """One TLS context of each kind for every connection, made when one needs it."""
        ctx = self._ssl.get(alpn)
        if ctx is None:
            ctx = ssl_context_for(self._settings.tls)
            self._ssl[alpn] = ctx = alpn_context(ctx) if alpn else ctx
        return ctx
