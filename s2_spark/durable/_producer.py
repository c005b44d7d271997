"""Idempotent producer: batches messages and pipelines them with Producer-Id/Epoch/Seq.

The server deduplicates by (producer id, epoch, seq), so every failed send is retried as
is, even when its outcome is unknown: a repeat that already landed answers 204 (duplicate,
reported as success). Answers that retrying cannot fix raise typed errors: StaleEpochError
(403, a newer epoch owns the id), SequenceGapError (409, a batch went missing),
StreamClosedError (409), StreamBadRequestError (400, e.g. a new epoch not starting at 0).

Pipelining: up to `max_in_flight` batches are on the wire at once (each on its own pooled
connection, from a small thread pool). Batches can reach the server out of order; the
server then answers the later one with a sequence gap, and that batch is sent again once
its predecessor is acknowledged, so order and exactly-once hold. The first batch of an
epoch (seq 0) goes alone: until the server has seen seq 0 of a new epoch it rejects any
later seq of that epoch with 400, not with a gap.
"""

from __future__ import annotations

import json
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from types import TracebackType
from typing import Any

from s2_spark.errors import SequenceGapError, StaleEpochError

from ._stream import AppendResult, DurableStream

__all__ = ["IdempotentProducer"]


class IdempotentProducer:
    """Appends to one stream as producer `producer_id` at `epoch`, seq from 0.

    `append()` buffers; a batch is sent when it reaches `max_batch_bytes` or
    `max_batch_messages` (without waiting for its answer while fewer than `max_in_flight`
    are unanswered), and on `flush()`, which returns once every batch is acknowledged and
    raises the first failure. Use it as a context manager (or call `close()`) to flush and
    release its threads. For JSON streams a message is any
    JSON-serialisable value (or pre-encoded JSON text via `append_raw`); for byte streams
    it is bytes, and a batch is their concatenation. `auto_claim=True` answers a stale
    epoch by taking the server's epoch + 1 (for producers that keep no epoch of their own).
    """

    def __init__(
        self,
        stream: DurableStream,
        producer_id: str,
        *,
        epoch: int = 0,
        max_batch_bytes: int = 1 << 20,
        max_batch_messages: int = 10_000,
        auto_claim: bool = False,
        max_in_flight: int = 4,
    ) -> None:
        self.check_options(producer_id, epoch, max_batch_bytes, max_batch_messages)
        if isinstance(max_in_flight, bool) or not isinstance(max_in_flight, int) or (
            max_in_flight < 1
        ):
            raise ValueError(f"max_in_flight must be an int >= 1 (got {max_in_flight!r})")
        self.stream = stream
        self.producer_id = producer_id
        self.epoch = epoch
        self.seq = 0
        self.auto_claim = auto_claim
        self._json = stream.is_json()
        self._max_bytes = max_batch_bytes
        self._max_messages = max_batch_messages
        self._parts: list[bytes] = []
        self._size = 0
        self.last_result: AppendResult | None = None
        self._close_seq: int | None = None
        self._max_in_flight = max_in_flight
        self._pool: ThreadPoolExecutor | None = None
        self._in_flight: deque[Future[AppendResult]] = deque()
        #: Batches acknowledged, and how many of them the server had already (204).
        self.acknowledged = 0
        self.duplicates = 0

    @staticmethod
    def check_options(
        producer_id: str,
        epoch: int = 0,
        max_batch_bytes: int = 1 << 20,
        max_batch_messages: int = 10_000,
    ) -> None:
        """Raise ValueError naming the first invalid option (before anything is sent)."""
        if not isinstance(producer_id, str) or not producer_id:
            raise ValueError(f"producer_id must be a non-empty string (got {producer_id!r})")
        for name, value, low in (
            ("epoch", epoch, 0),
            ("max_batch_bytes", max_batch_bytes, 1),
            ("max_batch_messages", max_batch_messages, 1),
        ):
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ValueError(f"{name} must be an int >= {low} (got {value!r})")

    def __repr__(self) -> str:
        return (
            f"IdempotentProducer({self.stream.url!r}, id={self.producer_id!r}, "
            f"epoch={self.epoch}, seq={self.seq})"
        )

    def append(self, message: Any) -> None:
        """Buffer one message (a JSON value for JSON streams, bytes otherwise)."""
        if self._json:
            self.append_raw(json.dumps(message, separators=(",", ":"), ensure_ascii=False))
        elif isinstance(message, bytes | bytearray | memoryview | str):
            self.append_raw(message)
        else:
            raise TypeError(f"a byte stream takes bytes or str (got {type(message).__name__})")

    def append_raw(self, data: bytes | bytearray | memoryview | str) -> None:
        """Buffer one message already encoded (JSON text for JSON streams)."""
        part = data.encode() if isinstance(data, str) else bytes(data)
        if self._parts and (
            self._size + len(part) > self._max_bytes or len(self._parts) >= self._max_messages
        ):
            self._submit()
        self._parts.append(part)
        self._size += len(part) + 1

    def append_encoded(self, body: bytes) -> None:
        """Send one batch encoded by the caller (for JSON streams a JSON array of messages,
        otherwise the bytes) as the next seq, pipelined like the batches `append` makes;
        what `append` buffered is sent first."""
        self._submit()
        self._submit_body(body)

    def flush(self) -> AppendResult | None:
        """Send what is buffered and wait until every batch is acknowledged."""
        self._submit()
        self._drain()
        return self.last_result

    def _submit(self) -> None:
        """Send the buffered batch, pipelined when allowed."""
        if not self._parts:
            return
        body = b"[" + b",".join(self._parts) + b"]" if self._json else b"".join(self._parts)
        self._parts, self._size = [], 0
        self._submit_body(body)

    def _submit_body(self, body: bytes) -> None:
        if self._max_in_flight == 1 or self.seq == 0:
            # Seq 0 opens the epoch (or claims one): later seqs of it wait for its answer.
            self.send(body)
            return
        if self._pool is None:
            self._pool = ThreadPoolExecutor(self._max_in_flight, "ds-producer")
        prev = self._in_flight[-1] if self._in_flight else None
        self._in_flight.append(
            self._pool.submit(self._send_after, body, self.epoch, self.seq, prev)
        )
        self.seq += 1
        while len(self._in_flight) > self._max_in_flight:
            self._settled(self._in_flight.popleft().result())

    def _settled(self, result: AppendResult) -> None:
        self.last_result = result
        self.acknowledged += 1
        self.duplicates += result.duplicate

    def _send_after(
        self, body: bytes, epoch: int, seq: int, prev: Future[AppendResult] | None
    ) -> AppendResult:
        """Send one pipelined batch; on a gap left by its predecessor, wait and resend."""
        try:
            return self._send_seq(body, epoch, seq, close=False)
        except SequenceGapError as gap:
            if prev is None or gap.expected_seq is None or gap.expected_seq >= seq:
                raise
            if prev.exception() is not None:  # waits; a failed predecessor leaves the gap
                raise
            return self._send_seq(body, epoch, seq, close=False)

    def _drain(self) -> None:
        """Wait for every pipelined batch; raise the first failure after all settled."""
        first: BaseException | None = None
        while self._in_flight:
            fut = self._in_flight.popleft()
            try:
                self._settled(fut.result())
            except BaseException as exc:  # keep waiting: none may be left running
                first = first or exc
        if first is not None:
            raise first

    def send(self, body: bytes, *, close: bool = False) -> AppendResult:
        """Send one batch with the next seq; retried until the server answers.

        Once this producer closed the stream, closing again re-sends the closing seq, so
        the server answers it as a duplicate: close is idempotent, and a retried
        close-with-body keeps the first body.
        """
        self._drain()
        if close and self._close_seq is not None:
            self.seq = self._close_seq
        try:
            result = self._send_seq(body, self.epoch, self.seq, close)
        except StaleEpochError as err:
            if not self.auto_claim or err.current_epoch is None:
                raise
            self.epoch, self.seq = err.current_epoch + 1, 0
            result = self._send_seq(body, self.epoch, self.seq, close)
        if close:
            self._close_seq = self.seq
        self.seq += 1
        self._settled(result)
        return result

    def _send_seq(self, body: bytes, epoch: int, seq: int, close: bool) -> AppendResult:
        headers = {
            "producer-id": self.producer_id,
            "producer-epoch": str(epoch),
            "producer-seq": str(seq),
        }
        return self.stream.append(body, headers=headers, close=close)

    def restart(self, epoch: int | None = None) -> None:
        """Start a new epoch (default: the next one) at seq 0, fencing older producers.

        Buffered messages are dropped; batches already sent are waited for first."""
        self._drain()
        self._parts, self._size = [], 0
        self.epoch = self.epoch + 1 if epoch is None else epoch
        self.seq = 0
        self._close_seq = None

    def close_stream(self, final: Any = None) -> AppendResult:
        """Flush, then close the stream (with `final` as its last message when given)."""
        self.flush()
        if final is None:
            return self.send(b"", close=True)
        if self._json:
            body = json.dumps(final, separators=(",", ":"), ensure_ascii=False).encode()
        else:
            body = final.encode() if isinstance(final, str) else bytes(final)
        return self.send(body, close=True)

    def close(self) -> None:
        """Flush and release the pipelining threads."""
        try:
            self.flush()
        finally:
            if self._pool is not None:
                self._pool.shutdown(wait=True)
                self._pool = None

    def __enter__(self) -> IdempotentProducer:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc_type is None:
            self.close()
        elif self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None
