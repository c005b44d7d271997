"""S2S read sessions over a streamed GET, with transparent reconnects.

Each data frame becomes one DecodedBatch, or, with `batch_bytes`, consecutive data frames
up to that many payload bytes become one: a ReadBatch's fields repeat, so the frames'
payloads are decoded as the one ReadBatch their concatenation is (all their records, the
last tail) into one Arrow batch, where they were received (`decode_read_batches` over
views into the socket's reads: no payload is copied before the Arrow buffers).
Progress (next seq_num, records and metered bytes delivered) is tracked per frame, so a
reconnect resumes at the first undelivered record with count/bytes reduced by what was
delivered: every record is delivered exactly once. Silence longer than
`session_idle_timeout` (no data, no heartbeat) is a dead session; like transport failures
and retryable terminal frames it is retried until the retry policy's timeout passes
without a frame. A frame flagged "reconnect advised" is delivered, then the session
reconnects without backoff.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Generator
from typing import TYPE_CHECKING, Any, Literal
from urllib.parse import quote

import httpx

from s2_spark._http import BodyDecodingError, Exchange, Response
from s2_spark.errors import (
    FrameError,
    Position,
    ReadPastTailError,
    S2Error,
    S2UnavailableError,
    ServiceError,
    SessionTimeoutError,
)
from s2_spark.retry import AttemptOutcome, ResumableRead, RetryLoop, run_attempts
from s2_spark.wire.frames import FrameDecoder, Message

from ._acks import SESSION_HEADERS
from ._errors import (
    error_from_decoding,
    error_from_response,
    error_from_status,
    error_from_transport,
)
from ._params import wait_seconds
from ._transport import Transport, query

if TYPE_CHECKING:
    from s2_spark.wire.records import DecodedBatch

__all__ = ["ReadSession"]

log = logging.getLogger("s2_spark.s2")

_ADVISED_RECONNECT_EVERY = 60.0


class ReadSession(ResumableRead["DecodedBatch"]):
    """Iterator of DecodedBatch from one logical read session (possibly several HTTP ones).

    Use it as a context manager or call `close()` to end the HTTP response early.
    `next_seq_num` is the first seq_num not yet delivered (None until known).
    """

    def __init__(
        self,
        transport: Transport,
        basin: str,
        stream: str,
        params: dict[str, Any],
        *,
        wait: float | None,
        include_command_records: bool,
        include_headers: bool,
        heartbeats: bool,
        batch_bytes: int | None = None,
    ) -> None:
        if batch_bytes is not None and (wait is not None or heartbeats):
            raise ValueError("batch_bytes holds frames back: it is for reads without "
                             "`wait` or heartbeats")
        self._t = transport
        self._batch_bytes = batch_bytes or 0
        self.basin = basin
        self.stream = stream
        self._params = params
        self._wait = wait
        self._include_command_records = include_command_records
        self._include_headers = include_headers
        self._heartbeats = heartbeats
        self._target = f"stream {stream!r} in basin {basin!r}"
        self.next_seq_num: int | None = params.get("seq_num")
        self.remaining_count: int | None = params.get("count")
        self.remaining_bytes: int | None = params.get("bytes")
        self.delivered_records = 0
        self.reconnects = 0
        self.last_tail: Position | None = None
        self._unbounded = wait is None and not any(k in params for k in ("count", "bytes", "until"))
        self._gen = self._run()

    def __repr__(self) -> str:
        return (
            f"ReadSession({self._target}, next_seq_num={self.next_seq_num}, "
            f"reconnects={self.reconnects})"
        )

    # -- internals --------------------------------------------------------------------------

    def _done(self) -> bool:
        return self.remaining_count == 0 or self.remaining_bytes == 0

    def _attempt_params(self, last_progress: float, first: bool) -> dict[str, Any] | None:
        """Query parameters resuming after what was delivered; None if nothing is left."""
        params = dict(self._params)
        if self.next_seq_num is not None:
            params.pop("timestamp", None)
            params.pop("tail_offset", None)
            params["seq_num"] = self.next_seq_num
        if self.remaining_count is not None:
            params["count"] = self.remaining_count
        if self.remaining_bytes is not None:
            params["bytes"] = self.remaining_bytes
        if self._wait is not None and self._wait > 0 and not first:
            # `wait` is an idle budget: a reconnect gets what is left of it.
            left = self._wait - (time.monotonic() - last_progress)
            if left <= 0:
                return None
            params["wait"] = wait_seconds(left)
        return params

    def _run(self) -> Generator[DecodedBatch, None, None]:
        cfg = self._t.config
        self._path = f"/streams/{quote(self.stream, safe='')}/records"
        self._timeout = self._t.timeout(cfg.session_idle_timeout)
        self._first_connect = True
        self._last_advised: float | None = None
        self._last_progress = time.monotonic()
        loop = RetryLoop(cfg.retry, f"read session of {self._target}", self._on_retry)
        yield from run_attempts(self._attempt, loop)

    def _on_retry(self, err: ServiceError, delay: float) -> None:
        self.reconnects += 1

    def _attempt(self, loop: RetryLoop) -> Generator[DecodedBatch, None, AttemptOutcome]:
        """One HTTP session from where the last one stopped, to its end or first failure."""
        if self._done():
            return "done"
        params = self._attempt_params(self._last_progress, self._first_connect)
        if params is None:
            return "done"
        was_first, self._first_connect = self._first_connect, False
        outcome: AttemptOutcome | Literal["ended"]
        exchange = Exchange(traced=False)  # reads: stale or not is all that counts
        try:
            with self._t.send("GET", self.basin, self._path + query(params), SESSION_HEADERS,
                              timeout=self._timeout, trace=exchange, stream=True,
                              views=True) as resp:
                if resp.status_code != 200:
                    resp.read()
                    outcome = error_from_response(resp, self._target)
                else:
                    outcome = yield from self._frames(resp, loop)
        except httpx.ReadTimeout as exc:
            outcome = SessionTimeoutError(
                f"read session of {self._target} received nothing (no data, no "
                f"heartbeat) for {self._t.config.session_idle_timeout:g}s; the server or "
                "network is stuck: reconnecting, or retry later if this persists",
                status=0,
                code="session_timeout",
            )
            outcome.__cause__ = exc
        except httpx.TransportError as exc:
            outcome = error_from_transport(exc, self._target, "read session", exchange)
            outcome.__cause__ = exc
        except BodyDecodingError as exc:
            raise error_from_decoding(exc, self._target) from exc
        except FrameError as exc:
            raise S2Error(
                f"read session of {self._target} received malformed S2S data: {exc}",
                code="bad_frame",
            ) from exc
        if outcome == "ended":
            if not self._unbounded:
                return "done"
            # S2 never ends an unbounded session on its own: this is a restart or an
            # intermediary closing the stream, so resume like after any failure.
            return S2UnavailableError(
                f"read session of {self._target} was closed by the server before any "
                "bound was reached; resuming",
                code="session_closed",
            )
        if (
            isinstance(outcome, ReadPastTailError)
            and not was_first
            and self.next_seq_num is not None
            and outcome.tail.seq_num == self.next_seq_num
        ):
            # Resumed exactly at the tail of a bounded session without wait: the
            # original session would have ended here, so this one ends too.
            return "done"
        return outcome

    def _frames(
        self, resp: Response, loop: RetryLoop
    ) -> Generator[DecodedBatch, None, AttemptOutcome | Literal["ended"]]:
        """Deliver one response's data frames (held until `batch_bytes` of them are
        here); "ended" when the server ended the body. Frames held when the connection
        fails are whole and valid: they are delivered before the failure is reported, so
        a connection cut sooner than `batch_bytes` still moves the read on."""
        decoder = FrameDecoder(views=True)
        held: list[bytes | memoryview] = []
        size = 0
        failure: httpx.TransportError | None = None
        try:
            for chunk in resp.iter_bytes():
                for frame in decoder.feed(chunk):
                    if not isinstance(frame, Message):
                        if held:
                            yield from self._deliver(held, loop, advised=False)
                        return error_from_status(frame.status, frame.error(), self._target)
                    held.append(frame.body)
                    size += len(frame.body)
                    if size < self._batch_bytes and not frame.reconnect_advised:
                        continue
                    outcome = yield from self._deliver(held, loop,
                                                       advised=frame.reconnect_advised)
                    held, size = [], 0
                    if outcome is not None:
                        return outcome
            decoder.finish()
        except httpx.TransportError as exc:
            failure = exc
        if held:
            outcome = yield from self._deliver(held, loop, advised=False)
            if outcome is not None:
                return outcome  # the bounds were reached: a failure after does not matter
        if failure is not None:
            raise failure
        return "ended"

    def _deliver(
        self, bodies: list[bytes | memoryview], loop: RetryLoop, *, advised: bool
    ) -> Generator[DecodedBatch, None, AttemptOutcome | None]:
        """Decode the payloads of consecutive frames as one ReadBatch, account for it and
        yield it (a heartbeat only with `heartbeats`); "done" at the session's bounds,
        "reconnect" after a frame advising it, else None."""
        from s2_spark.wire.records import decode_read_batches

        decoded = decode_read_batches(
            bodies,
            self.stream,
            include_command_records=self._include_command_records,
            include_headers=self._include_headers,
        )
        heartbeat = self._account(decoded)
        loop.progressed()  # delivered: progress (a frame only received and held is not)
        if not heartbeat:
            self._last_progress = time.monotonic()
        advised = advised and self._advice_taken()
        if not heartbeat or self._heartbeats:
            yield decoded
        if self._done():
            return "done"
        if advised:
            self.reconnects += 1
            log.debug("read session of %s reconnecting on server advice", self._target)
            return "reconnect"
        return None

    def _advice_taken(self) -> bool:
        """At most one advised reconnect a minute, as S2's SDKs do, so a server flagging
        every frame cannot churn us."""
        now = time.monotonic()
        if self._last_advised is not None and now - self._last_advised <= _ADVISED_RECONNECT_EVERY:
            return False
        self._last_advised = now
        return True

    def _account(self, decoded: DecodedBatch) -> bool:
        """Record a frame's progress; return whether it was a heartbeat (no records)."""
        if decoded.tail is not None:
            self.last_tail = decoded.tail
        if decoded.count == 0:
            if decoded.tail is not None and self.next_seq_num is None:
                self.next_seq_num = decoded.tail.seq_num
            return True
        assert decoded.last_seq_num is not None
        self.next_seq_num = decoded.last_seq_num + 1
        self.delivered_records += decoded.count
        if self.remaining_count is not None:
            self.remaining_count = max(self.remaining_count - decoded.count, 0)
        if self.remaining_bytes is not None:
            self.remaining_bytes = max(self.remaining_bytes - decoded.metered_bytes, 0)
        return False
