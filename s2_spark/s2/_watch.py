"""TailWatch: learn which of many S2 streams got records, without asking each repeatedly.

S2 has no call that watches several streams, but a unary read with `wait` long-polls one:
it answers as soon as a record at or after its seq_num exists, or empty after `wait`
seconds. The engine (`s2_spark._long_poll`) keeps one such read outstanding per stream
and tracks which streams are quiet; this module only builds the read and tells what its
answer means.
"""

from __future__ import annotations

from urllib.parse import quote

from google.protobuf.message import DecodeError

from s2_spark._http import AsyncTimeouts, Response
from s2_spark._long_poll import (
    Answer,
    ClientSettings,
    LongPollWatch,
    News,
    Pause,
    Poll,
    jittered_wait,
    watch_limit,
)
from s2_spark._proto import s2_pb2

from ._errors import error_from_response
from ._transport import Transport

__all__ = ["WATCH_WAIT", "TailWatch", "watch_limit"]

#: Seconds a long-poll waits server-side at most (S2 allows up to 60, its OpenAPI's
#: `wait`); each waits between three quarters of that and that (`jittered_wait`), so an
#: idle stream costs about one request per 52 s.
WATCH_WAIT = 60


class TailWatch(LongPollWatch[int]):
    """Long-polls the streams of one basin given to `watch` (positions: the next seq_num
    to plan), in a daemon thread."""

    def __init__(self, transport: Transport, basin: str, *, wait: int = WATCH_WAIT,
                 limit: int | None = None, own_connections: int | None = None) -> None:
        """`wait`: seconds each read waits at most; `limit`: streams watched at most and
        `own_connections`: streams on HTTP/1.1 connections of their own before HTTP/2
        (by default, see `LongPollWatch`)."""
        self._basin_url = transport.base_url(basin)
        self._wait = wait
        cfg = transport.config
        settings = ClientSettings(
            timeout=AsyncTimeouts(connect=cfg.connect_timeout, read=wait + cfg.request_timeout),
            headers=[*transport.base_headers(basin), (b"accept", b"application/protobuf")],
            tls=cfg.tls,
        )
        super().__init__(settings, self._basin_url, limit=limit,
                         own_connections=own_connections, label=f"basin={basin!r}")

    def _request(self, stream: str, position: int, state: None) -> Poll:
        """A read of one record from `position` that waits a random part of `wait`."""
        return Poll(self._basin_url, f"/streams/{quote(stream, safe='')}/records?seq_num="
                                     f"{position}&count=1&wait={jittered_wait(self._wait)}")

    def _read(self, stream: str, position: int, state: None,
              resp: Response) -> Answer | News[int] | Pause:
        if resp.status_code != 200:
            return _failed(resp, stream)
        try:
            batch = s2_pb2.ReadBatch.FromString(resp.content)
        except DecodeError as exc:
            raise ValueError(f"a read's answer is not a ReadBatch ({exc})") from exc
        if not batch.records:
            return Answer.NOTHING
        # A record that came while the read waited comes with the tail (s2-lite).
        return News(batch.tail.seq_num) if batch.HasField("tail") else Answer.NEWS


def _failed(resp: Response, stream: str) -> Answer | Pause:
    """What an error answer means for the watch, by S2's table of error codes: a stream
    deleted (or being deleted) or a refused request is not polled again (`GONE`: the
    caller looks it up and learns why); a retryable answer is polled again after a pause,
    at least the one its `retry-after-ms` asks for."""
    err = error_from_response(resp, f"stream {stream!r}")
    if not err.retryable:
        return Answer.GONE
    return Pause(err.retry_after) if err.retry_after is not None else Answer.FAILED
