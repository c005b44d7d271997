"""HTTP/1.1 pipelining for the fan-out: many requests in flight on one connection, sent
in one write, their answers read in one pass as they come back together.

One request at a time on a connection (`AsyncConnection`) costs a write and a read (two
system calls, and the loopback's work for each) and a turn of the loop per request: most
of a fan-out request's client CPU. A `Pipeline` queues what the fan-out sends in one turn
of the loop and writes it at once; the answers that arrive together are parsed one after
the other from the same buffer (`ResponseReader.adopt`), each handed to the fan-out.

What HTTP/1.1 says a pipelining client must do is `Pipe`'s (`_pipe`): here a request
that goes again is answered `ResendError`, sent again elsewhere by the fan-out.
"""

from __future__ import annotations

import asyncio
import ssl
from collections import deque
from collections.abc import Callable

from ._h1 import ResponseReader
from ._pipe import Deadlines, Pipe
from ._response import Response

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


#: A request in flight: (its token, its method, the most of its answer's body taken).
_Request = tuple[object, bytes, int]


class Pipeline(Pipe[_Request]):
    """Requests to one origin, up to `depth` in flight, answered in order (loop thread).

    `send` queues a request (written with the others of this turn of the loop); its answer
    or failure comes back through `answered` with the token it was sent with, on the
    loop. `room`: the connection is sound and carries fewer than `depth` requests."""

    def __init__(self, base_url: str, ssl_context: Callable[[], ssl.SSLContext],
                 answered: Answered, depth: int, flusher: Flusher, deadlines: Deadlines
                 ) -> None:
        super().__init__(base_url, ssl_context, deadlines)
        self._answered = answered
        self._flusher = flusher
        self.depth = depth
        self._pending: deque[_Request] = deque()  # in flight, oldest first
        self._out: list[bytes] = []  # requests of this turn, not written yet
        self.listed = False  # (the fan-out's) among its pool's connections with room

    @property
    def room(self) -> bool:
        return self.sound and len(self._pending) < self.depth

    def send(self, method: bytes, target: str, headers: Headers, content: bytes | None,
             max_body: int, token: object) -> None:
        """Queue a request; `answered(self, token, ...)` comes later (never within)."""
        loop = asyncio.get_running_loop()
        if not self.sound:
            loop.call_soon(self._answered, self, token, ResendError("connection closed"))
            return
        try:
            data = self._conn.request_bytes(method, target, headers, content)
        except ValueError as exc:
            loop.call_soon(self._answered, self, token, exc)
            return
        self._pending.append((token, method, max_body))
        self.in_flight += 1
        if not self._out:
            self._flusher.add(self)
        self._out.append(data)
        if self.in_flight == 1:  # busy from now: the deadline runs (and runs on)
            self._sent()

    def flush(self) -> None:
        """(The flusher) write the requests queued."""
        out, self._out = self._out, []
        if self._transport is not None and self.sound and out:
            self._transport.write(b"".join(out))

    def close(self) -> None:
        """Drop the connection and what is in flight on it, without callbacks."""
        super().close()
        self._pending.clear()
        self.in_flight = 0
        self._out = []

    # -- what `Pipe` asks ------------------------------------------------------------------

    def _new_reader(self) -> ResponseReader:
        _, method, self._limit = self._pending[0]
        self._reader = ResponseReader(head_request=method == b"HEAD", max_body=self._limit)
        return self._reader

    def _pop(self) -> _Request:
        self.in_flight -= 1
        return self._pending.popleft()

    def _give(self, request: _Request, result: Result) -> None:
        self._answered(self, request[0], result)

    def _again(self, request: _Request) -> None:
        self._answered(self, request[0], ResendError("not taken, or a GET behind a failure"))

    def _idempotent(self, request: _Request) -> bool:
        return request[1] in _IDEMPOTENT

    def _read_plain(self, buf: bytearray) -> tuple[int, bool]:
        return 0, True  # every answer by `ResponseReader` (C within it where it can)

    def _unwritten(self) -> int:
        return len(self._out)
