"""Reading a stream: catch-up, long-poll and SSE, resuming from the last delivered offset.

Every chunk a reader yields carries the offset to resume from (`next_offset`), so a retry
after a failure (429, 5xx, connection loss, a server restart) re-reads from exactly where
delivery stopped: nothing is lost or repeated. SSE data is delivered only together with
the control event that follows it, so a connection cut between the two re-reads that data
from the last control offset instead of delivering it twice.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Generator, Iterator, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Literal, TypeVar

import httpx
import pyarrow as pa

from s2_spark._http import BodyDecodingError, Exchange, Response
from s2_spark.errors import DurableStreamsError, MalformedResponseError
from s2_spark.retry import AttemptOutcome, ResumableRead, RetryLoop, run_attempts
from s2_spark.wire.durable import (
    BYTES_SCHEMA,
    JSON_SCHEMA,
    JsonArrayPieces,
    SSEParser,
    bytes_batch,
    decode_base64_data,
    json_array_bytes,
    json_batch,
    parse_control,
)

from ._errors import error_from_decoding, error_from_response, error_from_transport
from ._transport import Transport

__all__ = [
    "READ_CHUNK_BYTES",
    "AnswerPieces",
    "LiveMode",
    "PieceReader",
    "ReadChunk",
    "ReadPiece",
    "StreamReader",
    "check_offset",
    "flag",
    "is_json",
    "parse_chunk",
]

LiveMode = Literal["long-poll", "sse", "auto"] | None
T = TypeVar("T")

#: The most body one chunk of `StreamReader` holds (or `max_read_bytes`, if lower), about:
#: an answer of any length is taken as it arrives, a chunk at a time.
READ_CHUNK_BYTES = 4 << 20


def is_json(content_type: str | None) -> bool:
    return (content_type or "").split(";")[0].strip().lower() == "application/json"


def check_offset(offset: str) -> str:
    """Offsets are opaque strings from the server, or "-1" / "now"; never parsed."""
    if not isinstance(offset, str) or not offset or any(ord(c) < 0x21 for c in offset):
        raise ValueError(
            f"offset must be a non-empty string from Stream-Next-Offset, '-1' or 'now' "
            f"(got {offset!r})"
        )
    return offset


@dataclass(frozen=True, slots=True)
class ReadChunk:
    """What one read answer delivered.

    `data` is the answer's body, or a part of it (`partial`): for JSON streams a JSON array
    of messages (or empty), otherwise the stream's bytes. `next_offset` is where the next
    read starts. `up_to_date`: the chunk reached the tail as it was then. `closed`: the
    stream is closed and this chunk reached its end (EOF). `not_modified`: a 304 to
    If-None-Match.

    `partial`: more of the same answer follows (`StreamReader` yields an answer larger
    than a chunk as it arrives). An opaque offset cannot name a place inside an answer, so
    a partial chunk's `next_offset` is still the answer's start: a read resumed from it
    gets the partial chunks again, never skips them; keep positions from chunks that are
    not partial.
    """

    data: bytes
    offset: str
    next_offset: str
    up_to_date: bool
    closed: bool
    cursor: str | None
    etag: str | None
    content_type: str | None
    not_modified: bool = False
    status: int = 200
    partial: bool = False
    #: A JSON stream's messages as `read()` split them on arrival (`batch()` splits `data`
    #: again where this is None).
    _split: pa.Array | None = field(default=None, repr=False, compare=False)

    @property
    def json_mode(self) -> bool:
        return is_json(self.content_type)

    def batch(self) -> pa.RecordBatch:
        """Arrow rows: one per message (`value` string) for JSON streams, else one row with
        the chunk's bytes (`value` binary); no rows when the chunk is empty."""
        if self._split is not None and self.json_mode:
            return pa.RecordBatch.from_arrays([self._split], schema=JSON_SCHEMA)
        if self.json_mode:
            return json_batch(self.data) if self.data.strip() else JSON_SCHEMA.empty_table()
        return bytes_batch([self.data]) if self.data else BYTES_SCHEMA.empty_table()

    def messages(self) -> list[Any]:
        """The JSON messages as Python values (JSON streams only)."""
        if not self.json_mode:
            raise ValueError("messages() needs a JSON stream; use .data for bytes")
        if not self.data.strip():
            return []
        try:
            values = json.loads(self.data)
        except ValueError as exc:
            raise MalformedResponseError(
                "the server sent an invalid JSON-mode body", code="bad_json"
            ) from exc
        if not isinstance(values, list):
            raise MalformedResponseError(
                "the server sent a JSON-mode body that is not an array", code="bad_json"
            )
        return values


def _next_offset(resp: Response, offset: str) -> str:
    next_offset: str | None = resp.headers.get("stream-next-offset")
    if resp.status_code == 304:
        next_offset = next_offset or offset
    if not next_offset:
        raise MalformedResponseError(
            f"the server answered a read at offset {offset!r} without Stream-Next-Offset",
            status=resp.status_code,
            code="bad_header",
        )
    return next_offset


def flag(resp: Response, name: str) -> bool:
    """A boolean protocol header ("true" or absent)."""
    return str(resp.headers.get(name, "")).lower() == "true"


def _up_to_date(resp: Response) -> bool:
    return flag(resp, "stream-up-to-date") or resp.status_code == 204


def parse_chunk(resp: Response, offset: str, content_type: str | None,
                data: bytes | None = None) -> ReadChunk:
    """Build a chunk from a catch-up or long-poll answer (200, 204 or 304), of its body
    read whole or of `data`."""
    if data is None:
        data = resp.content if resp.status_code == 200 else b""
    return ReadChunk(
        data=data,
        offset=offset,
        next_offset=_next_offset(resp, offset),
        up_to_date=_up_to_date(resp),
        closed=flag(resp, "stream-closed"),
        cursor=resp.headers.get("stream-cursor"),
        etag=resp.headers.get("etag"),
        content_type=resp.headers.get("content-type") or content_type,
        not_modified=resp.status_code == 304,
        status=resp.status_code,
    )


class StreamReader(ResumableRead[ReadChunk]):
    """Iterator of ReadChunk from `offset` on.

    `live=None` (catch-up) ends at the first chunk that is up to date; "long-poll" and
    "sse" keep tailing; "auto" catches up, then long-polls. Every mode ends when the stream
    is closed (EOF). `offset`, `cursor`, `up_to_date` and `closed` describe what was
    delivered so far.
    """

    def __init__(
        self,
        transport: Transport,
        url: str,
        target: str,
        offset: str,
        live: LiveMode,
        content_type: str | None,
        headers: Mapping[str, str],
    ) -> None:
        if live not in (None, "long-poll", "sse", "auto"):
            raise ValueError(
                f"live must be None, 'long-poll', 'sse' or 'auto' (got {live!r})"
            )
        self._headers = {
            **headers,
            "accept-encoding": "gzip, deflate" if transport.config.compression else "identity",
        }
        self._t = transport
        self._url = url
        self._target = target
        self.offset = check_offset(offset)
        self.live = live
        self.content_type = content_type
        self.cursor: str | None = None
        self.up_to_date = False
        self.closed = False
        self.reconnects = 0
        self._answer = AnswerPieces()
        loop = RetryLoop(transport.config.retry, f"read of {target}", self._on_retry)
        attempt = self._sse_attempt if live == "sse" else self._poll_attempt
        self._gen = run_attempts(attempt, loop)

    def __repr__(self) -> str:
        return f"StreamReader({self._target}, offset={self.offset!r}, live={self.live!r})"

    def _on_retry(self, err: Exception, delay: float) -> None:
        self.reconnects += 1

    def _finished(self) -> bool:
        return self.closed or (self.live is None and self.up_to_date)

    def _deliver(self, chunk: ReadChunk, loop: RetryLoop) -> ReadChunk:
        loop.progressed()
        self.offset = chunk.next_offset
        self.cursor = chunk.cursor or self.cursor
        self.up_to_date = chunk.up_to_date
        self.closed = chunk.closed
        if chunk.content_type:
            self.content_type = chunk.content_type
        return chunk

    def _poll_attempt(self, loop: RetryLoop) -> Generator[ReadChunk, None, AttemptOutcome]:
        """One catch-up or long-poll request, its answer taken as it arrives."""
        if self._finished():
            return "done"
        params = {"offset": self.offset}
        if self.live == "long-poll" or (self.live == "auto" and self.up_to_date):
            params["live"] = "long-poll"
            if self.cursor:
                params["cursor"] = self.cursor
        read = self._t.config.live_timeout if "live" in params else self._t.config.request_timeout
        return (yield from _answer(self._t, self._url, self._target, self.offset, params,
                                   self._headers, read, lambda resp: self._chunks(resp, loop)))

    def _chunks(self, resp: Response, loop: RetryLoop) -> Generator[ReadChunk, None, None]:
        """One answer as chunks of about `READ_CHUNK_BYTES` of body, the last not partial."""
        head = parse_chunk(resp, self.offset, self.content_type, b"")
        limit = self._t.config.max_read_bytes
        for piece in self._answer.pieces(resp, self.offset, head.content_type,
                                         min(limit, READ_CHUNK_BYTES), limit):
            split = piece.messages if resp.status_code == 200 else None  # 204: no body
            data = piece.data if split is None else json_array_bytes(split)
            more: dict[str, Any] = {} if piece.last else {
                "next_offset": self.offset, "up_to_date": False, "closed": False,
                "partial": True}
            yield self._deliver(replace(head, data=data, _split=split, **more), loop)

    def _sse_attempt(self, loop: RetryLoop) -> Generator[ReadChunk, None, AttemptOutcome]:
        """One SSE connection, from the last control event's offset."""
        if self.closed:
            return "done"
        params = {"offset": self.offset, "live": "sse"}
        if self.cursor:
            params["cursor"] = self.cursor
        headers = {**self._headers, "accept": "text/event-stream"}
        exchange = Exchange(traced=False)  # reads: stale or not is all that counts
        try:
            with self._t.stream(
                self._url, params=params, headers=headers, read=self._t.config.live_timeout,
                exchange=exchange,
            ) as resp:
                if resp.status_code != 200:
                    return _failed(resp, self._target, self.offset)
                base64 = resp.headers.get("stream-sse-data-encoding", "").lower() == "base64"
                yield from self._sse_events(resp, base64, loop)
        except httpx.TransportError as exc:
            return error_from_transport(exc, self._target, "SSE read", exchange)
        except BodyDecodingError as exc:
            raise error_from_decoding(exc, self._target) from exc
        return "done" if self.closed else "reconnect"

    def _sse_events(
        self, resp: Response, base64: bool, loop: RetryLoop
    ) -> Generator[ReadChunk, None, None]:
        limit = self._t.config.max_read_bytes
        parser = SSEParser(limit, "DurableConfig.max_read_bytes")
        pending: list[str] = []
        held = 0
        for raw in resp.iter_bytes():
            for event in parser.feed(raw):
                if event.event == "data":
                    held += len(event.data)
                    if held > limit:
                        raise MalformedResponseError(
                            f"the server sent data events of over {limit} bytes without a "
                            "control event (the limit, DurableConfig.max_read_bytes)",
                            code="bad_sse")
                    pending.append(event.data)
                elif event.event == "control":
                    control = parse_control(event.data)
                    chunk = ReadChunk(
                        data=self._sse_data(pending, base64),
                        offset=self.offset,
                        next_offset=control.next_offset,
                        up_to_date=control.up_to_date,
                        closed=control.closed,
                        cursor=control.cursor,
                        etag=None,
                        content_type=self.content_type,
                    )
                    pending, held = [], 0
                    yield self._deliver(chunk, loop)
                    if control.closed:
                        return

    def _sse_data(self, events: list[str], base64: bool) -> bytes:
        if base64:
            return b"".join(decode_base64_data(e) for e in events)
        if not is_json(self.content_type) or len(events) < 2:
            return "".join(events).encode()
        inner = []
        for text in events:
            body = text.strip()
            if not (body.startswith("[") and body.endswith("]")):
                raise MalformedResponseError(
                    "the server sent an SSE data event of a JSON stream that is not a JSON "
                    f"array: {body[:100]!r}",
                    code="bad_json",
                )
            if body[1:-1].strip():
                inner.append(body[1:-1])
        return ("[" + ",".join(inner) + "]").encode()



@dataclass(frozen=True, slots=True)
class ReadPiece:
    """A bounded part of one catch-up answer, for readers that must not hold whole answers.

    `messages`: a JSON stream's complete messages in this piece (None for a byte stream,
    whose bytes are `data`). `offset` and `next_offset` are the answer's (Stream-Next-Offset
    is a header, so it is known from the first piece on); `last` marks the answer's final
    piece, after which the stream has been read up to `next_offset`.
    """

    messages: pa.Array | None
    data: bytes
    offset: str
    next_offset: str
    last: bool
    up_to_date: bool
    closed: bool
    content_type: str | None

    @property
    def json_mode(self) -> bool:
        return self.messages is not None

    @property
    def units(self) -> int:
        """Messages (JSON streams) or bytes in this piece."""
        return len(self.data) if self.messages is None else len(self.messages)


class PieceReader(ResumableRead[ReadPiece]):
    """Catch-up read from `offset` to the tail (or EOF), as pieces of at most about
    `piece_bytes` of body each, so memory stays bounded however large an answer is.

    A failure in the middle of an answer is retried from the answer's offset and the units
    already delivered from it are dropped (streams are append-only, so the answer's prefix
    is the same): nothing is repeated or lost.
    """

    def __init__(
        self,
        transport: Transport,
        url: str,
        target: str,
        offset: str,
        content_type: str | None,
        headers: Mapping[str, str],
        piece_bytes: int,
    ) -> None:
        self._headers = {
            **headers,
            "accept-encoding": "gzip, deflate" if transport.config.compression else "identity",
        }
        self._t = transport
        self._url = url
        self._target = target
        self._piece_bytes = piece_bytes
        self.offset = check_offset(offset)
        self.content_type = content_type
        self.up_to_date = False
        self.closed = False
        self._answer = AnswerPieces()
        self._gen = run_attempts(self._attempt, RetryLoop(transport.config.retry,
                                                          f"read of {target}"))

    def __repr__(self) -> str:
        return f"PieceReader({self._target}, offset={self.offset!r})"

    def _attempt(self, loop: RetryLoop) -> Generator[ReadPiece, None, AttemptOutcome]:
        """One answer, piece by piece."""
        if self.closed or self.up_to_date:
            return "done"
        return (yield from _answer(self._t, self._url, self._target, self.offset,
                                   {"offset": self.offset}, self._headers,
                                   self._t.config.request_timeout,
                                   lambda resp: self._pieces(resp, loop)))

    def _pieces(self, resp: Response, loop: RetryLoop) -> Generator[ReadPiece, None, None]:
        for piece in self._answer.pieces(resp, self.offset, self.content_type,
                                         self._piece_bytes, self._t.config.max_read_bytes):
            if piece.last:
                self.offset, self.content_type = piece.next_offset, piece.content_type
                self.up_to_date, self.closed = piece.up_to_date, piece.closed
            loop.progressed()
            yield piece


def _answer(transport: Transport, url: str, target: str, offset: str, params: Mapping[str, str],
            headers: Mapping[str, str], read: float,
            take: Callable[[Response], Iterator[T]]) -> Generator[T, None, AttemptOutcome]:
    """One catch-up or long-poll GET, its answer's items as `take` makes them while it
    arrives; what ended the attempt (see `run_attempts`)."""
    exchange = Exchange(traced=False)  # reads: stale or not is all that counts
    try:
        with transport.stream(url, params=params, headers=headers, read=read,
                              exchange=exchange) as resp:
            if resp.status_code not in (200, 204):
                return _failed(resp, target, offset)
            yield from take(resp)
    except httpx.TransportError as exc:
        return error_from_transport(exc, target, "read", exchange)
    except BodyDecodingError as exc:
        raise error_from_decoding(exc, target) from exc
    return "reconnect"


def _failed(resp: Response, target: str, offset: str) -> DurableStreamsError:
    """An answer that is not data: the error to retry with (raised if not retryable)."""
    resp.read()
    err = error_from_response(resp, target, offset)
    if err.retryable:
        return err
    raise err


class AnswerPieces:
    """Read answers as they arrive, in pieces; `delivered` counts the units of the answer
    being read that went out, kept across a retry so the answer read again from its start
    goes on after them (streams are append-only: its prefix is the same)."""

    __slots__ = ("delivered",)

    def __init__(self) -> None:
        self.delivered = 0

    def pieces(self, resp: Response, offset: str, content_type: str | None, piece_bytes: int,
               max_message: int) -> Generator[ReadPiece, None, None]:
        """`resp`'s body in pieces of about `piece_bytes` (a JSON stream's: whole messages,
        none over `max_message` bytes), less what went out before. A piece goes out once
        the next has come, so the answer's `last` piece carries data too: two are held at
        most."""
        answer = ReadPiece(
            None, b"", offset, _next_offset(resp, offset), last=False,
            up_to_date=_up_to_date(resp), closed=flag(resp, "stream-closed"),
            content_type=resp.headers.get("content-type") or content_type,
        )
        splitter = (JsonArrayPieces(max_message, "DurableConfig.max_read_bytes")
                    if is_json(answer.content_type) else None)
        skip, held = self.delivered, None
        for raw in resp.iter_bytes(piece_bytes):
            messages = splitter.feed(raw) if splitter is not None else None
            piece = _without_first(answer, messages, raw, skip, last=False)
            skip = max(0, skip - (len(raw) if messages is None else len(messages)))
            if piece.units:
                if held is not None:
                    self.delivered += held.units
                    yield held
                held = piece
        rest = splitter.finish() if splitter is not None else None
        last = _without_first(answer, rest, b"", skip, last=True)
        self.delivered = 0
        yield last if held is None else _joined(held, last)


def _without_first(
    answer: ReadPiece, messages: pa.Array | None, raw: bytes, skip: int, *, last: bool
) -> ReadPiece:
    """A piece of `answer` without its first `skip` units (delivered before a retry)."""
    if messages is not None:
        messages = messages.slice(min(skip, len(messages)))
        raw = b""
    elif skip:
        raw = raw[skip:]
    return replace(answer, messages=messages, data=raw, last=last)


def _joined(first: ReadPiece, last: ReadPiece) -> ReadPiece:
    """`first` with the answer's `last` piece after it (a byte stream's adds no bytes)."""
    if first.messages is None or last.messages is None or not len(last.messages):
        return replace(first, last=True)
    return replace(first, messages=pa.concat_arrays([first.messages, last.messages]), last=True)
