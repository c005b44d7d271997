"""The engine of a tail watch: learn which of many streams got data by keeping one
long-poll outstanding per stream, rather than asking each stream on every plan.

Neither service has a call that watches several streams, but both long-poll one: a read
that answers as soon as data at or after its position exists, or with nothing after a
while. A watch keeps one such poll outstanding per stream, all from one asyncio thread,
so an idle stream costs one request per long-poll and data appended to any stream is
known about at once. The polls share a few HTTP/2 connections where the service speaks
it, else take one HTTP/1.1 connection each, within the open-files limit
(`_connections`).

A stream is *quiet* while a poll is waiting at its watched position: any data at or after
it makes that poll answer, so a quiet stream has nothing new (data appended a moment ago
may still be on its way; it is reported when it arrives). A stream that got data, failed
(a network error: polled again after a pause; deleted or refused: not polled again), cannot
be watched at its position or is not watched yet is not quiet: the caller looks it up
itself and then watches it again from where it planned.

News that comes with the stream's tail is *followed*: a poll waits at that tail at once,
and while it waits the tail is exact (`news_tails`), so the caller plans up to it without
asking; watching the stream from that tail then keeps the same poll, so a stream that got
one append costs one answered poll and no lookup. If that poll answers with data too, the
stream is busy and its tail is dropped: the caller asks (a tail told once and kept would
be overtaken by every record after the first, and a plan made from it would leave those
for the next micro-batch).

This module holds no protocol: a subclass says how to long-poll one stream at one
position and what the answer means (an `Answer`); see `s2_spark.s2._watch` (S2) and
`s2_spark.durable._watch` (Durable Streams). No pyspark here either.
"""

from __future__ import annotations

import asyncio
import enum
import itertools
import logging
import random
import threading
from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import httpx

from s2_spark._closeable import Closeable
from s2_spark._http import Response

from ._connections import ClientSettings, PollConnections
from ._limits import watch_limit

__all__ = ["Answer", "LongPollWatch", "News", "Pause", "Poll", "jittered_wait"]

log = logging.getLogger("s2_spark.watch")

_RETRY_DELAYS = (0.1, 0.5, 1.0, 2.0, 5.0)

P = TypeVar("P")


class Answer(enum.Enum):
    """What one long-poll learnt about its stream at its position."""

    #: It waited and nothing came: poll again (the stream stays quiet).
    NOTHING = "nothing"
    #: Data at or after the position: not quiet, and not polled until watched again.
    NEWS = "news"
    #: A transient error (network, a 5xx, a bad answer): not quiet; polled again after a
    #: pause.
    FAILED = "failed"
    #: An error asking again cannot change (the stream is deleted or being deleted, the
    #: request is refused): not quiet, and not polled again until the caller, who looks
    #: the stream up and learns why, watches it again.
    GONE = "gone"
    #: Nothing can ever come at this position (a closed stream's end): quiet for good, and
    #: never polled again there.
    ENDED = "ended"


@dataclass(frozen=True, slots=True)
class News(Generic[P]):
    """`Answer.NEWS`, with the stream's tail as the answer told it: the watch follows it
    (polls there), and while nothing comes after it the caller may plan up to it without
    asking the stream again (see `LongPollWatch.news_tails`)."""

    tail: P


@dataclass(frozen=True, slots=True)
class Pause:
    """`Answer.FAILED`, with the pause the service asked for before asking again (S2's
    `retry-after-ms`): the next poll waits at least that long."""

    seconds: float


#: One long-poll of one stream at one position; raising `httpx.HTTPError` or `ValueError`
#: counts as `Answer.FAILED`. Made by `LongPollWatch._poller`, which may keep state in it.
Poll = Callable[[], Awaitable["Answer | News[Any] | Pause"]]


def jittered_wait(wait: int) -> int:
    """A long-poll wait in [3/4 wait, wait] whole seconds: polls started together would
    otherwise all end, and be sent again, at the same moment every `wait` seconds (a
    quarter of 60 s spreads them over 15 s, and an idle stream costs a poll per 52 s)."""
    return random.randint(max(1, wait * 3 // 4), max(1, wait))


class LongPollWatch(Closeable, ABC, Generic[P]):
    """Long-polls the streams given to `watch` from a daemon thread (a `StreamWatch` of
    `s2_spark.backends.base`; `with watch:` closes it). Subclasses say how to poll one
    stream (`_poller`) and which positions can be watched (`_watchable`)."""

    def __init__(self, settings: ClientSettings, base_url: str | None, *,
                 limit: int | None = None, own_connections: int | None = None,
                 repoll_pause: float = 0.0, label: str = "") -> None:
        """`base_url`: where the streams are (asked once whether it speaks HTTP/2; None:
        streams are anywhere, and the limit stays HTTP/1.1's);
        `limit`: streams watched at most (by default none over HTTP/2, `watch_limit()`
        over HTTP/1.1). `own_connections`: streams polled on an HTTP/1.1 connection of
        their own before HTTP/2 carries the rest (by default as many as the open-files
        limit allows; see `PollConnections`). `repoll_pause`: after a poll that found
        nothing, wait a random part of this many seconds before the next (the stream
        stays quiet meanwhile).
        For services whose server fixes how long a poll waits: their polls, started
        together, would otherwise stay in step for good (the others use
        `jittered_wait`)."""
        self._settings = settings
        self._base_url = base_url
        self._repoll_pause = repoll_pause
        self._label = label
        self._fixed_limit = limit
        self._own_connections = own_connections
        self._h2: bool | None = None  # whether `base_url` speaks HTTP/2, once known
        self._lock = threading.Lock()
        self._news = threading.Condition(self._lock)
        self._want: dict[str, P] = {}  # stream -> position to watch from
        self._quiet: dict[str, P] = {}  # stream -> position a poll is waiting at
        self._changed: set[str] = set()  # got data since the caller last watched it
        self._tails: dict[str, P] = {}  # the tail news came with, while a poll waits there
        self._pending: set[str] = set()  # touched by `watch`, not yet seen by `_sync`
        self._said_over = False
        self._said_malformed = False
        self._closed = False
        # Loop thread only: the poll of each stream (with its position), pools of
        # connections and which one each stream uses.
        self._tasks: dict[str, tuple[P, asyncio.Task[None]]] = {}
        self._polled: set[str] = set()  # given a poll, and still watched
        self._conns: PollConnections
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
        """(Loop thread) `stream` is not watched any more: close its connection, if it
        has one of its own. Subclasses that keep something per stream drop it too, then
        call this."""
        self._conns.forget(stream)

    # -- the caller's side (any thread) ---------------------------------------------------

    @property
    def limit(self) -> int | None:
        """Streams watched at most (None: as many as given): the one set, or none over
        HTTP/2 and `watch_limit()` over HTTP/1.1. The first call asks the service which it
        speaks (a connection); if that fails, HTTP/1.1's limit holds until a later call
        learns it."""
        if self._fixed_limit is not None:
            return self._fixed_limit
        if self._h2 is None and self._base_url is not None and not self._closed:
            probe = asyncio.run_coroutine_threadsafe(
                self._conns.speaks_h2(self._base_url), self._loop)
            try:
                self._h2 = probe.result(timeout=self._settings.timeout.connect + 5.0)
            except Exception as exc:  # a network failure: ask again next time
                probe.cancel()
                log.info("could not learn whether the service speaks HTTP/2: %s",
                         type(exc).__name__)
        return None if self._h2 else watch_limit()

    def watch(self, positions: Mapping[str, P]) -> set[str]:
        """Watch exactly these streams, each from its position (the next one to plan).
        Streams at positions that cannot be watched are left out (never quiet), and so
        are those beyond `limit`, which are returned (in the order given)."""
        watchable = {s: pos for s, pos in positions.items() if self._watchable(pos)}
        limit = self.limit
        wanted = dict(itertools.islice(watchable.items(), limit))
        over = {s: None for s in watchable if s not in wanted}
        if over and not self._said_over:
            self._said_over = True
            log.warning("the tail watch holds %d streams (the limit: the service speaks "
                        "HTTP/1.1 only, and the process may open too few files); %d more "
                        "are left to the caller", limit, len(over))
        with self._lock:
            if self._closed:
                return set(over)
            touched = [s for s in self._want if s not in wanted]
            for stream in touched:
                del self._want[stream]
                self._forget_news(stream)
            for stream, pos in wanted.items():
                if self._tails.get(stream) == pos:
                    self._adopt(stream, pos)
                elif self._want.get(stream) != pos or stream in self._changed:
                    self._want[stream] = pos
                    self._forget_news(stream)
                    touched.append(stream)
            self._schedule(touched)
        return set(over)

    def _adopt(self, stream: str, pos: P) -> None:
        """(Under the lock) `stream` is watched from the tail its news came with, where a
        poll already waits: that poll is the watch's, and the stream is quiet there."""
        self._want[stream] = pos
        self._changed.discard(stream)
        del self._tails[stream]
        self._quiet[stream] = pos

    def _forget_news(self, stream: str) -> None:
        """(Under the lock) what is known of `stream` is out of date."""
        self._quiet.pop(stream, None)
        self._changed.discard(stream)
        self._tails.pop(stream, None)

    def _schedule(self, streams: Iterable[str]) -> None:
        """(Under the lock) have the loop thread bring these streams' polls in line with
        what is wanted; `close` cannot have stopped the loop yet."""
        before = len(self._pending)
        self._pending.update(streams)
        if self._pending and (before == 0 or self._closed):
            self._loop.call_soon_threadsafe(self._sync)

    def news_tails(self, streams: Iterable[str]) -> dict[str, P]:
        """Of these streams, those whose news came with their tail, and that tail, while a
        poll waits there (nothing came after it): a position to plan up to without asking.
        Watching a stream from its tail keeps that poll."""
        with self._lock:
            return {s: self._tails[s] for s in streams if s in self._tails}

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

    def connections(self) -> dict[str, int]:
        """Connections open now, by protocol (`h2`, `http/1.1`)."""
        async def count() -> dict[str, int]:
            return {"h2": self._conns.h2_connections(),
                    "http/1.1": self._conns.h1_connections()}

        return asyncio.run_coroutine_threadsafe(count(), self._loop).result(5.0)

    def close(self) -> None:
        """Stop every poll and close the connections (waits up to 5 s for the thread)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._want.clear()
            self._quiet.clear()
            self._tails.clear()
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
        self._conns = PollConnections(self._settings, self._own_connections)
        self._ready.set()
        await self._stopped.wait()
        tasks = [task for _, task in self._tasks.values()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._conns.close()

    def _get(self, stream: str, base_url: str, target: str, *,
             head_only: bool = False) -> Awaitable[Response]:
        """(Loop thread) GET `base_url` + `target` for `stream` (see `PollConnections`).
        Not a coroutine of its own: every frame a waiting poll holds is held per stream."""
        return self._conns.get(stream, base_url, target, head_only=head_only)

    def _sync(self) -> None:
        """(Loop thread) start and cancel the polls of the streams `watch` touched, to
        match what is wanted: one task per stream and position; a stream with news waits
        until the caller watches it again."""
        with self._lock:
            pending, self._pending = self._pending, set()
            want = {s: self._want[s] for s in pending if s in self._want}
            changed = pending & self._changed
            closed = self._closed
        if closed:
            self._stopped.set()
            return
        for stream in pending:
            entry = self._tasks.get(stream)
            pos = want.get(stream)
            if entry is not None and (pos is None or entry[0] != pos or entry[1].done()):
                del self._tasks[stream]  # first: its end then leaves `_quiet` alone
                entry[1].cancel()
            if pos is None:
                if stream in self._polled:
                    self._polled.discard(stream)
                    self._forget(stream)
            elif stream not in self._tasks and stream not in changed:
                self._tasks[stream] = (pos, self._loop.create_task(self._poll(stream, pos)))
                self._polled.add(stream)

    async def _poll(self, stream: str, pos: P) -> None:
        """Long-poll `stream` at `pos` until data arrives there (see `Answer`); news that
        came with the tail is followed (`_follow`), and once the caller watches from that
        tail, polling goes on there. A transient failure makes the stream not quiet until
        a later poll, after a pause, waits again.

        When the task ends by itself, for whatever reason, the stream stops being quiet;
        one `_sync` cancelled was moved on by the caller, who saw to that. (One coroutine,
        the poll's own answer asked inline: each frame a waiting poll holds costs a few
        hundred bytes per watched stream.)"""
        try:
            poll = self._poller(stream, pos)
            failures = 0
            answer: Answer | News[Any] | Pause | None = None  # one in hand: a followed poll's
            while answer is not None or self._arm(stream, pos):
                if answer is None:
                    try:
                        answer = await poll()
                    except (httpx.HTTPError, ValueError) as exc:
                        self._failed(stream, exc)
                        answer = Answer.FAILED
                got, answer = answer, None
                if isinstance(got, News):
                    if not self._report(stream, pos, final=True, tail=got.tail):
                        return
                    adopted, answer = await self._follow(stream, got.tail)
                    if not adopted:
                        return
                    pos, poll, failures = got.tail, self._poller(stream, got.tail), 0
                    continue
                if got is Answer.NOTHING:
                    failures = 0
                    if self._repoll_pause > 0:
                        await asyncio.sleep(random.uniform(0, self._repoll_pause))
                    continue
                if got is Answer.ENDED:
                    await asyncio.Event().wait()  # quiet for good, until `_sync` cancels it
                final = got is Answer.NEWS or got is Answer.GONE
                self._report(stream, pos, final=final)
                if final:
                    return  # the caller looks it up and watches it again from its plan
                failures += 1
                delay = _RETRY_DELAYS[min(failures, len(_RETRY_DELAYS)) - 1]
                await asyncio.sleep(max(delay, got.seconds) if isinstance(got, Pause)
                                    else delay)
        except Exception as exc:
            log.warning("tail watch of %s stopped: %r", self._describe(stream), exc)
        finally:
            self._ended(stream)

    def _ended(self, stream: str) -> None:
        """(The stream's task, ending) unless `_sync` moved it on: not quiet any more."""
        entry = self._tasks.get(stream)
        if entry is not None and entry[1] is asyncio.current_task(self._loop):
            with self._news:  # a stream no poll waits on is never quiet
                self._quiet.pop(stream, None)
                if self._tails.get(stream) == entry[0]:
                    del self._tails[stream]
                if self._want.get(stream) == entry[0]:
                    self._changed.add(stream)  # polled again once watched again
                self._news.notify_all()

    async def _follow(self, stream: str, tail: P
                      ) -> tuple[bool, Answer | News[Any] | Pause | None]:
        """(The stream's task) poll at the tail news came with while `news_tails` gives
        it. Once the caller watches from it (`_adopt`), this is the stream's poll at its
        watched position: (True, the answer of the poll out then, if one was). (False,
        None) when the caller moved on, or the stream got more data first (the tail is
        dropped: the caller asks)."""
        task = asyncio.current_task()
        assert task is not None
        self._tasks[stream] = (tail, task)  # where it polls now, for `_sync` and `_poll`
        poll = self._poller(stream, tail)
        answer: Answer | News[Any] | Pause | None = None
        while True:
            with self._lock:
                if self._tails.get(stream) != tail:
                    adopted = self._want.get(stream) == tail and stream not in self._changed
                    return adopted, answer if adopted else None
                if answer is not None and answer is not Answer.NOTHING:
                    del self._tails[stream]
                    return False, None
            answer = await self._ask(stream, poll)

    async def _ask(self, stream: str, poll: Poll) -> Answer | News[Any] | Pause:
        """One poll; transport failures and malformed answers are `FAILED` (the type of
        the failure is logged, never a URL or a header: `_failed`)."""
        try:
            return await poll()
        except (httpx.HTTPError, ValueError) as exc:
            self._failed(stream, exc)
            return Answer.FAILED

    def _failed(self, stream: str, exc: Exception) -> None:
        """A poll failed (the type of the failure is logged, never a URL or a header). A
        malformed answer (a body that does not decode, or does not parse) is no passing
        failure: the first is logged as a warning, so a watch that can never learn
        anything does not fail unseen."""
        malformed = not isinstance(exc, httpx.TransportError)
        if malformed and not self._said_malformed:
            self._said_malformed = True
            log.warning("the tail watch of %s got an answer it cannot read (%s: %s); "
                        "such streams are looked up instead of watched",
                        self._describe(stream), type(exc).__name__, str(exc)[:200])
        else:
            log.debug("tail watch of %s: %s", self._describe(stream), type(exc).__name__)

    def _arm(self, stream: str, pos: P) -> bool:
        """Mark `stream` quiet at `pos` as a poll goes out, unless the caller moved on or
        has not looked at the news yet (then polling stops)."""
        with self._lock:
            if self._want.get(stream) != pos or stream in self._changed:
                return False
            self._quiet[stream] = pos
            return True

    def _report(self, stream: str, pos: P, *, final: bool, tail: P | None = None) -> bool:
        """`stream` is not quiet at `pos` any more; `final`: stop polling it until the
        caller watches it again (`tail`: where the answer put its tail, to follow). False,
        and nothing done, when the caller has moved on from `pos`."""
        with self._news:
            if self._want.get(stream) != pos:
                return False
            self._quiet.pop(stream, None)
            if final:
                self._changed.add(stream)
                if tail is not None:
                    self._tails[stream] = tail
            self._news.notify_all()
            return True
