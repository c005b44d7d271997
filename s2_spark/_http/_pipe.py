"""One HTTP/1.1 connection carrying many requests in order (pipelining): the life both the
fan-out's `Pipeline` and the bulk runs' `BulkPipe` share.

A `Pipe` connects through `AsyncConnection` (its route, tunnel and TLS) and takes its
transport; the requests on it are answered in the order they went. What HTTP/1.1 says a
pipelining client must do, it does, once for both kinds:

* after an answer that ends the connection (`Connection: close`, a body read to the close,
  HTTP/1.0) the server took none of the requests behind it (RFC 9112 section 9.6): they
  go again;
* a connection that breaks, answers malformed or too long, or times out fails its oldest
  request; a GET or HEAD behind it goes again (the oldest one failed, so each round
  settles one), any other fails too (it may have been taken: only its caller knows how to
  find out), but one never written goes again;
* bytes no request asked for drop the connection;
* a connection with requests in flight must answer one within the read timeout of the
  last answer (or of its first request): `Deadlines` looks at all of them on one timer;
* what it receives while more answers are due is acknowledged at once (`TCP_QUICKACK`,
  where the system has it): a server that leaves Nagle's algorithm on (s2-lite does) holds
  each answer after the first of a pipeline until the one before is acknowledged, and a
  delayed acknowledgement waits 40 ms, so every window of pipelined requests cost 40 ms
  more (issue 54: 256 one-record reads on s2-lite 53 ms a window, 9 ms without the wait).

The subclasses differ only in what they queue and in how they read plain answers
(`_read_plain`): a `Pipeline` reads every answer with `ResponseReader`, a `BulkPipe` reads
plain 200s in bulk in C and hands only the others to the same reader.
"""

from __future__ import annotations

import abc
import asyncio
import socket
import ssl
from collections.abc import Callable
from typing import Any, Generic, TypeVar

import httpx

from ._async_connection import AsyncConnection, AsyncTimeouts
from ._h1 import ResponseReader
from ._response import BodyTooLargeError, Response

__all__ = ["Deadlines", "Pipe"]

Result = Response | Exception
#: A request in flight, as the subclass keeps it (a token, an index into a run).
R = TypeVar("R")
#: Seconds between two looks at the busy connections' deadlines: a request times out up
#: to this late (a timer per request cost a tenth of the loop's work).
SWEEP = 0.25
#: What a malformed or too long answer raises while it is read.
_BAD = (httpx.RemoteProtocolError, BodyTooLargeError)
#: Linux's option to acknowledge received bytes at once (None elsewhere).
_QUICKACK: int | None = getattr(socket, "TCP_QUICKACK", None)


class Deadlines:
    """The read deadlines of the busy connections of one loop, looked at every `SWEEP`
    by one timer; one past its deadline is `expire`d (loop thread)."""

    __slots__ = ("_at", "_read", "_timer")

    def __init__(self, read: float | None) -> None:
        self._read = read
        self._at: dict[Pipe[Any], float] = {}
        self._timer: asyncio.TimerHandle | None = None

    def start(self, pipe: Pipe[Any]) -> None:
        """`pipe` has requests in flight: its deadline runs, unless it runs already."""
        if self._read is not None and pipe not in self._at:
            self.renew(pipe)

    def renew(self, pipe: Pipe[Any]) -> None:
        """`pipe` answered and has more in flight: its deadline starts again."""
        if self._read is None:
            return
        loop = asyncio.get_running_loop()
        self._at[pipe] = loop.time() + self._read
        if self._timer is None:
            self._timer = loop.call_later(SWEEP, self._sweep)

    def stop(self, pipe: Pipe[Any]) -> None:
        self._at.pop(pipe, None)

    def _sweep(self) -> None:
        loop = asyncio.get_running_loop()
        now = loop.time()
        for pipe in [p for p, at in self._at.items() if at <= now]:
            if self._at.pop(pipe, None) is not None:
                pipe.expire()
        self._timer = loop.call_later(SWEEP, self._sweep) if self._at else None

    def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._at.clear()


class Pipe(asyncio.Protocol, Generic[R], abc.ABC):
    """One connection's requests in flight, answered in order (loop thread). A subclass
    keeps the requests (of its type `R`) and says how plain answers are read; this class
    reads the others, ends answers at the close, fails and resends, and keeps deadlines.

    `sound`: open, and may carry more requests."""

    def __init__(self, base_url: str, ssl_context: Callable[[], ssl.SSLContext],
                 deadlines: Deadlines) -> None:
        self._conn = AsyncConnection(base_url, ssl_context)
        self._deadlines = deadlines
        self._transport: asyncio.Transport | None = None
        self._sock: Any = None  # the transport's socket, where acknowledgements are hurried
        self._buf = bytearray()  # answers' bytes not read yet
        self._reader: ResponseReader | None = None  # the oldest's answer, read by Python
        self._limit = 0  # the most of that answer's body taken
        self._fresh = False  # answers read since the deadline last moved on
        self.sound = False
        #: Requests sent (or queued to be) without their answer yet (the subclass counts).
        self.in_flight = 0

    async def connect(self, timeouts: AsyncTimeouts) -> None:
        """Open the connection (its route, tunnel and TLS as `AsyncConnection`'s)."""
        await self._conn.connect(timeouts)
        transport = self._conn.detach()
        transport.set_protocol(self)
        self._transport = transport
        if _QUICKACK is not None:
            self._sock = transport.get_extra_info("socket")
        self.sound = True

    def close(self) -> None:
        """Drop the connection, and what is in flight on it without a word (a subclass
        forgets its requests too)."""
        self.sound = False
        self._deadlines.stop(self)
        self._reader, self._buf, self._sock = None, bytearray(), None
        transport, self._transport = self._transport, None
        if transport is not None:
            transport.close()

    def expire(self) -> None:
        """The oldest request took too long: it fails, and the connection with it."""
        self._drop(httpx.ReadTimeout("no answer in time"),
                   httpx.ReadTimeout("no answer in time (queued behind one that had none)"))

    # -- what a subclass says ----------------------------------------------------------------

    @abc.abstractmethod
    def _new_reader(self) -> ResponseReader:
        """A reader for the oldest request's answer (as `_reader`; `_limit` set to the
        most of its body taken)."""

    @abc.abstractmethod
    def _pop(self) -> R:
        """Take the oldest request off: its answer is read."""

    @abc.abstractmethod
    def _give(self, request: R, result: Result) -> None:
        """Hand a request its answer (any status) or the exception it failed with."""

    @abc.abstractmethod
    def _again(self, request: R) -> None:
        """A request the server did not take, or may take twice: it goes again."""

    @abc.abstractmethod
    def _idempotent(self, request: R) -> bool:
        """Whether the request may go again after it may have been taken (GET, HEAD)."""

    @abc.abstractmethod
    def _read_plain(self, buf: bytearray) -> tuple[int, bool]:
        """Read the plain answers at the start of `buf` (handing them over); (where they
        end, whether the answer after them is one for `ResponseReader`)."""

    def _unwritten(self) -> int:
        """How many of the newest requests in flight are not written yet."""
        return 0

    def _progressed(self) -> None:
        """Answers were read and the connection goes on: queue more, or rest."""

    def _lost(self) -> None:
        """The connection closed (after its requests in flight were settled)."""

    def _sent(self) -> None:
        """(A subclass) requests were queued: the deadline runs if it did not."""
        self._deadlines.start(self)

    # -- asyncio.Protocol --------------------------------------------------------------------

    def data_received(self, data: bytes) -> None:
        if not self.sound:
            return
        if self._sock is not None and self.in_flight > 1:  # answers due behind these
            self._ack_now()
        reader = self._reader
        if reader is None:
            self._buf += data
        else:
            try:
                reader.feed(data)
            except _BAD as exc:
                self._malformed(exc)
                return
            if not reader.done or not self._took(reader):
                return
        if self._read():
            self._after_answers()

    def eof_received(self) -> bool | None:
        self._ended(None)
        return None

    def connection_lost(self, exc: Exception | None) -> None:
        self._ended(exc)

    def _ack_now(self) -> None:
        """Acknowledge what came at once, not 40 ms later (see the top): quick-ack mode
        lasts only a while, so it is asked again each time answers come."""
        try:
            self._sock.setsockopt(socket.IPPROTO_TCP, _QUICKACK, 1)
        except OSError:  # not TCP after all (a test's socket pair): nothing to hurry
            self._sock = None

    # -- answers ---------------------------------------------------------------------------

    def _read(self) -> bool:
        """Read the answers whole in the buffer, plain ones by `_read_plain`, others by
        `ResponseReader`; False once the connection is dropped."""
        buf = self._buf
        while buf and self.in_flight:
            pos, other = self._read_plain(buf)
            if pos:
                self._fresh = True
                del buf[:pos]
            if not other:
                break
            reader = self._new_reader()  # takes `buf` (`_took` gives the rest back)
            try:
                reader.adopt(buf)
            except _BAD as exc:
                self._malformed(exc)
                return False
            if not reader.done or not self._took(reader):
                return False
            buf = self._buf
        if buf and not self.in_flight:
            self._drop(httpx.ReadError("bytes unasked"), httpx.ReadError("bytes unasked"))
            return False
        return True

    def _after_answers(self) -> None:
        """After answers were read: more requests or rest, and the deadline moves on (not
        for bytes alone: a server sending an answer a byte at a time gets no more time)."""
        if not self._fresh:
            return
        self._fresh = False
        self._progressed()
        if self.in_flight:
            self._deadlines.renew(self)
        else:
            self._deadlines.stop(self)

    def _took(self, reader: ResponseReader) -> bool:
        """The oldest's answer, read whole by Python: handed over; False once the
        connection is dropped (the answer ended it, or bytes no request asked for came
        after it: decided before it is handed over, which may queue more)."""
        self._reader = None
        self._buf = reader.rest()
        result: Result
        try:
            result = Response(reader.status, reader.headers, content=reader.body,
                              limit=self._limit)
        except Exception as err:  # a body that does not decode
            result = err
        if not reader.keep_alive or (self._buf and self.in_flight == 1):
            self._drop(result, None)
            return False
        self._fresh = True
        self._give(self._pop(), result)
        return True

    def _ended(self, exc: Exception | None) -> None:
        """The connection closed (or broke): an answer read to the close ends here."""
        if not self.sound or not self.in_flight:
            self._drop(httpx.ReadError("the connection closed"), None)
            return
        reader = self._reader
        if reader is None:
            reader = self._new_reader()
            buf, self._buf = self._buf, bytearray()
            try:
                reader.adopt(buf)
            except _BAD as err:
                self._malformed(err)
                return
        try:
            reader.feed(b"")
        except httpx.RemoteProtocolError as err:
            first = httpx.ReadError(f"{type(exc).__name__}: {exc}") if exc else err
            self._drop(first, httpx.ReadError("the connection closed"))
            return
        if self._took(reader):  # whole before the close, and kept alive: none after it
            self._drop(httpx.ReadError("the connection closed"),
                       httpx.ReadError("the connection closed"))

    def _malformed(self, exc: Exception) -> None:
        self._drop(exc, httpx.ReadError("the connection was dropped after a malformed "
                                        "answer to an earlier request"))

    def _drop(self, first: Result, behind: Exception | None) -> None:
        """Close; the oldest request in flight gets `first`, those behind it go again but
        those written that may have been taken and must not be twice, which fail with
        `behind`. `behind` None: the oldest was answered and the server took none after it
        (it closed the connection), so every one behind goes again."""
        was_sound = self.sound
        pending = [self._pop() for _ in range(self.in_flight)]
        written = len(pending) - self._unwritten()
        self.close()
        for k, request in enumerate(pending):
            if k == 0 and (behind is None or written):
                self._give(request, first)
            elif behind is None or k >= written or self._idempotent(request):
                self._again(request)
            else:
                self._give(request, behind)
        if was_sound:
            self._lost()
