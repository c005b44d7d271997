"""One stream: create, append, close, HEAD, DELETE and reads."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any
from urllib.parse import urlsplit

from s2_spark.errors import MalformedResponseError, StreamBadRequestError

from ._errors import header_int
from ._reads import (
    LiveMode,
    PieceReader,
    ReadChunk,
    StreamReader,
    check_offset,
    flag,
    is_json,
    parse_chunk,
)
from ._transport import Transport

__all__ = ["AppendResult", "CreateResult", "DurableStream", "StreamInfo"]


@dataclass(frozen=True, slots=True)
class CreateResult:
    """`created` is False when the stream already existed with the same configuration."""

    created: bool
    next_offset: str | None
    closed: bool


@dataclass(frozen=True, slots=True)
class AppendResult:
    """The tail after an append; `duplicate` is True for a producer retry the server had
    already applied (204), `closed` when the stream is now closed."""

    next_offset: str | None
    closed: bool
    duplicate: bool = False
    producer_epoch: int | None = None
    producer_seq: int | None = None


@dataclass(frozen=True, slots=True)
class StreamInfo:
    """HEAD: the stream's content type, tail offset, closure, TTL / expiry and ETag."""

    content_type: str | None
    next_offset: str
    closed: bool
    ttl: int | None
    expires_at: str | None
    etag: str | None


def encode_json_messages(messages: Iterable[Any]) -> bytes:
    """A JSON array whose elements become one message each (the server flattens one level)."""
    items = list(messages)
    if not items:
        raise StreamBadRequestError(
            "append_json needs at least one message (an empty array is rejected by the "
            "protocol)",
            code="empty_append",
        )
    return json.dumps(items, separators=(",", ":"), ensure_ascii=False).encode()


class DurableStream:
    """A handle on one stream URL; cheap, holds no connection of its own."""

    def __init__(self, transport: Transport, url: str, content_type: str | None = None) -> None:
        self._t = transport
        self.url = url
        self.content_type = content_type
        self._target = f"stream {urlsplit(url).path!r}"

    def __repr__(self) -> str:
        return f"DurableStream({self.url!r})"

    def create(
        self,
        content_type: str = "application/octet-stream",
        *,
        ttl: int | None = None,
        expires_at: datetime | str | None = None,
        body: bytes | None = None,
        closed: bool = False,
        headers: Mapping[str, str] | None = None,
    ) -> CreateResult:
        """Create the stream (idempotent for the same configuration)."""
        if ttl is not None and expires_at is not None:
            raise ValueError("pass ttl or expires_at, not both (the protocol rejects both)")
        if ttl is not None and (isinstance(ttl, bool) or not isinstance(ttl, int) or ttl < 0):
            raise ValueError(f"ttl must be a whole number of seconds >= 0 (got {ttl!r})")
        hdrs = {**(headers or {}), "content-type": content_type}
        if ttl is not None:
            hdrs["stream-ttl"] = str(ttl)
        if expires_at is not None:
            hdrs["stream-expires-at"] = (
                expires_at.isoformat() if isinstance(expires_at, datetime) else expires_at
            )
        if closed:
            hdrs["stream-closed"] = "true"
        resp = self._t.request(
            "PUT", self.url, target=self._target, headers=hdrs, content=body, ok=(200, 201)
        )
        self.content_type = content_type
        return CreateResult(
            created=resp.status_code == 201,
            next_offset=resp.headers.get("stream-next-offset"),
            closed=flag(resp, "stream-closed"),
        )

    def _known_content_type(self) -> str:
        if self.content_type is None:
            self.content_type = self.head().content_type or "application/octet-stream"
        return self.content_type

    def append(
        self,
        data: bytes | str,
        *,
        seq: str | None = None,
        close: bool = False,
        headers: Mapping[str, str] | None = None,
        retry_unknown: bool = False,
    ) -> AppendResult:
        """Append bytes (for JSON streams: one JSON value, or an array of messages).

        Not retried when the outcome is unknown (that could duplicate data) unless
        `retry_unknown=True` accepts at-least-once; use an `IdempotentProducer` for appends
        that must survive failures exactly once.
        """
        content = data.encode() if isinstance(data, str) else bytes(data)
        hdrs = {"content-type": self._known_content_type(), **(headers or {})}
        if seq is not None:
            hdrs["stream-seq"] = seq
        if close:
            hdrs["stream-closed"] = "true"
        idempotent = "producer-id" in hdrs
        resp = self._t.request(
            "POST",
            self.url,
            target=self._target,
            headers=hdrs,
            content=content,
            retry="always" if idempotent or retry_unknown else "unsent",
        )
        return AppendResult(
            next_offset=resp.headers.get("stream-next-offset"),
            closed=flag(resp, "stream-closed"),
            duplicate=idempotent and resp.status_code == 204,
            producer_epoch=header_int(resp, "producer-epoch"),
            producer_seq=header_int(resp, "producer-seq"),
        )

    def append_json(self, messages: Iterable[Any], *, seq: str | None = None) -> AppendResult:
        """Append each item of `messages` as one message of a JSON stream."""
        return self.append(encode_json_messages(messages), seq=seq)

    def close(
        self, body: bytes | str | None = None, *, headers: Mapping[str, str] | None = None
    ) -> AppendResult:
        """Close the stream (EOF for readers), optionally appending a final body atomically."""
        content = b"" if body is None else body.encode() if isinstance(body, str) else body
        hdrs = {**(headers or {}), "stream-closed": "true"}
        if content:
            hdrs["content-type"] = self._known_content_type()
        # Closing is idempotent (closing a closed stream succeeds), so retries are safe
        # without a body; with one, an unknown outcome could append it twice.
        resp = self._t.request(
            "POST",
            self.url,
            target=self._target,
            headers=hdrs,
            content=content,
            retry="unsent" if content else "always",
        )
        return AppendResult(next_offset=resp.headers.get("stream-next-offset"), closed=True)

    def head(self, *, headers: Mapping[str, str] | None = None) -> StreamInfo:
        resp = self._t.request("HEAD", self.url, target=self._target, ok=(200,), headers=headers)
        next_offset = resp.headers.get("stream-next-offset")
        if not next_offset:
            raise MalformedResponseError(
                f"the server answered HEAD of {self._target} without Stream-Next-Offset",
                status=resp.status_code,
                code="bad_header",
            )
        self.content_type = resp.headers.get("content-type") or self.content_type
        return StreamInfo(
            content_type=resp.headers.get("content-type"),
            next_offset=next_offset,
            closed=flag(resp, "stream-closed"),
            ttl=header_int(resp, "stream-ttl"),
            expires_at=resp.headers.get("stream-expires-at"),
            etag=resp.headers.get("etag"),
        )

    def delete(self, *, headers: Mapping[str, str] | None = None) -> None:
        self._t.request(
            "DELETE", self.url, target=self._target, ok=(200, 202, 204), headers=headers
        )

    def get(
        self,
        offset: str = "-1",
        *,
        live: LiveMode = None,
        cursor: str | None = None,
        if_none_match: str | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> ReadChunk:
        """One catch-up or long-poll read (retried on transient failures), its answer held
        whole: one over `DurableConfig.max_read_bytes` fails at once with
        `MalformedResponseError` naming it (servers answer a catch-up read from the start
        with the whole backlog). `read()` takes answers of any length as they arrive."""
        if live not in (None, "long-poll"):
            raise ValueError(f"get() reads with live=None or 'long-poll' (got {live!r})")
        params = {"offset": check_offset(offset)}
        if live:
            params["live"] = live
        if cursor:
            params["cursor"] = cursor
        hdrs = {
            **(headers or {}),
            "accept-encoding": "gzip" if self._t.config.compression else "identity",
        }
        if if_none_match:
            hdrs["if-none-match"] = if_none_match
        resp = self._t.request(
            "GET",
            self.url,
            target=self._target,
            params=params,
            headers=hdrs,
            ok=(200, 204, 304),
            offset=offset,
            read_timeout=self._t.config.live_timeout if live else None,
        )
        return parse_chunk(resp, offset, self.content_type)

    def read(
        self,
        offset: str = "-1",
        *,
        live: LiveMode = None,
        headers: Mapping[str, str] | None = None,
    ) -> StreamReader:
        """Chunks from `offset` ("-1": start, "now": tail); see StreamReader for `live`.
        A catch-up or long-poll answer of any length is taken as it arrives, in chunks of
        at most about `READ_CHUNK_BYTES` (`partial` but the last)."""
        content_type = self.content_type
        if live == "sse" and content_type is None:
            content_type = self._known_content_type()
        return StreamReader(
            self._t, self.url, self._target, offset, live, content_type, headers or {}
        )

    def read_pieces(
        self,
        offset: str = "-1",
        *,
        piece_bytes: int = 4 * 1024 * 1024,
        content_type: str | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> PieceReader:
        """Catch-up read from `offset` to the tail in pieces of about `piece_bytes` of body
        (JSON: whole messages only), for readers that must not hold a whole answer.
        `content_type` is assumed for answers that do not name theirs."""
        if piece_bytes < 1:
            raise ValueError(f"piece_bytes must be at least 1 (got {piece_bytes!r})")
        return PieceReader(self._t, self.url, self._target, offset,
                           content_type or self.content_type, headers or {}, piece_bytes)

    def is_json(self) -> bool:
        return is_json(self._known_content_type())
