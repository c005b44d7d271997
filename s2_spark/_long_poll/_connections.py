"""The connections a tail watch's long-polls go over: per origin, HTTP/2 shared by every
stream where the origin speaks it (`Http2Origin`: a few connections for any number of
streams), else one HTTP/1.1 connection per stream (`AsyncConnection`), as many as the
process may open files for (`watch_limit`)."""

from __future__ import annotations

import asyncio
import ssl
from dataclasses import dataclass, field

from s2_spark._http import AsyncConnection, AsyncTimeouts, Response
from s2_spark._http._h2_origin import Http2Origin, NotHttp2, alpn_context
from s2_spark._tls import TlsConfig, ssl_context_for

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

    def __init__(self, settings: ClientSettings) -> None:
        self._settings = settings
        self._origins: dict[str, Http2Origin] = {}  # base URL -> its HTTP/2 connections
        self._h1: dict[str, AsyncConnection] = {}  # stream -> its own HTTP/1.1 connection
        self._connects = asyncio.Semaphore(CONNECTS_AT_ONCE)
        self._ssl: dict[bool, ssl.SSLContext] = {}  # ALPN offering h2? -> the context

    async def get(self, stream: str, base_url: str, target: str, *,
                  head_only: bool = False) -> Response:
        """GET `base_url` + `target` for `stream`, with the settings' headers and timeouts
        (see `AsyncConnection.request`): over HTTP/2 unless the origin does not speak it."""
        settings = self._settings
        origin = self._origin(base_url)
        if origin.speaks_h2 is not False:
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
