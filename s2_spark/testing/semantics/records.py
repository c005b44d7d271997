"""Record encoding for the local server: each record is stored once, already encoded.

A stored record is the exact bytes of one `records` entry of a protobuf ReadBatch
(field tag, length, SequencedRecord), so a read joins stored bytes instead of
re-encoding, which is what lets the server stream a million records a second.
"""

from __future__ import annotations

from dataclasses import dataclass

from s2_spark._proto import s2_pb2
from s2_spark.wire.appends import MAX_BATCH_BYTES, MAX_BATCH_RECORDS, encode_varint

__all__ = [
    "MAX_BATCH_BYTES",
    "MAX_BATCH_RECORDS",
    "CommandKind",
    "ValidationFailed",
    "decode_entry",
    "encode_entries",
    "encode_entry",
    "encode_position",
    "encode_varint",
]

MAX_FENCING_TOKEN_BYTES = 36


class ValidationFailed(Exception):
    """Input that S2 rejects with 422 `invalid` (S2's own wording where it has one)."""


class CommandKind:
    """Names of the command records (a single header with an empty name)."""

    FENCE = b"fence"
    TRIM = b"trim"


_SMALL_VARINTS = [encode_varint(i) for i in range(16384)]


_LARGE_VARINTS: dict[int, bytes] = {}


def _varint(value: int) -> bytes:
    """Varint with caches: small values from a table, large ones (timestamps, which
    repeat across a batch and its ack) from a small memo."""
    if value < 16384:
        return _SMALL_VARINTS[value]
    cached = _LARGE_VARINTS.get(value)
    if cached is None:
        if len(_LARGE_VARINTS) >= 4096:
            _LARGE_VARINTS.clear()
        cached = _LARGE_VARINTS[value] = encode_varint(value)
    return cached


def encode_entry(
    seq_num: int, timestamp: int, headers: list[tuple[bytes, bytes]], body: bytes
) -> bytes:
    """A ReadBatch `records` entry (tag 1, length, SequencedRecord) in canonical form."""
    parts: list[bytes] = []
    if seq_num:
        parts.append(b"\x08" + _varint(seq_num))
    if timestamp:
        parts.append(b"\x10" + _varint(timestamp))
    for name, value in headers:
        header = b""
        if name:
            header += b"\x0a" + _varint(len(name)) + name
        if value:
            header += b"\x12" + _varint(len(value)) + value
        parts.append(b"\x1a" + _varint(len(header)) + header)
    if body:
        parts.append(b"\x22" + _varint(len(body)) + body)
    record = b"".join(parts)
    return b"\x0a" + _varint(len(record)) + record


def encode_position(field: int, seq_num: int, timestamp: int) -> bytes:
    """A StreamPosition as a length-delimited field `field` of the enclosing message."""
    inner = b""
    if seq_num:
        inner += b"\x08" + _varint(seq_num)
    if timestamp:
        inner += b"\x10" + _varint(timestamp)
    return bytes(((field << 3) | 2,)) + _varint(len(inner)) + inner


_LOW = [bytes((0x80 | i,)) for i in range(128)]


def encode_entries(
    first_seq: int,
    timestamps: list[int],
    records: list[tuple[int | None, list[tuple[bytes, bytes]], bytes]],
) -> list[bytes]:
    """Encode a sequenced batch; the hot path of appends, so varints are cached.

    Sequence numbers are consecutive, so the varint above the low 7 bits changes only
    every 128 records; timestamps usually repeat within a batch.
    """
    if (
        first_seq >= 128
        and timestamps
        and timestamps[0] == timestamps[-1]
        and not any(r[1] for r in records)
    ):
        return _encode_plain(first_seq, timestamps[0], [r[2] for r in records])
    out: list[bytes] = []
    append = out.append
    small = _SMALL_VARINTS
    low = _LOW
    seq = first_seq
    upper_key = -1
    upper = b""
    ts_key = -1
    ts_part = b""
    for (_, headers, body), ts in zip(records, timestamps, strict=True):
        if seq < 128:
            seq_part = b"\x08" + small[seq] if seq else b""
        else:
            key = seq >> 7
            if key != upper_key:
                upper_key, upper = key, _varint(key)
            seq_part = b"\x08" + low[seq & 0x7F] + upper
        if ts != ts_key:
            ts_key = ts
            ts_part = b"\x10" + _varint(ts) if ts else b""
        if headers:
            append(encode_entry(seq, ts, headers, body))
            seq += 1
            continue
        n = len(body)
        if n:
            blen = small[n] if n < 16384 else encode_varint(n)
            rec_len = len(seq_part) + len(ts_part) + 1 + len(blen) + n
            head = small[rec_len] if rec_len < 16384 else encode_varint(rec_len)
            append(b"".join((b"\x0a", head, seq_part, ts_part, b"\x22", blen, body)))
        else:
            rec_len = len(seq_part) + len(ts_part)
            append(b"\x0a" + small[rec_len] + seq_part + ts_part)
        seq += 1
    return out


def _encode_plain(first_seq: int, timestamp: int, bodies: list[bytes]) -> list[bytes]:
    """Records without headers sharing one timestamp (the usual batch), seq >= 128.

    Works in blocks of sequence numbers that share the varint above their low 7 bits,
    so each record costs one join of cached pieces.
    """
    small = _SMALL_VARINTS
    low = _LOW
    ts_part = b"\x10" + _varint(timestamp) if timestamp else b""
    out: list[bytes] = []
    seq = first_seq
    i, n = 0, len(bodies)
    while i < n:
        lo = seq & 0x7F
        j = min(n, i + 128 - lo)
        upper = _varint(seq >> 7)
        # tag 08 + low byte + upper, ts part, tag 22; then the body length and body.
        fixed = 2 + len(upper) + len(ts_part) + 1
        mid = upper + ts_part + b"\x22"
        block = bodies[i:j]
        lengths = list(map(len, block))
        if min(lengths) > 0 and max(lengths) < 128:
            out.extend(
                [
                    b"".join(
                        (
                            b"\x0a",
                            small[fixed + 1 + len(b)],
                            b"\x08",
                            low[lo + k],
                            mid,
                            small[len(b)],
                            b,
                        )
                    )
                    for k, b in enumerate(block)
                ]
            )
        else:
            for k, b in enumerate(block):
                if not b:  # proto3 omits an empty body
                    rec = b"\x08" + low[lo + k] + upper + ts_part
                    out.append(b"\x0a" + _varint(len(rec)) + rec)
                    continue
                blen = _varint(len(b))
                out.append(
                    b"".join(
                        (
                            b"\x0a",
                            _varint(fixed + len(blen) + len(b)),
                            b"\x08",
                            low[lo + k],
                            mid,
                            blen,
                            b,
                        )
                    )
                )
        seq += j - i
        i = j
    return out


@dataclass(frozen=True, slots=True)
class DecodedRecord:
    """A stored record decoded back into fields (for JSON and SSE responses)."""

    seq_num: int
    timestamp: int
    headers: list[tuple[bytes, bytes]]
    body: bytes


def decode_entry(entry: bytes) -> DecodedRecord:
    """Decode a stored `records` entry (slow path: JSON and SSE reads only)."""
    # Skip the tag byte and the length varint.
    pos = 1
    while entry[pos] & 0x80:
        pos += 1
    rec = s2_pb2.SequencedRecord()
    rec.ParseFromString(entry[pos + 1 :])
    return DecodedRecord(
        rec.seq_num, rec.timestamp, [(h.name, h.value) for h in rec.headers], rec.body
    )


# ---------------------------------------------------------------- AppendInput parsing


def _read_varint(data: bytes, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        b = data[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if b < 0x80:
            if shift >= 64 or result >= 1 << 64:
                raise ValueError("varint too long")
            return result, pos
        shift += 7
        if shift > 63:
            raise ValueError("varint too long")


def _parse_header(data: bytes, pos: int, end: int) -> tuple[bytes, bytes]:
    name = value = b""
    while pos < end:
        key, pos = _read_varint(data, pos)
        if key == 0x0A or key == 0x12:
            length, pos = _read_varint(data, pos)
            if pos + length > end:
                raise ValueError("truncated header")
            if key == 0x0A:
                name = data[pos : pos + length]
            else:
                value = data[pos : pos + length]
            pos += length
        else:
            raise ValueError("unusual field: let the protobuf runtime decide")
    if pos != end:
        raise ValueError("truncated header")
    return name, value


def _parse_record(
    data: bytes, pos: int, end: int
) -> tuple[int | None, list[tuple[bytes, bytes]], bytes]:
    ts: int | None = None
    headers: list[tuple[bytes, bytes]] = []
    body = b""
    while pos < end:
        key = data[pos]
        if key == 0x1A:  # body, the common case first
            length = data[pos + 1]
            if length < 0x80:
                pos += 2
            else:
                length, pos = _read_varint(data, pos + 1)
            body = data[pos : pos + length]
            pos += length
        elif key == 0x08:
            ts, pos = _read_varint(data, pos + 1)
        elif key == 0x12:
            length, pos = _read_varint(data, pos + 1)
            if pos + length > end:
                raise ValueError("truncated header")
            headers.append(_parse_header(data, pos, pos + length))
            pos += length
        else:
            raise ValueError("unusual field: let the protobuf runtime decide")
    if pos != end:
        raise ValueError("truncated record")
    return ts, headers, body


def parse_append_input(
    data: bytes,
) -> tuple[list[tuple[int | None, list[tuple[bytes, bytes]], bytes]], int | None, str | None]:
    """Parse an AppendInput protobuf straight into (timestamp, headers, body) tuples.

    Faster than going through message objects, which cost microseconds per field
    access. Handles only the fields it knows, in their canonical encoding; it raises
    ValueError (or IndexError, UnicodeDecodeError) on anything else, and callers then
    let the protobuf runtime parse the input or name what is wrong with it.
    """
    records: list[tuple[int | None, list[tuple[bytes, bytes]], bytes]] = []
    append = records.append
    match: int | None = None
    fence: str | None = None
    pos, size = 0, len(data)
    while pos < size:
        key = data[pos]
        if key == 0x0A:
            length = data[pos + 1]
            if length < 0x80:
                pos += 2
            else:
                length, pos = _read_varint(data, pos + 1)
            end = pos + length
            if end > size:
                raise ValueError("truncated record")
            # Fast path: a record that is only a short body (tag, 1-byte length, bytes).
            if length >= 2 and data[pos] == 0x1A and data[pos + 1] == length - 2:
                append((None, [], data[pos + 2 : end]))
            else:
                append(_parse_record(data, pos, end))
            pos = end
        elif key == 0x10:
            match, pos = _read_varint(data, pos + 1)
        elif key == 0x1A:
            length, pos = _read_varint(data, pos + 1)
            if pos + length > size:
                raise ValueError("truncated fencing token")
            fence = data[pos : pos + length].decode()
            pos += length
        else:
            raise ValueError("unusual field: let the protobuf runtime decide")
    if pos != size:
        raise ValueError("truncated input")
    return records, match, fence
