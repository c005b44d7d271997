"""HTTP/1.1 pipelining for the fan-out: many requests in flight on one connection, sent
in one write, their answers read in one pass as they come back together.

One request at a time on a connection (`AsyncConnection`) costs a write and a read (two
system calls, and the loopback's work for each) and a turn of the loop per request: most
of a fan-out request's client CPU. A `Pipeline` queues what the fan-out sends in one turn
of the loop and writes it at once; the answers that arrive together are parsed one after
the other from the same buffer (`ResponseReader.adopt`), each handed to the fan-out.

What HTTP/1.1 says a pipelining client must do, it does: answers come back in the order
the requests went; after an answer that ends the connection (`Connection: close`, a body
read to the close, HTTP/1.0) the server took none of the requests behind it
(RFC 9112 section 9.6), so those are `ResendError`s, sent again elsewhere by the fan-out.
A connection that breaks, answers malformed or too long, or times out fails its oldest
request; a GET or HEAD behind it goes again (`ResendError`: the oldest one failed, so
each round settles one), any other fails too (it may have been taken: only its caller
knows how to find out, as for a single request cut short).
"""

from __future__ import annotations

import asyncio
import ssl
from collections import deque
from collections.abc import Callable

import httpx

from ._async_connection import AsyncConnection, AsyncTimeouts
from ._h1 import ResponseReader
from ._response import BodyTooLargeError, Response

__all__ = ["Flusher", "Pipeline", "ResendError"]

Headers = list[tuple[bytes, bytes]]
Result = Response | Exception
#: `Pipeline`'s callback: (the pipeline, the request's token, its answer or failure).
Answered = Callable[["Pipeline", object, Result], None]
#: Methods sent again when a request before them on the connection failed.
_IDEMPOTENT = frozenset((b"GET", b"HEAD"))


class ResendError(Exception):
    """The request may go again as it is: it never reached the server (queued behind an
    answer that closed the connection, or not written yet when it broke), or it is a GET
    or HEAD queued behind a request that failed."""


class Flusher:
    """Writes the requests pipelines queued in one turn of the loop, at its end: one
    callback for all of them, not one per connection (loop thread)."""

    __slots__ = ("_queued",)

    def __init__(self) -> None:
        self._queued: list[Pipeline] = []

    def add(self, pipeline: Pipeline) -> None:
        if not self._queued:
            asyncio.get_running_loop().call_soon(self._flush)
        self._queued.append(pipeline)

    def _flush(self) -> None:
        queued, self._queued = self._queued, []
        for pipeline in queued:
            pipeline.flush()


class Pipeline(asyncio.Protocol):
    """Requests to one origin, up to `depth` in flight, answered in order (loop thread).

    `send` queues a request (written with the others of this turn of the loop); its answer
    or failure comes back through `answered` with the token it was sent with, on the
    loop. `room`: the connection is sound and carries fewer than `depth` requests."""

    def __init__(self, base_url: str, ssl_context: Callable[[], ssl.SSLContext],
                 answered: Answered, depth: int, flusher: Flusher) -> None:
        self._conn = AsyncConnection(base_url, ssl_context)
        self._answered = answered
        self._flusher = flusher
        self.depth = depth
        self._transport: asyncio.Transport | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        #: The requests in flight, oldest first: (token, method, most of the body taken).
        self._pending: deque[tuple[object, bytes, int]] = deque()
        self._reader: ResponseReader | None = None  # the oldest one's answer
        self._out: list[bytes] = []  # requests of this turn, not written yet
        self.sound = False
        self.listed = False  # (the fan-out's) among its pool's connections with room

    @property
    def in_flight(self) -> int:
        return len(self._pending)

    @property
    def room(self) -> bool:
        return self.sound and len(self._pending) < self.depth

    async def connect(self, timeouts: AsyncTimeouts) -> None:
        """Open the connection (its route, tunnel and TLS as `AsyncConnection`'s)."""
        await self._conn.connect(timeouts)
        transport = self._conn.detach()
        transport.set_protocol(self)
        self._transport, self._loop = transport, asyncio.get_running_loop()
        self.sound = True

    def send(self, method: bytes, target: str, headers: Headers, content: bytes | None,
             max_body: int, token: object) -> None:
        """Queue a request; `answered(self, token, ...)` comes later (never within)."""
        loop = self._loop
        assert loop is not None
        if not self.sound:
            loop.call_soon(self._answered, self, token, ResendError("connection closed"))
            return
        try:
            data = self._conn.request_bytes(method, target, headers, content)
        except ValueError as exc:
            loop.call_soon(self._answered, self, token, exc)
            return
        self._pending.append((token, method, max_body))
        if self._reader is None:
            self._reader = ResponseReader(head_request=method == b"HEAD", max_body=max_body)
        if not self._out:
            self._flusher.add(self)
        self._out.append(data)

    def flush(self) -> None:
        """(The flusher) write the requests queued."""
        out, self._out = self._out, []
        if self._transport is not None and self.sound and out:
            self._transport.write(b"".join(out))

    def expire(self) -> None:
        """The oldest request took too long: every request on the connection fails."""
        self._fail(httpx.ReadTimeout("no answer in time"),
                   httpx.ReadTimeout("no answer in time (queued behind one that had none)"))

    def close(self) -> None:
        """Drop the connection and what is in flight on it, without callbacks."""
        self.sound = False
        self._pending.clear()
        self._reader, self._out = None, []
        transport, self._transport = self._transport, None
        if transport is not None:
            transport.close()

    # -- asyncio.Protocol --------------------------------------------------------------------

    def data_received(self, data: bytes) -> None:
        reader = self._reader
        if reader is None:  # bytes no request asked for: never reused
            self._fail(httpx.ReadError("bytes unasked"), httpx.ReadError("bytes unasked"))
            return
        try:
            reader.feed(data)
            while reader is not None and reader.done:
                reader = self._next(reader)
        except (httpx.RemoteProtocolError, BodyTooLargeError) as exc:
            self._fail(exc, httpx.ReadError("the connection was dropped after a malformed "
                                            "answer to an earlier request"))

    def eof_received(self) -> bool | None:
        self._ended(None)
        return None

    def connection_lost(self, exc: Exception | None) -> None:
        self._ended(exc)

    # -- answers ---------------------------------------------------------------------------

    def _next(self, reader: ResponseReader) -> ResponseReader | None:
        """Hand over the oldest request's whole answer; the next one's reader, fed what
        came after it (None: nothing more to read now)."""
        token, _, max_body = self._pending.popleft()
        rest = reader.rest()
        self._reader = None
        if not reader.keep_alive or (rest and not self._pending):
            self.sound = False  # closed by the server, or bytes unasked
        elif self._pending:
            _, method, limit = self._pending[0]
            self._reader = ResponseReader(head_request=method == b"HEAD", max_body=limit)
        result: Result
        try:
            result = Response(reader.status, reader.headers, content=reader.body,
                              limit=max_body)
        except Exception as err:  # a body that does not decode
            result = err
        if not self.sound:
            self._close_behind(token, result, reader.keep_alive)
            return None
        self._answered(self, token, result)  # may queue more (a new reader if none)
        nxt = self._reader
        if nxt is not None and rest:
            nxt.adopt(rest)
        return nxt

    def _close_behind(self, token: object, result: Result, keep_alive: bool) -> None:
        """An answer after which the connection ends: it, then those behind it."""
        pending, self._pending = self._pending, deque()
        self.close()
        self._answered(self, token, result)
        behind: Exception = (ResendError("queued behind an answer that closed the connection")
                             if not keep_alive else httpx.ReadError("bytes unasked"))
        for token_, _, _ in pending:
            self._answered(self, token_, behind)

    def _ended(self, exc: Exception | None) -> None:
        """The connection closed (or broke): an answer read to the close ends here."""
        reader = self._reader
        if not self.sound or reader is None:
            self._fail(httpx.ReadError("the connection closed"),
                       httpx.ReadError("the connection closed"))
            return
        try:
            reader.feed(b"")
        except httpx.RemoteProtocolError as err:
            first = httpx.ReadError(f"{type(exc).__name__}: {exc}") if exc else err
            self._fail(first, httpx.ReadError("the connection closed"))
            return
        self.sound = False  # no longer: `_next` hands the rest on as not sent
        self._next(reader)

    def _fail(self, first: Exception, behind: Exception) -> None:
        """Close; the oldest request fails with `first`, the others with `behind` but
        those that may go again (never written, or idempotent)."""
        written = len(self._pending) - len(self._out)  # one write a request
        pending, self._pending = self._pending, deque()
        self.close()
        for k, (token, method, _) in enumerate(pending):
            if k == 0 and k < written:
                self._answered(self, token, first)
            elif k >= written or method in _IDEMPOTENT:
                self._answered(self, token, ResendError("queued behind a failed request"))
            else:
                self._answered(self, token, behind)
