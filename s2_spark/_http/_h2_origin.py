"""Requests to one origin over HTTP/2, on as few connections as the server allows: what a
tail watch's long-polls share, thousands to a connection.

A connection takes requests up to the server's SETTINGS_MAX_CONCURRENT_STREAMS; beyond
that `Http2Origin` opens another. The route is the HTTP/1.1 path's (`route_for`): straight
there, h2c with prior knowledge over `http://` and TLS with ALPN over `https://`; through
a proxy, a CONNECT tunnel then TLS and ALPN. An origin that does not speak HTTP/2 (its
answer to the preface is not HTTP/2, ALPN chose http/1.1, or only a forwarding proxy for
`http://` is there) raises `NotHttp2`, and is remembered for the process: the caller uses
HTTP/1.1 (`AsyncConnection`) for it from then on.
"""

from __future__ import annotations

import asyncio
import ssl
import threading
from collections.abc import Callable

import httpx

from ._async_connection import HEAD_BYTES, AsyncTimeouts, open_tunnel
from ._h2_connection import H2Connection, NotHttp2, Unprocessed
from ._response import Response
from ._routes import Endpoint

__all__ = ["Http2Origin", "NotHttp2", "alpn_context"]

Headers = list[tuple[bytes, bytes]]
#: Sends of a request the server did not process (GOAWAY, REFUSED_STREAM), each on a
#: connection opened after the last.
_SENDS = 3

#: origin and route -> whether it speaks HTTP/2 (absent: not known yet); any thread.
_SPEAKS: dict[str, bool] = {}
_SPEAKS_LOCK = threading.Lock()


def alpn_context(context: ssl.SSLContext) -> ssl.SSLContext:
    """`context` offering h2, then http/1.1, by ALPN (a context of its own: HTTP/1.1
    connections must not be offered h2)."""
    context.set_alpn_protocols(["h2", "http/1.1"])
    return context


class Http2Origin:
    """Requests to the origin of `base_url` (and its path prefix) over HTTP/2; `ssl_context`
    gives the TLS context with ALPN (`alpn_context`). Loop thread only."""

    def __init__(self, base_url: str, ssl_context: Callable[[], ssl.SSLContext]) -> None:
        end = Endpoint.of(base_url)
        self._tls, self._host, self._port = end.tls, end.host, end.port
        self._authority = end.authority
        self._authority_bytes = end.authority.encode()
        self._scheme = end.scheme.encode()
        self._prefix = end.prefix
        self._proxy = end.proxy
        self._key = f"{end.scheme}://{end.authority} via {end.proxy}"
        if self._proxy is not None and not self._tls:
            self._remember(False)  # a forwarding proxy: HTTP/1.1, absolute-form requests
        self._ssl_context = ssl_context
        self._conns: list[H2Connection] = []  # in the order they were opened
        self._opened = 0  # connections opened so far (`H2Connection.serial`)
        self._opening = asyncio.Lock()

    @property
    def speaks_h2(self) -> bool | None:
        """Whether the origin speaks HTTP/2 (None: not known yet)."""
        with _SPEAKS_LOCK:
            return _SPEAKS.get(self._key)

    @property
    def connections(self) -> int:
        """HTTP/2 connections open now."""
        return sum(1 for c in self._conns if c.usable)

    async def probe(self, timeouts: AsyncTimeouts) -> bool:
        """Whether the origin speaks HTTP/2, connecting to learn it if not known yet
        (httpx's errors when that fails)."""
        known = self.speaks_h2
        if known is None:
            try:
                await self._connection(timeouts)
            except NotHttp2:
                return False
            return True
        return known

    async def request(self, method: bytes, target: str, headers: Headers,
                      timeouts: AsyncTimeouts, *, head_only: bool = False) -> Response:
        """A request without a body for `target` (under the base URL's path). `NotHttp2`
        if the origin does not speak it; `Unprocessed` if the server did not process it in
        `_SENDS` sends; httpx's errors for the rest."""
        path = (self._prefix + target).encode()
        last = 0  # the serial of the last send's connection: the next goes on a newer one
        for send in range(1, _SENDS + 1):
            conn = await self._connection(timeouts, newer_than=last)
            try:
                return await conn.request(method, self._authority_bytes, self._scheme,
                                          path, headers, timeouts.read,
                                          HEAD_BYTES if head_only else None)
            except Unprocessed as exc:
                if send == _SENDS:
                    raise Unprocessed(f"the server did not process the request in {_SENDS} "
                                      f"sends, each on a newer connection: {exc}") from exc
                last = conn.serial
        raise AssertionError("unreachable")

    def close(self) -> None:
        conns, self._conns = self._conns, []
        for conn in conns:
            conn.close()

    async def _connection(self, timeouts: AsyncTimeouts, newer_than: int = 0
                          ) -> H2Connection:
        """A connection with room for one more request, opened after the one numbered
        `newer_than` (`H2Connection.serial`); opened if none has."""
        conn = self._with_room(newer_than)
        if conn is not None:
            return conn
        async with self._opening:
            conn = self._with_room(newer_than)
            if conn is None:
                if self.speaks_h2 is False:
                    raise NotHttp2(self._key)
                conn = await self._open(timeouts)
                self._opened += 1
                conn.serial = self._opened
                self._conns.append(conn)
            return conn

    def _with_room(self, newer_than: int) -> H2Connection | None:
        self._conns = [c for c in self._conns if c.usable or c.in_flight]
        for conn in self._conns:
            if (conn.serial > newer_than and conn.usable
                    and conn.in_flight < conn.max_streams):
                return conn
        return None

    async def _open(self, timeouts: AsyncTimeouts) -> H2Connection:
        conns: list[H2Connection] = []
        try:
            async with asyncio.timeout(timeouts.connect):
                await self._handshake(conns)
                await conns[0].ready
        except BaseException as exc:
            if conns:
                conns[0].close()
            if isinstance(exc, NotHttp2):
                self._remember(False)
            elif isinstance(exc, TimeoutError):
                raise httpx.ConnectTimeout("connecting took too long") from exc
            elif isinstance(exc, OSError | ssl.SSLError):
                raise httpx.ConnectError(f"{type(exc).__name__}: {exc}") from exc
            raise
        self._remember(True)
        return conns[0]

    async def _handshake(self, out: list[H2Connection]) -> None:
        """TCP (through the proxy's tunnel), TLS with ALPN, then the HTTP/2 preface; the
        connection goes in `out` as soon as there is one (to be closed on failure)."""
        loop = asyncio.get_running_loop()
        ctx = self._ssl_context() if self._tls else None
        if self._proxy is None:
            transport, conn = await loop.create_connection(
                H2Connection, self._host, self._port, ssl=ctx,
                server_hostname=self._host if self._tls else None)
            out.append(conn)
        else:
            assert ctx is not None, "only https:// origins are tunnelled"
            raw, _ = await open_tunnel(self._proxy, self._authority, self._ssl_context)
            conn = H2Connection()
            out.append(conn)
            conn.transport = raw
            tls = await loop.start_tls(raw, conn, ctx, server_hostname=self._host)
            assert isinstance(tls, asyncio.Transport)
            transport = tls
        assert isinstance(transport, asyncio.Transport)
        if self._tls:
            ssl_object = transport.get_extra_info("ssl_object")
            if ssl_object is None or ssl_object.selected_alpn_protocol() != "h2":
                transport.close()
                raise NotHttp2("ALPN chose another protocol")
        conn.start(transport)

    def _remember(self, speaks: bool) -> None:
        with _SPEAKS_LOCK:
            _SPEAKS[self._key] = speaks
