"""The connections a tail watch's long-polls go over: where the origin speaks HTTP/2, a
few connections shared by every stream (`Http2Origin`, a few hundred bytes a waiting
poll); where it does not, one HTTP/1.1 connection per stream (`AsyncConnection`) for as
many streams as the process may open files for (`watch_limit`).

Why HTTP/2 first: with this client's own framing (`_h2_connection`), a long-poll over
HTTP/2 costs no more CPU than over HTTP/1.1 on either side (`benchmarks/watch_polls.py`
against the local server: 0.09 ms of client CPU against 0.11, the server's 0.20-0.22 ms
against 0.22-0.23), and a connection per stream costs a file descriptor and about 2 KB more
of the process's memory each (transport, socket, buffers). `own_connections` still puts
the first streams on connections of their own, for tests and for a service whose HTTP/2
costs more."""

from __future__ import annotations

import asyncio
import ssl
from dataclasses import dataclass, field
from typing import Protocol

from s2_spark._http import AsyncConnection, AsyncTimeouts, Response
from s2_spark._http._h2_origin import Http2Origin, NotHttp2, alpn_context
from s2_spark._http._response import Done, settle
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


class Pending(Protocol):
    """A request under way for a watched stream: `cancel()` gives it up (no callback)."""

    def cancel(self) -> object: ...


class PollConnections:
    """GETs on behalf of watched streams. Loop thread only."""

    def __init__(self, settings: ClientSettings, own_connections: int | None = None) -> None:
        """`own_connections`: streams polled on an HTTP/1.1 connection of their own
        before HTTP/2 carries the rest, where the origin speaks it (None: none)."""
        self._settings = settings
        self._own = own_connections or 0
        self._origins: dict[str, Http2Origin] = {}  # base URL -> its HTTP/2 connections
        self._h1: dict[str, AsyncConnection] = {}  # stream -> its own HTTP/1.1 connection
        self._connects = asyncio.Semaphore(CONNECTS_AT_ONCE)
        self._ssl: dict[bool, ssl.SSLContext] = {}  # ALPN offering h2? -> the context

    def send(self, stream: str, base_url: str, target: str, done: Done, *,
             head_only: bool = False) -> Pending:
        """GET `base_url` + `target` for `stream`, with the settings' headers and timeouts:
        on the stream's own HTTP/1.1 connection, or over HTTP/2 once `own_connections`
        streams have one (where the origin speaks it). `done` is called once, on the
        loop, with the answer or the exception it failed with (httpx's types), unless
        what this returns is cancelled first."""
        origin = self._origin(base_url)
        speaks = origin.speaks_h2
        if stream not in self._h1 and len(self._h1) >= self._own and speaks is not False:
            settings = self._settings
            if speaks:
                return origin.send(b"GET", target, settings.headers, settings.timeout, done,
                                   head_only=head_only)
            return _Either(self, origin, stream, base_url, target, done, head_only)
        return self._h1_send(stream, base_url, target, done, head_only)

    async def get(self, stream: str, base_url: str, target: str, *,
                  head_only: bool = False) -> Response:
        """`send`, awaited."""
        answer: asyncio.Future[Response] = asyncio.get_running_loop().create_future()

        pending = self.send(stream, base_url, target, settle(answer), head_only=head_only)
        try:
            return await answer
        except asyncio.CancelledError:
            pending.cancel()
            raise

    def _h1_send(self, stream: str, base_url: str, target: str, done: Done,
                 head_only: bool) -> Pending:
        """On the stream's own connection: at once if it is open, else once it is."""
        conn = self._h1.get(stream)
        if conn is None:
            conn = self._h1[stream] = AsyncConnection(base_url, self._h1_context)
        if not conn.reusable:
            return _Connecting(self, conn, target, done, head_only)
        settings = self._settings
        conn.send(b"GET", target, settings.headers, settings.timeout.read, done,
                  head_only=head_only)
        return conn

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


class _Connecting:
    """A poll whose stream's connection is (re)opened first, then sent on it."""

    __slots__ = ("_conn", "_task")

    def __init__(self, conns: PollConnections, conn: AsyncConnection, target: str,
                 done: Done, head_only: bool) -> None:
        self._conn = conn
        self._task: asyncio.Task[None] | None = asyncio.get_running_loop().create_task(
            self._run(conns, target, done, head_only))

    def cancel(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
        self._conn.cancel()

    async def _run(self, conns: PollConnections, target: str, done: Done,
                   head_only: bool) -> None:
        conn, settings = self._conn, conns._settings
        try:
            if conn.connected:
                conn.close()  # lost or unsound: open it again
            async with conns._connects:
                await conn.connect(settings.timeout)
        except Exception as exc:
            self._task = None
            done(exc)
            return
        self._task = None
        conn.send(b"GET", target, settings.headers, settings.timeout.read, done,
                  head_only=head_only)


class _Either:
    """A request to an origin not known yet to speak HTTP/2: tried over HTTP/2, and on
    `NotHttp2` sent on the stream's own HTTP/1.1 connection instead."""

    __slots__ = ("_base_url", "_conns", "_done", "_head_only", "_pending", "_stream",
                 "_target")

    def __init__(self, conns: PollConnections, origin: Http2Origin, stream: str,
                 base_url: str, target: str, done: Done, head_only: bool) -> None:
        self._conns, self._stream, self._base_url = conns, stream, base_url
        self._target, self._done, self._head_only = target, done, head_only
        settings = conns._settings
        self._pending: Pending | None = None
        self._pending = origin.send(b"GET", target, settings.headers, settings.timeout,
                                    self._answered, head_only=head_only)

    def cancel(self) -> None:
        pending, self._pending = self._pending, None
        if pending is not None:
            pending.cancel()

    def _answered(self, result: Response | Exception) -> None:
        if self._pending is None:
            return
        if isinstance(result, NotHttp2):
            self._pending = self._conns._h1_send(self._stream, self._base_url, self._target,
                                                 self._done, self._head_only)
            return
        self._pending = None
        self._done(result)
