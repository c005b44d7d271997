"""Arrow columns (or Python records) -> S2 AppendInput protobuf bytes, split within S2's limits.

The Spark writer's hot path: records are encoded once, straight from Arrow buffers, into
the `records` entries of an `AppendInput` (tag 0x0A, length, AppendRecord), then cut into
batches of at most 1000 records and 1 MiB metered. A batch becomes a full message by
appending `match_seq_num` / `fencing_token`, so retries never re-encode records. The C
accelerator (`_fastwire`, optional) and the pure-Python path give byte-identical output.

Nulls: a null body, header list, header, name or value counts as empty; a null timestamp
lets the service stamp the record.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from s2_spark.errors import RecordTooLargeError
from s2_spark.wire._accelerator import fastwire as _fastwire
from s2_spark.wire._limits import MAX_BATCH_BYTES, MAX_BATCH_RECORDS, MAX_RECORD_BYTES

__all__ = [
    "MAX_BATCH_BYTES",
    "MAX_BATCH_RECORDS",
    "MAX_RECORD_BYTES",
    "AppendBatch",
    "EncodedRecords",
    "chunked_batches",
    "encode_append_batches",
    "encode_entries",
    "encode_record",
    "encode_records",
    "metered_size",
]

_U64_MAX = (1 << 64) - 1

IMPLEMENTATION = "c" if _fastwire is not None else "python"
"""Which encoder `encode_append_batches` uses: "c" (the `_fastwire` extension) or "python"."""


@dataclass(frozen=True, slots=True)
class AppendBatch:
    """Encoded records for one append: at most 1000 records and 1 MiB metered.

    `records_payload` is the concatenated `records` entries of an AppendInput (a view into
    the rows' encoding where `EncodedRecords.batches` was asked not to copy); `more`, the
    entries that follow them, kept apart so that records from several buffers (and a
    writer's own trailing entries) are copied only once, where the message is built;
    `first_index` is the input row of the first record.
    """

    records_payload: bytes | memoryview = field(repr=False)
    count: int
    metered_bytes: int
    first_index: int
    more: tuple[bytes | memoryview, ...] = field(default=(), repr=False)

    def records_parts(self) -> list[bytes | memoryview]:
        """The `records` entries, in order, as the parts they are kept in."""
        return [self.records_payload, *self.more]

    def to_append_input(
        self, match_seq_num: int | None = None, fencing_token: str | None = None
    ) -> bytes:
        """The full AppendInput message: the records plus the optional conditions."""
        return b"".join(self.append_input_parts(match_seq_num, fencing_token))

    def append_input_parts(
        self, match_seq_num: int | None = None, fencing_token: str | None = None
    ) -> list[bytes | memoryview]:
        """`to_append_input` as the parts it joins (the records not copied)."""
        parts = self.records_parts()
        if match_seq_num is not None:
            if not 0 <= match_seq_num <= _U64_MAX:
                raise ValueError(f"match_seq_num must be a u64, got {match_seq_num}")
            parts.append(b"\x10" + _varint(match_seq_num))
        if fencing_token is not None:
            token = fencing_token.encode()
            parts.append(b"\x1a" + _varint(len(token)) + token)
        return parts


def metered_size(body: bytes, headers: Sequence[tuple[bytes, bytes]] = ()) -> int:
    """S2's metered size of one record: 8 + 2 per header + header names/values + body."""
    return 8 + 2 * len(headers) + sum(len(n) + len(v) for n, v in headers) + len(body)


def encode_append_batches(
    bodies: pa.Array | pa.ChunkedArray,
    headers: pa.Array | pa.ChunkedArray | None = None,
    timestamps: pa.Array | pa.ChunkedArray | None = None,
    *,
    max_records: int = MAX_BATCH_RECORDS,
    max_bytes: int = MAX_BATCH_BYTES,
) -> list[AppendBatch]:
    """Encode rows into append batches, in order, each within `max_records` / `max_bytes`.

    `bodies`: binary or string. `headers`: list of struct<name, value> (binary or string).
    `timestamps`: integer milliseconds (int64, or uint64 for the full u64 range) or a
    timestamp type; must not be negative.
    Raises RecordTooLargeError (before returning anything) if one record exceeds 1 MiB.
    """
    _check_limits(max_records, max_bytes)
    return encode_entries(bodies, headers, timestamps).batches(max_records, max_bytes)


@dataclass(frozen=True, slots=True)
class EncodedRecords:
    """Rows encoded once as AppendInput `records` entries, to be cut into appends later:
    `payload` holds the entries in order, `ends[i]` is where entry i ends in it and
    `meters[i]` is record i's metered size. Slices share the payload (no copy)."""

    payload: memoryview = field(repr=False)
    ends: Any = field(repr=False)
    meters: Any = field(repr=False)

    def __len__(self) -> int:
        return len(self.meters)

    @property
    def nbytes(self) -> int:
        return len(self.payload)

    def slice(self, start: int, stop: int | None = None) -> EncodedRecords:
        """Records [start, stop)."""
        stop = len(self) if stop is None else stop
        lo = int(self.ends[start - 1]) if start else 0
        hi = int(self.ends[stop - 1]) if stop > start else lo
        return EncodedRecords(self.payload[lo:hi], self.ends[start:stop] - lo,
                              self.meters[start:stop])

    @staticmethod
    def concat(parts: Sequence[EncodedRecords]) -> EncodedRecords:
        """The records of `parts`, in order (one part: itself)."""
        if len(parts) == 1:
            return parts[0]
        shifts = np.cumsum([0] + [p.nbytes for p in parts[:-1]])
        return EncodedRecords(
            memoryview(b"".join(p.payload for p in parts)),
            np.concatenate([p.ends + shift for p, shift in zip(parts, shifts, strict=True)]),
            np.concatenate([p.meters for p in parts]))

    def batches(self, max_records: int = MAX_BATCH_RECORDS,
                max_bytes: int = MAX_BATCH_BYTES, *, copy: bool = True) -> list[AppendBatch]:
        """The records cut into appends, in order, each within the limits (raises
        RecordTooLargeError first if one record exceeds 1 MiB). `copy` False: each
        append's records are a view into `payload` (a writer that adds its own entries
        copies them once, then)."""
        n = len(self)
        if 0 < n <= max_records:  # the common case of a small stream: one append
            # A few records' sizes add up faster as Python ints than through numpy.
            total = sum(self.meters.tolist()) if n <= 32 else int(self.meters.sum())
            if total <= max_bytes:
                return [AppendBatch(bytes(self.payload) if copy else self.payload, n, total, 0)]
        return _split(self.payload, self.ends, self.meters, max_records, max_bytes, copy=copy)


def encode_entries(
    bodies: pa.Array | pa.ChunkedArray,
    headers: pa.Array | pa.ChunkedArray | None = None,
    timestamps: pa.Array | pa.ChunkedArray | None = None,
) -> EncodedRecords:
    """Encode rows (as `encode_append_batches` takes them) without cutting them into
    appends: one pass over the columns, however many streams they go to."""
    cols = _Columns.from_arrow(bodies, headers, timestamps)
    encode = _encode_c if _fastwire is not None else _encode_python
    payload, ends, meters = encode(cols)
    return EncodedRecords(memoryview(payload), ends, meters)


def encode_records(
    records: Iterable[Any],
    *,
    max_records: int = MAX_BATCH_RECORDS,
    max_bytes: int = MAX_BATCH_BYTES,
) -> list[AppendBatch]:
    """Encode Python records into append batches (same splitting and limits).

    Each record is a `(body, headers, timestamp)` tuple, or any object with `body`,
    `headers` and `timestamp` attributes; headers are `(name, value)` byte pairs and a
    timestamp of None lets the service stamp the record.
    """
    _check_limits(max_records, max_bytes)
    parts: list[bytes] = []
    sizes: list[int] = []
    meters: list[int] = []
    for rec in records:
        if isinstance(rec, tuple):
            body, hdrs, ts = rec
        else:
            body, hdrs, ts = rec.body, rec.headers, rec.timestamp
        entry, metered = encode_record(bytes(body), [(bytes(n), bytes(v)) for n, v in hdrs], ts)
        parts.append(entry)
        sizes.append(len(entry))
        meters.append(metered)
    ends = np.cumsum(np.asarray(sizes, dtype=np.int64))
    return _split(b"".join(parts), ends, np.asarray(meters, dtype=np.int64), max_records, max_bytes)


# -- internals ----------------------------------------------------------------------------


def _encode_c(cols: _Columns) -> tuple[bytes, Any, Any]:
    """The entries, their end positions and metered sizes, by the C accelerator."""
    assert _fastwire is not None
    payload, ends, meters = _fastwire.encode_records(cols.n, *cols.buffers())
    return payload, np.frombuffer(ends, dtype=np.int64), np.frombuffer(meters, dtype=np.int64)


def _encode_python(cols: _Columns) -> tuple[bytes, Any, Any]:
    """The same as `_encode_c`, in Python: the reference path."""
    entries = [encode_record(b, h, t) for b, h, t in cols.rows()]
    payload = b"".join(e for e, _ in entries)
    ends = np.cumsum(np.fromiter((len(e) for e, _ in entries), np.int64, cols.n))
    return payload, ends, np.fromiter((m for _, m in entries), np.int64, cols.n)


def _check_limits(max_records: int, max_bytes: int) -> None:
    if not 1 <= max_records <= MAX_BATCH_RECORDS:
        raise ValueError(f"max_records must be 1..{MAX_BATCH_RECORDS}, got {max_records}")
    if not 1 <= max_bytes <= MAX_BATCH_BYTES:
        raise ValueError(f"max_bytes must be 1..{MAX_BATCH_BYTES}, got {max_bytes}")


def encode_varint(value: int) -> bytes:
    """Protobuf base-128 varint of a non-negative integer."""
    if value < 0x80:
        return bytes((value,))
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


_varint = encode_varint


def _ld(tag: int, data: bytes) -> bytes:
    return bytes((tag,)) + _varint(len(data)) + data


def encode_record(
    body: bytes, headers: Sequence[tuple[bytes, bytes]], timestamp: int | None
) -> tuple[bytes, int]:
    """One `records` entry of AppendInput (fields in number order, empty bytes omitted)
    and the record's metered size: for one record, without a batch's set-up."""
    parts = []
    if timestamp is not None:
        if not 0 <= timestamp <= _U64_MAX:
            raise ValueError(f"record timestamp must be u64 milliseconds, got {timestamp}")
        parts.append(b"\x08" + _varint(timestamp))
    for name, value in headers:
        h = (_ld(0x0A, name) if name else b"") + (_ld(0x12, value) if value else b"")
        parts.append(_ld(0x12, h))
    if body:
        parts.append(_ld(0x1A, body))
    return _ld(0x0A, b"".join(parts)), metered_size(body, headers)


def _split(
    payload: bytes | memoryview, ends: Any, meters: Any, max_records: int, max_bytes: int,
    *, copy: bool = True,
) -> list[AppendBatch]:
    """Greedy split into batches; checks every record's size first. `copy` False: views
    into `payload`."""
    view = memoryview(payload)
    starts, stops, metered = _cuts(meters, max_records, max_bytes)
    if not len(starts):
        return []
    his = ends[stops - 1]
    los = np.where(starts > 0, ends[starts - 1], 0)
    return [AppendBatch(bytes(view[lo:hi]) if copy else view[lo:hi], stop - start, m, start)
            for start, stop, m, lo, hi in zip(starts.tolist(), stops.tolist(),
                                              metered.tolist(), los.tolist(), his.tolist(),
                                              strict=True)]


def _cuts(meters: Any, max_records: int, max_bytes: int) -> tuple[Any, Any, Any]:
    """Where the greedy split cuts records into appends: the start, stop and metered
    bytes of each, in order (int64 arrays), at least one record each; raises
    RecordTooLargeError first if one record exceeds 1 MiB. Where every `max_records`
    records in a row fit `max_bytes` (small records), the cuts are every `max_records`
    records, found without a step per append (or a running sum: numpy's takes 4 ns a
    record)."""
    n = len(meters)
    if n == 0:
        empty = np.zeros(0, np.int64)
        return empty, empty, empty
    largest = int(meters.max())
    if largest * max_records <= max_bytes:
        starts = np.arange(0, n, max_records, dtype=np.int64)
        return starts, np.minimum(starts + max_records, n), np.add.reduceat(meters, starts)
    if largest > MAX_RECORD_BYTES:
        too_big = np.flatnonzero(meters > MAX_RECORD_BYTES)
        i = int(too_big[0])
        size = int(meters[i])
        raise RecordTooLargeError(
            f"record at row {i} is {size} metered bytes; S2 accepts at most "
            f"{MAX_RECORD_BYTES} (1 MiB) per record",
            metered_bytes=size,
            limit=MAX_RECORD_BYTES,
        )
    cum = np.cumsum(meters, dtype=np.int64)
    before = np.concatenate((np.zeros(1, np.int64), cum[:-1]))  # metered before each
    m = min(max_records, n)
    if int((cum[m - 1:] - before[:n - m + 1]).max()) <= max_bytes:
        starts = np.arange(0, n, max_records, dtype=np.int64)
        stops = np.minimum(starts + max_records, n)
    else:
        cut: list[int] = []
        start = 0
        while start < n:
            # Last index whose cumulative size fits, at least one record per batch.
            fit = int(np.searchsorted(cum, int(before[start]) + max_bytes, side="right"))
            cut.append(start)
            start = max(start + 1, min(fit, start + max_records, n))
        starts = np.asarray(cut, dtype=np.int64)
        stops = np.append(starts[1:], n)
    return starts, stops, cum[stops - 1] - before[starts]


#: Mean size below which an append's pieces from several buffers are joined into one
#: (copying small pieces costs less than handling each on its way out).
_JOIN_BELOW = 4096


def chunked_batches(chunks: Sequence[EncodedRecords], max_records: int = MAX_BATCH_RECORDS,
                    max_bytes: int = MAX_BATCH_BYTES) -> list[AppendBatch]:
    """The appends of `EncodedRecords.concat(chunks).batches(max_records, max_bytes,
    copy=False)`, the same records cut at the same places, without the concatenation (a
    copy of every record): an append whose records lie in several chunks holds a view
    of each (`AppendBatch.more`), or one joined copy of them where they are small."""
    chunks = [c for c in chunks if len(c)]
    if len(chunks) <= 1:
        return chunks[0].batches(max_records, max_bytes, copy=False) if chunks else []
    starts, stops, metered = _cuts(np.concatenate([c.meters for c in chunks]), max_records,
                                   max_bytes)
    sizes = np.array([len(c) for c in chunks], dtype=np.int64)
    firsts = np.cumsum(sizes) - sizes  # each chunk's first record
    local_ends = np.concatenate([c.ends for c in chunks])  # in each record's own chunk
    k_first = np.searchsorted(firsts, starts, side="right") - 1
    k_last = np.searchsorted(firsts, stops - 1, side="right") - 1
    los = np.where(starts > firsts[k_first], local_ends[starts - 1], 0)
    his = local_ends[stops - 1]
    payloads = [c.payload for c in chunks]
    batches = []
    for start, stop, m, k, last, lo, hi in zip(
            starts.tolist(), stops.tolist(), metered.tolist(), k_first.tolist(),
            k_last.tolist(), los.tolist(), his.tolist(), strict=True):
        if k == last:
            batches.append(AppendBatch(payloads[k][lo:hi], stop - start, m, start))
            continue
        parts = [payloads[k][lo:], *payloads[k + 1:last], payloads[last][:hi]]
        if sum(len(p) for p in parts) < _JOIN_BELOW * len(parts):
            parts = [b"".join(parts)]
        batches.append(AppendBatch(parts[0], stop - start, m, start, tuple(parts[1:])))
    return batches


def _combine(arr: pa.Array | pa.ChunkedArray) -> pa.Array:
    if isinstance(arr, pa.ChunkedArray):
        return arr.combine_chunks()
    return arr


# Arrow types a body or header may have; the view types exist from pyarrow 16 on.
_BINARY_LIKE = tuple(
    getattr(pa.types, f"is_{name}")
    for name in ("binary", "string", "large_binary", "large_string", "binary_view", "string_view")
    if hasattr(pa.types, f"is_{name}")
)


def _as_large_binary(arr: pa.Array, what: str) -> pa.Array:
    t = arr.type
    if not any(is_type(t) for is_type in _BINARY_LIKE):
        raise TypeError(f"{what} must be a binary or string array, got {t}")
    out = arr.cast(pa.large_binary())
    if out.null_count:
        out = pc.fill_null(out, pa.scalar(b"", pa.large_binary()))
    return out


def _offsets(arr: pa.Array) -> Any:
    """The int64 offsets of a large_binary/large_list array, adjusted for slicing."""
    buf = arr.buffers()[1]
    n = len(arr)
    if buf is None:  # zero-length arrays may omit the offsets buffer
        return np.zeros(n + 1, dtype=np.int64)
    return np.frombuffer(buf, dtype=np.int64)[arr.offset : arr.offset + n + 1]


def _data(arr: pa.Array) -> Any:
    buf = arr.buffers()[2]
    return b"" if buf is None else buf


@dataclass(frozen=True, slots=True)
class _Columns:
    """Normalised inputs: large_binary bodies, flattened headers, u64 ms timestamps."""

    n: int
    bodies: pa.Array
    header_offsets: Any
    names: pa.Array | None
    values: pa.Array | None
    timestamps: Any
    ts_valid: Any

    @classmethod
    def from_arrow(
        cls,
        bodies: pa.Array | pa.ChunkedArray,
        headers: pa.Array | pa.ChunkedArray | None,
        timestamps: pa.Array | pa.ChunkedArray | None,
    ) -> _Columns:
        b = _as_large_binary(_combine(bodies), "bodies")
        n = len(b)
        header_offsets = names = values = None
        if headers is not None:
            h = _combine(headers)
            if len(h) != n:
                raise ValueError(f"headers has {len(h)} rows but bodies has {n}")
            header_offsets, names, values = _flatten_headers(h)
        ts = ts_valid = None
        if timestamps is not None:
            t = _combine(timestamps)
            if len(t) != n:
                raise ValueError(f"timestamps has {len(t)} rows but bodies has {n}")
            ts, ts_valid = _timestamps_ms(t)
        return cls(n, b, header_offsets, names, values, ts, ts_valid)

    def buffers(self) -> tuple[Any, ...]:
        """Arguments for `_fastwire.encode_records` after `n`."""
        has_h = self.names is not None and self.values is not None
        return (
            _offsets(self.bodies),
            _data(self.bodies),
            self.header_offsets if has_h else None,
            _offsets(self.names) if has_h else None,
            _data(self.names) if has_h else None,
            _offsets(self.values) if has_h else None,
            _data(self.values) if has_h else None,
            self.timestamps,
            self.ts_valid,
        )

    def rows(self) -> Iterable[tuple[bytes, list[tuple[bytes, bytes]], int | None]]:
        """Row-by-row view for the pure-Python encoder."""
        bodies = self.bodies.to_pylist()
        names = self.names.to_pylist() if self.names is not None else []
        values = self.values.to_pylist() if self.values is not None else []
        for i in range(self.n):
            hdrs: list[tuple[bytes, bytes]] = []
            if self.header_offsets is not None:
                lo, hi = int(self.header_offsets[i]), int(self.header_offsets[i + 1])
                hdrs = list(zip(names[lo:hi], values[lo:hi], strict=True))
            ts = None
            if self.timestamps is not None and (self.ts_valid is None or self.ts_valid[i]):
                ts = int(self.timestamps[i])
            yield bodies[i], hdrs, ts


def _flatten_headers(h: pa.Array) -> tuple[Any, pa.Array, pa.Array]:
    t = h.type
    if not (pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_list_view(t)):
        raise TypeError(f"headers must be a list<struct<name, value>> array, got {t}")
    item = t.value_type
    if not pa.types.is_struct(item) or {item.field(i).name for i in range(item.num_fields)} != {
        "name",
        "value",
    }:
        raise TypeError(f"headers must be a list<struct<name, value>> array, got {t}")
    lengths = pc.fill_null(pc.list_value_length(h), 0).to_numpy(zero_copy_only=False)
    offsets = np.zeros(len(h) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    flat = pc.list_flatten(h)  # skips null lists, honours slicing
    fields = {f.name: a for f, a in zip(item, flat.flatten(), strict=True)}
    names = _as_large_binary(fields["name"], "header names")
    values = _as_large_binary(fields["value"], "header values")
    return offsets, names, values


def _timestamps_ms(t: pa.Array) -> tuple[Any, Any]:
    if pa.types.is_timestamp(t.type):
        raw = t.view(pa.int64())
        ms = t.cast(pa.timestamp("ms", tz=t.type.tz), safe=False).view(pa.int64())
    elif pa.types.is_unsigned_integer(t.type):  # u64 holds every S2 timestamp
        raw = pa.nulls(len(t), pa.int64())
        ms = t.cast(pa.uint64())
    elif pa.types.is_integer(t.type):
        raw = ms = t.cast(pa.int64())
    else:
        raise TypeError(f"timestamps must be int64 milliseconds or a timestamp array, got {t.type}")
    if pc.any(pc.less(raw, 0)).as_py():
        i = int(pc.index(pc.less(raw, 0), True).as_py())
        raise ValueError(f"timestamp at row {i} is negative; S2 timestamps are u64 milliseconds")
    valid = None
    if ms.null_count:
        valid = ms.is_valid().to_numpy(zero_copy_only=False).astype(np.uint8)
        ms = pc.fill_null(ms, 0)
    values = ms.to_numpy(zero_copy_only=False).astype(np.uint64)
    return np.ascontiguousarray(values), valid
