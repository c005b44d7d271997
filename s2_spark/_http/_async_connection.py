"""One HTTP/1.1 connection on asyncio, one request at a time, kept open between them:
what the tail watch long-polls each stream on, and what a fan-out sends many small
requests over (`Fanout`).

A watch keeps one long-poll waiting per stream, thousands at once, each answered after
seconds; a fan-out sends thousands of small requests to one service. httpcore's async
pools (under httpx's `AsyncClient`) cost 0.75 ms of CPU per such request (anyio cancel
scopes, pool scans, locks), and asyncio streams with h11 0.37 ms (measured on the machine
where this one costs 0.15 ms): a connection owned by one task, one request at a time,
needs neither. So an `AsyncConnection` is an asyncio protocol that sends a request's bytes
in one write and reads the answer with `_h1.ResponseReader`, one future per request, with
what the rest of the seam keeps:

* the route from the environment (`route_for`): an `http://` origin through a proxy gets
  absolute-form requests, an `https://` one a CONNECT tunnel (with the proxy's
  credentials from its URL), then TLS to the origin;
* TLS with the watch's context (private CAs, client certificates);
* httpx's exception types, so the watch tells failures apart as before;
* bodies decoded per their Content-Encoding (by `Response`, as on every path).
"""

from __future__ import annotations

import asyncio
import base64
import ssl
from collections.abc import Callable
from dataclasses import dataclass
from urllib.parse import unquote, urlsplit

import httpx

from ._h1 import ResponseReader, request_head
from ._response import MAX_BODY_BYTES, BodyTooLargeError, Response, settle
from ._routes import Endpoint

__all__ = ["AsyncConnection", "AsyncTimeouts", "open_tunnel"]

Headers = list[tuple[bytes, bytes]]
#: What `get(head_only=True)` reads of a body at most.
HEAD_BYTES = 1024


@dataclass(frozen=True, slots=True)
class AsyncTimeouts:
    """Seconds to connect (TCP, proxy tunnel and TLS) and to wait for each read."""

    connect: float
    read: float


class _Wire(asyncio.Protocol):
    """The connection's protocol: feeds what arrives to the current answer's reader and
    wakes the request once the answer is whole, or the connection failed."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.reader: ResponseReader | None = None
        #: Called once with None when the answer is whole, or with the failure.
        self.done: Callable[[Exception | None], None] | None = None
        self.lost = False
        self.stray = False  # bytes came with no request waiting: never reuse

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        reader = self.reader
        if reader is None:
            self.stray = True
            return
        try:
            reader.feed(data)
        except (httpx.RemoteProtocolError, BodyTooLargeError) as exc:
            self._wake(exc)
            return
        if reader.done:
            self._wake(None)

    def eof_received(self) -> bool | None:
        self._ended(None)
        return None

    def connection_lost(self, exc: Exception | None) -> None:
        self._ended(exc)

    def _ended(self, exc: Exception | None) -> None:
        self.lost = True
        reader = self.reader
        if reader is None or reader.done:
            return
        try:
            reader.feed(b"")  # a body delimited by the close ends here
        except httpx.RemoteProtocolError as err:
            self._wake(httpx.ReadError(f"{type(exc).__name__}: {exc}") if exc else err)
            return
        self._wake(None)

    def _wake(self, exc: Exception | None) -> None:
        done = self.done
        if done is not None:
            self.done = None
            done(exc)


class AsyncConnection:
    """Requests to one origin, one at a time, over one connection opened on first use and
    opened again after a failure or a server's close. Loop thread only.

    `send` starts a request on the open connection and calls back with its answer: no
    task, future or timeout context per request (a fan-out sends thousands a second, a
    watch keeps one waiting per stream); `request` is the same awaited."""

    __slots__ = ("_authority", "_done", "_head_only", "_host", "_host_header", "_max_body",
                 "_origin", "_port", "_prefix", "_proxy", "_reader", "_ssl_context", "_timer",
                 "_tls", "_wire")

    def __init__(self, base_url: str, ssl_context: Callable[[], ssl.SSLContext]) -> None:
        end = Endpoint.of(base_url)
        self._tls, self._host, self._port = end.tls, end.host, end.port
        self._authority = end.authority
        self._host_header = end.host_header.encode()
        self._origin = f"{end.scheme}://{end.host_header}"
        self._prefix = end.prefix
        self._proxy = end.proxy
        self._ssl_context = ssl_context
        self._wire: _Wire | None = None
        # The request in flight: its answer's reader, its callback, its read timer.
        self._reader: ResponseReader | None = None
        self._done: Callable[[Response | Exception], None] | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._head_only = False
        self._max_body = MAX_BODY_BYTES

    @property
    def connected(self) -> bool:
        return self._wire is not None

    @property
    def reusable(self) -> bool:
        """Open, idle and sound: the next request may go out on it at once (`send`)."""
        wire = self._wire
        return (wire is not None and self._done is None and not wire.lost
                and not wire.stray)

    async def connect(self, timeouts: AsyncTimeouts) -> None:
        """Open the connection (and the proxy's tunnel, and TLS) unless it is open."""
        if self._wire is not None:
            return
        try:
            async with asyncio.timeout(timeouts.connect):
                self._wire = await self._connect()
        except TimeoutError as exc:
            self.close()
            raise httpx.ConnectTimeout("connecting took too long") from exc
        except (OSError, ssl.SSLError) as exc:
            self.close()
            raise httpx.ConnectError(f"{type(exc).__name__}: {exc}") from exc
        except BaseException:
            self.close()
            raise

    async def request(self, method: bytes, target: str, headers: Headers,
                      timeouts: AsyncTimeouts, *, content: bytes | None = None,
                      head_only: bool = False) -> Response:
        """Send a request for `target` (under the base URL's path), connecting first if
        need be (again, if the server closed it while it was idle: nothing was sent yet).
        `head_only`: the body's first `HEAD_BYTES` are enough (the connection is dropped if
        more follow)."""
        if self._wire is not None and (self._wire.lost or self._wire.stray):
            self.close()
        await self.connect(timeouts)
        answer: asyncio.Future[Response] = asyncio.get_running_loop().create_future()
        self.send(method, target, headers, timeouts.read, settle(answer), content=content,
                  head_only=head_only)
        try:
            return await answer
        except asyncio.CancelledError:
            self.close()  # the answer is not waited for: the connection is in doubt
            raise

    def send(self, method: bytes, target: str, headers: Headers, read_timeout: float | None,
             done: Callable[[Response | Exception], None], *, content: bytes | None = None,
             head_only: bool = False, max_body: int = MAX_BODY_BYTES) -> None:
        """Start a request on the open connection (`reusable`); `done` is called once, on
        the loop, with the response or the exception it failed with (httpx's types: the
        connection is closed then). Not called if `close` comes first. `max_body`: the
        most of a body taken, as it came and decoded."""
        wire = self._wire
        assert wire is not None and wire.transport is not None and self._done is None
        if wire.lost or wire.stray:
            self._fail(done, httpx.ReadError("the connection was closed or sent bytes unasked"))
            return
        try:
            data = self.request_bytes(method, target, headers, content)
        except ValueError as exc:
            self._fail(done, exc)
            return
        self._reader = wire.reader = ResponseReader(head_request=method == b"HEAD",
                                                    head_only=HEAD_BYTES if head_only else None,
                                                    max_body=max_body)
        self._done, self._head_only, self._max_body = done, head_only, max_body
        wire.done = self._answered
        if read_timeout is not None:
            self._timer = asyncio.get_running_loop().call_later(read_timeout, self._timed_out)
        try:
            wire.transport.write(data)
        except (OSError, ssl.SSLError) as exc:
            self._answered(httpx.ReadError(f"{type(exc).__name__}: {exc}"))

    def detach(self) -> asyncio.Transport:
        """The open, idle connection's transport, handed over (to a `Pipeline`, which sets
        its own protocol on it): this object is closed then, the transport not."""
        wire, self._wire = self._wire, None
        self._clear()
        if wire is None or wire.transport is None or wire.lost or wire.stray:
            if wire is not None and wire.transport is not None:
                wire.transport.close()
            raise httpx.ReadError("the connection was closed or sent bytes unasked")
        wire.reader = wire.done = None
        return wire.transport

    def cancel(self) -> None:
        """Give up the request in flight (closing the connection: its answer would be in
        the way of the next); no callback then."""
        self.close()

    def close(self) -> None:
        """Close the connection; a request in flight is dropped without its callback."""
        wire, self._wire = self._wire, None
        self._clear()
        if wire is not None:
            wire.reader = wire.done = None
            if wire.transport is not None:
                wire.transport.close()

    def _answered(self, exc: Exception | None) -> None:
        """(The wire) the answer is whole, or the request failed."""
        done, reader, wire = self._done, self._reader, self._wire
        self._clear()
        if done is None or reader is None or wire is None:
            return
        wire.reader = None
        if exc is not None:
            self._fail(done, exc)
            return
        if not reader.keep_alive or reader.leftover or wire.lost:
            self.close()  # closed by the server, a body left unread, or bytes unasked
        try:
            response = Response(reader.status, reader.headers, content=reader.body,
                                prefix=self._head_only, limit=self._max_body)
        except Exception as err:  # a body that does not decode
            done(err)
            return
        done(response)

    def expire(self) -> None:
        """The request in flight took too long: it fails with `ReadTimeout` (for a caller
        that keeps the deadlines of many connections itself: `send` without a timeout)."""
        self._timed_out()

    def _timed_out(self) -> None:
        self._timer = None
        done = self._done
        if done is not None:
            self._clear()
            self._fail(done, httpx.ReadTimeout("no answer in time"))

    def _fail(self, done: Callable[[Response | Exception], None], exc: Exception) -> None:
        self.close()
        done(exc)

    def _clear(self) -> None:
        timer, self._timer = self._timer, None
        if timer is not None:
            timer.cancel()
        self._reader = self._done = None

    def request_bytes(self, method: bytes, target: str, headers: Headers,
                      content: bytes | None) -> bytes:
        """The request as sent on this connection: head (with `host`) and body."""
        head = [(b"host", self._host_header), *headers]
        if content is not None:
            head.append((b"content-length", b"%d" % len(content)))
        data = request_head(method, self._target(target), head)
        return data + content if content else data

    def get_affixes(self, headers: Headers) -> tuple[bytes, bytes]:
        """What comes before and after a GET's target (a path under the base URL, as
        bytes) on this connection: the requests of a bulk run differ only by their
        target, so each is the two joined around it, built once."""
        before, after = self._affixes(b"GET", headers, 1)
        return before, after

    def post_affixes(self, headers: Headers) -> tuple[bytes, bytes, bytes]:
        """`get_affixes` of a POST, its head's end (after its body's length, as
        `request_bytes` puts it last) the third: a request is target, length and body
        joined between them."""
        before, mid, end = self._affixes(b"POST", [*headers, (b"content-length", b"\x00")],
                                         2)
        return before, mid, end

    def _affixes(self, method: bytes, headers: Headers, cuts: int) -> list[bytes]:
        """The head of a request on this connection cut at its `cuts` NULs (the target,
        and a header value left to each request)."""
        head = request_head(method, b"\x00", [(b"host", self._host_header), *headers])
        parts = head.split(b"\x00")
        if len(parts) != cuts + 1:
            raise ValueError("a header holds a NUL")
        parts[0] += self._target("")
        return parts

    def _target(self, target: str) -> bytes:
        path = self._prefix + target
        if self._proxy is not None and not self._tls:
            return (self._origin + path).encode()  # absolute form, for the proxy
        return path.encode()

    async def _connect(self) -> _Wire:
        loop = asyncio.get_running_loop()
        if self._proxy is None:
            _, wire = await loop.create_connection(
                _Wire, self._host, self._port, ssl=self._ssl_context() if self._tls else None,
                server_hostname=self._host if self._tls else None)
            return wire
        return await self._connect_via_proxy(self._proxy)

    async def _connect_via_proxy(self, proxy_url: str) -> _Wire:
        if not self._tls:
            return await _connect_to_proxy(proxy_url, self._ssl_context)  # absolute form
        transport, wire = await open_tunnel(proxy_url, self._authority, self._ssl_context)
        tls = await asyncio.get_running_loop().start_tls(
            transport, wire, self._ssl_context(), server_hostname=self._host)
        assert isinstance(tls, asyncio.Transport)
        wire.transport = tls
        return wire


async def _connect_to_proxy(proxy_url: str,
                            ssl_context: Callable[[], ssl.SSLContext]) -> _Wire:
    """A connection to the proxy itself (TLS to it for an `https://` proxy)."""
    proxy = urlsplit(proxy_url)
    tls_to_proxy = proxy.scheme == "https"
    assert proxy.hostname is not None, "route_for gives proxies with a host"
    _, wire = await asyncio.get_running_loop().create_connection(
        _Wire, proxy.hostname, proxy.port or (443 if tls_to_proxy else 80),
        ssl=ssl_context() if tls_to_proxy else None,
        server_hostname=proxy.hostname if tls_to_proxy else None)
    return wire


async def open_tunnel(proxy_url: str, authority: str,
                      ssl_context: Callable[[], ssl.SSLContext]) -> tuple[asyncio.Transport, _Wire]:
    """A CONNECT tunnel through the proxy to `authority` (host:port), with the proxy's
    credentials from its URL: the transport to start TLS to the origin on, and its
    protocol until then. OSError when the proxy refuses."""
    wire = await _connect_to_proxy(proxy_url, ssl_context)
    transport = wire.transport
    assert transport is not None
    proxy = urlsplit(proxy_url)
    head = [(b"host", authority.encode())]
    if proxy.username is not None:
        raw = f"{unquote(proxy.username)}:{unquote(proxy.password or '')}".encode()
        head.append((b"proxy-authorization", b"Basic " + base64.b64encode(raw)))
    # The tunnel's answer has a body only if the proxy refuses (then it is dropped).
    answer = ResponseReader(head_request=True)
    try:
        await _answer(wire, request_head(b"CONNECT", authority.encode(), head), answer, None)
    except BaseException:
        transport.close()
        raise
    if answer.status != 200:
        transport.close()
        raise OSError(f"the proxy refused the tunnel (HTTP {answer.status})")
    return transport, wire


async def _answer(wire: _Wire, data: bytes, reader: ResponseReader,
                  read_timeout: float | None) -> None:
    """Send `data` on `wire` and wait until `reader` holds the whole answer (httpx's
    exception types for what goes wrong)."""
    assert wire.transport is not None
    if wire.lost or wire.stray:
        raise httpx.ReadError("the connection was closed or sent bytes unasked")
    waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def done(exc: Exception | None) -> None:
        if not waiter.done():
            if exc is None:
                waiter.set_result(None)
            else:
                waiter.set_exception(exc)

    wire.reader, wire.done = reader, done
    try:
        wire.transport.write(data)
        del data  # the transport holds what it has not sent yet
        async with asyncio.timeout(read_timeout):
            await waiter
    except TimeoutError as exc:
        raise httpx.ReadTimeout("no answer in time") from exc
    except (OSError, ssl.SSLError) as exc:
        raise httpx.ReadError(f"{type(exc).__name__}: {exc}") from exc
    finally:
        wire.reader = wire.done = None
