"""Tail lookups in bulk: thousands of GETs whose answers are read straight into arrays.

A fan-out request costs its loop thread a callback, a token, a `Response` and a future's
bookkeeping per answer: 26-29 us of a tail lookup's 31-33 us (issue 54). Here the
requests of a run are its targets joined between two affixes built once, pipelined
`depth` deep on up to `width` connections per origin; the answers that came together are
read in one C call (`_fastwire.h1_tails`: a plain 200 in S2's own spelling of a tail),
their positions written into two arrays. A `TailPipe` is a `Pipe` (`_pipe`, the
connection's life as a `Pipeline`'s) of GETs only: an answer of any other kind (an error
status, another spelling, a body framed otherwise, a fault) is read by `ResponseReader` as
a `Pipeline` reads it and kept as its `Response` (or exception) in `others`, for the
caller to handle as it handles a fan-out's answer; a request behind one that failed or
closed its connection goes again (GETs only: taken twice, no harm).

The answers are read many at a time, not as they come: a server writes each on its own
(s2-lite does), and a loop that reads them as they come (it keeps up with the server, so
it always does) spends a wake-up, a read and a write (its refill) per answer, more than
the C that reads it: 1.1-1.9 answers a read, 15-45 us of client CPU a lookup on s2-lite,
the most where the server is slowest. So a connection that has read its answers and has
more in flight rests `READ_WINDOW` before it reads again, and the fan-out's requests in
flight go on at most `BULK_WIDTH` connections, deeper (`bulk_shape`): each read then
takes what one connection got in the window (10-20 answers on s2-lite).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import ssl
from array import array
from collections import deque
from collections.abc import Callable, Sequence

from s2_spark.wire._accelerator import fastwire

from ._async_connection import AsyncTimeouts
from ._h1 import MAX_HEAD_BYTES, ResponseReader
from ._pipe import Deadlines, Pipe
from ._response import Response

__all__ = ["BULK_TAILS", "BulkTails", "TailRun"]

Headers = list[tuple[bytes, bytes]]
#: Whether this install reads tail answers in bulk (the C decoders are there).
BULK_TAILS = fastwire is not None
#: Seconds a bulk connection waits, once it has read its answers, before it reads again
#: (the requests in flight are tens of ms of the server's work: none the slower for it).
READ_WINDOW = 0.002
#: The most connections per origin the bulk runs use: the fewer, the more answers each
#: gets in a window.
BULK_WIDTH = 8


def bulk_shape(width: int, depth: int) -> tuple[int, int]:
    """(connections, depth) for a fan-out of `width` x `depth`: as many requests in flight
    (a server 20 ms away is as busy), on at most `BULK_WIDTH` connections."""
    conns = min(width, BULK_WIDTH)
    return conns, width * depth // conns


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

    def keep(self, i: int, result: Response | Exception) -> None:
        """Request i's answer of another kind, or the error it failed with."""
        self.others[i] = result
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
                 width: int, depth: int, deadlines: Deadlines) -> None:
        self._ssl_context = ssl_context
        self._timeouts = timeouts
        self._width = width
        self.depth = depth
        self._deadlines = deadlines  # the fan-out's
        self._origins: dict[str, _Origin] = {}
        self._runs: set[TailRun] = set()
        self._opening: set[asyncio.Task[None]] = set()
        self._conns: set[TailPipe] = set()  # open
        self._resting: list[TailPipe] = []  # not reading until `_wake`
        self._waking: asyncio.TimerHandle | None = None

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
        for _ in range(min(self._width - origin.open, -(-unsent // self.depth))):
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
        conn = TailPipe(run.base_url, self._ssl_context, self, origin, self._deadlines)
        try:
            await conn.connect(self._timeouts)
        except Exception as exc:
            origin.open -= 1
            if origin.open == 0:  # none to send them: every request waiting fails so
                self._fail_unsent(origin, exc)
            return
        self._conns.add(conn)
        self.free(conn)

    @staticmethod
    def _fail_unsent(origin: _Origin, exc: Exception) -> None:
        while origin.runs:
            run = origin.runs.popleft()
            run.queued = False
            for start, end in run.take(len(run.again) + len(run.targets)):
                for i in range(start, end):
                    run.keep(i, exc)

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
        self._conns.discard(conn)
        if conn in origin.idle:
            origin.idle.remove(conn)
        if conn.run is not None:
            self.queue(origin, conn.run)

    def rest(self, conn: TailPipe) -> None:
        """`conn` read its answers and has more in flight: it reads again (with every
        other that rests by then) after `READ_WINDOW`, many answers at once."""
        if self._waking is None:
            self._waking = asyncio.get_running_loop().call_later(READ_WINDOW, self._wake)
        self._resting.append(conn)
        conn.pause()

    def _wake(self) -> None:
        resting, self._resting, self._waking = self._resting, [], None
        for conn in resting:
            conn.resume()

    def close(self) -> None:
        if self._waking is not None:
            self._waking.cancel()
            self._waking = None
        self._resting.clear()
        for task in list(self._opening):
            task.cancel()
        for conn in self._conns:
            conn.close()
        self._origins.clear()
        self._conns.clear()
        for run in list(self._runs):
            if not run.answered.done():
                run.answered.set_exception(RuntimeError("the fan-out was closed"))
        self._runs.clear()


class TailPipe(Pipe[int]):
    """One connection of bulk tail lookups, up to `depth` in flight, answered in order
    (loop thread). `_ranges`: the requests in flight, oldest first, as [start, end) of
    its run's."""

    def __init__(self, base_url: str, ssl_context: Callable[[], ssl.SSLContext],
                 bulk: BulkTails, origin: _Origin, deadlines: Deadlines) -> None:
        super().__init__(base_url, ssl_context, deadlines)
        self._bulk = bulk
        self.origin = origin
        self.run: TailRun | None = None
        self._ranges: deque[list[int]] = deque()

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
        ranges = run.take(self._bulk.depth - self.in_flight)
        if not ranges:
            return
        before, after = run.affixes
        targets = run.targets
        out = []
        for start, end in ranges:
            self._ranges.append([start, end])
            self.in_flight += end - start
            out += [before + t + after for t in targets[start:end]]
        self._sent()
        self._transport.write(b"".join(out))

    def pause(self) -> None:
        if self._transport is not None:
            self._transport.pause_reading()

    def resume(self) -> None:
        if self._transport is not None:
            self._transport.resume_reading()

    def close(self) -> None:
        super().close()
        self._ranges.clear()
        self.in_flight = 0

    # -- what `Pipe` asks ------------------------------------------------------------------

    def _read_plain(self, buf: bytearray) -> tuple[int, bool]:
        """The plain 200s in C (`h1_tails`), straight into the run's arrays."""
        assert fastwire is not None and self.run is not None
        run, ranges, pos = self.run, self._ranges, 0
        while ranges and pos < len(buf):
            r = ranges[0]
            k, pos, stop = fastwire.h1_tails(buf, pos, MAX_HEAD_BYTES, run.max_body,
                                             run.seqs, run.tss, r[0], r[1] - r[0])
            if k:
                r[0] += k
                self.in_flight -= k
                run.settle(k)
                if r[0] == r[1]:
                    ranges.popleft()
            if stop:
                return pos, stop == 2
        return pos, False

    def _new_reader(self) -> ResponseReader:
        assert self.run is not None
        self._limit = self.run.max_body
        self._reader = ResponseReader(max_body=self._limit)
        return self._reader

    def _pop(self) -> int:
        r = self._ranges[0]
        i = r[0]
        r[0] += 1
        if r[0] == r[1]:
            self._ranges.popleft()
        self.in_flight -= 1
        return i

    def _give(self, request: int, result: Response | Exception) -> None:
        assert self.run is not None
        self.run.keep(request, result)

    def _again(self, request: int) -> None:
        assert self.run is not None
        self.run.again.append(request)

    def _idempotent(self, request: int) -> bool:
        return True  # GETs

    def _progressed(self) -> None:
        """More of the run's requests, or the next run's, or idle; the answers to those
        in flight are read after a rest."""
        run = self.run
        assert run is not None
        if run.unsent:
            self._send()
        elif not self.in_flight:
            self._bulk.free(self)
        if self.in_flight:
            self._bulk.rest(self)

    def _lost(self) -> None:
        self._bulk.lost(self)
