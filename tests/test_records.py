"""ReadBatch -> Arrow decoding: both implementations against protobuf's own parser."""

from __future__ import annotations

import datetime as dt
import inspect
from typing import Any

import pyarrow as pa
import pytest
from fuzz_targets import _batch_view
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from s2_spark._proto import s2_pb2
from s2_spark.errors import FrameError, Position
from s2_spark.wire import records as R
from s2_spark.wire.records import (
    READ_SCHEMA,
    READ_SCHEMA_NO_HEADERS,
    DecodedBatch,
    decode_read_batch,
    decode_read_many,
)

IMPLS = ["python"] + (["c"] if R._fastwire is not None else [])


def decode(impl: str, payload: bytes, stream: str = "s", **kw: bool) -> DecodedBatch:
    inc_cmd = kw.get("include_command_records", True)
    inc_h = kw.get("include_headers", True)
    if impl == "c":
        return R._decode_c([payload], stream, inc_cmd, inc_h)
    return R._decode_python([payload], stream, inc_cmd, inc_h)


def expected(
    payload: bytes,
    stream: str,
    *,
    include_command_records: bool = True,
    include_headers: bool = True,
) -> dict[str, Any]:
    """What a decode must give, computed from protobuf's own parse."""
    msg: Any = s2_pb2.ReadBatch.FromString(payload)
    rows = []
    metered = 0
    for r in msg.records:
        hs = [(h.name, h.value) for h in r.headers]
        metered += 8 + 2 * len(hs) + sum(len(n) + len(v) for n, v in hs) + len(r.body)
        if not include_command_records and len(hs) == 1 and hs[0][0] == b"":
            continue
        row: dict[str, Any] = {
            "stream": stream,
            "seq_num": r.seq_num,
            "timestamp": r.timestamp * 1000,
        }
        if include_headers:
            row["headers"] = [{"name": n, "value": v} for n, v in hs]
        row["body"] = r.body
        rows.append(row)
    recs = msg.records
    return {
        "rows": rows,
        "tail": Position(msg.tail.seq_num, msg.tail.timestamp) if msg.HasField("tail") else None,
        "count": len(recs),
        "first": recs[0].seq_num if recs else None,
        "last": recs[-1].seq_num if recs else None,
        "metered": metered,
    }


def rows(batch: pa.RecordBatch) -> list[dict[str, Any]]:
    """Rows with timestamps as integer microseconds (datetime cannot hold every value)."""
    names = batch.schema.names
    columns = [
        c.cast(pa.int64()) if n == "timestamp" else c
        for n, c in zip(names, batch.columns, strict=True)
    ]
    return pa.RecordBatch.from_arrays(columns, names=names).to_pylist()


def check(payload: bytes, stream: str = "s", **kw: bool) -> list[DecodedBatch]:
    want = expected(payload, stream, **kw)
    results = []
    for impl in IMPLS:
        got = decode(impl, payload, stream, **kw)
        got.batch.validate(full=True)
        schema = READ_SCHEMA if kw.get("include_headers", True) else READ_SCHEMA_NO_HEADERS
        assert got.batch.schema == schema
        assert rows(got.batch) == want["rows"], impl
        assert got.tail == want["tail"]
        assert got.count == want["count"]
        assert got.first_seq_num == want["first"]
        assert got.last_seq_num == want["last"]
        assert got.metered_bytes == want["metered"]
        results.append(got)
    for other in results[1:]:
        assert other.batch.equals(results[0].batch)
        assert other == results[0] or (
            (other.tail, other.count, other.first_seq_num, other.last_seq_num, other.metered_bytes)
            == (
                results[0].tail,
                results[0].count,
                results[0].first_seq_num,
                results[0].last_seq_num,
                results[0].metered_bytes,
            )
        )
    return results


def make_batch(
    records: list[tuple[int, int, list[tuple[bytes, bytes]], bytes]],
    tail: tuple[int, int] | None = None,
) -> bytes:
    msg = s2_pb2.ReadBatch(
        records=[
            s2_pb2.SequencedRecord(
                seq_num=s,
                timestamp=t,
                headers=[s2_pb2.Header(name=n, value=v) for n, v in hs],
                body=b,
            )
            for s, t, hs, b in records
        ]
    )
    if tail is not None:
        msg.tail.seq_num, msg.tail.timestamp = tail
    return msg.SerializeToString()


def test_schema_equals_pyspark_arrow_schema() -> None:
    # The codec tests also run where PySpark is not installed (each wheel's own tests).
    T = pytest.importorskip("pyspark.sql.types")
    to_arrow_schema = pytest.importorskip("pyspark.sql.pandas.types").to_arrow_schema
    # DDL: stream string, seq_num bigint, timestamp timestamp,
    #      headers array<struct<name: binary, value: binary>>, body binary
    spark_schema = T.StructType(
        [
            T.StructField("stream", T.StringType()),
            T.StructField("seq_num", T.LongType()),
            T.StructField("timestamp", T.TimestampType()),
            T.StructField(
                "headers",
                T.ArrayType(
                    T.StructType(
                        [
                            T.StructField("name", T.BinaryType()),
                            T.StructField("value", T.BinaryType()),
                        ]
                    )
                ),
            ),
            T.StructField("body", T.BinaryType()),
        ]
    )
    # PySpark 4.1+ takes the session time zone; 4.0 has no such parameter and uses UTC.
    utc = {"timezone": "UTC"} if "timezone" in inspect.signature(to_arrow_schema).parameters else {}
    assert to_arrow_schema(spark_schema, **utc) == READ_SCHEMA
    no_headers = T.StructType([f for f in spark_schema.fields if f.name != "headers"])
    assert to_arrow_schema(no_headers, **utc) == READ_SCHEMA_NO_HEADERS
    assert all(f.nullable for f in READ_SCHEMA)


def test_public_entry_point_and_types() -> None:
    payload = make_batch(
        [(7, 1_700_000_000_123, [(b"k", b"v")], b"hello")], tail=(8, 1_700_000_000_124)
    )
    got = decode_read_batch(payload, "orders")
    assert got.count == 1 and got.first_seq_num == 7 and got.last_seq_num == 7
    assert got.tail == Position(8, 1_700_000_000_124)
    assert got.metered_bytes == 8 + 2 + 2 + 5
    assert got.batch.to_pylist() == [
        {
            "stream": "orders",
            "seq_num": 7,
            "timestamp": dt.datetime(2023, 11, 14, 22, 13, 20, 123000, tzinfo=dt.UTC),
            "headers": [{"name": b"k", "value": b"v"}],
            "body": b"hello",
        }
    ]
    assert got.batch.column("timestamp").cast(pa.int64()).to_pylist() == [1_700_000_000_123_000]
    with pytest.raises(AttributeError):
        got.count = 2  # type: ignore[misc]


def test_empty_message_and_heartbeat() -> None:
    for impl in IMPLS:
        got = decode(impl, b"")
        assert got.batch.num_rows == 0 and got.tail is None and got.count == 0
        assert got.first_seq_num is None and got.last_seq_num is None and got.metered_bytes == 0
    heartbeat = make_batch([], tail=(0, 0))
    assert heartbeat == b"\x12\x00"
    for got in check(heartbeat):
        assert got.tail == Position(0, 0)


def test_command_records_filtered_and_kept() -> None:
    fence = (1, 10, [(b"", b"fence")], b"token")
    trim = (2, 11, [(b"", b"trim")], (5).to_bytes(8, "big"))
    not_cmd_two = (3, 12, [(b"", b"x"), (b"", b"y")], b"two headers")
    not_cmd_named = (4, 13, [(b"n", b"")], b"named")
    plain = (5, 14, [], b"")
    payload = make_batch([fence, trim, not_cmd_two, not_cmd_named, plain], tail=(6, 14))
    kept = check(payload, include_command_records=True)[0]
    assert kept.batch.column("seq_num").to_pylist() == [1, 2, 3, 4, 5]
    dropped = check(payload, include_command_records=False)[0]
    assert dropped.batch.column("seq_num").to_pylist() == [3, 4, 5]
    assert (dropped.count, dropped.first_seq_num, dropped.last_seq_num) == (5, 1, 5)
    assert dropped.metered_bytes == kept.metered_bytes
    only_cmds = check(make_batch([fence, trim]), include_command_records=False)[0]
    assert only_cmds.batch.num_rows == 0 and only_cmds.count == 2
    assert (only_cmds.first_seq_num, only_cmds.last_seq_num) == (1, 2)
    for inc in (True, False):
        check(payload, include_command_records=inc, include_headers=False)


def test_empty_bodies_many_headers_large_records() -> None:
    many = [(bytes([i % 256]) * (i % 7), b"v" * (i % 5)) for i in range(300)]
    check(make_batch([(0, 0, many, b""), (1, 1, [], b""), (2, 2, many[:3], b"")]))
    big = b"\xab" * (1024 * 1024)
    got = check(make_batch([(9, 5, [(b"h", b"v")], big)]))[0]
    assert got.batch.column("body")[0].as_py() == big
    assert got.metered_bytes == 8 + 2 + 2 + len(big)


def test_thousand_record_batch() -> None:
    recs = [
        (1000 + i, 1_700_000_000_000 + i, [(b"i", str(i).encode())], b"x" * 100)
        for i in range(1000)
    ]
    got = check(make_batch(recs, tail=(2000, 1_700_000_000_999)), stream="long-stream-name")[0]
    assert got.batch.num_rows == 1000 and got.count == 1000
    assert (got.first_seq_num, got.last_seq_num) == (1000, 1999)
    check(make_batch(recs), include_headers=False)


def test_unicode_stream_name() -> None:
    check(make_batch([(0, 0, [], b"a"), (1, 0, [], b"b")]), stream="strömé-😀")


def test_protobuf_semantics_unknown_fields_order_and_merge() -> None:
    def varint(v: int) -> bytes:
        out = bytearray()
        while v >= 0x80:
            out.append((v & 0x7F) | 0x80)
            v >>= 7
        out.append(v)
        return bytes(out)

    def ld(field: int, data: bytes) -> bytes:
        return varint(field << 3 | 2) + varint(len(data)) + data

    header = ld(2, b"val") + ld(1, b"first") + ld(1, b"nm")  # last name wins
    record = (
        ld(4, b"old body")
        + varint(2 << 3)
        + varint(99)  # timestamp before seq_num
        + varint(1 << 3)
        + varint(5)
        + ld(3, header)
        + varint(15 << 3 | 5)
        + b"\x00\x00\x00\x00"  # unknown fixed32
        + varint(16 << 3 | 1)
        + b"\x00" * 8  # unknown fixed64
        + varint(17 << 3 | 3)
        + varint(1 << 3)
        + varint(1)
        + varint(17 << 3 | 4)  # group
        + ld(18, b"unknown")
        + varint(1 << 3)
        + varint(6)  # later seq_num wins
        + ld(4, b"new body")
    )
    tail_a = varint(1 << 3) + varint(40)
    tail_b = varint(2 << 3) + varint(50)
    payload = ld(2, tail_a) + ld(1, record) + varint(9 << 3) + varint(1) + ld(2, tail_b)
    got = check(payload)[0]
    assert got.tail == Position(40, 50)  # two tail occurrences merge
    assert got.batch.to_pylist()[0]["body"] == b"new body"
    assert got.batch.to_pylist()[0]["headers"] == [{"name": b"nm", "value": b"val"}]
    assert got.first_seq_num == 6
    # A known field number with the wrong wire type is an unknown field, not a record.
    check(varint(1 << 3) + varint(3) + ld(2, b""))


def test_joined_payloads_decode_as_one_batch_of_all_their_records() -> None:
    """A catch-up read decodes consecutive frames' payloads joined (`batch_bytes`): the
    ReadBatch they make holds every record in order and the last tail, in both decoders,
    with counts and metered bytes over all of them."""
    hs = [(b"k", b"v")]
    parts = [
        make_batch([(0, 10, [], b"a"), (1, 11, hs, b"b")]),
        make_batch([(2, 12, [(b"", b"fence")], b"")], tail=(3, 12)),  # a command record
        make_batch([(3, 13, [], b"c" * 300)], tail=(4, 13)),
    ]
    for kept in (True, False):
        alone = [check(p, include_command_records=kept)[0] for p in parts]
        joined = check(b"".join(parts), include_command_records=kept)[0]
        assert joined.batch.to_pylist() == [r for a in alone for r in a.batch.to_pylist()]
        assert joined.tail == Position(4, 13)
        assert (joined.count, joined.first_seq_num, joined.last_seq_num) == (4, 0, 3)
        assert joined.metered_bytes == sum(a.metered_bytes for a in alone)


@pytest.mark.parametrize("impl", IMPLS)
def test_values_arrow_cannot_hold_raise_frame_error(impl: str) -> None:
    with pytest.raises(FrameError, match="seq_num"):
        decode(impl, make_batch([(1 << 63, 0, [], b"")]))
    with pytest.raises(FrameError, match="timestamp"):
        decode(impl, make_batch([(0, (1 << 63) // 1000 + 1, [], b"")]))
    top = check(make_batch([((1 << 63) - 1, (1 << 63) // 1000, [], b"")]))[0]
    assert top.last_seq_num == (1 << 63) - 1


@pytest.mark.parametrize(
    "payload",
    [
        b"\x0a",  # length missing
        b"\x0a\x05abc",  # length past the end
        b"\x0a\x02\x08",  # truncated varint inside a record
        b"\x00\x01",  # field number 0
        b"\x0e",  # wire type 6
        b"\x0c",  # end-group with no group
        b"\x0b\x08\x01",  # unterminated group
        b"\x08" + b"\xff" * 10 + b"\x01",  # varint longer than 10 bytes
        b"\x0a\x03\x1a\x02\x0a",  # header truncated
        b"\x12\x02\x08",  # tail truncated
    ],
)
def test_malformed_payloads_raise_frame_error(payload: bytes) -> None:
    for impl in IMPLS:
        with pytest.raises(FrameError, match="malformed S2 ReadBatch"):
            decode(impl, payload)
    with pytest.raises(FrameError):
        decode_read_batch(payload, "s")


def test_many_payloads_decode_as_each_alone_into_slices_of_one_batch() -> None:
    """`decode_read_many` (the reads of many small streams): each result is what
    `decode_read_batch` gives its payload alone, its rows a slice of one batch."""
    cmd = (1, 5, [(b"", b"fence")], b"tok")
    payloads = [
        make_batch([(7, 1_700_000_000_123, [(b"k", b"v")], b"hello")], tail=(8, 9)),
        make_batch([], tail=(0, 0)),
        make_batch([(0, 1, [], b""), cmd, (2, 6, [(b"a", b""), (b"b", b"c")], b"xy")]),
        b"",
    ]
    streams = ["orders", "empty", "mixed", "none"]
    for kw in ({}, {"include_headers": False}, {"include_command_records": False}):
        got = decode_read_many(payloads, streams, **kw)
        alone = [decode_read_batch(p, s, **kw) for p, s in zip(payloads, streams, strict=True)]
        assert [(g.batch.to_pylist(), g.batch.schema, g.tail, g.count, g.first_seq_num,
                 g.last_seq_num, g.metered_bytes) for g in got] == [
            (a.batch.to_pylist(), a.batch.schema, a.tail, a.count, a.first_seq_num,
             a.last_seq_num, a.metered_bytes) for a in alone]
    whole = decode_read_many(payloads, streams)
    assert [g.batch.column("seq_num").buffers()[1].address for g in whole] == (
        [whole[0].batch.column("seq_num").buffers()[1].address] * 4)  # one buffer, sliced
    with pytest.raises(FrameError, match="malformed S2 ReadBatch message: "):
        decode_read_many([payloads[0], b"\x12\x02\x08"], ["a", "b"])


def test_many_payloads_fail_as_decoding_them_one_by_one_fails() -> None:
    """`decode_read_many` meets the first error payload by payload (a payload's numbers
    checked before the next is read), and takes any stream name (UTF-8 per row)."""
    good = make_batch([(3, 4, [], b"x")])
    too_far = make_batch([(1 << 63, 1, [], b"")])
    with pytest.raises(FrameError, match="seq_num 9223372036854775808 is out of range"):
        decode_read_many([good, too_far, b"\x12\x02\x08"], ["a", "b", "c"])
    with pytest.raises(FrameError, match="malformed S2 ReadBatch message: "):
        decode_read_many([good, b"\x12\x02\x08", too_far], ["a", "b", "c"])
    with pytest.raises(UnicodeEncodeError):
        decode_read_many([good, b"\x12\x02\x08"], ["a", "\ud800"])
    with pytest.raises(ValueError):
        decode_read_many([good, good], ["a"])
    got = decode_read_many([good, make_batch([]), good], ["é/ü", "", "流"])
    assert [g.batch.column("stream").to_pylist() for g in got] == [["é/ü"], [], ["流"]]


def _groups(field: int, depth: int) -> bytes:
    """`depth` nested groups of an unknown field (start tags, then end tags)."""
    return bytes([field << 3 | 3]) * depth + bytes([field << 3 | 4]) * depth


def _inside(field: int, message: bytes) -> bytes:
    return bytes([field << 3 | 2]) + _varint(len(message)) + message


def _varint(value: int) -> bytes:
    out = b""
    while value >= 0x80:
        out, value = out + bytes([value & 0x7F | 0x80]), value >> 7
    return out + bytes([value])


@pytest.mark.parametrize(
    ("payload", "valid"),
    [
        # Found by mutating valid batches: a tag in 6 bytes (a trailing 0x00 byte). Protobuf
        # reads tags of at most 5 bytes; the C decoder took it.
        (bytes.fromhex(
            "0a2508cc978781b71c10c79d97cbed3f1a070a02f43e1201761a070a023c501201762203909ff30a"
            "2308b6c79cc6c007108cf198a7fa3c22132b02a86f81c24ed0b10d11b80ad63e9bd2df96b5d885978"
            "80051770a1408d6a3eed1951910e0de81a5be6b22040e51005e"), False),
        (bytes.fromhex("b5d8859708") + b"abcd", True),  # the same tag in 5 bytes: a fixed32
        (bytes.fromhex("b5d885978800") + b"abcd", False),
        # Protobuf allows 100 levels of nesting, messages and groups together.
        (_groups(5, 100), True),
        (_groups(5, 101), False),
        (_inside(1, _groups(5, 99)), True),  # a record is one level
        (_inside(1, _groups(5, 100)), False),
        (_inside(2, _groups(5, 99)), True),  # so is the tail
        (_inside(2, _groups(5, 100)), False),
        (_inside(1, _inside(3, _groups(5, 98))), True),  # a header two
        (_inside(1, _inside(3, _groups(5, 99))), False),
    ],
    ids=["fuzzed-6-byte-tag", "5-byte-tag", "6-byte-tag", "groups-100", "groups-101",
         "record-99", "record-100", "tail-99", "tail-100", "header-98", "header-99"],
)
def test_decoders_read_exactly_what_protobuf_reads(payload: bytes, valid: bool) -> None:
    """The C decoder takes the strict reading where it differed from protobuf's."""
    assert_same_outcome(payload)
    for impl in IMPLS:
        assert (outcome(impl, payload) is not None) == valid, impl


def test_fallback_selected_without_extension(monkeypatch: pytest.MonkeyPatch) -> None:
    payload = make_batch([(1, 2, [(b"a", b"b")], b"c")], tail=(2, 2))
    native = decode_read_batch(payload, "s")
    monkeypatch.setattr(R, "_fastwire", None)
    fallback = decode_read_batch(payload, "s")
    assert fallback.batch.equals(native.batch) and fallback.tail == native.tail


headers_st = st.lists(st.tuples(st.binary(max_size=8), st.binary(max_size=8)), max_size=6)
record_st = st.tuples(
    st.integers(0, (1 << 63) - 1),
    st.integers(0, (1 << 63) // 1000),
    st.one_of(headers_st, st.just([(b"", b"fence")]), st.just([(b"", b"trim")])),
    st.binary(max_size=300),
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    records=st.lists(record_st, max_size=40),
    tail=st.none() | st.tuples(st.integers(0, (1 << 64) - 1), st.integers(0, (1 << 64) - 1)),
    include_command_records=st.booleans(),
    include_headers=st.booleans(),
    stream=st.text(min_size=1, max_size=20),
)
def test_random_batches_match_protobuf(
    records: list[tuple[int, int, list[tuple[bytes, bytes]], bytes]],
    tail: tuple[int, int] | None,
    include_command_records: bool,
    include_headers: bool,
    stream: str,
) -> None:
    check(
        make_batch(records, tail),
        stream,
        include_command_records=include_command_records,
        include_headers=include_headers,
    )


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    batches=st.lists(st.tuples(
        st.lists(record_st, max_size=6),
        st.none() | st.tuples(st.integers(0, (1 << 64) - 1), st.integers(0, (1 << 64) - 1)),
        st.text(max_size=12)), max_size=8),
    include_command_records=st.booleans(),
    include_headers=st.booleans(),
)
def test_random_many_match_protobuf_one_by_one(
    batches: list[tuple[list[tuple[int, int, list[tuple[bytes, bytes]], bytes]],
                        tuple[int, int] | None, str]],
    include_command_records: bool,
    include_headers: bool,
) -> None:
    """`decode_read_many` (in C, `_fastwire.decode_read_many`) gives what protobuf's
    parser gives each payload alone, as its stream's."""
    payloads = [make_batch(records, tail) for records, tail, _ in batches]
    streams = [stream for _, _, stream in batches]
    kw = {"include_command_records": include_command_records,
          "include_headers": include_headers}
    got = decode_read_many(payloads, streams, **kw)
    for d in got:
        d.batch.validate(full=True)
    assert [_batch_view(d) for d in got] == [
        _batch_view(R._decode_python([p], s, include_command_records, include_headers))
        for p, s in zip(payloads, streams, strict=True)]


def outcome(impl: str, payload: bytes) -> DecodedBatch | None:
    try:
        return decode(impl, payload)
    except FrameError:
        return None


def assert_same_outcome(payload: bytes) -> None:
    """Every implementation fails with FrameError exactly when protobuf fails, else agrees."""
    try:
        msg: Any = s2_pb2.ReadBatch.FromString(payload)
    except Exception:
        msg = None
    representable = msg is not None and all(
        r.seq_num < 1 << 63 and r.timestamp <= (1 << 63) // 1000 for r in msg.records
    )
    for impl in IMPLS:
        got = outcome(impl, payload)  # anything but FrameError propagates and fails
        assert (got is not None) == representable, (impl, payload)
    if representable:
        check(payload)


@settings(max_examples=500, deadline=None)
@given(st.binary(max_size=200))
def test_fuzz_random_bytes(payload: bytes) -> None:
    assert_same_outcome(payload)


@settings(max_examples=500, deadline=None)
@given(
    records=st.lists(record_st, min_size=1, max_size=5),
    cut=st.integers(0, 10_000),
    flips=st.lists(st.tuples(st.integers(0, 10_000), st.integers(0, 255)), max_size=4),
)
def test_fuzz_mutated_batches(
    records: list[tuple[int, int, list[tuple[bytes, bytes]], bytes]],
    cut: int,
    flips: list[tuple[int, int]],
) -> None:
    data = bytearray(make_batch(records, (1, 2)))
    assume(data)
    for pos, val in flips:
        data[pos % len(data)] = val
    assert_same_outcome(bytes(data[: cut % (len(data) + 1)]))
