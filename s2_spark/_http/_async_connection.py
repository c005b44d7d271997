"""One HTTP/1.1 connection on asyncio, one request at a time, kept open between them:
what the tail watch long-polls each stream on, and what a fan-out sends many small
requests over (`Fanout`).

A watch keeps one long-poll waiting per stream, thousands at once, each answered after
seconds; a fan-out sends thousands of small requests to one service. httpcore's async
pools (under httpx's `AsyncClient`) cost 0.75 ms of CPU per such request (anyio cancel
scopes, pool scans, locks), which at 10,000 streams kept a core busy, and threads on its
sync pools pay in GIL handoffs (0.5-0.6 ms a request with 16-32 of them). Neither needs
that machinery: a connection owned by one task, one request at a time. So an
`AsyncConnection` is asyncio streams and h11 (the HTTP/1.1 engine httpx speaks through),
0.15 ms a request, with what the rest of the seam keeps:

* the route from the environment (`route_for`): an `http://` origin through a proxy gets
  absolute-form requests, an `https://` one a CONNECT tunnel (with the proxy's
  credentials from its URL), then TLS to the origin;
* TLS with the watch's context (private CAs, client certificates);
* httpx's exception types, so the watch tells failures apart as before.
"""

from __future__ import annotations

import asyncio
import base64
import ssl
from collections.abc import Callable
from dataclasses import dataclass
from urllib.parse import unquote, urlsplit

import h11
import httpx

from ._response import Response
from ._routes import route_for

__all__ = ["AsyncConnection", "AsyncTimeouts"]

Headers = list[tuple[bytes, bytes]]
_CHUNK = 65536
#: What `get(head_only=True)` reads of a body at most.
HEAD_BYTES = 1024


@dataclass(frozen=True, slots=True)
class AsyncTimeouts:
    """Seconds to connect (TCP, proxy tunnel and TLS) and to wait for each read."""

    connect: float
    read: float


class AsyncConnection:
    """Requests to one origin, one at a time, over one connection opened on first use and
    opened again after a failure or a server's close. Loop thread only."""

    def __init__(self, base_url: str, ssl_context: Callable[[], ssl.SSLContext]) -> None:
        parts = urlsplit(base_url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"not an http:// or https:// URL: {base_url!r}")
        self._tls = parts.scheme == "https"
        self._host = parts.hostname
        self._port = parts.port or (443 if self._tls else 80)
        default = self._port == (443 if self._tls else 80)
        shown = f"[{self._host}]" if ":" in self._host else self._host
        self._authority = f"{shown}:{self._port}"
        self._host_header = (shown if default else self._authority).encode()
        self._origin = f"{parts.scheme}://{self._host_header.decode()}"
        self._prefix = parts.path.rstrip("/")
        self._proxy = route_for(parts.scheme, self._host, self._port).proxy
        self._ssl_context = ssl_context
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None
        self._h11: h11.Connection | None = None

    @property
    def connected(self) -> bool:
        return self._h11 is not None

    async def connect(self, timeouts: AsyncTimeouts) -> None:
        """Open the connection (and the proxy's tunnel, and TLS) unless it is open."""
        if self._h11 is not None:
            return
        try:
            async with asyncio.timeout(timeouts.connect):
                await self._connect()
        except TimeoutError as exc:
            self.close()
            raise httpx.ConnectTimeout("connecting took too long") from exc
        except BaseException:
            self.close()
            raise

    async def request(self, method: bytes, target: str, headers: Headers,
                      timeouts: AsyncTimeouts, *, content: bytes | None = None,
                      head_only: bool = False) -> Response:
        """Send a request for `target` (under the base URL's path), connecting first if
        need be. `head_only`: the body's first `HEAD_BYTES` are enough (the connection is
        dropped if more follow)."""
        await self.connect(timeouts)
        head = [(b"host", self._host_header), *headers]
        if content is not None:
            head.append((b"content-length", b"%d" % len(content)))
        try:
            return await self._exchange(h11.Request(method=method, target=self._target(target),
                                                    headers=head),
                                        content, timeouts.read, head_only)
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
        self._reader = self._writer = self._h11 = None

    def _target(self, target: str) -> bytes:
        path = self._prefix + target
        if self._proxy is not None and not self._tls:
            return (self._origin + path).encode()  # absolute form, for the proxy
        return path.encode()

    async def _connect(self) -> None:
        try:
            if self._proxy is None:
                self._reader, self._writer = await asyncio.open_connection(
                    self._host, self._port, ssl=self._ssl_context() if self._tls else None,
                    server_hostname=self._host if self._tls else None)
            else:
                await self._connect_via_proxy(self._proxy)
        except (OSError, ssl.SSLError) as exc:
            raise httpx.ConnectError(f"{type(exc).__name__}: {exc}") from exc
        self._h11 = h11.Connection(h11.CLIENT)

    async def _connect_via_proxy(self, proxy_url: str) -> None:
        proxy = urlsplit(proxy_url)
        tls_to_proxy = proxy.scheme == "https"
        self._reader, self._writer = await asyncio.open_connection(
            proxy.hostname, proxy.port or (443 if tls_to_proxy else 80),
            ssl=self._ssl_context() if tls_to_proxy else None,
            server_hostname=proxy.hostname if tls_to_proxy else None)
        if not self._tls:
            return  # absolute-form requests, forwarded by the proxy
        authority = self._authority.encode()
        head = [(b"host", authority)]
        if proxy.username is not None:
            raw = f"{unquote(proxy.username)}:{unquote(proxy.password or '')}".encode()
            head.append((b"proxy-authorization", b"Basic " + base64.b64encode(raw)))
        tunnel = h11.Connection(h11.CLIENT)
        self._writer.write(tunnel.send(h11.Request(method=b"CONNECT", target=authority,
                                                   headers=head)))
        answer = await _next_response(tunnel, self._reader)
        if answer.status_code != 200:
            raise OSError(f"the proxy refused the tunnel (HTTP {answer.status_code})")
        await self._writer.start_tls(self._ssl_context(), server_hostname=self._host)

    async def _exchange(self, request: h11.Request, content: bytes | None,
                        read_timeout: float, head_only: bool) -> Response:
        conn, reader, writer = self._h11, self._reader, self._writer
        assert conn is not None and reader is not None and writer is not None
        try:
            sent = conn.send(request)
            if content:
                sent += conn.send(h11.Data(data=content))
            writer.write(sent + conn.send(h11.EndOfMessage()))
            async with asyncio.timeout(read_timeout):
                head = await _next_response(conn, reader)
                body = await _body(conn, reader, head_only)
        except TimeoutError as exc:
            raise httpx.ReadTimeout("no answer in time") from exc
        except (OSError, ssl.SSLError) as exc:
            raise httpx.ReadError(f"{type(exc).__name__}: {exc}") from exc
        except h11.ProtocolError as exc:
            raise httpx.RemoteProtocolError(str(exc)) from exc
        if conn.our_state is h11.DONE and conn.their_state is h11.DONE:
            conn.start_next_cycle()
        else:
            self.close()  # closed by the server, or a body left unread
        return Response(head.status_code, list(head.headers), content=body)


async def _receive(conn: h11.Connection, reader: asyncio.StreamReader) -> object:
    """The next h11 event, reading from the connection as needed."""
    while True:
        event = conn.next_event()
        if event is not h11.NEED_DATA:
            return event
        data = await reader.read(_CHUNK)
        if not data and conn.their_state is h11.SEND_RESPONSE:
            raise httpx.RemoteProtocolError("the server closed the connection mid-answer")
        conn.receive_data(data)


async def _next_response(conn: h11.Connection, reader: asyncio.StreamReader) -> h11.Response:
    """The response's head (informational answers skipped)."""
    while True:
        event = await _receive(conn, reader)
        if isinstance(event, h11.Response):
            return event
        if isinstance(event, h11.ConnectionClosed):
            raise httpx.RemoteProtocolError("the server closed the connection")


async def _body(conn: h11.Connection, reader: asyncio.StreamReader, head_only: bool) -> bytes:
    """The body (its first `HEAD_BYTES` at least, with `head_only`)."""
    parts: list[bytes] = []
    size = 0
    while True:
        event = await _receive(conn, reader)
        if isinstance(event, h11.Data):
            parts.append(bytes(event.data))
            size += len(parts[-1])
            if head_only and size >= HEAD_BYTES:
                return b"".join(parts)
        elif isinstance(event, h11.EndOfMessage | h11.ConnectionClosed):
            return b"".join(parts)
