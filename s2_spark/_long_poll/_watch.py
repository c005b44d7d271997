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

Why no append is missed: a stream is marked quiet at `pos` only as a poll at `pos` goes
out (`_arm`) or, adopting a followed tail, while the follow poll there is out and has
brought no data (`_adopt`, under the lock that same answer takes to drop the tail). A
poll answers as soon as a record at or after its position is at the server, whether the
record came before the poll got there or while it waited; it answers empty only after
waiting with none there. Every answer either sends the next poll at the same position,
the stream staying quiet (an empty one: at once, or after `repoll_pause`; a record that
lands before the next poll arrives is found by it), or makes the stream not quiet under
the lock (data, an error, a failure), or says nothing can ever come there (`ENDED`). A
stream moved elsewhere stops being quiet before its new poll arms it, and the old poll's
late answer is ignored. So a record at `pos` reaches a quiet stream within a poll's
round trip (two, and any pause, when it falls between polls); `tests/test_watch_news.py`
and `scripts/watch_news.py` check it on S2.

News comes without a tail when the record was at the server before the poll waited
there: appended just as the watch armed, or between one poll and the next. S2 tells the
tail only with records that came while a read waited (s2-lite's `read_session`); the
local server does the same. Such news makes the stream not quiet, and the caller asks.

A watched stream is a small record (`_Watched`), its polls driven by the callbacks of the
connections (`PollConnections.send`), not a task each: a waiting poll holds the record,
its request on the wire and the connection's share, about half a kilobyte, where a task
and its suspended coroutines took several.

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
from collections.abc import Iterable, Mapping
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


@dataclass(frozen=True, slots=True)
class Poll:
    """One long-poll's request: a GET of `base_url` + `target`; `head_only`: the first
    bytes of the body are enough to tell what the answer means."""

    base_url: str
    target: str
    head_only: bool = False


#: `_Watched.pending` while its request is being handed to the connections.
_SENDING = object()


def _moved(wanted: Mapping[str, Any], want: Mapping[str, Any]) -> set[str]:
    """The streams of `wanted` new to `want` or at another position there (compared in C
    where positions can be hashed)."""
    if wanted == want:
        return set()
    try:
        return {s for s, _ in wanted.items() - want.items()}
    except TypeError:  # positions that are dicts (Durable Streams)
        return {s for s, pos in wanted.items() if s not in want or want[s] != pos}


def jittered_wait(wait: int) -> int:
    """A long-poll wait in [3/4 wait, wait] whole seconds: polls started together would
    otherwise all end, and be sent again, at the same moment every `wait` seconds (a
    quarter of 60 s spreads them over 15 s, and an idle stream costs a poll per 52 s)."""
    return random.randint(max(1, wait * 3 // 4), max(1, wait))


class _Watched:
    """(Loop thread) one watched stream: where it is polled, the protocol's state for
    that position, and what is under way (a request, or a timer before the next one).
    Called with each answer, it hands it to the watch: the connections take it as the
    request's callback, so a waiting poll allocates nothing of its own."""

    __slots__ = ("failures", "following", "live", "pending", "pos", "state", "stream",
                 "timer", "watch")

    def __init__(self, watch: LongPollWatch[Any], stream: str, pos: Any, state: Any) -> None:
        self.watch = watch
        self.stream = stream
        self.pos = pos
        self.state = state
        self.following = False  # polling at the tail news came with (`news_tails`)
        self.failures = 0  # failed polls in a row
        self.live = True  # False once ended or dropped: answers are then ignored
        self.pending: Any = None  # the request on the wire (`cancel()`able)
        self.timer: asyncio.TimerHandle | None = None

    def __call__(self, result: Response | Exception) -> None:
        self.watch._answered(self, result)


class LongPollWatch(Closeable, ABC, Generic[P]):
    """Long-polls the streams given to `watch` from a daemon thread (a `StreamWatch` of
    `s2_spark.backends.base`; `with watch:` closes it). Subclasses say how to poll one
    stream (`_request`, `_read`) and which positions can be watched (`_watchable`)."""

    def __init__(self, settings: ClientSettings, base_url: str | None, *,
                 limit: int | None = None, own_connections: int | None = None,
                 repoll_pause: float = 0.0, label: str = "") -> None:
        """`base_url`: where the streams are (asked once whether it speaks HTTP/2; None:
        streams are anywhere, and the limit stays HTTP/1.1's);
        `limit`: streams watched at most (by default none over HTTP/2, `watch_limit()`
        over HTTP/1.1). `own_connections`: streams polled on an HTTP/1.1 connection of
        their own before HTTP/2 carries the rest (by default none: where the service
        speaks HTTP/2 every poll goes over it; see `PollConnections`). `repoll_pause`:
        after a poll that found nothing, wait a random part of this many seconds before
        the next (the stream stays quiet meanwhile).
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
        # Loop thread only: each stream's polls (where, what is under way), pools of
        # connections and which one each stream uses.
        self._records: dict[str, _Watched] = {}
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
    def _request(self, stream: str, position: P, state: Any) -> Poll | Answer:
        """(Loop thread) the request that long-polls `stream` at `position` once (`state`:
        what `_poll_state` made for that position), or the answer itself where none is
        needed (`Answer.ENDED`: nothing can come there)."""

    @abstractmethod
    def _read(self, stream: str, position: P, state: Any,
              response: Response) -> Answer | News[Any] | Pause:
        """(Loop thread) what a poll's answer means; `ValueError` for an answer that
        cannot be read (`Answer.FAILED`)."""

    def _poll_state(self, stream: str, position: P) -> Any:
        """(Loop thread) what the protocol keeps while polling `stream` at `position`
        (none by default)."""
        return None

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
        are those beyond `limit`, which are returned (in the order given).

        Over 100,000 streams a plan calls this with positions that mostly did not move:
        what changed is found by comparing whole dicts (in C), and only those streams and
        the ones with news are looked at one by one."""
        if type(self)._watchable is LongPollWatch._watchable:
            watchable: Mapping[str, P] = positions
        else:
            watchable = {s: pos for s, pos in positions.items() if self._watchable(pos)}
        limit = self.limit
        if limit is None or len(watchable) <= limit:
            wanted, over = watchable, {}
        else:
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
            want = self._want
            touched = list(want.keys() - wanted.keys())
            for stream in touched:
                del want[stream]
                self._forget_news(stream)
            for stream in _moved(wanted, want) | (self._changed & wanted.keys()):
                pos = wanted[stream]
                if self._tails.get(stream) == pos:
                    self._adopt(stream, pos)
                elif want.get(stream) != pos or stream in self._changed:
                    want[stream] = pos
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
            if positions == self._quiet:  # an idle plan's question: one look, in C
                return set(positions)
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
        for rec in list(self._records.values()):
            self._drop(rec)
        self._records.clear()
        self._conns.close()

    def _sync(self) -> None:
        """(Loop thread) start and drop the polls of the streams `watch` touched, to match
        what is wanted: one record per stream and position; a stream with news waits
        until the caller watches it again."""
        with self._lock:
            pending, self._pending = self._pending, set()
            want = {s: self._want[s] for s in pending if s in self._want}
            changed = pending & self._changed
            closed = self._closed
        if closed:
            self._stopped.set()
            return
        records = self._records
        for stream in pending:
            rec = records.get(stream)
            pos = want.get(stream)
            if rec is not None and (pos is None or rec.pos != pos):
                del records[stream]  # first: its end then leaves `_quiet` alone
                self._drop(rec)
            if pos is None:
                self._forget(stream)
            elif stream not in records and stream not in changed:
                rec = records[stream] = _Watched(self, stream, pos,
                                                 self._new_state(stream, pos))
                self._next(rec)

    def _new_state(self, stream: str, pos: P) -> Any:
        try:
            return self._poll_state(stream, pos)
        except Exception as exc:
            log.warning("tail watch of %s stopped: %r", self._describe(stream), exc)
            return None

    @staticmethod
    def _drop(rec: _Watched) -> None:
        """(Loop thread) stop a stream's polls: the caller moved it on (no `_end`)."""
        rec.live = False
        pending, timer, rec.pending, rec.timer = rec.pending, rec.timer, None, None
        if timer is not None:
            timer.cancel()
        if pending is not None and pending is not _SENDING:
            pending.cancel()

    def _next(self, rec: _Watched) -> None:
        """(Loop thread) poll again at the stream's watched position: quiet there from
        now, unless the caller moved on or has not looked at the news yet (then polling
        stops)."""
        rec.timer = None
        if not rec.live:
            return
        if not self._arm(rec.stream, rec.pos):
            self._end(rec)
            return
        self._send(rec)

    def _send(self, rec: _Watched) -> None:
        """(Loop thread) one poll of `rec` at its position; the answer comes to
        `_answered`."""
        try:
            request = self._request(rec.stream, rec.pos, rec.state)
        except Exception as exc:
            log.warning("tail watch of %s stopped: %r", self._describe(rec.stream), exc)
            self._end(rec)
            return
        if isinstance(request, Answer):
            self._answered(rec, request)
            return
        rec.pending = _SENDING
        handle = self._conns.send(rec.stream, request.base_url, request.target, rec,
                                  head_only=request.head_only)
        if rec.pending is _SENDING:  # not answered (or dropped) while being sent
            rec.pending = handle

    def _answered(self, rec: _Watched, result: Response | Exception | Answer) -> None:
        """(Loop thread) a poll's answer (or failure): what it means, then what follows."""
        if not rec.live:
            return
        rec.pending = None
        got: Answer | News[Any] | Pause
        if isinstance(result, Answer):
            got = result
        elif isinstance(result, Response):
            try:
                got = self._read(rec.stream, rec.pos, rec.state, result)
            except ValueError as exc:
                self._failed(rec.stream, exc)
                got = Answer.FAILED
            except Exception as exc:
                log.warning("tail watch of %s stopped: %r", self._describe(rec.stream), exc)
                self._end(rec)
                return
        elif isinstance(result, httpx.HTTPError | ValueError):
            self._failed(rec.stream, result)
            got = Answer.FAILED
        else:
            log.warning("tail watch of %s stopped: %r", self._describe(rec.stream), result)
            self._end(rec)
            return
        if rec.following:
            self._followed(rec, got)
        else:
            self._then(rec, got)

    def _then(self, rec: _Watched, got: Answer | News[Any] | Pause) -> None:
        """(Loop thread) after an answer at the watched position (see `Answer`): news that
        came with the tail is followed; once the caller watches from that tail, polling
        goes on there. A transient failure makes the stream not quiet until a later poll,
        after a pause, waits again."""
        stream, pos = rec.stream, rec.pos
        if isinstance(got, News):
            if not self._report(stream, pos, final=True, tail=got.tail):
                self._end(rec)
                return
            rec.following, rec.pos = True, got.tail
            rec.state = self._new_state(stream, got.tail)
            self._followed(rec, None)
            return
        if got is Answer.NOTHING:
            rec.failures = 0
            if self._repoll_pause > 0:
                rec.timer = self._loop.call_later(random.uniform(0, self._repoll_pause),
                                                  self._next, rec)
            else:
                self._next(rec)
            return
        if got is Answer.ENDED:
            return  # quiet for good, until `_sync` drops it
        final = got is Answer.NEWS or got is Answer.GONE
        self._report(stream, pos, final=final)
        if final:
            self._end(rec)  # the caller looks it up and watches it again from its plan
            return
        rec.failures += 1
        delay = _RETRY_DELAYS[min(rec.failures, len(_RETRY_DELAYS)) - 1]
        if isinstance(got, Pause):
            delay = max(delay, got.seconds)
        rec.timer = self._loop.call_later(delay, self._next, rec)

    def _followed(self, rec: _Watched, answer: Answer | News[Any] | Pause | None) -> None:
        """(Loop thread) poll at the tail news came with while `news_tails` gives it. Once
        the caller watches from it (`_adopt`), this is the stream's poll at its watched
        position, and the answer of the poll out then (if one was) is taken as such. The
        polling ends when the caller moved on, or the stream got more data first (the
        tail is dropped: the caller asks)."""
        stream, tail = rec.stream, rec.pos
        adopted: bool | None = None
        with self._lock:
            if self._tails.get(stream) != tail:
                adopted = self._want.get(stream) == tail and stream not in self._changed
            elif answer is not None and answer is not Answer.NOTHING:
                del self._tails[stream]
                adopted = False
        if adopted is None:
            self._send(rec)  # (again) at the tail
        elif not adopted:
            self._end(rec)
        else:
            rec.following, rec.failures = False, 0
            if answer is None:
                self._next(rec)
            else:
                self._then(rec, answer)

    def _end(self, rec: _Watched) -> None:
        """(Loop thread) the stream's polls end by themselves: unless `_sync` moved it on,
        it is not quiet any more (watched again, it is polled again)."""
        rec.live = False
        if self._records.get(rec.stream) is not rec:
            return
        del self._records[rec.stream]
        stream, pos = rec.stream, rec.pos
        with self._news:  # a stream no poll waits on is never quiet
            self._quiet.pop(stream, None)
            if self._tails.get(stream) == pos:
                del self._tails[stream]
            if self._want.get(stream) == pos:
                self._changed.add(stream)  # polled again once watched again
            self._news.notify_all()

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
