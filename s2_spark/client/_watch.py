"""TailWatch: learn which of many streams got records, without asking each one repeatedly.

S2 has no call that watches several streams, but a unary read with `wait` long-polls one:
it answers as soon as a record at or after its seq_num exists, or empty after `wait`
seconds. A watch keeps one such read outstanding per stream, all from one asyncio thread
(one connection each, over HTTP/1.1), so an idle stream costs one request per `wait`
seconds and a record appended to any stream is known about at once.

A stream is *quiet* while a read is waiting at its watched position: any record at or
after it makes that read answer, so a quiet stream has nothing new (a record appended a
moment ago may still be on its way; it is reported when it arrives). A stream that got a
record, failed (deleted, trimmed past, a network error) or is not watched yet is not
quiet: the caller looks it up itself and then watches it again from where it planned.
"""

from __future__ import annotations

import asyncio
import logging
import random
import resource
import ssl
import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from urllib.parse import quote

import httpx

from s2_spark._proto import s2_pb2

from ._transport import Transport

__all__ = ["WATCH_WAIT", "TailWatch", "watch_limit"]

log = logging.getLogger("s2_spark.client")

#: Seconds a long-poll waits server-side at most (S2 allows up to 60); each waits between
#: half that and that.
WATCH_WAIT = 20
#: Streams one watch long-polls at most (each holds a connection); see `watch_limit`.
MAX_WATCHED = 2000
#: Connections per pool (see `TailWatch._client_for`).
SHARD_CONNECTIONS = 50
_RETRY_DELAYS = (0.1, 0.5, 1.0, 2.0, 5.0)


@dataclass(eq=False)
class _Shard:
    """One connection pool of a watch, and how many streams use it."""

    client: httpx.AsyncClient
    streams: int = 0


def watch_limit() -> int:
    """`MAX_WATCHED`, or fewer where the process may open fewer than 4x as many files."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return MAX_WATCHED
    return max(0, min(MAX_WATCHED, soft // 4))


class TailWatch:
    """Long-polls the streams of one basin given to `watch`, in a daemon thread."""

    def __init__(self, transport: Transport, basin: str, *, wait: int = WATCH_WAIT,
                 limit: int | None = None) -> None:
        self._transport = transport
        self._basin = basin
        self._wait = wait
        self.limit = watch_limit() if limit is None else limit
        self._lock = threading.Lock()
        self._news = threading.Condition(self._lock)
        self._want: dict[str, int] = {}  # stream -> position to watch from
        self._quiet: dict[str, int] = {}  # stream -> position a read is waiting at
        self._changed: set[str] = set()  # got a record or failed since last looked at
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._closed = False
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        # Loop thread only: pools of connections, and which one each stream uses.
        self._shards: list[_Shard] = []
        self._shard_of: dict[str, _Shard] = {}
        self._verify: ssl.SSLContext | bool | None = None
        self._thread = threading.Thread(target=self._run, name="s2-spark-tail-watch",
                                        daemon=True)
        self._thread.start()
        self._ready.wait()

    def __repr__(self) -> str:
        return f"TailWatch(basin={self._basin!r}, streams={len(self._want)})"

    # -- the caller's side (any thread) ---------------------------------------------------

    def watch(self, positions: Mapping[str, int]) -> None:
        """Watch exactly these streams, each from its position (the next seq_num to
        plan). Streams beyond `limit` are left out (never quiet)."""
        wanted = dict(list(positions.items())[: self.limit])
        if len(positions) > self.limit:
            log.info("watching %d of %d streams (the limit); the rest are looked up on "
                     "every plan", self.limit, len(positions))
        with self._lock:
            if self._closed:
                return
            for stream in list(self._want):
                if stream not in wanted:
                    del self._want[stream]
                    self._quiet.pop(stream, None)
            for stream, pos in wanted.items():
                if self._want.get(stream) != pos or stream in self._changed:
                    self._want[stream] = pos
                    self._quiet.pop(stream, None)
                    self._changed.discard(stream)
        self._loop.call_soon_threadsafe(self._sync)

    def quiet(self, positions: Mapping[str, int]) -> set[str]:
        """The streams known to have no record at or after the given positions."""
        with self._lock:
            return {s for s, pos in positions.items() if self._quiet.get(s) == pos}

    def wait(self, streams: Iterable[str], timeout: float) -> None:
        """Return once one of `streams` is no longer quiet, or after `timeout` seconds."""
        names = set(streams)
        with self._news:
            self._news.wait_for(lambda: self._closed or not names.issubset(self._quiet),
                                timeout=timeout)

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._want.clear()
            self._quiet.clear()
            self._news.notify_all()
        self._loop.call_soon_threadsafe(self._sync)
        self._thread.join(timeout=5.0)

    # -- the watch thread -------------------------------------------------------------------

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._loop.run_until_complete(self._main())
        self._loop.close()

    async def _main(self) -> None:
        self._stopped = asyncio.Event()
        self._ready.set()
        await self._stopped.wait()
        for task in self._tasks.values():
            task.cancel()
        await asyncio.gather(*self._tasks.values(), return_exceptions=True)
        for shard in self._shards:
            await shard.client.aclose()

    def _client_for(self, stream: str) -> httpx.AsyncClient:
        """(Loop thread) the client whose pool `stream`'s polls use. httpcore looks at
        every connection of a pool on each request and response, so the polls are spread
        over pools of at most `SHARD_CONNECTIONS` connections: the cost of one stream's
        poll then does not grow with the number of streams watched."""
        shard = self._shard_of.get(stream)
        if shard is None:
            free = [s for s in self._shards if s.streams < SHARD_CONNECTIONS]
            if not free:
                free = [self._new_shard()]
            shard = self._shard_of[stream] = free[0]
            shard.streams += 1
        return shard.client

    def _new_shard(self) -> _Shard:
        cfg = self._transport.config
        if self._verify is None:
            self._verify = cfg.tls.ssl_context() if cfg.tls is not None else True
        limits = httpx.Limits(max_connections=SHARD_CONNECTIONS,
                              max_keepalive_connections=SHARD_CONNECTIONS)
        timeout = httpx.Timeout(connect=cfg.connect_timeout, read=self._wait + cfg.request_timeout,
                                write=cfg.request_timeout, pool=None)
        client = httpx.AsyncClient(limits=limits, timeout=timeout, trust_env=True,
                                   follow_redirects=False, verify=self._verify)
        self._shards.append(_Shard(client))
        return self._shards[-1]

    def _sync(self) -> None:
        """(Loop thread) start and cancel polls to match what is wanted."""
        with self._lock:
            want = dict(self._want)
            closed = self._closed
        if closed:
            self._stopped.set()
            return
        for stream, task in list(self._tasks.items()):
            if stream not in want or task.done():
                task.cancel()
                del self._tasks[stream]
            if stream not in want and stream in self._shard_of:
                self._shard_of.pop(stream).streams -= 1
        for stream in want:
            if stream not in self._tasks:
                self._tasks[stream] = self._loop.create_task(self._poll(stream))

    async def _poll(self, stream: str) -> None:
        """Long-poll `stream` (see `_poll_until_news`); when the task ends, for whatever
        reason, the stream stops being quiet."""
        try:
            await self._poll_until_news(stream)
        except Exception as exc:
            log.warning("tail watch of stream %r stopped: %r", stream, exc)
        finally:
            with self._news:  # a stream no read waits on is never quiet
                self._quiet.pop(stream, None)
                self._news.notify_all()

    async def _poll_until_news(self, stream: str) -> None:
        """Long-poll `stream` from its wanted position until it has a record there.

        An answer for a position the caller has moved on from is dropped, and the next
        poll starts from the new one. A failure makes the stream not quiet until a later
        poll (after a pause) waits again; a deleted stream keeps failing, slowly."""
        client = self._client_for(stream)
        url = self._transport.url(self._basin, f"/streams/{quote(stream, safe='')}/records")
        headers = self._transport.headers(self._basin, {"accept": "application/protobuf"})
        failures = 0
        while True:
            with self._lock:
                pos = self._want.get(stream)
                if pos is None or stream in self._changed:
                    return
                self._quiet[stream] = pos
            # Spread over [wait/2, wait]: polls started together would otherwise all end,
            # and be sent again, at the same moment every `wait` seconds.
            wait = random.randint(max(1, self._wait // 2), max(1, self._wait))
            params = {"seq_num": pos, "count": 1, "wait": wait}
            try:
                resp = await client.get(url, params=params, headers=headers)
                ok = resp.status_code == 200
                got = ok and bool(s2_pb2.ReadBatch.FromString(resp.content).records)
            except (httpx.HTTPError, ValueError) as exc:
                log.debug("tail watch of stream %r: %s", stream, type(exc).__name__)
                ok = got = False
            with self._lock:
                if self._want.get(stream) != pos:
                    continue  # the caller moved on while this poll waited
            if ok and not got:
                failures = 0
                continue
            self._report(stream, pos, final=got)
            if got:
                return  # the caller looks it up and watches it again from its plan
            failures += 1
            await asyncio.sleep(_RETRY_DELAYS[min(failures, len(_RETRY_DELAYS)) - 1])

    def _report(self, stream: str, pos: int, *, final: bool) -> None:
        """`stream` is not quiet at `pos` any more; `final`: stop polling it until the
        caller watches it again."""
        with self._news:
            if self._quiet.get(stream) == pos:
                del self._quiet[stream]
            if final:
                self._changed.add(stream)
            self._news.notify_all()
