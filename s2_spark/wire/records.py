"""S2 ReadBatch protobuf bytes -> one Arrow record batch, without per-record Python objects.

The hot path of every read: a C scanner (`_fastwire`, optional) walks the message once and
fills the offset/data buffers the Arrow arrays are built on. Without it, a pure-Python path
parses with protobuf and builds the same arrays; both give identical results. Several
messages (a read session's consecutive frames) decode into one batch where they lie:
nothing is copied on the way but the bytes the arrays hold.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
from google.protobuf.message import DecodeError

from s2_spark._proto import s2_pb2
from s2_spark.errors import FrameError, Position
from s2_spark.wire._accelerator import fastwire as _fastwire

__all__ = [
    "HEADER_TYPE",
    "READ_SCHEMA",
    "READ_SCHEMA_NO_HEADERS",
    "DecodedBatch",
    "decode_read_batch",
    "decode_read_batches",
    "decode_read_many",
    "read_batch_prefix",
]

HEADER_STRUCT = pa.struct([("name", pa.binary()), ("value", pa.binary())])
HEADER_TYPE = pa.list_(pa.field("element", HEADER_STRUCT))
TIMESTAMP_TYPE = pa.timestamp("us", tz="UTC")

READ_SCHEMA = pa.schema(
    [
        ("stream", pa.string()),
        ("seq_num", pa.int64()),
        ("timestamp", TIMESTAMP_TYPE),
        ("headers", HEADER_TYPE),
        ("body", pa.binary()),
    ]
)
READ_SCHEMA_NO_HEADERS = pa.schema([f for f in READ_SCHEMA if f.name != "headers"])

_INT64_MAX = (1 << 63) - 1
_MAX_TIMESTAMP_MS = _INT64_MAX // 1000

if _fastwire is not None:
    _fastwire._set_error_type(FrameError)

IMPLEMENTATION = "c" if _fastwire is not None else "python"
"""Which decoder `decode_read_batch` uses: "c" (the `_fastwire` extension) or "python"."""


@dataclass(frozen=True, slots=True)
class DecodedBatch:
    """One decoded ReadBatch.

    `batch` holds the kept records (command records may be filtered out); `count`,
    `first_seq_num`, `last_seq_num` and `metered_bytes` cover every record in the message,
    so callers can advance positions and budgets past filtered ones.
    """

    batch: pa.RecordBatch
    tail: Position | None
    count: int
    first_seq_num: int | None
    last_seq_num: int | None
    metered_bytes: int


Payload = bytes | bytearray | memoryview


def decode_read_batch(
    payload: Payload,
    stream: str,
    *,
    include_command_records: bool = True,
    include_headers: bool = True,
) -> DecodedBatch:
    """Decode a serialized `ReadBatch` into Arrow (`READ_SCHEMA` or `READ_SCHEMA_NO_HEADERS`).

    Timestamps turn from S2's milliseconds into microseconds. A command record (exactly one
    header, with an empty name) is dropped when `include_command_records` is false.
    Raises `FrameError` for malformed protobuf or values Arrow cannot hold.
    """
    return decode_read_batches([payload], stream, include_command_records=include_command_records,
                               include_headers=include_headers)


def decode_read_batches(
    payloads: Sequence[Payload],
    stream: str,
    *,
    include_command_records: bool = True,
    include_headers: bool = True,
) -> DecodedBatch:
    """Decode serialized `ReadBatch`es into one Arrow batch, as `decode_read_batch` decodes
    the one message their concatenation is (a ReadBatch's fields repeat: the records of
    all in order, the tail's fields merged), each checked on its own; read in place."""
    decode = _decode_c if _fastwire is not None else _decode_python
    return decode(payloads, stream, include_command_records, include_headers)



def decode_read_many(
    payloads: Sequence[Payload],
    streams: Sequence[str],
    *,
    include_command_records: bool = True,
    include_headers: bool = True,
) -> list[DecodedBatch]:
    """Each payload decoded as `decode_read_batch` decodes it (a ReadBatch of its own, of
    stream `streams[i]`), their records in one Arrow batch built once, of which each
    result's `batch` is a slice: the reads of many small streams cost one batch, not one
    each (building one is most of a one-record read's decode). The C decoder takes them
    all in one call (`_fastwire.decode_read_many`): a call each was 4-5 us a read."""
    if _fastwire is None or len(payloads) < 2:
        return [decode_read_batch(p, s, include_command_records=include_command_records,
                                  include_headers=include_headers)
                for p, s in zip(payloads, streams, strict=True)]
    if len(payloads) != len(streams):
        raise ValueError("decode_read_many: one stream a payload")
    metas, n, *buffers = _fastwire.decode_read_many(
        payloads, list(streams), include_command_records, include_headers)
    batch = pa.RecordBatch.from_arrays(
        _arrays(n, buffers, include_headers),
        schema=READ_SCHEMA if include_headers else READ_SCHEMA_NO_HEADERS)
    out, row, each = [], 0, iter(metas)  # 7 numbers a payload, no tuple made for them
    for count, first, last, metered, seq, ts, k in zip(*[each] * 7, strict=True):
        out.append(DecodedBatch(batch.slice(row, k), None if seq is None else Position(seq, ts),
                                count, first, last, metered))  # positional: a third less
        row += k
    return out


def _arrays(n: int, buffers: Sequence[Any], include_headers: bool) -> list[pa.Array]:
    """The columns of `n` rows on the C decoder's buffers (`decode_read_batches`'s order:
    stream, seq_num, timestamp, body, then the headers' list, name and value ones)."""
    buf = pa.py_buffer
    stream_off, stream_data, seqs, tss, body_off, body_data = buffers[:6]
    arrays = [
        pa.Array.from_buffers(pa.string(), n, [None, buf(stream_off), buf(stream_data)]),
        pa.Array.from_buffers(pa.int64(), n, [None, buf(seqs)]),
        pa.Array.from_buffers(TIMESTAMP_TYPE, n, [None, buf(tss)]),
    ]
    if include_headers:
        hdr_off, name_off, name_data, value_off, value_data = buffers[6:]
        n_headers = len(name_off) // 4 - 1
        names = pa.Array.from_buffers(pa.binary(), n_headers, [None, buf(name_off), buf(name_data)])
        values = pa.Array.from_buffers(
            pa.binary(), n_headers, [None, buf(value_off), buf(value_data)]
        )
        structs = pa.Array.from_buffers(HEADER_STRUCT, n_headers, [None], children=[names, values])
        arrays.append(
            pa.Array.from_buffers(HEADER_TYPE, n, [None, buf(hdr_off)], children=[structs])
        )
    arrays.append(pa.Array.from_buffers(pa.binary(), n, [None, buf(body_off), buf(body_data)]))
    return arrays


def _decode_c(
    payloads: Sequence[Payload],
    stream: str,
    include_command_records: bool,
    include_headers: bool,
) -> DecodedBatch:
    assert _fastwire is not None
    count, first, last, metered, tail, n, *buffers = _fastwire.decode_read_batches(
        payloads, stream.encode(), include_command_records, include_headers
    )
    schema = READ_SCHEMA if include_headers else READ_SCHEMA_NO_HEADERS
    return DecodedBatch(
        batch=pa.RecordBatch.from_arrays(_arrays(n, buffers, include_headers), schema=schema),
        tail=None if tail is None else Position(tail[0], tail[1]),
        count=count,
        first_seq_num=first,
        last_seq_num=last,
        metered_bytes=metered,
    )


def _decode_python(
    payloads: Sequence[Payload],
    stream: str,
    include_command_records: bool,
    include_headers: bool,
) -> DecodedBatch:
    """Reference path: protobuf's own parser (merging message after message, as it parses
    their concatenation), then Arrow arrays from Python lists."""
    msg: Any = s2_pb2.ReadBatch()
    try:
        for payload in payloads:
            msg.MergeFromString(bytes(payload))
    except DecodeError as e:
        raise FrameError(f"malformed S2 ReadBatch message: {e}") from None
    seqs: list[int] = []
    tss: list[int] = []
    bodies: list[bytes] = []
    header_offsets = [0]
    names: list[bytes] = []
    values: list[bytes] = []
    metered = 0
    for rec in msg.records:
        seq_num, timestamp, body, hdrs = rec.seq_num, rec.timestamp, rec.body, rec.headers
        if seq_num > _INT64_MAX:
            raise FrameError(f"S2 record seq_num {seq_num} is out of range")
        if timestamp > _MAX_TIMESTAMP_MS:
            raise FrameError(f"S2 record timestamp {timestamp} ms is out of range for microseconds")
        metered += 8 + len(body)
        if hdrs:
            hnames = [h.name for h in hdrs]
            hvalues = [h.value for h in hdrs]
            metered += 2 * len(hnames) + sum(map(len, hnames)) + sum(map(len, hvalues))
            if not include_command_records and len(hnames) == 1 and not hnames[0]:
                continue
            names += hnames
            values += hvalues
        seqs.append(seq_num)
        tss.append(timestamp * 1000)
        bodies.append(body)
        header_offsets.append(len(names))
    n = len(seqs)
    arrays = [
        pa.array([stream] * n, pa.string()),
        pa.array(seqs, pa.int64()),
        pa.array(tss, TIMESTAMP_TYPE),
    ]
    if include_headers:
        structs = pa.StructArray.from_arrays(
            [pa.array(names, pa.binary()), pa.array(values, pa.binary())],
            fields=list(HEADER_STRUCT),
        )
        arrays.append(
            pa.ListArray.from_arrays(pa.array(header_offsets, pa.int32()), structs, HEADER_TYPE)
        )
    arrays.append(pa.array(bodies, pa.binary()))
    schema = READ_SCHEMA if include_headers else READ_SCHEMA_NO_HEADERS
    records = msg.records
    return DecodedBatch(
        batch=pa.RecordBatch.from_arrays(arrays, schema=schema),
        tail=Position(msg.tail.seq_num, msg.tail.timestamp) if msg.HasField("tail") else None,
        count=len(records),
        first_seq_num=records[0].seq_num if records else None,
        last_seq_num=records[-1].seq_num if records else None,
        metered_bytes=metered,
    )


def _varint(data: bytes, pos: int) -> tuple[int, int] | None:
    """A protobuf varint at `pos`: (value, next position), None when it is cut off."""
    value = shift = 0
    while pos < len(data):
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, pos
        shift += 7
        if shift > 63:
            raise FrameError("a ReadBatch holds a varint longer than 10 bytes")
    return None


def read_batch_prefix(data: bytes) -> bytes | None:
    """The part of a ReadBatch cut short in transit that holds whole records, or None if
    not one record arrived whole.

    A protobuf message cut at a field boundary is itself a valid message, so the records
    that arrived whole decode as a ReadBatch of their own (without its `tail`).
    """
    pos = kept = records = 0
    while pos < len(data):
        key = _varint(data, pos)
        if key is None:
            break
        tag, at = key
        if tag & 7 != 2:  # ReadBatch has length-delimited fields only
            raise FrameError(f"a ReadBatch holds field {tag >> 3} of wire type {tag & 7}")
        size = _varint(data, at)
        if size is None or size[1] + size[0] > len(data):
            break
        pos = size[1] + size[0]
        if tag >> 3 == 1:
            records += 1
            kept = pos
    return data[:kept] if records else None
