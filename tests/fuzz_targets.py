"""Fuzz targets for the wire decoders: each takes any bytes and fails only on a real fault.

A target runs one input through the C accelerator and through the pure-Python path behind
the same function and raises `Disagreement` when they give different rows or different
typed errors; any other exception (an `IndexError`, a crash) is a fault of its own. The
only exceptions a decoder may raise on bad input are its typed ones: `FrameError` for S2,
`MalformedResponseError` for Durable Streams, `ValueError`/`TypeError` for bad arguments to
the append encoder, `httpx.RemoteProtocolError` for an HTTP/1.1 answer (`h1_response`, the
reader the tail watch and the fan-out parse answers with, checked against h11;
`h1_streamed`, the head and streamed body of a read session, checked against it).

`scripts/fuzz.py` runs them coverage-guided (atheris); `tests/test_fuzz.py` replays the
corpus in `tests/data/fuzz/<target>/` (seeds, and every input that ever failed) on each
test run. Structured targets read their parameters from the input's first bytes, so an
input means the same thing to every run.
"""

from __future__ import annotations

import contextlib
import json
import random
from collections.abc import Callable, Iterator
from typing import Any

import h11
import httpx
import numpy as np
import pyarrow as pa

from s2_spark._http._h1 import BodyReader, ResponseReader, body_framing
from s2_spark._proto import s2_pb2
from s2_spark.errors import FrameError, MalformedResponseError
from s2_spark.wire import appends, durable, frames, records

__all__ = ["TARGETS", "Disagreement"]


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


TARGETS: dict[str, Callable[[bytes], None]] = {
    "read_batch": read_batch,
    "read_batches": read_batches,
    "encode_records": encode_records,
    "json_array": json_array,
    "json_prefix": json_prefix,
    "append_columns": append_columns,
    "s2s_frames": s2s_frames,
    "sse": sse,
    "h1_response": h1_response,
    "h1_streamed": h1_streamed,
}
"""Every fuzz target by name; the first five call one C entry point each (the first two
the same one, with one payload and with several)."""
