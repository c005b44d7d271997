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
from ._response import Done, Response, settle
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


class _Sending:
    """One request through an `Http2Origin` until it is answered: sent again on a newer
    connection while the server says it did not process it (`_SENDS` sends at most).
    `cancel` gives up on it (no callback then)."""

    __slots__ = ("conn", "done", "head_only", "headers", "method", "origin", "path",
                 "sends", "sid", "timeouts")

    def __init__(self, origin: Http2Origin, method: bytes, path: bytes, headers: Headers,
                 timeouts: AsyncTimeouts, done: Done, head_only: bool) -> None:
        self.origin = origin
        self.method = method
        self.path = path
        self.headers = headers
        self.timeouts = timeouts
        self.done: Done | None = done
        self.head_only = head_only
        self.sends = 0
        self.conn: H2Connection | None = None  # the connection of the last send
        self.sid = 0

    @property
    def newer_than(self) -> int:
        """The next send goes on a connection opened after the last send's."""
        return self.conn.serial if self.conn is not None else 0

    def send_on(self, conn: H2Connection) -> None:
        origin = self.origin
        self.sends += 1
        self.conn = conn
        try:
            self.sid = conn.send(self.method, origin._authority_bytes, origin._scheme,
                                 self.path, self.headers, self.timeouts.read, self,
                                 HEAD_BYTES if self.head_only else None)
        except Exception as exc:  # no room after all (closing), or a header too long
            self(exc)

    def cancel(self) -> None:
        self.done = None
        if self.conn is not None and self.sid:
            self.conn.cancel(self.sid)
        self.origin._forget(self)

    def __call__(self, result: Response | Exception) -> None:
        """The answer of the last send (the connection's callback: no bound method is
        made per request)."""
        self.sid = 0
        if self.done is None:
            return
        if isinstance(result, Unprocessed):
            if self.sends < _SENDS:
                self.origin._dispatch(self)
                return
            result = Unprocessed(f"the server did not process the request in {_SENDS} sends, "
                                 f"each on a newer connection: {result}")
        self.fail_or_answer(result)

    def fail_or_answer(self, result: Response | Exception) -> None:
        done, self.done = self.done, None
        if done is not None:
            done(result)


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
        self._last: H2Connection | None = None  # the last one found with room
        # Requests waiting for a connection with room, and the one being opened for them.
        self._waiting: dict[_Sending, None] = {}
        self._opening: asyncio.Task[None] | None = None
        self._probing: asyncio.Future[None] | None = None

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
            if self._with_room(0) is None:
                try:
                    self._conns.append(await self._open(timeouts))
                except NotHttp2:
                    return False
            return True
        return known

    async def request(self, method: bytes, target: str, headers: Headers,
                      timeouts: AsyncTimeouts, *, head_only: bool = False) -> Response:
        """`send`, awaited (cancelling it gives the request up)."""
        answer: asyncio.Future[Response] = asyncio.get_running_loop().create_future()

        sending = self.send(method, target, headers, timeouts, settle(answer),
                            head_only=head_only)
        try:
            return await answer
        except asyncio.CancelledError:
            sending.cancel()
            raise

    def send(self, method: bytes, target: str, headers: Headers, timeouts: AsyncTimeouts,
             done: Done, *, head_only: bool = False) -> _Sending:
        """A request without a body for `target` (under the base URL's path); `done` is
        called once, on the loop, with the answer or the exception: `NotHttp2` if the
        origin does not speak it, `Unprocessed` if the server did not process it in
        `_SENDS` sends, httpx's errors for the rest. `cancel()` on what it returns gives
        the request up (no callback then)."""
        sending = _Sending(self, method, (self._prefix + target).encode(), headers,
                           timeouts, done, head_only)
        self._dispatch(sending)
        return sending

    def close(self) -> None:
        conns, self._conns, self._last = self._conns, [], None
        if self._opening is not None:
            self._opening.cancel()
        for conn in conns:
            conn.close()

    # -- inside ------------------------------------------------------------------------------

    def _dispatch(self, sending: _Sending) -> None:
        """Send on a connection with room opened after the last send's; else wait for
        one, opened for the requests waiting."""
        conn = self._with_room(sending.newer_than)
        if conn is not None:
            sending.send_on(conn)
            return
        if self.speaks_h2 is False:
            sending.fail_or_answer(NotHttp2(self._key))
            return
        self._waiting[sending] = None
        if self._opening is None:
            self._opening = asyncio.get_running_loop().create_task(
                self._open_for_waiting(sending.timeouts))

    def _forget(self, sending: _Sending) -> None:
        self._waiting.pop(sending, None)

    async def _open_for_waiting(self, timeouts: AsyncTimeouts) -> None:
        """Open connections until every waiting request is sent (a failure fails those
        waiting then)."""
        try:
            while self._waiting:
                try:
                    conn = await self._open(timeouts)
                except Exception as exc:
                    waiting, self._waiting = self._waiting, {}
                    for sending in waiting:
                        sending.fail_or_answer(exc)
                    return
                self._conns.append(conn)
                for sending in list(self._waiting):
                    if not (conn.usable and conn.in_flight < conn.max_streams):
                        break
                    if conn.serial > sending.newer_than:
                        del self._waiting[sending]
                        sending.send_on(conn)
        finally:
            self._opening = None

    def _with_room(self, newer_than: int) -> H2Connection | None:
        """A connection with room opened after `newer_than`: the last one found, while
        it has room (a look at each connection per request, thousands of requests over
        a hundred connections, cost a tenth of a watch's CPU)."""
        last = self._last
        if (last is not None and last.serial > newer_than and last.usable
                and last.in_flight < last.max_streams):
            return last
        conns = self._conns
        if any(not (c.usable or c.in_flight) for c in conns):
            self._conns = conns = [c for c in conns if c.usable or c.in_flight]
        for conn in conns:
            if (conn.serial > newer_than and conn.usable
                    and conn.in_flight < conn.max_streams):
                self._last = conn
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
        self._opened += 1
        conns[0].serial = self._opened
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
