"""Many small requests at once from threaded code: the driver's tail lookups over
thousands of streams, a task's reads of many small ranges.

A pool of threads on the sync client costs 0.5-0.6 ms of CPU a request at 16-32 threads
(every answer hands the GIL around), where one thread would spend 0.22 ms; and the
threads are there only to wait for the network together. A `Fanout` waits for all of a
batch's answers on one asyncio loop (a daemon thread of its own) over up to `width`
connections per origin, kept from batch to batch, each carrying up to `depth` requests
at once (HTTP/1.1 pipelining, `Pipeline`): the requests of one turn of the loop go out
in one write and the answers that come back together are read in one pass, where one
request at a time cost a write, a read and a turn of the loop each (half the CPU of a
tail lookup, measured against s2-lite).

A failed request is returned as its exception, never retried here: callers send it again
through their client's own path, which retries by deadline and reports typed errors. Sent
again here are only the requests the server never took (behind an answer that closed
their connection) and GETs queued behind a request that failed (`ResendError`).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import ssl
import threading
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TypeVar, cast

from s2_spark._closeable import Closeable

from ._async_connection import AsyncTimeouts
from ._bulk import AppendRun, BulkRun, BulkRuns, ReadRun, TailRun, bulk_shape
from ._pipe import Deadlines
from ._pipeline import Flusher, Pipeline, ResendError
from ._response import MAX_BODY_BYTES, Response

__all__ = ["FANOUT_WIDTH", "Call", "Fanout", "FollowUp"]

Headers = list[tuple[bytes, bytes]]
#: Connections a fan-out keeps per origin: requests in flight at once. On a loopback they
#: are answered about as fast as sent; 20 ms away, 64 still send 3,000 a second.
FANOUT_WIDTH = 64
#: Requests in flight at once on one of those connections (HTTP/1.1 pipelining): those
#: sent in one turn of the loop go out in one write, and answers that come back together
#: are read in one pass.
PIPELINE_DEPTH = 16


@dataclass(slots=True)  # not frozen: that costs twice as much to make, thousands a run
class Call:
    """One request of a fan-out: `target` is the path (and query) under `base_url`;
    `max_body`, the most of its answer's body taken (a run holds every answer until its
    last: a call whose answer is small says so, and a server cannot make the run's
    answers together any larger than that many times it)."""

    method: bytes
    base_url: str
    target: str
    headers: Headers = field(repr=False)  # credentials
    content: bytes | None = None
    max_body: int = MAX_BODY_BYTES


BulkRunT = TypeVar("BulkRunT", bound=BulkRun)
#: `Fanout.run`'s `then`: the request to send after call i's response, or None.
FollowUp = Callable[[int, Response], "Call | None"]


class _Run:
    """One `run`'s calls as they go out and come back (loop thread, but for `answered`)."""

    __slots__ = ("answered", "calls", "in_flight", "left", "limit", "next", "results", "then")

    def __init__(self, calls: Sequence[Call], limit: int | None, then: FollowUp | None
                 ) -> None:
        self.calls = calls
        self.limit = len(calls) if limit is None else max(1, limit)
        self.then = then
        self.results: list[Response | Exception | None] = [None] * len(calls)
        self.next = 0  # the next call to send
        self.in_flight = 0
        self.left = len(calls)  # calls without their last answer yet
        self.answered: concurrent.futures.Future[None] = concurrent.futures.Future()


class _Pool:
    """One origin's connections: those open, those with room for one more request (in
    turn), how many are open or opening, and the requests waiting for room (loop thread)."""

    __slots__ = ("conns", "open", "spare", "waiting")

    def __init__(self) -> None:
        self.conns: set[Pipeline] = set()
        self.spare: deque[Pipeline] = deque()
        self.open = 0
        self.waiting: deque[tuple[_Run, int, Call]] = deque()


class Fanout(Closeable):
    """Sends the calls of `run` concurrently; any thread may call it.

    Loop side, a request is a connection's callback, not a task: each answer hands its
    connection the next request waiting for one, so a request costs the loop its bytes
    out, its answer in and a call or two."""

    def __init__(self, ssl_context: Callable[[], ssl.SSLContext], timeouts: AsyncTimeouts,
                 *, width: int = FANOUT_WIDTH, depth: int = PIPELINE_DEPTH) -> None:
        self._ssl_context = ssl_context
        self._timeouts = timeouts
        self._width = width
        self._depth = depth
        self._flusher = Flusher()  # loop thread only
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        # Loop thread only: each origin's connections, the runs not answered yet and the
        # connections being opened.
        self._pools: dict[str, _Pool] = {}
        self._runs: set[_Run] = set()
        self._opening: set[asyncio.Task[None]] = set()
        self._deadlines = Deadlines(timeouts.read)  # of every connection, bulk ones too
        self._bulk = BulkRuns(ssl_context, timeouts, *bulk_shape(width, depth),
                              self._deadlines, width)

    def __repr__(self) -> str:
        return f"Fanout(width={self._width}, depth={self._depth})"

    def run(self, calls: Sequence[Call], *, limit: int | None = None,
            then: FollowUp | None = None) -> list[Response | Exception]:
        """Each call's response (any status), or the exception it failed with; at most
        `limit` of these calls in flight at once (and `width` per origin in all).

        `then(i, response)` (run on the fan-out's loop: quick, no I/O) may answer a
        response of call i with the next request to send in its place: call i's result
        is then the last response of that chain (a missing stream created, then the
        append sent again, at once rather than in another round)."""
        if not calls:
            return []
        run = _Run(calls, limit, then)
        self._started().call_soon_threadsafe(self._begin, run)
        run.answered.result()
        return run.results  # type: ignore[return-value]  # every one set by now

    def run_tails(self, base_url: str, targets: Sequence[bytes], headers: Headers,
                  max_body: int) -> TailRun:
        """Tail lookups, a GET of each target under `base_url`, their answers read in bulk
        (`_bulk`: positions into arrays, answers of another kind kept as they are).
        Only where `_bulk.BULK_TAILS` (the C decoders are there)."""
        return self._bulk_run(TailRun(base_url, targets, headers, max_body))

    def run_reads(self, base_url: str, targets: Sequence[bytes], headers: Headers,
                  max_body: int) -> ReadRun:
        """Small reads, a GET of each target under `base_url`, read in bulk as `run_tails`
        reads tails: each plain answer's body as bytes, any other kept as it is."""
        return self._bulk_run(ReadRun(base_url, targets, headers, max_body))

    def run_appends(self, base_url: str, targets: Sequence[bytes], headers: Headers,
                    bodies: Sequence[bytes], max_body: int, limit: int) -> AppendRun:
        """Appends, a POST of `bodies[i]` to `targets[i]` under `base_url` (at most
        `limit` in flight), their acks read in bulk as `run_tails` reads tails; never
        sent twice (an unknown outcome is kept as its failure)."""
        return self._bulk_run(AppendRun(base_url, targets, headers, bodies, max_body, limit))

    def _bulk_run(self, run: BulkRunT) -> BulkRunT:
        if run.targets:
            self._started().call_soon_threadsafe(self._bulk.begin, run)
            run.answered.result()
        return run

    def close(self) -> None:
        with self._lock:
            loop, thread, self._loop, self._thread = self._loop, self._thread, None, None
        if loop is None or thread is None:
            return
        asyncio.run_coroutine_threadsafe(self._drop_connections(), loop).result(timeout=5)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=5)

    def _started(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self._loop is None:
                loop = asyncio.new_event_loop()
                thread = threading.Thread(target=loop.run_forever, name="s2-spark-fanout",
                                          daemon=True)
                thread.start()
                self._loop, self._thread = loop, thread
            return self._loop

    # -- the loop thread ---------------------------------------------------------------------

    def _begin(self, run: _Run) -> None:
        self._runs.add(run)
        self._feed(run)

    def _feed(self, run: _Run) -> None:
        """Send the run's next calls, up to its limit."""
        calls = run.calls
        while run.in_flight < run.limit and run.next < len(calls):
            i = run.next
            run.next += 1
            run.in_flight += 1
            self._submit(run, i, calls[i])

    def _submit(self, run: _Run, i: int, call: Call) -> None:
        """Send call i of `run` on a connection of its origin with room (in turn), else on
        a new one if the origin has fewer than `width`, else once one has room."""
        pool = self._pools.get(call.base_url)
        if pool is None:
            pool = self._pools[call.base_url] = _Pool()
        spare = pool.spare
        while spare:
            conn = spare[0]
            if not conn.room:
                spare.popleft()
                conn.listed = False
                if not conn.sound and conn in pool.conns:  # closed while idle
                    self._drop(pool, conn)
                continue
            spare.rotate(-1)
            self._send(conn, run, i, call)
            return
        if pool.open < self._width:
            pool.open += 1
            self._open(pool, run, i, call)
        else:
            pool.waiting.append((run, i, call))

    def _open(self, pool: _Pool, run: _Run, i: int, call: Call) -> None:
        task = asyncio.get_running_loop().create_task(self._connect(pool, run, i, call))
        self._opening.add(task)
        task.add_done_callback(self._opening.discard)

    async def _connect(self, pool: _Pool, run: _Run, i: int, call: Call) -> None:
        conn = Pipeline(call.base_url, self._ssl_context, self._answered, self._depth,
                        self._flusher, self._deadlines)
        try:
            await conn.connect(self._timeouts)
        except Exception as exc:
            pool.open -= 1
            self._settled(run, i, exc)
            self._next_waiting(pool)
            return
        pool.conns.add(conn)
        self._send(conn, run, i, call)
        self._fill(pool, conn)

    @staticmethod
    def _send(conn: Pipeline, run: _Run, i: int, call: Call) -> None:
        conn.send(call.method, call.target, call.headers, call.content, call.max_body,
                  (run, i, call))

    def _answered(self, conn: Pipeline, token: object, result: Response | Exception
                  ) -> None:
        """(A pipeline) a call's answer: the follow-up `then` asks for goes out, else it is
        the call's result; a call the server never took goes out again as it was."""
        run, i, call = cast("tuple[_Run, int, Call]", token)  # what `_send` gave
        pool = self._pools[call.base_url]
        self._fill(pool, conn)
        if isinstance(result, ResendError):
            self._submit(run, i, call)
            return
        follow = None
        if run.then is not None and isinstance(result, Response):
            try:
                follow = run.then(i, result)
            except Exception as exc:
                result = exc
        if follow is not None:
            self._submit(run, i, follow)
            return
        self._settled(run, i, result)

    def _fill(self, pool: _Pool, conn: Pipeline) -> None:
        """A connection answered (or opened): the requests waiting go out on it while it
        has room; a closed one is dropped."""
        if not conn.sound:
            if conn in pool.conns:
                self._drop(pool, conn)
                self._next_waiting(pool)
            return
        while pool.waiting and conn.room:
            self._send(conn, *pool.waiting.popleft())
        if conn.room and not conn.listed:
            conn.listed = True
            pool.spare.append(conn)

    def _settled(self, run: _Run, i: int, result: Response | Exception) -> None:
        run.results[i] = result
        run.in_flight -= 1
        run.left -= 1
        if run.left == 0:
            self._runs.discard(run)
            run.answered.set_result(None)
        else:
            self._feed(run)

    @staticmethod
    def _drop(pool: _Pool, conn: Pipeline) -> None:
        conn.close()
        pool.conns.discard(conn)
        pool.open -= 1

    def _next_waiting(self, pool: _Pool) -> None:
        """A connection closed: open one for the next waiting request, if any."""
        if pool.waiting and pool.open < self._width:
            pool.open += 1
            self._open(pool, *pool.waiting.popleft())

    async def _drop_connections(self) -> None:
        self._bulk.close()
        self._deadlines.close()
        for task in list(self._opening):
            task.cancel()
        for pool in self._pools.values():
            for conn in pool.conns:
                conn.close()
        self._pools.clear()
        for run in list(self._runs):
            if not run.answered.done():
                run.answered.set_exception(RuntimeError("the fan-out was closed"))
        self._runs.clear()
