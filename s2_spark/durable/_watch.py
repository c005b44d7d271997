"""DurableTailWatch: learn which of many Durable Streams got data, without asking each one
on every plan.

A long-poll read (`GET <stream>?offset=O&live=long-poll[&cursor=C]`) answers at once with
data at or after O, or waits up to the server's long-poll timeout and answers 204; a closed
stream read at its end answers 204 with `Stream-Closed: true` at once. The engine
(`s2_spark._long_poll`) keeps one such read outstanding per stream and tracks which
streams are quiet; this module only builds the read and tells what its answer means.

Positions are the Durable backend's: `{"offset": O, "skip": k, ...}` (k units after
server offset O), with `"closed": true` at the end of a closed stream. Only `skip == 0` can
be waited at (a server offset); a closed position can never get data, so it is quiet for
good without a request, and so is a position a poll finds at a closed stream's end.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

from s2_spark._http import AsyncTimeouts, Response
from s2_spark._long_poll import Answer, ClientSettings, LongPollWatch, Poll

from ._reads import flag, is_json
from ._transport import Transport, query, split_url

__all__ = ["REPOLL_PAUSE", "DurableTailWatch"]

#: The server fixes how long a long-poll waits, so re-polls are spread by pausing up to
#: this many seconds after one that timed out (a record appended meanwhile is seen late
#: by at most that).
REPOLL_PAUSE = 0.5

#: A position as the Durable backend writes it (JSON object).
Position = Mapping[str, Any]


class DurableTailWatch(LongPollWatch[Position]):
    """Long-polls the Durable Streams given to `watch` (named as
    `DurableStreamsClient.stream` accepts them: a URL or a path under base_url), in a
    daemon thread, with the client's headers, TLS settings, proxies and timeouts."""

    def __init__(self, transport: Transport, *, limit: int | None = None,
                 own_connections: int | None = None,
                 repoll_pause: float = REPOLL_PAUSE) -> None:
        """`limit`: streams watched at most and `own_connections`: streams on HTTP/1.1
        connections of their own before HTTP/2 (by default, see `LongPollWatch`);
        `repoll_pause`: see `REPOLL_PAUSE`."""
        self._config = cfg = transport.config
        self._cursors: dict[str, str] = {}  # loop thread: the last Stream-Cursor per stream
        settings = ClientSettings(
            # The read timeout is the sync client's for live reads: longer than the
            # server's long-poll timeout.
            timeout=AsyncTimeouts(connect=cfg.connect_timeout, read=cfg.live_timeout),
            headers=[*transport.base_headers(), (b"accept-encoding", b"identity")],
            tls=cfg.tls,
        )
        super().__init__(settings, cfg.base_url, limit=limit,
                         own_connections=own_connections, repoll_pause=repoll_pause,
                         label=f"base_url={cfg.base_url!r}")

    def _watchable(self, position: Position) -> bool:
        """Only at a server offset (`skip == 0`) can a poll wait."""
        return (isinstance(position, Mapping) and position.get("skip") == 0
                and isinstance(position.get("offset"), str))

    def _describe(self, stream: str) -> str:
        return f"stream {urlsplit(stream).path!r}"  # a URL's path only: no user info

    def _forget(self, stream: str) -> None:
        self._cursors.pop(stream, None)
        super()._forget(stream)

    def _poll_state(self, stream: str, position: Position) -> _Offset:
        return _Offset(position["offset"], bool(position.get("closed")))

    def _request(self, stream: str, position: Position, state: _Offset) -> Poll | Answer:
        """A long-poll read from the offset (echoing the last cursor); none at a closed
        stream's end. Its answer's head is enough."""
        if state.ended:
            return Answer.ENDED
        params = {"offset": state.offset, "live": "long-poll"}
        cursor = self._cursors.get(stream)
        if cursor:
            params["cursor"] = cursor
        base, path = split_url(self._config.stream_url(stream))
        return Poll(base, path + query(params), head_only=True)

    def _read(self, stream: str, position: Position, state: _Offset,
              resp: Response) -> Answer:
        if resp.headers.get("stream-cursor"):
            self._cursors[stream] = resp.headers["stream-cursor"]
        if resp.status_code == 204:
            return Answer.ENDED if flag(resp, "stream-closed") else Answer.NOTHING
        if resp.status_code != 200:
            return Answer.FAILED
        if _has_data(resp):
            return Answer.NEWS
        return state.moved(resp)


class _Offset:
    """Where one stream is long-polled from one position: the server offset, which an
    empty answer that moves it (a read from "-1" on an empty stream answers at once)
    moves on (the same position: the next poll starts from the offset it gave), and
    whether the stream is closed there."""

    __slots__ = ("ended", "offset")

    def __init__(self, offset: str, ended: bool) -> None:
        self.offset = offset
        self.ended = ended

    def moved(self, resp: Response) -> Answer:
        """An answer without data: closed there, or the same position at a new offset."""
        if flag(resp, "stream-closed"):
            return Answer.ENDED
        next_offset = resp.headers.get("stream-next-offset")
        if not next_offset or next_offset == self.offset:
            return Answer.FAILED  # it would answer at once again: pause, as after errors
        self.offset = next_offset
        return Answer.NOTHING


def _has_data(resp: Response) -> bool:
    """Whether a 200 answer holds data, from the head of its body (it may hold everything
    from the offset on: servers need not cut it, and the watch has no use for it). A JSON
    stream's empty answer is `[]`."""
    head = resp.content.lstrip()
    if not is_json(resp.headers.get("content-type")):
        return bool(resp.content)
    if head[:1] != b"[":
        return bool(head)  # not an array: let the caller's own read make sense of it
    return head[1:].lstrip()[:1] not in (b"]", b"")
