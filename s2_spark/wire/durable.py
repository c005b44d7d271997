"""Durable Streams response parsing, no I/O: JSON-mode bodies, SSE events, Arrow batches.

A JSON-mode body is a JSON array whose elements are the stream's messages. `split_json_array`
finds the top-level elements in one C pass (`_fastjson`, optional) or with numpy over the
body's structural bytes only (quotes, backslashes, brackets, commas, whitespace); either
way no Python object is made per message: the Arrow string column is built from one
offsets buffer and the body minus separators. Each
row is the message's JSON text as the server sent it (surrounding whitespace trimmed).

`JsonArrayPieces` splits a body as it arrives, piece by piece, so a reader holds one piece
of a large response at a time instead of the whole body.

The structure is checked, the same by both paths (one top-level array, brackets balanced
and of matching kinds, at most 1024 levels deep, terminated strings without raw control
characters (RFC 8259), no empty elements, only JSON characters outside strings, valid
UTF-8); a full grammar check of every value is left to whoever parses the messages.
"""

from __future__ import annotations

import base64
import binascii
import json
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from s2_spark.errors import MalformedResponseError
from s2_spark.wire._accelerator import fastjson as _fastjson

IMPLEMENTATION = "c" if _fastjson is not None else "numpy"
"""Which splitter `split_json_array` uses: "c" (the `_fastjson` extension) or "numpy"."""

__all__ = [
    "BYTES_SCHEMA",
    "IMPLEMENTATION",
    "JSON_SCHEMA",
    "ControlEvent",
    "JsonArrayPieces",
    "SSEEvent",
    "SSEParser",
    "binary_array",
    "bytes_batch",
    "decode_base64_data",
    "json_array_bytes",
    "json_batch",
    "parse_control",
    "split_json_array",
    "split_json_array_numpy",
]

# One row per message: its JSON text.
JSON_SCHEMA = pa.schema([pa.field("value", pa.string(), nullable=False)])
# One row per response chunk of a byte stream: the bytes exactly as stored (a byte stream
# has no message boundaries, so a chunk is the unit the server delivered).
BYTES_SCHEMA = pa.schema([pa.field("value", pa.binary(), nullable=False)])

# Arrays here are made from buffers, never `pa.array(<a list or ndarray>)`: pyarrow asks
# whether such an argument is a pandas object, importing pandas (0.4-0.6 s of CPU) into
# every Spark Python process that reads a Durable Stream, which needs nothing of it.
_EMPTY_STRINGS = pa.StringArray.from_buffers(0, pa.py_buffer(np.zeros(1, np.int32)),
                                             pa.py_buffer(b""))

_OTHER, _QUOTE, _BACKSLASH, _OPEN, _CLOSE, _COMMA, _SPACE, _BAD = range(8)
_CLASSES = np.zeros(256, dtype=np.uint8)
_CLASSES[ord('"')] = _QUOTE
_CLASSES[ord("\\")] = _BACKSLASH
_CLASSES[[ord("["), ord("{")]] = _OPEN
_CLASSES[[ord("]"), ord("}")]] = _CLOSE
_CLASSES[ord(",")] = _COMMA
_CLASSES[[ord(" "), ord("\t"), ord("\n"), ord("\r")]] = _SPACE
# Bytes that may appear outside strings besides the structural ones: numbers, literals, ':'.
_ALLOWED_OUTSIDE = set(b"0123456789+-.eEtrufalsn:")
_CLASSES[[b for b in range(256) if _CLASSES[b] == 0 and b not in _ALLOWED_OUTSIDE]] = _BAD
_MAX_DEPTH = 1024  # nesting levels, the outer array included (as the C splitter allows)


def _bad(what: str) -> MalformedResponseError:
    return MalformedResponseError(
        f"the server sent an invalid JSON-mode body ({what}); a JSON stream's read answer "
        "must be one JSON array of messages",
        code="bad_json",
    )


def split_json_array(body: bytes) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]:
    """Split a JSON array into its elements: (int32 offsets, element bytes concatenated)."""
    if _fastjson is None:
        return split_json_array_numpy(body)
    try:
        offsets, values = _fastjson.split_json_array(body)
    except ValueError as exc:
        raise _bad(str(exc)) from None
    return np.frombuffer(offsets, dtype=np.int32), np.frombuffer(values, dtype=np.uint8)


def split_json_array_numpy(body: bytes) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]:
    """The numpy path of `split_json_array` (used without the C accelerator)."""
    data = np.frombuffer(body, dtype=np.uint8)
    pos, c, real_quote, outside = _scanned(data)
    if real_quote.sum() % 2:
        raise _bad("unterminated string")
    if np.any(outside & (c == _BAD)) or np.any(outside & (c == _BACKSLASH)):
        raise _bad("a character outside strings that JSON does not allow")
    delta = np.where(outside & (c == _OPEN), 1, 0) - np.where(outside & (c == _CLOSE), 1, 0)
    depth_after = np.cumsum(delta, dtype=np.int64)
    depth_at = depth_after - delta
    structural = outside & ~real_quote
    top = structural & (depth_at <= 1)
    boundary = (top & (c == _COMMA)) | (outside & (c == _OPEN) & (depth_at == 0))
    boundary |= outside & (c == _CLOSE) & (depth_after == 0)
    _check_shape(body, pos, c, outside, depth_after)
    _check_nesting(data, pos, c, outside, depth_after)
    if np.any((data[pos] < 0x20) & ~outside):
        raise _bad("a control character inside a string")
    removed = boundary | (top & (c == _SPACE))
    removed_before = np.cumsum(removed, dtype=np.int64) - removed
    j = np.flatnonzero(boundary)
    lengths = (pos[j[1:]] - pos[j[:-1]] - 1) - (removed_before[j[1:]] - removed_before[j[:-1]] - 1)
    if len(lengths) == 1 and lengths[0] == 0:
        lengths = lengths[:0]  # "[]": no messages
    elif np.any(lengths == 0):
        raise _bad("an empty element")
    keep = np.ones(len(data), dtype=bool)
    keep[pos[removed]] = False
    keep[: pos[j[0]]] = False
    keep[pos[j[-1]] + 1 :] = False
    offsets = np.zeros(len(lengths) + 1, dtype=np.int32)
    np.cumsum(lengths, out=offsets[1:])
    return offsets, data[keep]


def _scanned(data: np.ndarray[Any, Any]) -> tuple[np.ndarray[Any, Any], ...]:
    """The structural bytes of a body: their positions, classes, which are unescaped
    quotes, and which lie outside strings."""
    cls = _CLASSES[data]
    pos = np.flatnonzero(cls)
    c = cls[pos]
    real_quote = (c == _QUOTE) & ~_escaped(pos, c)
    outside = ((np.cumsum(real_quote, dtype=np.int64) - real_quote) & 1) == 0
    return pos, c, real_quote, outside


def _escaped(pos: np.ndarray[Any, Any], c: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    """Which special bytes follow an odd run of backslashes (so are escaped)."""
    bs = c == _BACKSLASH
    adjacent = np.zeros(len(pos), dtype=bool)
    adjacent[1:] = bs[:-1] & (pos[:-1] == pos[1:] - 1)
    run_start = bs & ~adjacent
    start = np.maximum.accumulate(np.where(run_start, pos, -1)) if len(pos) else pos
    out = np.zeros(len(pos), dtype=bool)
    prev_start = start[:-1]
    out[1:] = adjacent[1:] & ((pos[1:] - prev_start) % 2 == 1)
    return out


def _check_shape(
    body: bytes,
    pos: np.ndarray[Any, Any],
    c: np.ndarray[Any, Any],
    outside: np.ndarray[Any, Any],
    depth_after: np.ndarray[Any, Any],
) -> None:
    stripped = body.strip(b" \t\r\n")
    if not stripped.startswith(b"[") or not stripped.endswith(b"]"):
        raise _bad("not a JSON array")
    if np.any(depth_after < 0):
        raise _bad("unbalanced brackets")
    closes = np.flatnonzero(outside & (depth_after == 0) & (c == _CLOSE))
    if len(closes) != 1 or depth_after[-1] != 0 or pos[closes[0]] != len(body.rstrip()) - 1:
        raise _bad("unbalanced brackets or data after the array")


def _check_nesting(
    data: np.ndarray[Any, Any],
    pos: np.ndarray[Any, Any],
    c: np.ndarray[Any, Any],
    outside: np.ndarray[Any, Any],
    depth_after: np.ndarray[Any, Any],
) -> None:
    """Each closing bracket matches the kind of its opening one; at most 1024 levels deep.

    Ordered by nesting level, then by position, a balanced body's brackets come in
    open/close pairs, and the pairs' bytes differ by 2 (`[` `]`, `{` `}`).
    """
    if len(depth_after) and depth_after.max() > _MAX_DEPTH:
        raise _bad("nesting too deep")
    brackets = outside & ((c == _OPEN) | (c == _CLOSE))
    level = depth_after[brackets] + (c[brackets] == _CLOSE)
    kinds = data[pos[brackets][np.lexsort((pos[brackets], level))]].astype(np.int16)
    if np.any(kinds[1::2] - kinds[0::2] != 2):
        raise _bad("unbalanced brackets")


def json_batch(body: bytes) -> pa.RecordBatch:
    """One row per message of a JSON-mode body: `value` = the message's JSON text."""
    return pa.RecordBatch.from_arrays([_strings(*split_json_array(body))], schema=JSON_SCHEMA)


def _strings(offsets: np.ndarray[Any, Any], values: np.ndarray[Any, Any] | bytes) -> pa.Array:
    array = pa.StringArray.from_buffers(
        len(offsets) - 1, pa.py_buffer(offsets), pa.py_buffer(values)
    )
    try:
        array.validate(full=True)
    except pa.ArrowInvalid as exc:
        raise _bad("not valid UTF-8") from exc
    return array


class JsonArrayPieces:
    """Splits a JSON-mode body that arrives in pieces into its messages, as it arrives.

    `feed` returns the messages completed so far (a string array) and keeps the unfinished
    rest, at most one message plus one piece; `finish` checks the array ended. A message
    still unfinished after more than `max_message` bytes fails (naming `limit_name`, the
    setting that raises it), so a body of any length is read in bounded memory. Without
    the C accelerator the same is done with numpy (`_complete_prefix`).
    """

    def __init__(self, max_message: int | None = None, limit_name: str = "") -> None:
        self._rest = b""
        self._continued = False  # the rest starts after a top-level comma, not at '['
        self._closed = False
        self._max = max_message
        self._limit = f" ({limit_name})" if limit_name else ""

    def feed(self, piece: bytes) -> pa.Array:
        if self._closed:
            if piece.strip(b" \t\r\n"):
                raise _bad("data after the array")
            return _EMPTY_STRINGS
        body = self._rest + piece if self._rest else piece
        if not self._continued and not body.strip(b" \t\r\n"):
            self._rest = body
            return _EMPTY_STRINGS
        offsets, values, consumed, closed = _split_prefix(body, self._continued)
        self._rest = body[consumed:]
        self._continued = self._continued or consumed > 0
        self._closed = closed
        if self._max is not None and (
                len(self._rest) > self._max
                or (len(offsets) > 1 and int(np.diff(offsets).max()) > self._max)):
            raise MalformedResponseError(
                f"the server sent a message over {self._max} bytes{self._limit}",
                code="bad_json")
        return _strings(offsets, values)

    def finish(self) -> pa.Array:
        """The last messages; raises unless the body was one whole JSON array."""
        if self._closed or not (self._continued or self._rest.strip(b" \t\r\n")):
            return _EMPTY_STRINGS  # done, or an empty body: no messages
        raise _bad("not a JSON array" if not self._continued else "the array never ends")


def _split_prefix(body: bytes, continued: bool
                  ) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any] | bytes, int, bool]:
    """The complete elements of a received prefix of an array (`continued`: it starts
    right after a top-level comma): (offsets, values, bytes consumed, array closed)."""
    if _fastjson is not None:
        try:
            offsets, values, consumed, closed = _fastjson.split_json_prefix(body, continued)
        except ValueError as exc:
            raise _bad(str(exc)) from None
        return np.frombuffer(offsets, dtype=np.int32), values, consumed, closed
    return _split_prefix_numpy(body, continued)


def _split_prefix_numpy(body: bytes, continued: bool
                        ) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any], int, bool]:
    """`_split_prefix` without C: find where the complete elements end, split them whole."""
    if not continued and not body.lstrip(b" \t\r\n").startswith(b"["):
        raise _bad("not a JSON array")
    array = b"[" + body if continued else body
    shift = 1 if continued else 0
    cut, closed = _complete_prefix(array)
    if cut < 0:
        return np.zeros(1, dtype=np.int32), np.zeros(0, dtype=np.uint8), 0, False
    offsets, values = split_json_array_numpy(array if closed else array[:cut] + b"]")
    if len(offsets) == 1 and (continued or not closed):  # nothing beside a comma
        raise _bad("an empty element")
    return offsets, values, len(body) if closed else cut + 1 - shift, closed


def _complete_prefix(array: bytes) -> tuple[int, bool]:
    """Where the complete elements of an array's received prefix end: the position of its
    closing bracket (True) or of its last top-level comma (False); -1 when neither came."""
    pos, c, real_quote, outside = _scanned(np.frombuffer(array, dtype=np.uint8))
    structural = outside & ~real_quote
    delta = (np.where(structural & (c == _OPEN), 1, 0)
             - np.where(structural & (c == _CLOSE), 1, 0))
    depth_after = np.cumsum(delta, dtype=np.int64)
    closes = np.flatnonzero(structural & (c == _CLOSE) & (depth_after <= 0))
    if len(closes):
        return int(pos[closes[0]]), True
    commas = np.flatnonzero(structural & (c == _COMMA) & (depth_after == 1))
    return (int(pos[commas[-1]]), False) if len(commas) else (-1, False)


def json_array_bytes(messages: pa.Array) -> bytes:
    """Messages (their JSON texts, a string array) as one JSON array, without a Python
    object per message: the texts joined by commas, in brackets."""
    if not len(messages):
        return b"[]"
    _, offsets_buf, values_buf = messages.buffers()
    offsets = np.frombuffer(offsets_buf, dtype=np.int32)[messages.offset:
                                                         messages.offset + len(messages) + 1]
    values = np.frombuffer(values_buf, dtype=np.uint8)[offsets[0]:offsets[-1]]
    return b"[" + np.insert(values, offsets[1:-1] - offsets[0], ord(",")).tobytes() + b"]"


def bytes_batch(chunks: list[bytes]) -> pa.RecordBatch:
    """One row per delivered chunk of a byte stream: `value` = the chunk's bytes."""
    return pa.RecordBatch.from_arrays([binary_array(chunks)], schema=BYTES_SCHEMA)


def binary_array(chunks: list[bytes]) -> pa.Array:
    """`chunks` as a binary array, made from buffers (see `_EMPTY_STRINGS`); together at
    most 2 GiB, as a binary array holds."""
    offsets = np.zeros(len(chunks) + 1, dtype=np.int64)
    np.cumsum([len(chunk) for chunk in chunks], out=offsets[1:])
    if offsets[-1] > np.iinfo(np.int32).max:
        raise ValueError(f"{offsets[-1]} bytes of chunks: a binary array holds 2 GiB at most")
    return pa.Array.from_buffers(pa.binary(), len(chunks), [
        None, pa.py_buffer(offsets.astype(np.int32)), pa.py_buffer(b"".join(chunks))])


@dataclass(frozen=True, slots=True)
class SSEEvent:
    """One dispatched SSE event: its type ("message" when unnamed) and its data text."""

    event: str
    data: str


#: The default bound on one SSE event from a Durable Streams server (its lines, data and
#: the data events before the next control event): a server whose line or event never
#: ends gets a `MalformedResponseError` naming it instead of the client's memory.
MAX_SSE_EVENT = 64 << 20


class SSEParser:
    """Incremental Server-Sent Events parser (the WHATWG event-stream rules).

    Lines end in LF, CRLF or CR; `data:` lines join with LF; one leading space after the
    colon is dropped; comments and unknown fields are ignored; a blank line dispatches.
    An event (its unfinished line included) larger than `max_event` bytes is an error
    (naming `limit_name`, the setting that raises it, where there is one).
    """

    def __init__(self, max_event: int = MAX_SSE_EVENT, limit_name: str = "") -> None:
        self._max = max_event
        self._limit = f" ({limit_name})" if limit_name else ""
        self._buf = b""
        self._parts: list[bytes] = []  # a line's bytes while no line break came
        self._line_bytes = 0  # of the unfinished line (`_buf` and `_parts`)
        self._data_bytes = 0  # of the event's data lines so far
        self._event = ""
        self._data: list[str] = []
        self._pending_cr = False

    def _check(self) -> None:
        if self._line_bytes + self._data_bytes > self._max:
            raise MalformedResponseError(
                f"the server sent an SSE event over {self._max} bytes{self._limit}",
                code="bad_sse")

    def feed(self, chunk: bytes) -> list[SSEEvent]:
        """Parse more bytes; return the events completed by them."""
        if not chunk:  # nothing new; a CR that ended the last chunk still awaits its LF
            return []
        if self._pending_cr and chunk.startswith(b"\n"):
            chunk = chunk[1:]
        self._pending_cr = False
        if not chunk:
            return []
        if b"\n" not in chunk and b"\r" not in chunk:  # held, not joined: linear time
            self._line_bytes += len(chunk)
            self._check()
            self._parts.append(chunk)
            return []
        buf = b"".join([self._buf, *self._parts, chunk])
        self._parts = []
        lines = buf.replace(b"\r\n", b"\n").replace(b"\r", b"\n").split(b"\n")
        self._buf = lines.pop()
        if buf.endswith(b"\r"):
            self._pending_cr = True
        self._line_bytes = 0
        events: list[SSEEvent] = []
        for raw in lines:
            event = self._line(raw)
            if event is not None:
                events.append(event)
        self._line_bytes = len(self._buf)
        self._check()
        return events

    def _line(self, raw: bytes) -> SSEEvent | None:
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise MalformedResponseError(
                "the server sent an SSE line that is not UTF-8", code="bad_sse"
            ) from exc
        if not line:
            if not self._data and not self._event:
                return None
            event = SSEEvent(self._event or "message", "\n".join(self._data))
            self._event, self._data, self._data_bytes = "", [], 0
            return event
        if line.startswith(":"):
            return None
        name, _, value = line.partition(":")
        if value.startswith(" "):
            value = value[1:]
        if name == "data":
            self._data_bytes += len(value) + 1
            self._check()
            self._data.append(value)
        elif name == "event":
            self._event = value
        return None

    def finish(self) -> bool:
        """Whether the stream ended cleanly (no half line or undispatched event left)."""
        return not self._buf and not self._parts and not self._data and not self._event


@dataclass(frozen=True, slots=True)
class ControlEvent:
    """An SSE `control` event: where to resume, and whether the stream is caught up/closed."""

    next_offset: str
    cursor: str | None
    up_to_date: bool
    closed: bool


def parse_control(data: str) -> ControlEvent:
    """Parse a control event's JSON; a missing or non-string `streamNextOffset` is malformed."""
    try:
        info = json.loads(data)
    except ValueError as exc:
        raise MalformedResponseError(
            f"the server sent an SSE control event that is not JSON: {data[:200]!r}",
            code="bad_control",
        ) from exc
    offset = info.get("streamNextOffset") if isinstance(info, dict) else None
    if not isinstance(offset, str) or not offset:
        raise MalformedResponseError(
            f"the server sent an SSE control event without streamNextOffset: {data[:200]!r}",
            code="bad_control",
        )
    cursor = info.get("streamCursor")
    closed = info.get("streamClosed") is True
    return ControlEvent(
        next_offset=offset,
        cursor=cursor if isinstance(cursor, str) else None,
        up_to_date=info.get("upToDate") is True or closed,
        closed=closed,
    )


def decode_base64_data(data: str) -> bytes:
    """Decode a base64 SSE data event (line breaks between `data:` lines removed)."""
    text = data.replace("\n", "").replace("\r", "")
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise MalformedResponseError(
            f"the server sent invalid base64 in an SSE data event: {text[:100]!r}",
            code="bad_base64",
        ) from exc
