"""S2S session framing: encode frames and decode them incrementally. No I/O.

A frame is a 3-byte big-endian length (flag byte + payload), a flag byte
``[T][CC][A][RRRR]`` and a payload. T marks a terminal frame, whose payload is a
2-byte status and a JSON error and is never compressed. CC is the payload's
compression (none, zstd, gzip). A is "reconnect advised", set by servers about to end
the session (older docs call it reserved). The four low bits are reserved: ignored on
decode, as S2's own decoder does, so newer servers stay readable; never set on encode.
Payloads under 1 KiB are sent uncompressed. A frame's length is at most 2 MiB and a
decompressed payload at most 2 MiB - 1, so a hostile peer cannot make us allocate more.
"""

from __future__ import annotations

import enum
import json
import zlib
from dataclasses import dataclass
from typing import Any

import zstandard

from s2_spark.errors import FrameError

__all__ = [
    "COMPRESSION_THRESHOLD",
    "MAX_FRAME_LENGTH",
    "MAX_PAYLOAD_BYTES",
    "Compression",
    "FrameDecoder",
    "Message",
    "Terminal",
    "compress",
    "encode_message",
    "encode_terminal",
    "message_parts",
]

COMPRESSION_THRESHOLD = 1024
MAX_FRAME_LENGTH = 2 * 1024 * 1024
MAX_PAYLOAD_BYTES = MAX_FRAME_LENGTH - 1

_TERMINAL = 0x80
_COMPRESSION_MASK = 0x60
_COMPRESSION_SHIFT = 5
_RECONNECT_ADVISED = 0x10


class Compression(enum.IntEnum):
    """Payload compression, with the value carried in the flag byte's CC bits."""

    NONE = 0
    ZSTD = 1
    GZIP = 2

    @property
    def token(self) -> str | None:
        """The `Accept-Encoding` token naming this algorithm (None for NONE)."""
        return None if self is Compression.NONE else self.name.lower()

    @classmethod
    def negotiate(cls, accept_encoding: str | None) -> Compression:
        """Pick what a server's S2S frames use for an `Accept-Encoding` header: zstd if
        named, else gzip if named, else none. As s2-lite picks it
        (`CompressionAlgorithm::from_accept_encoding`, api/src/v1/stream/s2s.rs):
        q-values are not looked at, so `zstd;q=0` still names zstd."""
        if not accept_encoding:
            return cls.NONE
        offered = {part.partition(";")[0].strip().lower() for part in accept_encoding.split(",")}
        if "zstd" in offered:
            return cls.ZSTD
        if "gzip" in offered:
            return cls.GZIP
        return cls.NONE


@dataclass(frozen=True, slots=True)
class Message:
    """A regular frame: its decompressed protobuf payload (a memoryview into the input
    from a `FrameDecoder(views=True)`)."""

    body: bytes | memoryview
    reconnect_advised: bool = False


@dataclass(frozen=True, slots=True)
class Terminal:
    """A terminal frame: the session's final HTTP status and its JSON error text."""

    status: int
    body: str

    def error(self) -> dict[str, Any]:
        """The error body as a dict; a non-object body becomes {"message": body}."""
        try:
            parsed = json.loads(self.body) if self.body else {}
        except ValueError:
            return {"message": self.body}
        return parsed if isinstance(parsed, dict) else {"message": parsed}


def encode_message(
    body: bytes, compression: Compression = Compression.NONE, *, reconnect_advised: bool = False
) -> bytes:
    """Frame a protobuf payload, compressing it when it is at least 1 KiB."""
    if len(body) > MAX_PAYLOAD_BYTES:
        raise FrameError(
            f"S2S payload of {len(body)} bytes exceeds the {MAX_PAYLOAD_BYTES}-byte limit"
        )
    if compression is Compression.NONE or len(body) < COMPRESSION_THRESHOLD:
        compression, payload = Compression.NONE, body
    else:
        payload = compress(compression, body)
        if len(payload) > MAX_PAYLOAD_BYTES:
            compression, payload = Compression.NONE, body
    flag = (compression << _COMPRESSION_SHIFT) | (_RECONNECT_ADVISED if reconnect_advised else 0)
    return (len(payload) + 1).to_bytes(3, "big") + bytes((flag,)) + payload


def message_parts(parts: list[bytes | memoryview], compression: Compression = Compression.NONE
                  ) -> list[bytes | memoryview]:
    """`encode_message` of the concatenation of `parts`, as parts to join with others:
    uncompressed, the frame's head and `parts` themselves (a session's body is then copied
    once, where it is joined); compressed, one frame."""
    size = sum(len(p) for p in parts)
    if compression is not Compression.NONE and size >= COMPRESSION_THRESHOLD:
        return [encode_message(b"".join(parts), compression)]
    if size > MAX_PAYLOAD_BYTES:
        raise FrameError(
            f"S2S payload of {size} bytes exceeds the {MAX_PAYLOAD_BYTES}-byte limit"
        )
    return [(size + 1).to_bytes(3, "big") + b"\x00", *parts]


def encode_terminal(status: int, error: str | dict[str, Any]) -> bytes:
    """Frame a terminal message: 2-byte HTTP status and a JSON error body."""
    if not 0 <= status <= 0xFFFF:
        raise FrameError(f"terminal status {status} does not fit in 2 bytes")
    text = error if isinstance(error, str) else json.dumps(error, separators=(",", ":"))
    payload = status.to_bytes(2, "big") + text.encode()
    if len(payload) > MAX_PAYLOAD_BYTES:
        raise FrameError(f"terminal payload of {len(payload)} bytes exceeds the frame limit")
    return (len(payload) + 1).to_bytes(3, "big") + bytes((_TERMINAL,)) + payload


class FrameDecoder:
    """Incremental decoder: feed bytes as they arrive, get whole frames back.

    A frame that spans several chunks is assembled once, when its last byte arrives,
    so a 2 MiB frame fed in 64 KiB chunks is copied a bounded number of times.
    After a terminal frame the session is over, so any further byte is an error.
    `finish()` at end of input reports a truncated trailing frame. With `views`, an
    uncompressed payload that arrived within one input is not copied: its `body` is a
    memoryview into that input (which it keeps alive, and which must not change: feed it
    bytes), for a reader that decodes bodies where they lie (a catch-up read's frames are
    most of its bytes).
    """

    __slots__ = ("_chunks", "_needed", "_pending", "_terminated", "_views")

    def __init__(self, *, views: bool = False) -> None:
        self._views = views
        self._chunks: list[bytes] = []
        self._pending = 0  # bytes held in _chunks
        self._needed = 0  # bytes the first buffered frame needs in all (0: unknown yet)
        self._terminated = False

    @property
    def buffered(self) -> int:
        """Bytes received that do not yet form a whole frame."""
        return self._pending

    def feed(self, data: bytes | bytearray | memoryview) -> list[Message | Terminal]:
        """Consume `data`; return every frame it completes, in order. Of `data`, only a
        frame begun in earlier input is copied to be whole (the rest is read in place)."""
        if self._terminated:
            if data:
                raise FrameError("S2S data received after the terminal frame")
            return []
        if not data:
            return []
        frames: list[Message | Terminal] = []
        if self._chunks:
            if self._needed == 0:  # not even its length yet: a few bytes are held
                data = b"".join([*self._chunks, data])
            elif self._pending + len(data) < self._needed:
                self._chunks.append(bytes(data))
                self._pending += len(data)
                return []
            else:
                view = memoryview(data)
                take = self._needed - self._pending
                self._frames(b"".join([*self._chunks, view[:take]]), frames)
                data = view[take:]
            self._chunks.clear()
            self._pending = self._needed = 0
        self._frames(data, frames)
        return frames

    def _frames(self, data: bytes | bytearray | memoryview,
                frames: list[Message | Terminal]) -> None:
        """Append the whole frames at the start of `data` to `frames`; hold the rest."""
        if self._terminated and data:
            raise FrameError("S2S data received after the terminal frame")
        pos, size = 0, len(data)
        with memoryview(data) as view:
            while size - pos >= 3:
                length = (view[pos] << 16) | (view[pos + 1] << 8) | view[pos + 2]
                if length == 0:
                    raise FrameError("S2S frame has length 0: every frame needs a flag byte")
                if length > MAX_FRAME_LENGTH:
                    raise FrameError(
                        f"S2S frame length {length} exceeds the {MAX_FRAME_LENGTH}-byte limit"
                    )
                end = pos + 3 + length
                if end > size:
                    self._needed = end - pos
                    break
                payload = view[pos + 4 : end]
                frame = _decode_frame(view[pos + 3], payload if self._views else payload.tobytes())
                pos = end
                frames.append(frame)
                if isinstance(frame, Terminal):
                    self._terminated = True
                    if pos != size:
                        raise FrameError("S2S data received after the terminal frame")
                    break
            if pos < size:
                self._chunks.append(view[pos:].tobytes())
                self._pending = size - pos

    def finish(self) -> None:
        """Declare end of input; raise if a partial frame is left over."""
        if self._pending:
            raise FrameError(
                f"S2S input ended inside a frame ({self._pending} bytes of it received)"
            )


def _decode_frame(flag: int, payload: bytes | memoryview) -> Message | Terminal:
    if flag & _TERMINAL:
        if len(payload) < 2:
            raise FrameError("S2S terminal frame is missing its 2-byte status code")
        try:
            text = bytes(payload[2:]).decode()
        except UnicodeDecodeError as e:
            raise FrameError("S2S terminal frame body is not valid UTF-8") from e
        return Terminal(int.from_bytes(payload[:2], "big"), text)
    code = (flag & _COMPRESSION_MASK) >> _COMPRESSION_SHIFT
    if code == 3:
        raise FrameError("S2S frame uses compression code 3, which is reserved")
    body = payload if code == 0 else _decompress(Compression(code), payload)
    return Message(body, bool(flag & _RECONNECT_ADVISED))


def compress(compression: Compression, data: bytes) -> bytes:
    """`data` compressed whole (zstd, or gzip's container): a frame's payload, or an HTTP
    request body of the same algorithm."""
    if compression is Compression.ZSTD:
        return zstandard.ZstdCompressor().compress(data)
    return zlib.compress(data, wbits=31)  # gzip container


def _decompress(compression: Compression, payload: bytes | memoryview) -> bytes:
    try:
        if compression is Compression.ZSTD:
            if zstandard.frame_content_size(payload) > MAX_PAYLOAD_BYTES:
                raise FrameError(_too_big(compression))
            # Bounded even when the frame header does not state the content size.
            out = zstandard.ZstdDecompressor().decompress(
                payload, max_output_size=MAX_PAYLOAD_BYTES + 1
            )
        else:
            z = zlib.decompressobj(wbits=31)
            out = z.decompress(payload, MAX_PAYLOAD_BYTES + 1)
            if not z.eof:
                if len(out) > MAX_PAYLOAD_BYTES:
                    raise FrameError(_too_big(compression))
                raise FrameError("S2S gzip payload is truncated")
            if z.unused_data:
                raise FrameError("S2S gzip payload has trailing bytes")
    except (zstandard.ZstdError, zlib.error) as e:
        raise FrameError(f"S2S {compression.name.lower()} payload is corrupt: {e}") from e
    if len(out) > MAX_PAYLOAD_BYTES:
        raise FrameError(_too_big(compression))
    return out


def _too_big(compression: Compression) -> str:
    return (
        f"S2S {compression.name.lower()} payload decompresses to more than "
        f"{MAX_PAYLOAD_BYTES} bytes"
    )
