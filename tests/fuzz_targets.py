"""Fuzz targets for the wire decoders: each takes any bytes and fails only on a real fault.

A target runs one input through the C accelerator and through the pure-Python path behind
the same function and raises `Disagreement` when they give different rows or different
typed errors; any other exception (an `IndexError`, a crash) is a fault of its own. The
only exceptions a decoder may raise on bad input are its typed ones: `FrameError` for S2,
`MalformedResponseError` for Durable Streams, `ValueError`/`TypeError` for bad arguments to
the append encoder, `httpx.RemoteProtocolError` for an HTTP/1.1 answer (`h1_response`, the
reader the tail watch and the fan-out parse answers with, checked against h11;
`h1_streamed`, the head and streamed body of a read session, checked against it). For
HTTP/2 (`h2_frames`, the tail watch's connections) the outcomes compared are each
request's: its answer, a reset, or the connection failed, checked against h2.

`scripts/fuzz.py` runs them coverage-guided (atheris); `tests/test_fuzz.py` replays the
corpus in `tests/data/fuzz/<target>/` (seeds, and every input that ever failed) on each
test run. Structured targets read their parameters from the input's first bytes, so an
input means the same thing to every run.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import random
import zlib
from collections.abc import Callable, Coroutine, Iterator
from typing import Any

import h2.config
import h2.connection
import h2.events
import h2.exceptions
import h2.settings
import h11
import hpack
import httpx
import numpy as np
import pyarrow as pa

from s2_spark._http import _h1
from s2_spark._http._h1 import BodyReader, ResponseReader, body_framing
from s2_spark._http._h2_connection import (
    CONNECTION_WINDOW,
    MAX_HEADER_BLOCK,
    STREAM_WINDOW,
    H2Connection,
    NotHttp2,
    Unprocessed,
)
from s2_spark._http._response import MAX_BODY_BYTES, BodyTooLargeError, Response
from s2_spark._proto import s2_pb2
from s2_spark.errors import FrameError, MalformedResponseError
from s2_spark.wire import appends, durable, frames, records

__all__ = ["TARGETS", "Disagreement", "bulk_python"]


class Disagreement(AssertionError):
    """The two paths of one function answered one input differently."""


def _outcome(call: Callable[[], Any], errors: tuple[type[BaseException], ...]) -> Any:
    """The call's result, or the type (and code) of the typed error it raised."""
    try:
        return ("ok", call())
    except errors as exc:
        return ("error", type(exc).__name__, getattr(exc, "code", None))


def _agree(what: str, c: Any, py: Any) -> None:
    if c != py:
        raise Disagreement(f"{what}: C gave {c!r}, Python gave {py!r}")


def _cuts(data: bytes, seed: int) -> list[bytes]:
    """`data` cut into pieces at places drawn from `seed` (single bytes, empty pieces too)."""
    rng = random.Random(seed)
    pieces, pos = [], 0
    while pos < len(data):
        size = rng.choice((0, 1, 1, 2, 3, 7, 16, 64, 1 << 20))
        pieces.append(data[pos : pos + size])
        pos += size
    return pieces


# -- S2: ReadBatch ----------------------------------------------------------------------


def _batch_view(d: records.DecodedBatch) -> tuple[Any, ...]:
    # Timestamps as integers: Python's datetime ends at year 9999, S2's timestamps do not.
    columns = [c.view(pa.int64()) if pa.types.is_timestamp(c.type) else c
               for c in d.batch.columns]
    return ([c.to_pylist() for c in columns], d.batch.schema, d.tail, d.count,
            d.first_seq_num, d.last_seq_num, d.metered_bytes)


def _read_batches_both(payloads: list[Any], flags: int) -> None:
    cmd, hdrs = bool(flags & 1), bool(flags & 2)

    def run(decode: Callable[..., records.DecodedBatch]) -> Any:
        return _outcome(lambda: _batch_view(decode(payloads, "s", cmd, hdrs)), (FrameError,))

    c = run(records._decode_c) if records._fastwire is not None else None
    py = run(records._decode_python)
    if c is not None:
        _agree("decode_read_batches", c, py)


def _read_batch_both(payload: bytes, flags: int) -> None:
    _read_batches_both([payload], flags)


def read_batch(data: bytes) -> None:
    """`decode_read_batch`, C against protobuf; and `read_batch_prefix` on the same bytes."""
    if not data:
        return
    payload = data[1:]
    _read_batch_both(payload, data[0])
    prefix = _outcome(lambda: records.read_batch_prefix(payload), (FrameError,))
    if prefix[0] == "ok" and prefix[1] is not None:
        if not payload.startswith(prefix[1]):
            raise Disagreement("read_batch_prefix returned bytes that are not a prefix")
        _read_batch_both(prefix[1], data[0])


def read_batches(data: bytes) -> None:
    """`decode_read_batches` over several payloads (a read session's consecutive frames),
    C against protobuf merging them one by one: byte 0 the flags, then each payload a
    `_Reader.blob`; with flag 4, memoryviews into the input (as the session passes them),
    else bytes of their own (so the sanitizer sees a read past one's end)."""
    if not data:
        return
    r, view = _Reader(data[1:]), memoryview(data)
    pieces: list[Any] = []
    while r.left():
        blob = r.blob()
        if blob is not None:
            end = min(1 + r.pos, len(data))
            pieces.append(view[end - len(blob) : end] if data[0] & 4 else blob)
    _read_batches_both(pieces, data[0])


def read_many(data: bytes) -> None:
    """`decode_read_many` (the reads of many small streams: each payload a ReadBatch of
    its own stream, decoded by C and joined into one Arrow batch, each read's a slice of
    it) against `decode_read_batch` payload by payload, each by protobuf: the same rows,
    tails, counts and metered bytes, or the same first `FrameError`. Byte 0 the flags,
    then each payload a `_Reader.blob`, of stream "s<k>"."""
    if not data:
        return
    r, payloads = _Reader(data[1:]), []
    while r.left():
        blob = r.blob()
        if blob is not None:
            payloads.append(blob)
    cmd, hdrs = bool(data[0] & 1), bool(data[0] & 2)
    streams = [f"s{k}" for k in range(len(payloads))]
    many = _outcome(lambda: [_batch_view(d) for d in records.decode_read_many(
        payloads, streams, include_command_records=cmd, include_headers=hdrs)],
        (FrameError,))
    each = _outcome(lambda: [_batch_view(records._decode_python([p], s, cmd, hdrs))
                             for p, s in zip(payloads, streams, strict=True)], (FrameError,))
    _agree("decode_read_many", many, each)


# -- S2: AppendInput encoding -----------------------------------------------------------


class _Reader:
    """Reads parameters off the front of a fuzz input; zeros once it runs out."""

    def __init__(self, data: bytes) -> None:
        self.data, self.pos = data, 0

    def byte(self) -> int:
        self.pos += 1
        return self.data[self.pos - 1] if self.pos <= len(self.data) else 0

    def left(self) -> bool:
        return self.pos < len(self.data)

    def take(self, n: int) -> bytes:
        self.pos += n
        return self.data[self.pos - n : self.pos]

    def blob(self) -> bytes | None:
        """A byte string (up to 4 KiB, so lengths take 1-2 varint bytes), or None."""
        size = self.byte()
        if size == 0xFF:
            return None
        if size >= 0xF0:
            size = (size - 0xF0) * 256 + self.byte()
        return self.take(size)


_BINARY_TYPES = (pa.binary(), pa.large_binary(), getattr(pa, "binary_view", pa.binary)())
_TS_TYPES = (pa.int64(), pa.uint64(), pa.timestamp("ms"), pa.timestamp("us", tz="UTC"),
             pa.int32())


def _columns(r: _Reader) -> tuple[pa.Array, pa.Array | None, pa.Array | None]:
    """Bodies, headers and timestamps read from the input, with nulls, slices and chunks."""
    flags = r.byte()
    kind = _BINARY_TYPES[flags % 3]
    bodies: list[bytes | None] = []
    headers: list[list[dict[str, bytes | None] | None] | None] = []
    stamps: list[int | None] = []
    while r.left() and len(bodies) < 64:
        shape = r.byte()
        bodies.append(r.blob())
        hs = [
            None if shape & 0x40 and i == 0 else {"name": r.blob(), "value": r.blob()}
            for i in range(shape % 5)
        ]
        headers.append(None if shape & 0x20 else hs)
        stamps.append(None if shape & 0x10 else int.from_bytes(r.take(8), "little") >> (
            r.byte() % 64))
    skip = min(flags >> 6, len(bodies))
    header_type = pa.list_(pa.struct([("name", kind), ("value", kind)]))
    ts_type = _TS_TYPES[(flags >> 2) % len(_TS_TYPES)]
    b = pa.array(bodies, kind).slice(skip)
    h = pa.array(headers, header_type).slice(skip) if flags & 0x08 else None
    t = None
    if flags & 0x20:
        t = pa.array(stamps, pa.uint64())
        t = (t if ts_type == pa.uint64() else t.view(pa.int64()).cast(ts_type, safe=False))
        t = t.slice(skip)
    if flags & 0x10 and len(b) > 1:  # two chunks
        b = pa.chunked_array([b.slice(0, 1), b.slice(1)])
    return b, h, t


def append_columns(data: bytes) -> None:
    """`encode_append_batches` from Arrow columns (nulls, slices, chunks, every accepted
    type): the C encoder against Python, and the batches parse back as the rows."""
    r = _Reader(data)
    limits = (r.byte() % 5 + 1, (r.byte() + 1) * 64)
    try:
        b, h, t = _columns(r)
        cols = appends._Columns.from_arrow(b, h, t)
    except (ValueError, TypeError, pa.ArrowInvalid):
        return
    py = appends._encode_python(cols)
    if appends._fastwire is not None:
        c = appends._encode_c(cols)
        _agree("encode_records", (c[0], c[1].tolist(), c[2].tolist()),
               (py[0], py[1].tolist(), py[2].tolist()))
    rows = list(cols.rows())
    batches = _outcome(lambda: appends._split(*py, *limits), (appends.RecordTooLargeError,))
    if batches[0] == "ok" and rows:  # cut from two buffers: the same appends, bytes
        whole = appends.EncodedRecords(memoryview(py[0]), py[1], py[2])
        at = limits[1] // 64 % len(rows)
        chunked = appends.chunked_batches([whole.slice(0, at), whole.slice(at)], *limits)
        _agree("chunked_batches",
               [(b"".join(b.records_parts()), b.count, b.metered_bytes) for b in chunked],
               [(b.records_payload, b.count, b.metered_bytes) for b in batches[1]])
    if batches[0] == "ok":
        parsed = [
            (rec.body, [(x.name, x.value) for x in rec.headers],
             rec.timestamp if rec.HasField("timestamp") else None)
            for batch in batches[1]
            for rec in s2_pb2.AppendInput.FromString(batch.to_append_input()).records
        ]
        _agree("AppendInput round trip", parsed, rows)


def _offsets(sizes: list[int], base: int) -> bytes:
    """int64 offsets of consecutive items of `sizes` bytes, the first at `base`, preceded
    by `base` unused entries (offsets are absolute, as for a sliced Arrow array)."""
    return np.concatenate([np.zeros(base), base + np.cumsum([0, *sizes])]).astype(
        np.int64).tobytes()


def _buffers(r: _Reader) -> tuple[int, list[Any]]:
    """Arguments for `_fastwire.encode_records`: consistent ones, then perhaps one spoilt
    (an offset moved, a buffer cut or left out, `n` off by one), perhaps all unaligned."""
    flags, n = r.byte(), r.byte() % 9
    bodies = [r.blob() or b"" for _ in range(n)]
    base = r.byte() % 3
    args: list[Any] = [_offsets([len(b) for b in bodies], base),
                       bytes(base) + b"".join(bodies) + bytes(r.byte() % 2),
                       None, None, None, None, None, None, None]
    if flags & 1:
        counts = [r.byte() % 4 for _ in range(n)]
        pairs = [(r.blob() or b"", r.blob() or b"") for _ in range(sum(counts))]
        at = r.byte() % 3
        args[2:7] = [_offsets(counts, at), _offsets([len(k) for k, _ in pairs], at),
                     b"".join(k for k, _ in pairs), _offsets([len(v) for _, v in pairs], at),
                     b"".join(v for _, v in pairs)]
    if flags & 2:
        args[7] = r.take(8 * n).ljust(8 * n, b"\0")
        args[8] = bytes(r.byte() & 1 for _ in range(n)) if flags & 4 else None
    if flags & 8:
        k = r.byte() % 9
        if isinstance(args[k], bytes) and k in (0, 2, 3, 5) and len(args[k]) >= 8:
            spoilt = np.frombuffer(args[k], np.int64).copy()
            spoilt[r.byte() % len(spoilt)] += r.byte() - 128
            args[k] = spoilt.tobytes()
        elif isinstance(args[k], bytes):
            args[k] = args[k][: r.byte() % (len(args[k]) + 1)]
        else:
            args[k] = None if args[k] is not None else b""
    if flags & 16:
        n += 1 if flags & 32 else -1
    if flags & 64:
        args = [memoryview(bytearray(b"\0" + a))[1:] if a is not None else None for a in args]
    return n, args


def _checked(buf: Any, first: int, last: int, limit: int) -> list[int]:
    """Entries first..last of an int64 offsets buffer; ValueError unless they exist, never
    decrease and lie within 0..limit (what the C encoder accepts)."""
    if buf is None or first < 0 or last < first or last >= len(buf) // 8:
        raise ValueError("offsets missing")
    values = np.frombuffer(bytes(buf)[: len(buf) // 8 * 8], np.int64)[first : last + 1]
    if values[0] < 0 or np.any(np.diff(values) < 0) or values[-1] > limit:
        raise ValueError("offsets out of order or range")
    return [0] * first + values.tolist()


def _encode_reference(n: int, args: list[Any]) -> tuple[bytes, list[int], list[int]]:
    """What `_fastwire.encode_records(n, *args)` must return, by `encode_record` per row;
    ValueError where it must refuse."""
    bo, bd, ho, no, nd, vo, vd, ts, tv = (None if a is None else bytes(a) for a in args)
    if n < 0 or bd is None:
        raise ValueError("no bodies")
    body_at = _checked(bo, 0, n, len(bd))
    if ho is not None:
        if nd is None or vd is None:
            raise ValueError("header data missing")
        header_at = _checked(ho, 0, n, (1 << 63) - 2)
        name_at = _checked(no, header_at[0], header_at[n], len(nd))
        value_at = _checked(vo, header_at[0], header_at[n], len(vd))
    if (ts is None and tv is not None) or (ts is not None and (
            len(ts) // 8 < n or (tv is not None and len(tv) < n))):
        raise ValueError("bad timestamps")
    entries = []
    for i in range(n):
        headers = [] if ho is None else [
            (nd[name_at[h] : name_at[h + 1]], vd[value_at[h] : value_at[h + 1]])
            for h in range(header_at[i], header_at[i + 1])]
        stamp = None
        if ts is not None and (tv is None or tv[i]):
            stamp = int.from_bytes(ts[8 * i : 8 * i + 8], "little")
        entries.append(appends.encode_record(bd[body_at[i] : body_at[i + 1]], headers, stamp))
    ends = np.cumsum([len(e) for e, _ in entries]).tolist()
    return b"".join(e for e, _ in entries), ends, [m for _, m in entries]


def encode_records(data: bytes) -> None:
    """`_fastwire.encode_records`, the C append encoder, on buffers as `_Columns` passes
    them and spoilt ones: the same entries as `encode_record` row by row, or ValueError."""
    if appends._fastwire is None:
        return
    n, args = _buffers(_Reader(data))

    def c() -> tuple[bytes, list[int], list[int]]:
        payload, ends, meters = appends._fastwire.encode_records(n, *args)
        return payload, np.frombuffer(ends, np.int64).tolist(), np.frombuffer(
            meters, np.int64).tolist()

    _agree("encode_records", _outcome(c, (ValueError,)),
           _outcome(lambda: _encode_reference(n, args), (ValueError,)))


def crc32(data: bytes) -> None:
    """`_fastwire.crc32`, the marks' digest, against zlib's: the input's first 4 bytes are
    the value carried on, the rest the data, taken whole and from each of its first 16
    offsets (the blocks' loads unaligned), as bytes and as a view."""
    if appends._fastwire is None or len(data) < 4:
        return
    value, rest = int.from_bytes(data[:4], "little"), data[4:]
    for skip in range(min(16, len(rest) + 1)):
        view = memoryview(rest)[skip:]
        _agree("crc32", appends._fastwire.crc32(view, value), zlib.crc32(view, value))
    _agree("crc32", appends._fastwire.crc32(rest), zlib.crc32(rest))


# -- S2: a writer's first appends to many streams, and their acks ------------------------


_HEAD_CHARS = "0123456789abcdefghijklmnopqrstuvwxyz."


def _sink_bodies_args(r: _Reader) -> list[Any]:
    """Arguments for `_fastwire.sink_bodies`: consistent ones (segments within their
    payloads, marks of any length), then perhaps one array spoilt as `_buffers` spoils."""
    flags = r.byte()
    payloads = [r.blob() or b"" for _ in range(1 + r.byte() % 3)]
    seg_payload, seg_lo, seg_hi, firsts, counts = [], [], [], [0], []
    for _ in range(r.byte() % 6):
        for _ in range(r.byte() % 4):
            k = r.byte() % len(payloads)
            lo = r.byte() % (len(payloads[k]) + 1)
            seg_payload.append(k)
            seg_lo.append(lo)
            seg_hi.append(lo + r.byte() % (len(payloads[k]) - lo + 1))
        firsts.append(len(seg_payload))
        counts.append(r.byte() << (8 * (r.byte() % 4) if flags & 1 else 0))
    head = "".join(_HEAD_CHARS[b % len(_HEAD_CHARS)] for b in r.take(r.byte() % 40))
    suffixes = [r.blob() or b"" for _ in range(1 + r.byte() % 3)]
    suffix_of = [r.byte() % len(suffixes) for _ in counts]
    arrays = [np.asarray(a, np.int64).tobytes()
              for a in (seg_payload, seg_lo, seg_hi, firsts, counts, suffix_of)]
    if flags & 2:
        k = r.byte() % len(arrays)
        if len(arrays[k]) >= 8 and flags & 4:
            spoilt = np.frombuffer(arrays[k], np.int64).copy()
            spoilt[r.byte() % len(spoilt)] += r.byte() - 128
            arrays[k] = spoilt.tobytes()
        else:
            arrays[k] = arrays[k][: r.byte() % (len(arrays[k]) + 1)]
    if flags & 8:
        payloads = [memoryview(bytearray(b"\0" + p))[1:] for p in payloads]
    seg_payload_, seg_lo_, seg_hi_, firsts_, counts_, suffix_of_ = arrays
    return [payloads, seg_payload_, seg_lo_, seg_hi_, firsts_, counts_, head, suffixes,
            suffix_of_]


def _sink_bodies_reference(args: list[Any]) -> list[bytes]:
    """What `_fastwire.sink_bodies` must return: `first_bodies_python` (the sink's own
    mark, digest and fence record), or ValueError where the C one refuses its input."""
    from s2_spark.backends.s2._first_appends import first_bodies_python
    from s2_spark.errors import S2SparkError

    payloads, *arrays, head, suffixes, suffix_of = args
    if any(len(a) % 8 for a in (*arrays, suffix_of)):
        raise ValueError("not an int64 buffer")
    seg_payload, seg_lo, seg_hi, firsts, counts = (np.frombuffer(a, np.int64) for a in arrays)
    suffix_of = np.frombuffer(suffix_of, np.int64)
    n, segs = len(counts), len(seg_payload)
    if len(seg_lo) != segs or len(seg_hi) != segs or len(firsts) != n + 1 or len(
            suffix_of) != n:
        raise ValueError("mismatched lengths")
    for k, lo, hi in zip(seg_payload.tolist(), seg_lo.tolist(), seg_hi.tolist(), strict=True):
        if not (0 <= k < len(payloads) and 0 <= lo <= hi <= len(payloads[k])):
            raise ValueError("segment out of its payload")
    f = firsts.tolist()
    if f[0] != 0 or f[-1] != segs or any(b < a for a, b in itertools.pairwise(f)):
        raise ValueError("bad firsts")
    if any(c < 0 for c in counts.tolist()) or any(
            not 0 <= j < len(suffixes) for j in suffix_of.tolist()):
        raise ValueError("bad counts or suffixes")
    try:
        return first_bodies_python(payloads, seg_payload, seg_lo, seg_hi, firsts, counts,
                                   head, suffixes, suffix_of)
    except S2SparkError as exc:  # a mark over 36 bytes
        raise ValueError(str(exc)) from exc


def sink_bodies(data: bytes) -> None:
    """`_fastwire.sink_bodies`, a writer's first appends to many streams built in one C
    call, against the sink's own pieces in Python (`first_bodies_python`): the same
    bodies, or ValueError for both."""
    if appends._fastwire is None:
        return
    args = _sink_bodies_args(_Reader(data))
    c_args = [*args[:6], args[6].encode(), *args[7:]]
    _agree("sink_bodies", _outcome(lambda: appends._fastwire.sink_bodies(*c_args),
                                   (ValueError,)),
           _outcome(lambda: _sink_bodies_reference(args), (ValueError,)))


def _ack_reference(answer: bytes) -> tuple[int, ...] | None:
    """An AppendAck answer's six numbers as protobuf reads it, None if it is not one."""
    from google.protobuf.message import DecodeError

    try:
        a = s2_pb2.AppendAck.FromString(answer)
    except DecodeError:
        return None
    return (a.start.seq_num, a.start.timestamp, a.end.seq_num, a.end.timestamp,
            a.tail.seq_num, a.tail.timestamp)


def append_acks(data: bytes) -> None:
    """`_fastwire.append_acks`, many AppendAck answers read in one call, against
    protobuf's parser answer by answer (the numbers, or "not an ack" for both); and
    `acks_of` and `ack_objects`, which the writers read them with, against `ack_of`."""
    if appends._fastwire is None:
        return
    from google.protobuf.message import DecodeError

    from s2_spark.s2._append_session import ack_objects, ack_of, acks_of

    r = _Reader(data)
    answers = [r.blob() or b"" for _ in range(r.byte() % 8)]
    raw, bad = appends._fastwire.append_acks(answers)
    values = np.frombuffer(raw, np.uint64).reshape(-1, 6).tolist()
    got = [None if i in bad else tuple(v) for i, v in enumerate(values)]
    _agree("append_acks", got, [_ack_reference(a) for a in answers])

    def reference() -> tuple[list[int], list[int]]:
        acks = [ack_of(a) for a in answers]
        return [a.start.seq_num for a in acks], [a.end.seq_num for a in acks]

    _agree("acks_of", _outcome(lambda: acks_of(answers), (DecodeError,)),
           _outcome(reference, (DecodeError,)))
    _agree("ack_objects", _outcome(lambda: ack_objects(answers), (DecodeError,)),
           _outcome(lambda: [ack_of(a) for a in answers], (DecodeError,)))


# -- Durable Streams: JSON-mode bodies --------------------------------------------------


def _rows(split: Callable[[bytes], tuple[Any, Any]], body: bytes) -> list[str]:
    return durable._strings(*split(body)).to_pylist()


def _strict_json(body: bytes) -> Any:
    """The body as RFC 8259 JSON (no NaN/Infinity), or None if it is not."""
    def refuse(name: str) -> None:
        raise ValueError(name)

    try:
        return json.loads(body.decode("utf-8"), parse_constant=refuse)
    except (ValueError, RecursionError):
        return None


def json_array(data: bytes) -> None:
    """`split_json_array` (C) against the numpy splitter; a body that is a JSON array by
    RFC 8259 must split into its elements."""
    bad = (MalformedResponseError,)
    c = _outcome(lambda: _rows(durable.split_json_array, data), bad)
    py = _outcome(lambda: _rows(durable.split_json_array_numpy, data), bad)
    _agree("split_json_array", c, py)
    value = _strict_json(data)
    if isinstance(value, list) and (c[0] != "ok" or [json.loads(r) for r in c[1]] != value):
        raise Disagreement(f"split_json_array on a valid JSON array gave {c!r}")


@contextlib.contextmanager
def _without_c() -> Iterator[None]:
    saved, durable._fastjson = durable._fastjson, None
    try:
        yield
    finally:
        durable._fastjson = saved


def _pieces_rows(pieces: list[bytes]) -> list[str]:
    splitter = durable.JsonArrayPieces()
    rows: list[str] = []
    for piece in pieces:
        rows += splitter.feed(piece).to_pylist()
    return rows + splitter.finish().to_pylist()


def json_prefix(data: bytes) -> None:
    """`split_json_prefix` (C, through `JsonArrayPieces`) fed the body in pieces, against
    the whole body split at once, and against the pieces without the C path."""
    if not data:
        return
    bad = (MalformedResponseError,)
    body = data[1:]
    pieces = _cuts(body, data[0])
    whole = _outcome(lambda: _rows(durable.split_json_array_numpy, body), bad)
    if not body.strip(b" \t\r\n"):
        whole = ("ok", [])  # an empty body has no messages
    _agree("JsonArrayPieces", _outcome(lambda: _pieces_rows(pieces), bad), whole)
    with _without_c():
        _agree("JsonArrayPieces without C", _outcome(lambda: _pieces_rows(pieces), bad), whole)
    if durable._fastjson is not None:  # any bytes as the piece after a top-level comma
        _agree("split_json_prefix continued", _prefix_after_comma(body), _prefix_after_comma(
            b"[0," + body, first=1))


def _prefix_after_comma(body: bytes, first: int = 0) -> Any:
    """`split_json_prefix(body)` as a piece after a comma, or the same pieces of a body
    that starts with `[0,` instead: its elements from `first` on, and its bytes after
    them."""
    def split() -> tuple[list[int], bytes, int, bool]:
        assert durable._fastjson is not None
        offsets, values, consumed, closed = durable._fastjson.split_json_prefix(body, not first)
        ends = np.frombuffer(offsets, np.int32).tolist()[first:]
        return [e - ends[0] for e in ends], values[ends[0]:], len(body) - consumed, closed

    return _outcome(split, (ValueError,))


# -- S2S frames and SSE events (pure Python) --------------------------------------------


def _frames(pieces: list[bytes], views: bool = False) -> list[Any]:
    decoder = frames.FrameDecoder(views=views)
    out = [f for piece in pieces for f in decoder.feed(piece)]
    decoder.finish()
    return out


def s2s_frames(data: bytes) -> None:
    """`FrameDecoder` fed in pieces against fed at once, and with `views` (bodies read in
    place) against without; every message decoded as a ReadBatch by both paths."""
    if not data:
        return
    pieces = _cuts(data[1:], data[0])
    got = _outcome(lambda: _frames(pieces), (FrameError,))
    _agree("FrameDecoder pieces", got, _outcome(lambda: _frames([data[1:]]), (FrameError,)))
    _agree("FrameDecoder views", got,
           _outcome(lambda: _frames(pieces, views=True), (FrameError,)))
    for frame in got[1] if got[0] == "ok" else ():
        if isinstance(frame, frames.Message):
            _read_batch_both(frame.body, data[0])
        else:
            _outcome(lambda f=frame: f.error, (FrameError,))


def _events(pieces: list[bytes]) -> tuple[list[durable.SSEEvent], bool]:
    parser = durable.SSEParser()
    return [e for piece in pieces for e in parser.feed(piece)], parser.finish()


def sse(data: bytes) -> None:
    """`SSEParser` fed in pieces against fed at once; control and base64 data events
    parsed from every event's data."""
    if not data:
        return
    bad = (MalformedResponseError,)
    got = _outcome(lambda: _events(_cuts(data[1:], data[0])), bad)
    _agree("SSEParser pieces", got, _outcome(lambda: _events([data[1:]]), bad))
    for event in got[1][0] if got[0] == "ok" else ():
        _outcome(lambda e=event: durable.parse_control(e.data), bad)
        _outcome(lambda e=event: durable.decode_base64_data(e.data), bad)


# -- HTTP/1.1 responses (the watch's and the fan-out's reader) -----------------------------


def _h1_read(pieces: list[bytes], flags: int) -> Any:
    reader = ResponseReader(head_request=bool(flags & 1), head_only=64 if flags & 2 else None)
    for piece in pieces:
        if piece:  # a connection never delivers nothing: b"" means it closed
            reader.feed(piece)
        if reader.done:
            break
    if not reader.done:
        reader.feed(b"")  # the connection closes after the bytes
    body = reader.body[:64] if flags & 2 else reader.body  # at least the first 64: enough
    return (reader.status, reader.headers, body, reader.keep_alive, reader.done)


def _h11_read(data: bytes, head_request: bool) -> Any:
    """What h11 makes of a whole response (None where it does not finish one)."""
    conn = h11.Connection(h11.CLIENT)
    conn.send(h11.Request(method=b"HEAD" if head_request else b"GET", target=b"/",
                          headers=[(b"host", b"x")]))
    conn.send(h11.EndOfMessage())
    conn.receive_data(data)
    conn.receive_data(b"")
    head, body = None, b""
    while True:
        event = conn.next_event()
        if isinstance(event, h11.Response):
            head = event
        elif isinstance(event, h11.Data):
            body += bytes(event.data)
        elif isinstance(event, h11.EndOfMessage) and head is not None:
            return head.status_code, [(k, v) for k, v in head.headers], body
        elif event is h11.NEED_DATA or isinstance(event, h11.ConnectionClosed):
            return None


def _as_h11_keeps(headers: list[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
    """Header fields as h11 keeps them: a transfer coding lower-cased, a repeated
    Content-Length once."""
    out, lengths = [], 0
    for name, value in headers:
        if name == b"content-length":
            lengths += 1
            if lengths > 1:
                continue
        out.append((name, value.lower() if name == b"transfer-encoding" else value))
    return out


def h1_response(data: bytes) -> None:
    """`ResponseReader` fed a response in pieces against fed at once (the same answer or
    the same refusal); where it reads a whole response that h11 reads too, both give the
    same status, headers and body."""
    if len(data) < 2:
        return
    flags, body = data[1], data[2:]
    bad = (httpx.RemoteProtocolError,)
    got = _outcome(lambda: _h1_read(_cuts(body, data[0]), flags), bad)
    _agree("ResponseReader pieces", got, _outcome(lambda: _h1_read([body], flags), bad))
    if got[0] != "ok" or flags & 2 or not got[1][4]:
        return
    try:
        theirs = _h11_read(body, bool(flags & 1))
    except h11.ProtocolError:
        return
    if theirs is not None:
        status, headers, content = got[1][:3]
        _agree("ResponseReader against h11", (status, _as_h11_keeps(headers), content), theirs)


def _h1_answers(pieces: list[bytes], flags: int) -> list[Any]:
    """Up to four answers read off one connection in turn, as a `Pipeline` reads them
    (each reader handed the bytes after the last: `rest`, `adopt`); flag bit k: answer k
    is to a HEAD; bit 4: each takes at most 16 bytes of body. The connection closes after
    the bytes (an answer begun is then read to its end, or refused)."""
    limit = 16 if flags & 16 else MAX_BODY_BYTES
    answers: list[Any] = []
    reader = ResponseReader(head_request=bool(flags & 1), max_body=limit)
    begun = False
    for piece in [*(p for p in pieces if p), b""]:
        if not piece and not begun:
            break  # closed between answers
        begun = True
        reader.feed(piece)
        while reader.done:
            answers.append((reader.status, reader.headers, reader.body, reader.keep_alive))
            if len(answers) == 4 or not reader.keep_alive:
                return answers
            rest = reader.rest()
            begun = bool(rest)
            reader = ResponseReader(head_request=bool(flags >> len(answers) & 1),
                                    max_body=limit)
            reader.adopt(rest)
    return answers


@contextlib.contextmanager
def _without_fast_answer() -> Iterator[None]:
    saved, _h1.fast_answer = _h1.fast_answer, None
    try:
        yield
    finally:
        _h1.fast_answer = saved


def h1_pipelined(data: bytes) -> None:
    """Answers read one after another off one connection (the fan-out's `Pipeline`):
    `_fastwire.h1_response` (C, each plain answer in one call) against the Python steps of
    `ResponseReader`, fed in pieces and at once: the same answers and the same error."""
    if len(data) < 2:
        return
    flags, body = data[1], data[2:]
    bad = (httpx.RemoteProtocolError, BodyTooLargeError)
    pieces = _cuts(body, data[0])
    got = _outcome(lambda: _h1_answers(pieces, flags), bad)
    with _without_fast_answer():
        _agree("h1 answers, C and Python", got,
               _outcome(lambda: _h1_answers(pieces, flags), bad))
    _agree("h1 answers, pieces and at once", got,
           _outcome(lambda: _h1_answers([body], flags), bad))


def h1_answer(head: bytes | None, body: bytes) -> bytes:
    """One HTTP/1.1 answer of `body`, as the bulk readers' tests put them on a connection:
    after `head` (its status line and fields) with its content-length, or a chunked 200
    (`head` None)."""
    if head is None:
        return (b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n"
                + (b"%x\r\n%s\r\n" % (len(body), body) if body else b"") + b"0\r\n\r\n")
    return head + b"content-length: %d\r\n\r\n" % len(body) + body


def _bulk_c(read: str, pieces: list[bytes], count: int, max_body: int) -> tuple[Any, ...]:
    """`_fastwire.<read>` (`h1_tails`, `h1_acks`, `h1_bodies`) over bytes as they arrive,
    as a `BulkPipe` calls it: the buffer grows by a piece, the answers whole so far are
    read off it, up to `count` (`h1_bodies`' bodies taken where it says, as `ReadRun`
    takes them, before the buffer is cut)."""
    from array import array

    fn = getattr(records._fastwire, read)
    firsts, seconds = array("Q", bytes(8 * count)), array("Q", bytes(8 * count))
    buf, done, stop, taken, got = bytearray(), 0, 0, 0, []
    for piece in pieces:
        buf += piece
        taken += 1
        k, pos, stop = fn(buf, 0, _h1.MAX_HEAD_BYTES, max_body, firsts, seconds, done,
                          count - done)
        pairs = zip(firsts[done:done + k], seconds[done:done + k], strict=True)
        got += ([bytes(buf[a:a + n]) for a, n in pairs] if read == "h1_bodies"
                else list(pairs))
        del buf[:pos]
        done += k
        if stop == 2 or done == count:
            break
    rest = bytes(buf) + b"".join(pieces[taken:])  # with what never came to be read
    return done, rest, stop, got


def _tail_numbers(body: bytes) -> tuple[int, int] | None:
    """A tail answer's position, where its body is S2's spelling of one (`_many._TAIL`)."""
    from s2_spark.s2._many import _TAIL

    m = _TAIL.fullmatch(body)
    return None if m is None else (int(m[1]), int(m[2]))


def _ack_numbers(body: bytes) -> tuple[int, int] | None:
    """An append answer's start and end seq_num, where protobuf reads an AppendAck."""
    ack = _ack_reference(body)
    return None if ack is None else (ack[0], ack[2])


def bulk_python(data: bytes, done: int, max_body: int,
                numbers: Callable[[bytes], Any | None]) -> tuple[bytes, list[Any]]:
    """The Python reference of `h1_tails`, `h1_acks` and `h1_bodies`: the first `done`
    answers of `data` read by `ResponseReader`'s Python steps, each required to be what C
    took: a kept-alive 200, not coded (no Content-Encoding), whose body `numbers` reads;
    the bytes after them and the numbers (the bodies)."""
    got, rest = [], bytearray(data)
    with _without_fast_answer():
        for _ in range(done):
            reader = ResponseReader(max_body=max_body)
            reader.adopt(rest)
            pair = numbers(reader.body) if reader.done else None
            coded = any(name == b"content-encoding" for name, _ in reader.headers)
            if not (reader.done and reader.status == 200 and reader.keep_alive
                    and not coded and pair is not None):
                raise Disagreement(f"C took an answer Python reads otherwise: {reader.status}")
            got.append(pair)
            rest = reader.rest()
    return bytes(rest), got


def _h1_bulk(read: str, numbers: Callable[[bytes], Any | None], data: bytes) -> None:
    """`h1_tails` / `h1_acks` / `h1_bodies` (C) against `bulk_python`: every answer C
    takes is a plain 200 to Python too, with the same numbers and end; where C waits for
    more, Python has not read the answer whole; at once and in pieces, C takes the same
    answers."""
    if len(data) < 2:
        return
    count, max_body, body = data[0] % 8 + 1, 64 if data[1] & 1 else 16 << 10, data[2:]
    done, rest, stop, got = _bulk_c(read, _cuts(body, data[1]), count, max_body)
    _agree(f"{read}, in pieces and at once", (done, got),
           _bulk_c(read, [body], count, max_body)[::3])
    rest_py, got_py = bulk_python(body, done, max_body, numbers)
    _agree(f"{read}, C and Python", (got, rest), (got_py, rest_py))
    if stop == 1 and rest == _bulk_c(read, [body], count, max_body)[1]:
        # not whole yet, all of it read: Python's reader waits too (no error, not done)
        with _without_fast_answer():
            reader = ResponseReader(max_body=max_body)
            reader.adopt(bytearray(rest))
            _agree(f"{read}, an answer begun", False, reader.done)


def h1_tails(data: bytes) -> None:
    """Tail lookups' answers read in bulk (`_fastwire.h1_tails`) against `bulk_python`
    and `_many._TAIL` (`_h1_bulk`)."""
    _h1_bulk("h1_tails", _tail_numbers, data)


def h1_acks(data: bytes) -> None:
    """Appends' answers read in bulk (`_fastwire.h1_acks`) against `bulk_python` and
    protobuf's AppendAck (`_h1_bulk`)."""
    _h1_bulk("h1_acks", _ack_numbers, data)


def h1_bodies(data: bytes) -> None:
    """Small reads' answers read in bulk (`_fastwire.h1_bodies`: where each plain body
    lies, taken as bytes) against `bulk_python`, any body as it came (`_h1_bulk`)."""
    _h1_bulk("h1_bodies", bytes, data)


def _streamed_read(pieces: list[bytes]) -> Any:
    """A GET's answer read as `StreamedGets` reads it: the head by `ResponseReader`, the
    body's pieces by `BodyReader` from views into what arrived, to the close at most."""
    head = ResponseReader(head_request=True)
    rest = iter(p for p in pieces if p)  # a connection never delivers nothing
    for piece in rest:
        head.feed(piece)
        if head.done:
            break
    if not head.done:
        head.feed(b"")  # closed: refused (no answer) or informational answers only
    kind, length = ("none", 0) if head.status in (204, 304) else body_framing(head.headers)
    body = BodyReader(kind, length)
    out = [bytes(v) for v in body.feed(memoryview(head.leftover))]
    for piece in rest:  # what follows the end counts as leftover
        out += [bytes(v) for v in body.feed(memoryview(bytearray(piece)))]
    if not body.done:
        body.closed()
    keep = head.keep_alive and kind != "eof"
    return head.status, head.headers, b"".join(out), keep, body.leftover > 0


def h1_streamed(data: bytes) -> None:
    """A GET's answer read as a read session reads it (`BodyReader` after the head) in
    pieces against at once, and against `ResponseReader` reading it whole: the same
    status, headers, body and reuse of the connection, or both refuse."""
    if len(data) < 2:
        return
    body = data[1:]
    bad = (httpx.RemoteProtocolError,)
    got = _outcome(lambda: _streamed_read(_cuts(body, data[0])), bad)
    _agree("streamed pieces", got, _outcome(lambda: _streamed_read([body]), bad))

    theirs = _outcome(lambda: _whole_read(body), bad)
    _agree("streamed against ResponseReader", got, theirs)


def _whole_read(data: bytes) -> Any:
    """The same as `_streamed_read` gives, from `ResponseReader` reading it whole."""
    reader = ResponseReader()
    reader.feed(data)
    if not reader.done:
        reader.feed(b"")
    return (reader.status, reader.headers, reader.body, reader.keep_alive,
            bool(reader.leftover))


# -- HTTP/2 frames (the tail watch's connections) -------------------------------------------


_DATA, _HEADERS, _PRIORITY, _RST_STREAM, _SETTINGS = 0, 1, 2, 3, 4
_PUSH_PROMISE, _PING, _GOAWAY, _WINDOW_UPDATE, _CONTINUATION = 5, 6, 7, 8, 9
_END_HEADERS, _PADDED, _PRIORITY_FLAG = 0x4, 0x8, 0x20
_MAX_FRAME = 16384
_STATUSES = (b"200", b"204", b"404", b"100", b"103", b"500", b"304", b"200")
_NAMES = (b"content-type", b"x-id", b"set-cookie", b"cookie", b"content-length", b"server")
#: Settings the server sends: the six of RFC 9113, and two unknown ones (never 8, see
#: `h2_frames`).
_SETTING_CODES = (1, 2, 3, 4, 5, 6, 0x10, 0x4242)


def _h2_frame(kind: int, flags: int, sid: int, payload: bytes, length: int = -1) -> bytes:
    size = len(payload) if length < 0 else length
    return size.to_bytes(3, "big") + bytes((kind, flags)) + sid.to_bytes(4, "big") + payload


def _settings_payload(r: _Reader, raw: bool) -> bytes:
    """SETTINGS entries, each setting once (its last value: hyperframe keeps a frame's
    settings in a dict, so h2 never sees an earlier one); unless `raw`, each value in the
    range RFC 9113 6.5.2 allows."""
    settings: dict[int, int] = {}
    for _ in range(r.byte() % 4):
        code = _SETTING_CODES[r.byte() % 8]
        value = int.from_bytes(r.take(4).ljust(4, b"\0"), "big")
        if not raw:
            value = {2: 0, 4: value & 0x7FFFFFFF,
                     5: _MAX_FRAME + value % ((1 << 24) - _MAX_FRAME)}.get(code, value)
        settings.pop(code, None)
        settings[code] = value
    return b"".join(c.to_bytes(2, "big") + v.to_bytes(4, "big") for c, v in settings.items())


def _header_block(r: _Reader, encoder: hpack.Encoder) -> bytes:
    """A response head encoded by one server encoder (its dynamic table carried from
    block to block), perhaps after a table size update (8,192: past the 4,096 allowed)."""
    shape = r.byte()
    if shape & 0x80:
        encoder.header_table_size = (0, 256, 4096, 8192)[shape >> 5 & 3]
    fields = [(b":status", _STATUSES[shape % 8], False)] + [
        (_NAMES[r.byte() % 6], r.blob() or b"", bool(shape & 0x40))
        for _ in range(shape >> 3 & 3)]
    return encoder.encode(fields, huffman=bool(shape & 0x04))


def _padded(flags: int, r: _Reader, fixed: bytes, body: bytes, spoil: bool) -> bytes:
    """`fixed` fields and `body`, with padding if `flags` says so (with `spoil`, fewer
    padding bytes than the Pad Length says)."""
    if not flags & _PADDED:
        return fixed + body
    pad = r.byte()
    return bytes((pad,)) + fixed + body + bytes(r.byte() % (pad + 1) if spoil else pad)


def _stream_id(where: int, r: _Reader) -> int:
    """0, a request's stream (1, 3, 5, 7: idle where fewer were sent), an even one, 9
    (idle), or any; perhaps with the reserved bit set (to be ignored)."""
    sid = (0, 1, 3, 5, 7, 2, 9, -1)[where % 8]
    if sid < 0:
        sid = int.from_bytes(r.take(4).ljust(4, b"\0"), "big") & 0x7FFFFFFF
    return sid | (0x80000000 if where & 0x40 else 0)


def _server_frames(r: _Reader, encoder: hpack.Encoder) -> list[bytes]:
    """The frames of one step of the server: mostly one; a header block split into a
    HEADERS frame and its CONTINUATION frames. An eighth of them spoilt: fixed-size
    fields cut or grown, padding short of its Pad Length, SETTINGS values out of range."""
    kind, flags, where = r.byte(), r.byte(), r.byte()
    spoil, t = kind >= 0xE0, kind % 16
    t = _HEADERS if t in (12, 13) else _DATA if t > 13 else t  # answers more often
    sid = _stream_id(where, r)
    if t in (_SETTINGS, _PING, _GOAWAY) and not where & 0x80:
        sid = 0
    if t == _HEADERS:
        block = r.blob() or b"" if kind & 0x30 == 0x30 else _header_block(r, encoder)
        ends = sorted(r.byte() % (len(block) + 1) for _ in range(r.byte() % 4))
        pieces = [block[a:b] for a, b in zip([0, *ends], [*ends, len(block)], strict=True)]
        priority = b""
        if flags & _PRIORITY_FLAG:
            dep = int.from_bytes(r.take(4).ljust(4, b"\0"), "big")
            if dep & 0x7FFFFFFF == sid & 0x7FFFFFFF:
                dep ^= 1  # never on itself: see `h2_frames`
            priority = (dep.to_bytes(4, "big") + r.take(1))[: r.byte() % 6 if spoil else 5]
        last = flags & _END_HEADERS  # on the last piece only: unset, the block is unfinished
        heads = [_h2_frame(_HEADERS, flags & ~_END_HEADERS | (last if len(pieces) == 1 else 0),
                           sid, _padded(flags, r, priority, pieces[0], spoil))]
        return heads + [_h2_frame(_CONTINUATION, last if i == len(pieces) - 1 else 0, sid, p)
                        for i, p in enumerate(pieces) if i]
    if t == 10:  # an unknown type (10, ALTSVC, is not unknown to h2: see `h2_frames`)
        return [_h2_frame(11 + r.byte() % 245, flags, sid, r.blob() or b"")]
    if t == 11:  # over the frame size: refused from its header on (12-15: HEADERS, DATA)
        return [_h2_frame(r.byte() % 10, flags, sid, r.blob() or b"", _MAX_FRAME + 1 + r.byte())]
    if t == _DATA:
        payload = _padded(flags, r, b"", r.blob() or b"", spoil)
    elif t == _PUSH_PROMISE:
        payload = _padded(flags, r, (2 + 2 * r.byte()).to_bytes(4, "big"), r.blob() or b"",
                          spoil)
    elif t == _CONTINUATION:
        payload = r.blob() or b""
    elif t == _SETTINGS:
        payload = b"" if flags & 1 else _settings_payload(r, spoil)
    elif t == _GOAWAY:
        last = (0, 1, 3, 5, 7, 0x7FFFFFFF, 0x80000001, 2)[r.byte() % 8]  # reserved bit too
        payload = last.to_bytes(4, "big") + bytes(3) + bytes((r.byte() % 16,)) + (r.blob() or b"")
    else:  # PRIORITY, RST_STREAM, PING, WINDOW_UPDATE: fixed sizes
        size = {_PRIORITY: 5, _RST_STREAM: 4, _PING: 8, _WINDOW_UPDATE: 4}[t]
        payload = ((r.byte() % 16).to_bytes(4, "big") if t == _RST_STREAM
                   else r.take(size).ljust(size, b"\0"))
    if spoil and t not in (_DATA, _PUSH_PROMISE):
        payload = (payload + r.take(8))[: r.byte() % (len(payload) + 9)]
    return [_h2_frame(t, flags, sid, payload)]


def _comparable(wire: bytes) -> tuple[list[bytes], bytes]:
    """The server's bytes as frames for h2, and as bytes for ours. A frame over the
    frame size ends both (ours refuses it at its header, h2 once it is whole: h2 gets it
    completed with zeros). An unfinished last frame is not given to h2 (it may judge a
    frame header before the frame arrives, ours judges whole frames). Both end before a
    header block's 64th CONTINUATION frame (where h2 stops, see `h2_frames`)."""
    frames: list[bytes] = []
    pos = continued = 0
    while len(wire) - pos >= 9:
        length = int.from_bytes(wire[pos : pos + 3], "big")
        frame = wire[pos : pos + 9 + length]
        if length > _MAX_FRAME:
            return [*frames, frame.ljust(9 + length, b"\0")], wire
        if len(frame) < 9 + length:
            break
        continued = continued + 1 if frame[3] == _CONTINUATION else 0
        if continued == 64:
            return frames, wire[:pos]
        frames.append(frame)
        pos += len(frame)
    return frames, wire


class _Transport:
    """What `H2Connection` asks of its transport; what it writes is not looked at."""

    def __init__(self) -> None:
        self.closed = False

    def write(self, data: bytes) -> None:
        pass

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        self.closed = True

    def get_write_buffer_size(self) -> int:
        return 0


class _Ours(H2Connection):
    """Ours, telling a failed connection (one exception, every request still waiting
    given it) from a reset stream."""

    broke: Exception | None = None

    def _broken(self, exc: Exception, not_h2: NotHttp2 | None = None) -> None:
        self.broke = exc
        super()._broken(exc, not_h2)


def _answer(status: int, headers: list[tuple[bytes, bytes]], body: bytes) -> Any:
    """An answer as `Response` gives it (the body decoded by its Content-Encoding), on
    both sides, so that decoding a body is never a difference."""
    try:
        response = Response(status, headers, content=body)
    except Exception as exc:  # what `_settle` hands on
        return ("error", type(exc).__name__)
    return ("answer", response.status_code, response.headers.raw, response.content)


async def _ours_read(first: list[bytes], rest: list[bytes], n: int) -> list[Any]:
    conn, transport = _Ours(), _Transport()
    conn.start(transport)  # type: ignore[arg-type]
    got: list[Any] = [("pending",)] * n

    def done(i: int) -> Callable[[Any], None]:
        def record(result: Any) -> None:
            if isinstance(result, Response):
                got[i] = ("answer", result.status_code, result.headers.raw, result.content)
            elif result is conn.broke:
                got[i] = ("failed",)
            elif isinstance(result, Unprocessed):
                got[i] = ("unprocessed",)
            elif isinstance(result, httpx.RemoteProtocolError):
                got[i] = ("reset",)
            else:
                got[i] = ("error", type(result).__name__)
        return record

    def feed(pieces: list[bytes]) -> None:
        for piece in pieces:
            if transport.closed:  # asyncio delivers nothing after `close`
                break
            if piece:  # nor an empty read
                conn.data_received(piece)

    feed(first)
    for i in range(n):
        try:
            conn.send(b"GET", b"s2.test", b"https", b"/", [], None, done(i))
        except Unprocessed:  # not ready: the SETTINGS unfinished, or refused
            got[i] = ("failed",) if conn.broke else ("pending",)
        except httpx.LocalProtocolError as exc:  # the server's frame size too small for it
            got[i] = ("error", type(exc).__name__)
    feed(rest)
    await asyncio.sleep(0)  # the writes it put off
    if conn.ready.done() and not conn.ready.cancelled():
        conn.ready.exception()  # seen
    return got


class _Oracle(h2.connection.H2Connection):
    """h2's connection, a HEADERS frame on a closed stream decoded (the table follows
    every block) and otherwise ignored, as ours does (see `h2_frames`)."""

    def _receive_headers_frame(self, frame: Any) -> Any:
        if self._stream_closed_by(frame.stream_id) is None:
            return super()._receive_headers_frame(frame)
        h2.connection._decode_headers(self.decoder, frame.data)
        return [], []


class _Malformed(Exception):
    """A response head h2 passes (its field validation off) that RFC 9113 calls
    malformed."""


def _status(fields: list[tuple[bytes, bytes]]) -> int:
    """The status of a well-formed response head: its one pseudo-header field, first,
    `:status` of three digits (RFC 9113 8.3, RFC 9110 15)."""
    if (not fields or fields[0][0] != b":status" or len(fields[0][1]) != 3
            or not fields[0][1].isdigit() or any(n.startswith(b":") for n, _ in fields[1:])):
        raise _Malformed(fields)
    return int(fields[0][1])


def _trailers(fields: list[tuple[bytes, bytes]]) -> None:
    """Trailers without pseudo-header fields (RFC 9113 8.1)."""
    if any(n.startswith(b":") for n, _ in fields):
        raise _Malformed(fields)


def _h2_read(frames: list[bytes], n: int) -> list[Any]:
    conn = _Oracle(h2.config.H2Configuration(
        client_side=True, header_encoding=None, validate_inbound_headers=False,
        normalize_inbound_headers=False))
    conn.local_settings = h2.settings.Settings(client=True, initial_values={
        h2.settings.SettingCodes.ENABLE_PUSH: 0,
        h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: STREAM_WINDOW,
        h2.settings.SettingCodes.MAX_HEADER_LIST_SIZE: MAX_HEADER_BLOCK})
    conn.local_settings.acknowledge()  # in force from the start, as ours has them
    conn.initiate_connection()
    conn.increment_flow_control_window(CONNECTION_WINDOW - 65535)  # ours' window too
    got: dict[int, Any] = {}
    heads: dict[int, tuple[int, list[tuple[bytes, bytes]]]] = {}
    bodies = {2 * i + 1: b"" for i in range(n)}
    for sid in bodies:
        conn.send_headers(sid, [(b":method", b"GET"), (b":scheme", b"https"),
                                (b":authority", b"s2.test"), (b":path", b"/")], end_stream=True)
    going_away = in_block = False
    for frame in frames:
        kind, flags, stream = frame[3], frame[4], int.from_bytes(frame[5:9], "big") & 0x7FFFFFFF
        if kind in (_PRIORITY, _WINDOW_UPDATE) and not in_block and len(frame) <= 9 + _MAX_FRAME:
            continue  # ignored by ours
        in_block = (not flags & _END_HEADERS if kind == _HEADERS else
                    in_block and not flags & _END_HEADERS if kind == _CONTINUATION else in_block)
        try:
            if kind == _PUSH_PROMISE:
                raise h2.exceptions.ProtocolError("PUSH_PROMISE with push off")
            if kind in (_DATA, _HEADERS, _RST_STREAM) and (not stream & 1 or stream > 2 * n):
                raise h2.exceptions.ProtocolError("a stream the client did not open")
            if kind == _DATA and stream in got:
                raise h2.exceptions.ProtocolError("DATA on a stream that ended")
            if _padding_over_priority(frame):
                raise h2.exceptions.ProtocolError("padding over the priority fields")
            for event in conn.receive_data(_full_room(frame)):
                sid = getattr(event, "stream_id", 0)
                if sid not in bodies or sid in got:
                    if isinstance(event, h2.events.ConnectionTerminated):
                        going_away = True
                        _went_away(conn, event.last_stream_id, bodies, got)
                elif isinstance(event, h2.events.InformationalResponseReceived):
                    _status(event.headers)
                elif isinstance(event, h2.events.ResponseReceived):
                    heads[sid] = (_status(event.headers), [
                        (k, v) for k, v in event.headers if not k.startswith(b":")])
                elif isinstance(event, h2.events.TrailersReceived):
                    _trailers(event.headers)
                elif isinstance(event, h2.events.DataReceived):
                    bodies[sid] += event.data
                elif isinstance(event, h2.events.StreamEnded):
                    got[sid] = _answer(*heads[sid], bodies[sid])
                elif isinstance(event, h2.events.StreamReset):
                    got[sid] = ("unprocessed",) if event.error_code == 7 else ("reset",)
        except (h2.exceptions.ProtocolError, _Malformed):
            got = {sid: got.get(sid, ("failed",)) for sid in bodies}
            break
        if going_away and len(got) == n:
            break  # ours closes the connection here
    return [got.get(sid, ("pending",)) for sid in bodies]


def _went_away(conn: h2.connection.H2Connection, last: int | None, bodies: dict[int, bytes],
               got: dict[int, Any]) -> None:
    """A GOAWAY: the requests past its last stream id (h2 keeps its reserved bit) unprocessed,
    their streams reset (ours forgets them), and the connection open again for the others'
    answers."""
    conn.state_machine.state = h2.connection.ConnectionState.CLIENT_OPEN
    for sid in bodies:
        if sid > (last or 0) & 0x7FFFFFFF and sid not in got:
            got[sid] = ("unprocessed",)
            conn.reset_stream(sid)


def _padding_over_priority(frame: bytes) -> bool:
    """A padded HEADERS frame with priority whose padding reaches into the 5 bytes of
    priority fields: RFC 9113 6.2 refuses it, hyperframe only padding past them."""
    kind, flags, payload = frame[3], frame[4], frame[9:]
    return (kind == _HEADERS and bool(flags & _PADDED) and bool(flags & _PRIORITY_FLAG)
            and len(payload) > 0 and payload[0] > len(payload) - 6)


def _full_room(frame: bytes) -> bytes:
    """A padded HEADERS frame (without priority) all padding after its Pad Length, given
    to h2 without padding (the same empty fragment): hyperframe refuses it."""
    kind, flags = frame[3], frame[4]
    if (kind == _HEADERS and flags & _PADDED and not flags & _PRIORITY_FLAG
            and len(frame) > 9 and frame[9] == len(frame) - 10):
        return _h2_frame(kind, flags & ~_PADDED, int.from_bytes(frame[5:9], "big"), b"")
    return frame


def h2_frames(data: bytes) -> None:
    """`H2Connection` (ours, the tail watch's HTTP/2) reading a server's frames in
    pieces, against h2 reading them frame by frame: every request the same answer
    (status, headers, body), the same reset, or the same failed connection.

    Input: byte 0 seeds the cuts; byte 1: requests (1-4, streams 1, 3, 5, 7), whether
    the bytes stop a few bytes short, whether the first SETTINGS holds any values; then
    the server's SETTINGS and its frames, each from three bytes (kind, flags, where) and
    what follows (`_server_frames`).

    Normalised, each where ours made a documented choice, RFC 9113 leaves the choice
    open, or h2 departs from it:
    * PRIORITY and WINDOW_UPDATE frames are not given to h2 (ours ignores both: it
      sends no DATA, and priority signals are deprecated, RFC 9113 5.3.2), but inside a
      header block, where both must refuse them; a HEADERS frame's priority never
      names its own stream (h2 fails the connection on it, ours ignores priority).
    * DATA on a stream that ended (END_STREAM, RST_STREAM, past a GOAWAY's last id):
      h2 resets the stream (a stream error, RFC 9113 6.1), ours ends the connection,
      which 5.4.1 allows for any stream error: the oracle ends it too.
    * HEADERS on a closed stream: ours decodes the block and ignores it; h2 fails the
      connection after END_STREAM (RFC 9113 5.1 allows both), and after RST_STREAM on
      an informational head (5.1: ignored): to h2 they are decoded and ignored too.
    * GOAWAY: h2 refuses every frame after one (its connection state is closed), while
      RFC 9113 6.8 lets the streams up to its last id finish, as ours does; h2 is opened
      again, the streams past the last id (read without its reserved bit, which h2 keeps)
      reset (ours forgets them). Once no request waits, ours closes the connection: h2 is
      given no more.
    * A frame over 16,384 bytes: ours refuses it at its header, h2 once it is whole
      (given zeros to complete it). An unfinished last frame is not given to h2.
    * PUSH_PROMISE: ours refuses it at once (push is off: RFC 9113 8.4), h2 once its
      header block is complete: to h2 it is an error at once.
    * DATA, HEADERS and RST_STREAM on a stream the client did not open (0, even, or
      past the last it opened) end the connection at the frame (RFC 9113 5.1, 5.1.1,
      6.4), as ours ends it: h2 judges HEADERS only once its block is whole, takes
      HEADERS on an even stream as a request from the server, and ignores RST_STREAM on
      an idle stream.
    * h2 refuses a header block of more than 63 CONTINUATION frames; ours a block
      over MAX_HEADER_BLOCK (64 KiB): the bytes end before the 64th.
    * A padded HEADERS frame (without priority) all padding after its Pad Length (an
      empty fragment): hyperframe refuses it, RFC 9113 6.2 only padding that exceeds
      the room left for the fragment; h2 gets it unpadded. With priority fields,
      padding that reaches into them: RFC 9113 6.2 refuses it (as ours does), hyperframe
      only padding past them too; to h2 it is an error at once.
    * Header fields are not validated (h2's validation off, ours has none), but a
      response head must be well formed: one pseudo-header field, first, `:status` of
      three digits (RFC 9113 8.3; h2 makes other malformed responses connection errors,
      so this does too), and trailers must hold no pseudo-header field (8.1); their
      other fields are not looked at (ours drops them).
    * A SETTINGS frame names each setting once: hyperframe reads a frame's settings
      into a dict, so h2 checks only the last value of one named twice (RFC 9113 6.5.3
      processes each in order, as ours does: a first value out of range is an error).
    * Setting 8 (ENABLE_CONNECT_PROTOCOL, RFC 8441) is never sent: h2 checks its value,
      ours does not know it and must ignore it; type 10 (ALTSVC, RFC 7838) is never
      sent as an unknown type: h2 parses it.
    * h2's settings are ours' from the start (h2 applies its own once acknowledged):
      push off, windows of 1 MiB a stream and 64 MiB the connection, which inputs of
      8 KiB (fuzz.py's -max_len) never fill, padding included (at most 255 bytes a
      frame of 5 input bytes): neither gives a window back.
    """
    r = _Reader(data)
    seed, control = r.byte(), r.byte()
    n = 1 + control % 4
    encoder = hpack.Encoder()
    wire = _h2_frame(_SETTINGS, 0, 0, _settings_payload(r, control >= 0xC0))
    first = len(wire)
    while r.left():
        wire += b"".join(_server_frames(r, encoder))
    if control & 0x20:
        wire = wire[: len(wire) - (control >> 2) % 8]
    frames, wire = _comparable(wire)
    ours = _run(_ours_read(_cuts(wire[:first], seed), _cuts(wire[first:], seed + 1), n))
    theirs = _h2_read(frames, n)
    if ours != theirs:
        raise Disagreement(f"H2Connection gave {ours!r}, h2 gave {theirs!r}")


_loop: asyncio.AbstractEventLoop | None = None


def _run(coroutine: Coroutine[Any, Any, list[Any]]) -> list[Any]:
    """Runs on one event loop for the whole process (a new loop per input costs more
    than the input)."""
    global _loop
    if _loop is None:
        _loop = asyncio.new_event_loop()
    return _loop.run_until_complete(coroutine)


TARGETS: dict[str, Callable[[bytes], None]] = {
    "read_batch": read_batch,
    "read_batches": read_batches,
    "read_many": read_many,
    "encode_records": encode_records,
    "crc32": crc32,
    "sink_bodies": sink_bodies,
    "append_acks": append_acks,
    "json_array": json_array,
    "json_prefix": json_prefix,
    "append_columns": append_columns,
    "s2s_frames": s2s_frames,
    "sse": sse,
    "h1_response": h1_response,
    "h1_streamed": h1_streamed,
    "h1_pipelined": h1_pipelined,
    "h1_tails": h1_tails,
    "h1_acks": h1_acks,
    "h1_bodies": h1_bodies,
    "h2_frames": h2_frames,
}
"""Every fuzz target by name; the first eight call one C entry point each (the first two
the same one, with one payload and with several)."""
