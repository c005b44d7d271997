"""Tail lookups, small reads and appends in bulk: thousands of requests whose answers are
read straight into arrays.

A fan-out request costs its loop thread a callback, a token, a `Response` and a future's
bookkeeping per answer: 26-29 us of a tail lookup's 31-33 us, 35-60 us of an append
(issue 54). Here the requests of a run are its targets (and an append's length and body)
joined between affixes built once, pipelined up to a depth on up to `width` connections
per origin; the answers that came together are read in one C call (`_fastwire.h1_tails`:
a plain 200 in S2's own spelling of a tail; `h1_acks`: a plain 200 AppendAck), their two
numbers written into two arrays (`h1_bodies`, a small read's: where its body lies, taken
as bytes for `decode_read_many`, which decodes the run's ReadBatches together). A
`BulkPipe` is a `Pipe` (`_pipe`, the connection's life as a `Pipeline`'s) of one run's
requests at a time: an answer of any other kind (an error status, another spelling, a
coded body or one framed otherwise, a fault) is read by
`ResponseReader` as a `Pipeline` reads it and kept as its `Response` (or exception) in
`others`, for the caller to handle as it handles a fan-out's answer. A request behind one
that failed or closed its connection goes again if it is a GET (taken twice, no harm);
an append there fails with that failure (it may have landed), as the fan-out's would.

The answers are read many at a time, not as they come: a server writes each on its own
(s2-lite does), and a loop that reads them as they come (it keeps up with the server, so
it always does) spends a wake-up, a read and a write (its refill) per answer, more than
the C that reads it: 1.1-1.9 answers a read, 15-45 us of client CPU a lookup on s2-lite,
the most where the server is slowest. So a connection that has read its answers and has
more in flight rests `READ_WINDOW` before it reads again, and the fan-out's requests in
flight go on at most `BULK_WIDTH` connections, deeper (`bulk_shape`): each read then
takes what one connection got in the window (10-20 answers on s2-lite). Appends are
answered otherwise: an `AppendRun`'s connections carry one each and never rest.
"""

from __future__ import annotations

import abc
import asyncio
import concurrent.futures
import ssl
from array import array
from collections import deque
from collections.abc import Callable, Sequence

from s2_spark.wire._accelerator import fastwire

from ._async_connection import AsyncConnection, AsyncTimeouts
from ._h1 import MAX_HEAD_BYTES, ResponseReader
from ._pipe import Deadlines, Pipe
from ._response import Response

__all__ = ["BULK_TAILS", "AppendRun", "BulkRun", "BulkRuns", "ReadRun", "TailRun"]

Headers = list[tuple[bytes, bytes]]
#: Whether this install reads tail, read and append answers in bulk (the C decoders are
#: there).
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


class BulkRun(abc.ABC):
    """One bulk run's requests, a target each under `base_url`: `columns[0][i]`,
    `columns[1][i]` the two numbers read from request i's plain answer where `others` has
    no entry for it, else its answer of another kind or the error it failed with. A
    subclass says how its requests are written and its answers read. At most `limit` in
    flight at once, on up to `width` connections, `depth` on each (`BulkRuns.begin` sets
    them; None: as many as the bulk's connections carry). Loop thread, but for `answered`
    and what is read once it is set."""

    __slots__ = ("affixes", "again", "answered", "base_url", "columns", "depth", "headers",
                 "left", "limit", "max_body", "next", "others", "out", "queued", "targets",
                 "width")

    #: Whether a request may go again after the server may have taken it (a GET).
    idempotent = True
    #: Whether a connection that read its answers rests before it reads again.
    rests = True

    def __init__(self, base_url: str, targets: Sequence[bytes], headers: Headers,
                 max_body: int, limit: int | None = None) -> None:
        self.base_url = base_url
        self.targets = targets
        self.headers = headers
        self.max_body = max_body
        self.limit = limit
        self.width: int | None = None
        self.depth: int | None = None
        self.columns = (array("Q", bytes(8 * len(targets))), array("Q", bytes(8 * len(targets))))
        self.others: dict[int, Response | Exception] = {}
        self.affixes: tuple[bytes, ...] | None = None  # the first connection's
        self.next = 0  # the next request never sent
        self.again: deque[int] = deque()  # requests to send again
        self.left = len(targets)  # requests without their answer
        self.out = 0  # requests taken to send, without their answer
        self.queued = False  # among its origin's runs with requests to send
        self.answered: concurrent.futures.Future[None] = concurrent.futures.Future()

    @property
    def unsent(self) -> bool:
        return bool(self.again) or self.next < len(self.targets)

    @property
    def room(self) -> bool:
        """Whether it may send one more now (its `limit`)."""
        return self.limit is None or self.out < self.limit

    def settle(self, k: int) -> None:
        self.left -= k
        self.out -= k
        if self.left == 0 and not self.answered.done():
            self.answered.set_result(None)

    def keep(self, i: int, result: Response | Exception) -> None:
        """Request i's answer of another kind, or the error it failed with."""
        self.others[i] = result
        self.settle(1)

    def resend(self, i: int) -> None:
        """Request i goes again (the server did not take it, or may take it twice)."""
        self.again.append(i)
        self.out -= 1

    def take(self, room: int) -> list[tuple[int, int]]:
        """Up to `room` requests to send (fewer at its `limit`), as ranges [start, end),
        those sent again first."""
        if self.limit is not None:
            room = min(room, self.limit - self.out)
        ranges = []
        again = self.again
        while again and room > 0:
            i = again.popleft()
            ranges.append((i, i + 1))
            room -= 1
            self.out += 1
        if room > 0 and self.next < len(self.targets):
            end = min(len(self.targets), self.next + room)
            ranges.append((self.next, end))
            self.out += end - self.next
            self.next = end
        return ranges

    def fail_unsent(self, exc: Exception) -> None:
        """Every request not sent yet fails with `exc` (none can be sent)."""
        unsent = [*self.again, *range(self.next, len(self.targets))]
        self.again.clear()
        self.next = len(self.targets)
        self.out += len(unsent)
        for i in unsent:
            self.keep(i, exc)

    def set_affixes(self, conn: AsyncConnection) -> None:
        """What each request is joined between, as `conn` writes it (every connection
        of the origin alike)."""
        self.affixes = conn.get_affixes(self.headers)

    def requests(self, start: int, end: int) -> list[bytes]:
        """Requests `start` .. `end`, as written: in one join (one bytes a request, then
        joined again for the write, cost a tail lookup or read 0.5 us)."""
        assert self.affixes is not None
        if start >= end:
            return []
        before, after = self.affixes
        return [before, (after + before).join(self.targets[start:end]), after]

    @abc.abstractmethod
    def read(self, buf: bytearray, pos: int, first: int, count: int) -> tuple[int, int, int]:
        """The plain answers in `buf` from `pos` to requests `first` .. (up to `count`),
        read in C into `columns`: as `_fastwire.h1_tails` returns."""


class TailRun(BulkRun):
    """Tail lookups: `seqs[i]`, `tss[i]` the tail of request i (a plain 200 answer)."""

    __slots__ = ()

    @property
    def seqs(self) -> array[int]:
        return self.columns[0]

    @property
    def tss(self) -> array[int]:
        return self.columns[1]

    def read(self, buf: bytearray, pos: int, first: int, count: int) -> tuple[int, int, int]:
        assert fastwire is not None
        return fastwire.h1_tails(buf, pos, MAX_HEAD_BYTES, self.max_body,  # type: ignore[no-any-return]
                                 *self.columns, first, count)


class ReadRun(BulkRun):
    """Small reads (GETs): `bodies[i]` the body of request i's plain 200 answer, as it
    came (a ReadBatch), None where `others` has its answer. `h1_bodies` says where each
    lies in the connection's buffer (into `columns`); it is copied out before the buffer
    moves on, one bytes per read as the fan-out's `Response` held, and no other object."""

    __slots__ = ("bodies",)

    def __init__(self, base_url: str, targets: Sequence[bytes], headers: Headers,
                 max_body: int) -> None:
        super().__init__(base_url, targets, headers, max_body)
        self.bodies: list[bytes | None] = [None] * len(targets)

    def read(self, buf: bytearray, pos: int, first: int, count: int) -> tuple[int, int, int]:
        assert fastwire is not None
        offsets, lengths = self.columns
        got: tuple[int, int, int] = fastwire.h1_bodies(
            buf, pos, MAX_HEAD_BYTES, self.max_body, offsets, lengths, first, count)
        if got[0]:
            bodies = self.bodies
            with memoryview(buf) as view:  # released before the buffer is cut
                for i in range(first, first + got[0]):
                    at = offsets[i]
                    bodies[i] = view[at:at + lengths[i]].tobytes()
        return got


class AppendRun(BulkRun):
    """Appends, POSTs of `bodies[i]` (protobuf AppendInput) to target i: `starts[i]`,
    `ends[i]` request i's ack (a plain 200 AppendAck). Never sent twice: one whose answer
    was not read when its connection failed is kept in `others` as that failure (it may
    have landed: the caller knows how to find out).

    One in flight a connection, on as many as its `limit` (up to the fan-out's width),
    none resting: s2-lite answers a connection's appends one at a time, each after its
    durability wait (~6 ms), so a deeper connection or a rest got no more answers a read,
    only waits (8 connections 8 deep: 4-7x the wall time, 10,000 appends)."""

    __slots__ = ("bodies",)

    idempotent = False
    rests = False

    def __init__(self, base_url: str, targets: Sequence[bytes], headers: Headers,
                 bodies: Sequence[bytes], max_body: int, limit: int | None) -> None:
        super().__init__(base_url, targets, headers, max_body, limit)
        self.bodies = bodies

    @property
    def starts(self) -> array[int]:
        return self.columns[0]

    @property
    def ends(self) -> array[int]:
        return self.columns[1]

    def set_affixes(self, conn: AsyncConnection) -> None:
        self.affixes = conn.post_affixes(self.headers)

    def requests(self, start: int, end: int) -> list[bytes]:
        assert self.affixes is not None
        before, mid, after = self.affixes
        targets, bodies = self.targets, self.bodies
        out: list[bytes] = []
        for i in range(start, end):
            body = bodies[i]
            out += (before, targets[i], mid, b"%d" % len(body), after, body)
        return out

    def read(self, buf: bytearray, pos: int, first: int, count: int) -> tuple[int, int, int]:
        assert fastwire is not None
        return fastwire.h1_acks(buf, pos, MAX_HEAD_BYTES, self.max_body,  # type: ignore[no-any-return]
                                *self.columns, first, count)


class _Origin:
    """One origin's bulk connections: idle ones, how many are open or opening, and the
    runs with requests to send (loop thread)."""

    __slots__ = ("idle", "open", "runs")

    def __init__(self) -> None:
        self.idle: list[BulkPipe] = []
        self.open = 0
        self.runs: deque[BulkRun] = deque()


class BulkRuns:
    """The bulk runs of a `Fanout` (its loop thread)."""

    def __init__(self, ssl_context: Callable[[], ssl.SSLContext], timeouts: AsyncTimeouts,
                 width: int, depth: int, deadlines: Deadlines, wide: int) -> None:
        self._ssl_context = ssl_context
        self._timeouts = timeouts
        self._width = width
        self._wide = wide  # the most connections per origin of a run with a limit
        self.depth = depth
        self._deadlines = deadlines  # the fan-out's
        self._origins: dict[str, _Origin] = {}
        self._runs: set[BulkRun] = set()
        self._opening: set[asyncio.Task[None]] = set()
        self._conns: set[BulkPipe] = set()  # open
        self._resting: list[BulkPipe] = []  # not reading until `_wake`
        self._waking: asyncio.TimerHandle | None = None

    def begin(self, run: BulkRun) -> None:
        if run.limit is not None:  # its requests in flight, one a connection
            run.width = min(run.limit, self._wide)
            run.depth = -(-run.limit // run.width)
        self._runs.add(run)
        run.answered.add_done_callback(lambda _: self._runs.discard(run))
        origin = self._origins.get(run.base_url)
        if origin is None:
            origin = self._origins[run.base_url] = _Origin()
        self.queue(origin, run)

    def queue(self, origin: _Origin, run: BulkRun) -> None:
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
        if run_.limit is not None:
            unsent = min(unsent, run_.limit - run_.out)
        width = self._width if run_.width is None else run_.width
        for _ in range(min(width - origin.open, -(-unsent // self.depth_of(run_)))):
            origin.open += 1
            task = asyncio.get_running_loop().create_task(self._connect(origin, run_))
            self._opening.add(task)
            task.add_done_callback(self._opening.discard)

    def depth_of(self, run: BulkRun) -> int:
        """Requests of `run` in flight on one connection at most."""
        return self.depth if run.depth is None else min(self.depth, run.depth)

    @staticmethod
    def work(origin: _Origin) -> BulkRun | None:
        """The first of the origin's runs with requests to send now (short of its limit)."""
        runs = origin.runs
        while runs and not runs[0].unsent:
            runs.popleft().queued = False
        return next((run for run in runs if run.room and run.unsent), None)

    async def _connect(self, origin: _Origin, run: BulkRun) -> None:
        conn = BulkPipe(run.base_url, self._ssl_context, self, origin, self._deadlines)
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
            run.fail_unsent(exc)

    def free(self, conn: BulkPipe) -> None:
        """A connection with nothing in flight: it takes the next run's requests, or idles."""
        run = self.work(conn.origin)
        if run is not None:
            conn.serve(run)
        else:
            conn.origin.idle.append(conn)

    def lost(self, conn: BulkPipe) -> None:
        """A connection closed: the others, or a new one, take what it had to send again."""
        origin = conn.origin
        origin.open -= 1
        self._conns.discard(conn)
        if conn in origin.idle:
            origin.idle.remove(conn)
        if conn.run is not None:
            self.queue(origin, conn.run)

    def rest(self, conn: BulkPipe) -> None:
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


class BulkPipe(Pipe[int]):
    """One connection of bulk runs, one run at a time, up to its depth in flight,
    answered in order (loop thread). `_ranges`: the requests in flight, oldest first, as
    [start, end) of its run's."""

    def __init__(self, base_url: str, ssl_context: Callable[[], ssl.SSLContext],
                 bulk: BulkRuns, origin: _Origin, deadlines: Deadlines) -> None:
        super().__init__(base_url, ssl_context, deadlines)
        self._bulk = bulk
        self.origin = origin
        self.run: BulkRun | None = None
        self._ranges: deque[list[int]] = deque()

    def serve(self, run: BulkRun) -> None:
        """Send `run`'s next requests, up to its depth in flight."""
        assert self._transport is not None
        if run is not self.run:
            self.run = run
            if run.affixes is None:
                run.set_affixes(self._conn)
        self._send()

    def _send(self) -> None:
        run = self.run
        assert run is not None and self._transport is not None and run.affixes is not None
        ranges = run.take(self._bulk.depth_of(run) - self.in_flight)
        if not ranges:
            return
        out = []
        for start, end in ranges:
            self._ranges.append([start, end])
            self.in_flight += end - start
            out += run.requests(start, end)
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
        """The plain 200s in C (`BulkRun.read`), straight into the run's arrays."""
        assert self.run is not None
        run, ranges, pos = self.run, self._ranges, 0
        while ranges and pos < len(buf):
            r = ranges[0]
            k, pos, stop = run.read(buf, pos, r[0], r[1] - r[0])
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
        self.run.resend(request)

    def _idempotent(self, request: int) -> bool:
        assert self.run is not None
        return self.run.idempotent

    def _progressed(self) -> None:
        """More of the run's requests, or the next run's, or idle; the answers to those
        in flight are read after a rest (if the run rests)."""
        run = self.run
        assert run is not None
        if run.unsent:
            self._send()
        if not self.in_flight:
            self._bulk.free(self)
        if self.in_flight and run.rests:
            self._bulk.rest(self)

    def _lost(self) -> None:
        self._bulk.lost(self)
