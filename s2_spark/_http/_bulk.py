"""Tail lookups in bulk: thousands of GETs whose answers are read straight into arrays.

A fan-out request costs its loop thread a callback, a token, a `Response` and a future's
bookkeeping per answer: 26-29 us of a tail lookup's 31-33 us (issue 54). Here the
requests of a run are its targets joined between two affixes built once, pipelined
`depth` deep on up to `width` connections per origin; the answers that came together are
read in one C call (`_fastwire.h1_tails`: a plain 200 in S2's own spelling of a tail),
their positions written into two arrays. An answer of any other kind (an error status,
another spelling, a body framed otherwise, a fault) is read by `ResponseReader` as a
`Pipeline` reads it and kept as its `Response` (or exception) in `others`, for the caller
to handle as it handles a fan-out's answer; a request behind one that failed or closed
its connection goes again (GETs only: taken twice, no harm).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import ssl
from array import array
from collections import deque
from collections.abc import Callable, Sequence

import httpx

from s2_spark.wire._accelerator import fastwire

from ._async_connection import AsyncConnection, AsyncTimeouts
from ._h1 import MAX_HEAD_BYTES, ResponseReader
from ._response import BodyTooLargeError, Response

__all__ = ["BULK_TAILS", "BulkTails", "TailRun"]

Headers = list[tuple[bytes, bytes]]
#: Whether this install reads tail answers in bulk (the C decoders are there).
BULK_TAILS = fastwire is not None
_SWEEP = 0.25  # seconds between looks at the busy connections' deadlines


class TailRun:
    """One run's tail lookups: `seqs[i]`, `tss[i]` the tail of request i where `others`
    has no entry for it, else its answer of another kind or the error it failed with.
    Loop thread, but for `answered` and what is read once it is set."""

    __slots__ = ("affixes", "again", "answered", "base_url", "headers", "left", "max_body",
                 "next", "others", "queued", "seqs", "targets", "tss")

    def __init__(self, base_url: str, targets: Sequence[bytes], headers: Headers,
                 max_body: int) -> None:
        self.base_url = base_url
        self.targets = targets
        self.headers = headers
        self.max_body = max_body
        self.seqs = array("Q", bytes(8 * len(targets)))
        self.tss = array("Q", bytes(8 * len(targets)))
        self.others: dict[int, Response | Exception] = {}
        self.affixes: tuple[bytes, bytes] | None = None  # the first connection's
        self.next = 0  # the next request never sent
        self.again: deque[int] = deque()  # requests to send again
        self.left = len(targets)  # requests without their answer
        self.queued = False  # among its origin's runs with requests to send
        self.answered: concurrent.futures.Future[None] = concurrent.futures.Future()

    @property
    def unsent(self) -> bool:
        return bool(self.again) or self.next < len(self.targets)

    def settle(self, k: int) -> None:
        self.left -= k
        if self.left == 0 and not self.answered.done():
            self.answered.set_result(None)

    def fail(self, i: int, exc: Exception) -> None:
        self.others[i] = exc
        self.settle(1)

    def take(self, room: int) -> list[tuple[int, int]]:
        """Up to `room` requests to send, as ranges [start, end), those sent again first."""
        ranges = []
        again = self.again
        while again and room:
            i = again.popleft()
            ranges.append((i, i + 1))
            room -= 1
        if room and self.next < len(self.targets):
            end = min(len(self.targets), self.next + room)
            ranges.append((self.next, end))
            self.next = end
        return ranges


class _Origin:
    """One origin's bulk connections: idle ones, how many are open or opening, and the
    runs with requests to send (loop thread)."""

    __slots__ = ("idle", "open", "runs")

    def __init__(self) -> None:
        self.idle: list[TailPipe] = []
        self.open = 0
        self.runs: deque[TailRun] = deque()


class BulkTails:
    """The bulk runs of a `Fanout` (its loop thread)."""

    def __init__(self, ssl_context: Callable[[], ssl.SSLContext], timeouts: AsyncTimeouts,
                 width: int, depth: int) -> None:
        self._ssl_context = ssl_context
        self._timeouts = timeouts
        self._width = width
        self._depth = depth
        self._origins: dict[str, _Origin] = {}
        self._runs: set[TailRun] = set()
        self._opening: set[asyncio.Task[None]] = set()
        self.busy: set[TailPipe] = set()  # connections with requests in flight
        self._sweeping: asyncio.TimerHandle | None = None

    def begin(self, run: TailRun) -> None:
        self._runs.add(run)
        run.answered.add_done_callback(lambda _: self._runs.discard(run))
        origin = self._origins.get(run.base_url)
        if origin is None:
            origin = self._origins[run.base_url] = _Origin()
        self.queue(origin, run)

    def queue(self, origin: _Origin, run: TailRun) -> None:
        """`run` has requests to send: idle connections take them, and new ones open
        for what is left (up to `width`)."""
        if not run.queued and run.unsent:
            run.queued = True
            origin.runs.append(run)
        while origin.idle and (run_ := self.work(origin)) is not None:
            origin.idle.pop().serve(run_)
        run_ = self.work(origin)
        if run_ is None:
            return
        unsent = len(run_.again) + len(run_.targets) - run_.next
        for _ in range(min(self._width - origin.open, -(-unsent // self._depth))):
            origin.open += 1
            task = asyncio.get_running_loop().create_task(self._connect(origin, run_))
            self._opening.add(task)
            task.add_done_callback(self._opening.discard)

    @staticmethod
    def work(origin: _Origin) -> TailRun | None:
        """The first of the origin's runs with requests to send."""
        runs = origin.runs
        while runs and not runs[0].unsent:
            runs.popleft().queued = False
        return runs[0] if runs else None

    async def _connect(self, origin: _Origin, run: TailRun) -> None:
        conn = TailPipe(run.base_url, self._ssl_context, self, origin)
        try:
            await conn.connect(self._timeouts)
        except Exception as exc:
            origin.open -= 1
            if origin.open == 0:  # none to send them: every request waiting fails so
                self._fail_unsent(origin, exc)
            return
        self.free(conn)

    @staticmethod
    def _fail_unsent(origin: _Origin, exc: Exception) -> None:
        while origin.runs:
            run = origin.runs.popleft()
            run.queued = False
            for start, end in run.take(len(run.again) + len(run.targets)):
                for i in range(start, end):
                    run.fail(i, exc)

    def free(self, conn: TailPipe) -> None:
        """A connection with nothing in flight: it takes the next run's requests, or idles."""
        run = self.work(conn.origin)
        if run is not None:
            conn.serve(run)
        else:
            conn.origin.idle.append(conn)

    def lost(self, conn: TailPipe) -> None:
        """A connection closed: the others, or a new one, take what it had to send again."""
        origin = conn.origin
        origin.open -= 1
        self.busy.discard(conn)
        if conn in origin.idle:
            origin.idle.remove(conn)
        if conn.run is not None:
            self.queue(origin, conn.run)

    def watch(self, conn: TailPipe) -> None:
        """`conn` has requests in flight: its deadline is looked at every `_SWEEP`."""
        read = self._timeouts.read
        if read is None:
            return
        loop = asyncio.get_running_loop()
        conn.deadline = loop.time() + read
        self.busy.add(conn)
        if self._sweeping is None:
            self._sweeping = loop.call_later(_SWEEP, self._sweep)

    def _sweep(self) -> None:
        loop = asyncio.get_running_loop()
        now = loop.time()
        for conn in [c for c in self.busy if c.deadline <= now]:
            conn.fail(httpx.ReadTimeout("no answer in time"))
        self._sweeping = loop.call_later(_SWEEP, self._sweep) if self.busy else None

    def close(self) -> None:
        if self._sweeping is not None:
            self._sweeping.cancel()
            self._sweeping = None
        for task in list(self._opening):
            task.cancel()
        for origin in self._origins.values():
            for conn in [*origin.idle, *self.busy]:
                conn.close()
        self._origins.clear()
        self.busy.clear()
        for run in list(self._runs):
            if not run.answered.done():
                run.answered.set_exception(RuntimeError("the fan-out was closed"))
        self._runs.clear()


class TailPipe(asyncio.Protocol):
    """One connection of bulk tail lookups, up to `depth` in flight, answered in order
    (loop thread). `ranges`: the requests in flight, oldest first, as [start, end)."""

    def __init__(self, base_url: str, ssl_context: Callable[[], ssl.SSLContext],
                 bulk: BulkTails, origin: _Origin) -> None:
        self._conn = AsyncConnection(base_url, ssl_context)
        self._bulk = bulk
        self.origin = origin
        self._transport: asyncio.Transport | None = None
        self.run: TailRun | None = None
        self._ranges: deque[list[int]] = deque()
        self._in_flight = 0
        self._buf = bytearray()
        self._reader: ResponseReader | None = None  # an answer of another kind, begun
        self.deadline = 0.0
        self.sound = False

    async def connect(self, timeouts: AsyncTimeouts) -> None:
        await self._conn.connect(timeouts)
        transport = self._conn.detach()
        transport.set_protocol(self)
        self._transport = transport
        self.sound = True

    def serve(self, run: TailRun) -> None:
        """Send `run`'s next requests, up to `depth` in flight."""
        assert self._transport is not None
        if run is not self.run:
            self.run = run
            if run.affixes is None:
                run.affixes = self._conn.get_affixes(run.headers)
        self._send()

    def _send(self) -> None:
        run = self.run
        assert run is not None and self._transport is not None and run.affixes is not None
        ranges = run.take(self._bulk._depth - self._in_flight)
        if not ranges:
            return
        before, after = run.affixes
        targets = run.targets
        out = []
        idle = not self._in_flight
        for start, end in ranges:
            self._ranges.append([start, end])
            self._in_flight += end - start
            out += [before + t + after for t in targets[start:end]]
        if idle:
            self._bulk.watch(self)
        self._transport.write(b"".join(out))

    def close(self) -> None:
        self.sound = False
        transport, self._transport = self._transport, None
        if transport is not None:
            transport.close()

    # -- asyncio.Protocol --------------------------------------------------------------------

    def data_received(self, data: bytes) -> None:
        if not self.sound:
            return
        if self._reader is not None:
            try:
                self._reader.feed(data)
            except (httpx.RemoteProtocolError, BodyTooLargeError) as exc:
                self.fail(exc)
                return
            if not self._reader.done or not self._other():
                return
        else:
            self._buf += data
        if self._read() and self.sound:
            self._next()

    def eof_received(self) -> bool | None:
        self._ended(None)
        return None

    def connection_lost(self, exc: Exception | None) -> None:
        self._ended(exc)

    # -- answers ---------------------------------------------------------------------------

    def _read(self) -> bool:
        """Read the answers here; False once the connection is dropped."""
        assert fastwire is not None
        run, ranges, buf, pos = self.run, self._ranges, self._buf, 0
        while ranges and pos < len(buf):
            assert run is not None
            r = ranges[0]
            k, pos, stop = fastwire.h1_tails(buf, pos, MAX_HEAD_BYTES, run.max_body,
                                             run.seqs, run.tss, r[0], r[1] - r[0])
            if k:
                r[0] += k
                self._in_flight -= k
                run.settle(k)
                if r[0] == r[1]:
                    ranges.popleft()
            if stop == 1:
                break
            if stop == 2:
                self._reader = ResponseReader(max_body=run.max_body)
                rest = buf[pos:]
                buf.clear()
                try:
                    self._reader.adopt(rest)
                except (httpx.RemoteProtocolError, BodyTooLargeError) as exc:
                    self.fail(exc)
                    return False
                if not self._reader.done or not self._other():
                    return False
                buf, pos = self._buf, 0
        del buf[:pos]
        if buf and not ranges:
            self.fail(httpx.ReadError("bytes unasked"))
            return False
        return True

    def _oldest(self) -> int:
        r = self._ranges[0]
        i = r[0]
        r[0] += 1
        if r[0] == r[1]:
            self._ranges.popleft()
        self._in_flight -= 1
        return i

    def _other(self) -> bool:
        """The answer the Python reader read (done): kept as it is; False once the
        connection is dropped (it ended the connection, or bytes came unasked after)."""
        reader, self._reader = self._reader, None
        assert reader is not None and self.run is not None
        run = self.run
        i = self._oldest()
        self._buf = reader.rest()
        result: Response | Exception
        try:
            result = Response(reader.status, reader.headers, content=reader.body,
                              limit=run.max_body)
        except Exception as err:  # a body that does not decode
            result = err
        run.others[i] = result
        run.settle(1)
        if not reader.keep_alive:
            self._drop()
            return False
        if self._buf and not self._ranges:
            self.fail(httpx.ReadError("bytes unasked"))
            return False
        return True

    def _next(self) -> None:
        """After the answers read: more requests, or the next run, or idle."""
        run = self.run
        assert run is not None
        if run.unsent:
            self._send()
        elif not self._in_flight:
            self._bulk.busy.discard(self)
            self._bulk.free(self)
            return
        if self._in_flight:
            self._bulk.watch(self)

    def _ended(self, exc: Exception | None) -> None:
        """The connection closed: an answer read to the close ends here."""
        if not self.sound:
            return
        if not self._ranges:
            self._drop()
            return
        assert self.run is not None
        if self._reader is None and self._buf:
            self._reader = ResponseReader(max_body=self.run.max_body)
            rest, self._buf = self._buf, bytearray()
            try:
                self._reader.adopt(rest)
            except (httpx.RemoteProtocolError, BodyTooLargeError) as err:
                self.fail(err)
                return
        if self._reader is None:
            self.fail(httpx.ReadError("the connection closed"))
            return
        try:
            self._reader.feed(b"")
        except httpx.RemoteProtocolError as err:
            self.fail(httpx.ReadError(f"{type(exc).__name__}: {exc}") if exc else err)
            return
        if self._other():
            self._drop()

    def fail(self, exc: Exception) -> None:
        """The oldest request in flight fails with `exc`; those behind it go again."""
        if self._ranges and self.run is not None:
            self.run.fail(self._oldest(), exc)
        self._drop()

    def _drop(self) -> None:
        """Close; the requests still in flight go again (on other connections)."""
        run = self.run
        if run is not None:
            for start, end in self._ranges:
                run.again.extend(range(start, end))
        self._ranges.clear()
        self._in_flight = 0
        self._reader = None
        self._buf = bytearray()
        was_sound = self.sound
        self.close()
        if was_sound:
            self._bulk.lost(self)

