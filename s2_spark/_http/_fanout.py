"""Many small requests at once from threaded code: the driver's tail lookups over
thousands of streams, a task's reads of many small ranges.

A pool of threads on the sync client costs 0.5-0.6 ms of CPU a request at 16-32 threads
(every answer hands the GIL around), where one thread would spend 0.22 ms; and the
threads are there only to wait for the network together. A `Fanout` waits for all of a
batch's answers on one asyncio loop (a daemon thread of its own) over up to `width`
`AsyncConnection`s per origin, kept from batch to batch: 0.15 ms a request, answers as
fast as the service gives them (4,500 tail lookups a second against the local server,
where 8-32 threads reached 1,500-2,000).

A failed request is returned as its exception, never retried here: callers send it again
through their client's own path, which retries by deadline and reports typed errors.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from s2_spark._closeable import Closeable

from ._async_connection import AsyncConnection, AsyncTimeouts
from ._response import Response

__all__ = ["FANOUT_WIDTH", "Call", "Fanout", "FollowUp"]

Headers = list[tuple[bytes, bytes]]
#: Connections a fan-out keeps per origin: requests in flight at once. On a loopback they
#: are answered about as fast as sent; 20 ms away, 64 still send 3,000 a second.
FANOUT_WIDTH = 64


@dataclass(frozen=True, slots=True)
class Call:
    """One request of a fan-out: `target` is the path (and query) under `base_url`."""

    method: bytes
    base_url: str
    target: str
    headers: Headers = field(repr=False)  # credentials
    content: bytes | None = None


#: `Fanout.run`'s `then`: the request to send after call i's response, or None.
FollowUp = Callable[[int, Response], "Call | None"]


class Fanout(Closeable):
    """Sends the calls of `run` concurrently; any thread may call it."""

    def __init__(self, ssl_context: Callable[[], ssl.SSLContext], timeouts: AsyncTimeouts,
                 *, width: int = FANOUT_WIDTH) -> None:
        self._ssl_context = ssl_context
        self._timeouts = timeouts
        self._width = width
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        # Loop thread only: idle connections and free places per origin.
        self._idle: dict[str, list[AsyncConnection]] = {}
        self._slots: dict[str, asyncio.Semaphore] = {}

    def __repr__(self) -> str:
        return f"Fanout(width={self._width})"

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
        return asyncio.run_coroutine_threadsafe(self._all(calls, limit, then),
                                                self._started()).result()

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

    async def _all(self, calls: Sequence[Call], limit: int | None, then: FollowUp | None
                   ) -> list[Response | Exception]:
        mine = asyncio.Semaphore(limit) if limit is not None else contextlib.nullcontext()
        done = await asyncio.gather(*(self._chain(i, c, mine, then)
                                      for i, c in enumerate(calls)),
                                    return_exceptions=True)
        out: list[Response | Exception] = []
        for result in done:
            if isinstance(result, BaseException) and not isinstance(result, Exception):
                raise result  # cancelled, interrupted: not a failed request
            out.append(result)
        return out

    async def _chain(self, i: int, call: Call | None,
                     mine: contextlib.AbstractAsyncContextManager[Any],
                     then: FollowUp | None) -> Response:
        """Call `call`, then what `then` asks for in reply, until it asks for nothing."""
        response = None
        while call is not None:
            response = await self._one(call, mine)
            call = then(i, response) if then is not None else None
        assert response is not None
        return response

    async def _one(self, call: Call, mine: contextlib.AbstractAsyncContextManager[Any]
                   ) -> Response:
        slots = self._slots.get(call.base_url)
        if slots is None:
            slots = self._slots[call.base_url] = asyncio.Semaphore(self._width)
        async with mine, slots:
            idle = self._idle.setdefault(call.base_url, [])
            conn = idle.pop() if idle else AsyncConnection(call.base_url, self._ssl_context)
            try:
                return await conn.request(call.method, call.target, call.headers,
                                          self._timeouts, content=call.content)
            finally:
                if conn.connected:
                    idle.append(conn)

    async def _drop_connections(self) -> None:
        for idle in self._idle.values():
            for conn in idle:
                conn.close()
        self._idle.clear()
