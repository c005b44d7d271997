"""The engine of a tail watch: learn which of many streams got data by keeping one
long-poll outstanding per stream, rather than asking each stream on every plan.

Neither service has a call that watches several streams, but both long-poll one: a read
that answers as soon as data at or after its position exists, or with nothing after a
while. A watch keeps one such poll outstanding per stream, all from one asyncio thread
(one connection each, over HTTP/1.1), so an idle stream costs one request per long-poll
and data appended to any stream is known about at once.

A stream is *quiet* while a poll is waiting at its watched position: any data at or after
it makes that poll answer, so a quiet stream has nothing new (data appended a moment ago
may still be on its way; it is reported when it arrives). A stream that got data, failed
(deleted, trimmed past, a network error), cannot be watched at its position or is not
watched yet is not quiet: the caller looks it up itself and then watches it again from
where it planned.

This module holds no protocol: a subclass says how to long-poll one stream at one
position and what the answer means (an `Answer`); see `s2_spark.client._watch` (S2) and
`s2_spark.durable._watch` (Durable Streams). No pyspark here either.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import random
import resource
import ssl
import threading
from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Generic, TypeVar

import httpx

from s2_spark._closeable import Closeable
from s2_spark._tls import TlsConfig

__all__ = [
    "MAX_WATCHED",
    "SHARD_CONNECTIONS",
    "Answer",
    "ClientSettings",
    "LongPollWatch",
    "Poll",
    "jittered_wait",
    "watch_limit",
]

log = logging.getLogger("s2_spark.watch")

#: Streams one watch long-polls at most (each holds a connection); see `watch_limit`.
MAX_WATCHED = 2000
#: Connections per pool (see `LongPollWatch._client_for`).
SHARD_CONNECTIONS = 50
_RETRY_DELAYS = (0.1, 0.5, 1.0, 2.0, 5.0)

P = TypeVar("P")


class Answer(enum.Enum):
    """What one long-poll learnt about its stream at its position."""

    #: It waited and nothing came: poll again (the stream stays quiet).
    NOTHING = "nothing"
    #: Data at or after the position: not quiet, and not polled until watched again.
    NEWS = "news"
    #: An error (deleted stream, bad answer, network): not quiet; polled again after a pause.
    FAILED = "failed"
    #: Nothing can ever come at this position (a closed stream's end): quiet for good, and
    #: never polled again there.
    ENDED = "ended"


#: One long-poll of one stream at one position; raising `httpx.HTTPError` or `ValueError`
#: counts as `Answer.FAILED`. Made by `LongPollWatch._poller`, which may keep state in it.
Poll = Callable[[], Awaitable[Answer]]


@dataclass(frozen=True)
class ClientSettings:
    """How the watch's connection pools reach the service, taken from the protocol
    client's own settings so both talk to it alike. The read timeout must exceed the
    longest long-poll wait. Headers (credentials) stay out of repr."""

    timeout: httpx.Timeout
    headers: Mapping[str, str] = field(default_factory=dict, repr=False)
    tls: TlsConfig | None = None


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


def jittered_wait(wait: int) -> int:
    """A long-poll wait in [wait/2, wait] whole seconds: polls started together would
    otherwise all end, and be sent again, at the same moment every `wait` seconds."""
    return random.randint(max(1, wait // 2), max(1, wait))


class LongPollWatch(Closeable, ABC, Generic[P]):
    """Long-polls the streams given to `watch` from a daemon thread (a `StreamWatch` of
    `s2_spark.backends.base`; `with watch:` closes it). Subclasses say how to poll one
    stream (`_poller`) and which positions can be watched (`_watchable`)."""

    def __init__(self, settings: ClientSettings, *, limit: int | None = None,
                 repoll_pause: float = 0.0, label: str = "") -> None:
        """`repoll_pause`: after a poll that found nothing, wait a random part of this many
        seconds before the next (the stream stays quiet meanwhile). For services whose
        server fixes how long a poll waits: their polls, started together, would
        otherwise stay in step for good (the others use `jittered_wait`)."""
        self._settings = settings
        self._repoll_pause = repoll_pause
        self._label = label
        self.limit = watch_limit() if limit is None else limit
        self._lock = threading.Lock()
        self._news = threading.Condition(self._lock)
        self._want: dict[str, P] = {}  # stream -> position to watch from
        self._quiet: dict[str, P] = {}  # stream -> position a poll is waiting at
        self._changed: set[str] = set()  # got data since the caller last watched it
        self._closed = False
        # Loop thread only: the poll of each stream (with its position), pools of
        # connections and which one each stream uses.
        self._tasks: dict[str, tuple[P, asyncio.Task[None]]] = {}
        self._polled: set[str] = set()  # given a poll, and still watched
        self._shards: list[_Shard] = []
        self._shard_of: dict[str, _Shard] = {}
        self._verify: ssl.SSLContext | bool | None = None
        self._stopped: asyncio.Event
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, name="s2-spark-tail-watch",
                                        daemon=True)
        self._thread.start()
        self._ready.wait()

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self._label}, streams={len(self._want)})"

    # -- the protocol's part -----------------------------------------------------------------

    @abstractmethod
    def _poller(self, stream: str, position: P) -> Poll:
        """(Loop thread) how to long-poll `stream` at `position`, once per call; the same
        callable is used for every poll at that position."""

    def _watchable(self, position: P) -> bool:
        """Whether a poll can wait at `position` (others are never quiet)."""
        return True

    def _describe(self, stream: str) -> str:
        """`stream` as logs name it (no credentials)."""
        return f"stream {stream!r}"

    def _forget(self, stream: str) -> None:
        """(Loop thread) `stream` is not watched any more: free its place in a pool.
        Subclasses that keep something per stream drop it too, then call this."""
        shard = self._shard_of.pop(stream, None)
        if shard is not None:
            shard.streams -= 1

    # -- the caller's side (any thread) ---------------------------------------------------

    def watch(self, positions: Mapping[str, P]) -> None:
        """Watch exactly these streams, each from its position (the next one to plan).
        Streams at positions that cannot be watched, and beyond `limit`, are left out
        (never quiet)."""
        watchable = {s: pos for s, pos in positions.items() if self._watchable(pos)}
        wanted = dict(list(watchable.items())[: self.limit])
        if len(watchable) > self.limit:
            log.info("watching %d of %d streams (the limit); the rest are looked up on "
                     "every plan", self.limit, len(watchable))
        with self._lock:
            if self._closed:
                return
            for stream in list(self._want):
                if stream not in wanted:
                    del self._want[stream]
                    self._quiet.pop(stream, None)
                    self._changed.discard(stream)
            for stream, pos in wanted.items():
                if self._want.get(stream) != pos or stream in self._changed:
                    self._want[stream] = pos
                    self._quiet.pop(stream, None)
                    self._changed.discard(stream)
            # Under the lock: `close` cannot have stopped the loop yet.
            self._loop.call_soon_threadsafe(self._sync)

    def quiet(self, positions: Mapping[str, P]) -> set[str]:
        """The streams known to have nothing at or after the given positions."""
        with self._lock:
            return {s for s, pos in positions.items() if self._quiet.get(s) == pos}

    def wait(self, streams: Iterable[str], timeout: float) -> None:
        """Return once one of `streams` is no longer quiet, or after `timeout` seconds."""
        names = set(streams)
        with self._news:
            self._news.wait_for(lambda: self._closed or not names.issubset(self._quiet),
                                timeout=timeout)

    def close(self) -> None:
        """Stop every poll and close the connections (waits up to 5 s for the thread)."""
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
        tasks = [task for _, task in self._tasks.values()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
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
            shard = self._shard_of[stream] = free[0] if free else self._new_shard()
            shard.streams += 1
        return shard.client

    def _new_shard(self) -> _Shard:
        """A pool set up as the protocol client's own (proxies from the environment too)."""
        settings = self._settings
        if self._verify is None:
            self._verify = settings.tls.ssl_context() if settings.tls is not None else True
        limits = httpx.Limits(max_connections=SHARD_CONNECTIONS,
                              max_keepalive_connections=SHARD_CONNECTIONS)
        client = httpx.AsyncClient(limits=limits, timeout=settings.timeout,
                                   headers=dict(settings.headers), trust_env=True,
                                   follow_redirects=False, verify=self._verify)
        self._shards.append(_Shard(client))
        return self._shards[-1]

    def _sync(self) -> None:
        """(Loop thread) start and cancel polls to match what is wanted: one task per
        stream and position; a stream with news waits until the caller watches it again."""
        with self._lock:
            want = dict(self._want)
            changed = set(self._changed)
            closed = self._closed
        if closed:
            self._stopped.set()
            return
        for stream, (pos, task) in list(self._tasks.items()):
            if stream not in want or want[stream] != pos or task.done():
                del self._tasks[stream]  # first: its end then leaves `_quiet` alone
                task.cancel()
        for stream in [s for s in self._polled if s not in want]:
            self._polled.discard(stream)
            self._forget(stream)
        for stream, pos in want.items():
            if stream not in self._tasks and stream not in changed:
                self._tasks[stream] = (pos, self._loop.create_task(self._poll(stream, pos)))
                self._polled.add(stream)

    async def _poll(self, stream: str, pos: P) -> None:
        """Long-poll `stream` at `pos` (see `_poll_until_news`). When the task ends by
        itself, for whatever reason, the stream stops being quiet; one `_sync` cancelled
        was moved on by the caller, who saw to that."""
        try:
            await self._poll_until_news(stream, pos)
        except Exception as exc:
            log.warning("tail watch of %s stopped: %r", self._describe(stream), exc)
        finally:
            entry = self._tasks.get(stream)
            if entry is not None and entry[1] is asyncio.current_task():
                with self._news:  # a stream no poll waits on is never quiet
                    self._quiet.pop(stream, None)
                    self._news.notify_all()

    async def _poll_until_news(self, stream: str, pos: P) -> None:
        """Long-poll `stream` at `pos` until data arrives there (see `Answer`). A failure
        makes the stream not quiet until a later poll, after a pause, waits again: a
        deleted stream keeps failing, slowly."""
        poll = self._poller(stream, pos)
        failures = 0
        while self._arm(stream, pos):
            answer = await self._ask(stream, poll)
            if answer is Answer.NOTHING:
                failures = 0
                if self._repoll_pause > 0:
                    await asyncio.sleep(random.uniform(0, self._repoll_pause))
                continue
            if answer is Answer.ENDED:
                await asyncio.Event().wait()  # quiet for good, until `_sync` cancels it
            self._report(stream, pos, final=answer is Answer.NEWS)
            if answer is Answer.NEWS:
                return  # the caller looks it up and watches it again from its plan
            failures += 1
            await asyncio.sleep(_RETRY_DELAYS[min(failures, len(_RETRY_DELAYS)) - 1])

    async def _ask(self, stream: str, poll: Poll) -> Answer:
        """One poll; transport failures and malformed answers are `FAILED` (the type of
        the failure is logged, never a URL or a header)."""
        try:
            return await poll()
        except (httpx.HTTPError, ValueError) as exc:
            log.debug("tail watch of %s: %s", self._describe(stream), type(exc).__name__)
            return Answer.FAILED

    def _arm(self, stream: str, pos: P) -> bool:
        """Mark `stream` quiet at `pos` as a poll goes out, unless the caller moved on or
        has not looked at the news yet (then polling stops)."""
        with self._lock:
            if self._want.get(stream) != pos or stream in self._changed:
                return False
            self._quiet[stream] = pos
            return True

    def _report(self, stream: str, pos: P, *, final: bool) -> None:
        """`stream` is not quiet at `pos` any more; `final`: stop polling it until the
        caller watches it again. Dropped when the caller has moved on from `pos`."""
        with self._news:
            if self._want.get(stream) != pos:
                return
            self._quiet.pop(stream, None)
            if final:
                self._changed.add(stream)
            self._news.notify_all()
