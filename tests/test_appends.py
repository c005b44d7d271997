"""Append encoding: round trips through protobuf's parser, batch splitting, size limits."""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from s2_spark._proto import s2_pb2
from s2_spark.errors import RecordTooLargeError
from s2_spark.wire import appends as A
from s2_spark.wire.appends import (
    MAX_BATCH_BYTES,
    MAX_BATCH_RECORDS,
    MAX_RECORD_BYTES,
    AppendBatch,
    encode_append_batches,
    encode_records,
    metered_size,
)

IMPLS = ["python"] + (["c"] if A._fastwire is not None else [])
HEADERS = pa.list_(pa.field("element", pa.struct([("name", pa.binary()), ("value", pa.binary())])))
STR_HEADERS = pa.list_(pa.struct([("name", pa.string()), ("value", pa.string())]))

Rec = tuple[bytes, list[tuple[bytes, bytes]], int | None]


@pytest.fixture(params=IMPLS)
def impl(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    if request.param == "python":
        monkeypatch.setattr(A, "_fastwire", None)
    return str(request.param)


def arrow_inputs(recs: list[Rec]) -> tuple[pa.Array, pa.Array, pa.Array]:
    bodies = pa.array([r[0] for r in recs], pa.binary())
    headers = pa.array([[{"name": n, "value": v} for n, v in r[1]] for r in recs], HEADERS)
    timestamps = pa.array([r[2] for r in recs], pa.int64())
    return bodies, headers, timestamps


def parsed(batches: list[AppendBatch]) -> list[Rec]:
    out: list[Rec] = []
    for b in batches:
        msg: Any = s2_pb2.AppendInput.FromString(b.to_append_input())
        assert len(msg.records) == b.count
        for r in msg.records:
            hs = [(h.name, h.value) for h in r.headers]
            out.append((r.body, hs, r.timestamp if r.HasField("timestamp") else None))
    return out


def check_batches(batches: list[AppendBatch], recs: list[Rec], max_records: int, max_bytes: int):
    assert parsed(batches) == recs
    meters = [metered_size(b, h) for b, h, _ in recs]
    index = 0
    for i, b in enumerate(batches):
        assert b.first_index == index
        assert 1 <= b.count <= max_records
        assert b.metered_bytes == sum(meters[index : index + b.count])
        assert b.metered_bytes <= max_bytes or b.count == 1
        if i + 1 < len(batches):  # greedy: the next record did not fit
            full = b.count == max_records or b.metered_bytes + meters[index + b.count] > max_bytes
            assert full
        expected = s2_pb2.AppendInput(
            records=[
                s2_pb2.AppendRecord(
                    body=body, headers=[s2_pb2.Header(name=n, value=v) for n, v in hs], timestamp=ts
                )
                for body, hs, ts in recs[index : index + b.count]
            ]
        ).SerializeToString(deterministic=True)
        assert b.records_payload == expected
        index += b.count
    assert index == len(recs)


record_st = st.tuples(
    st.binary(max_size=200),
    st.lists(st.tuples(st.binary(max_size=10), st.binary(max_size=10)), max_size=5),
    st.none() | st.integers(0, (1 << 63) - 1),
)


@settings(max_examples=200, deadline=None)
@given(
    recs=st.lists(record_st, max_size=60),
    max_records=st.integers(1, 20),
    max_bytes=st.integers(1, 2000),
    cut=st.integers(0, 5),
)
def test_round_trip_random(recs: list[Rec], max_records: int, max_bytes: int, cut: int) -> None:
    bodies, headers, timestamps = arrow_inputs(recs)
    results = []
    for name in IMPLS:
        saved = A._fastwire
        if name == "python":
            A._fastwire = None
        try:
            got = encode_append_batches(
                bodies, headers, timestamps, max_records=max_records, max_bytes=max_bytes
            )
            # Sliced inputs (non-zero Arrow offsets) encode the same rows.
            sliced = encode_append_batches(
                bodies.slice(cut),
                headers.slice(cut),
                timestamps.slice(cut),
                max_records=max_records,
                max_bytes=max_bytes,
            )
        finally:
            A._fastwire = saved
        check_batches(got, recs, max_records, max_bytes)
        check_batches(sliced, recs[cut:], max_records, max_bytes)
        results.append(got)
    assert all(r == results[0] for r in results)
    assert encode_records(recs, max_records=max_records, max_bytes=max_bytes) == results[0]


def test_string_inputs_nulls_and_timestamp_types(impl: str) -> None:
    bodies = pa.array(["hé", None, ""], pa.string())
    headers = pa.array(
        [[{"name": "k", "value": "v"}], None, [None, {"name": None, "value": "x"}]], STR_HEADERS
    )
    ts = pa.array([1_500, None, 0], pa.timestamp("us", tz="UTC"))
    got = encode_append_batches(bodies, headers, ts)
    assert parsed(got) == [
        ("hé".encode(), [(b"k", b"v")], 1),
        (b"", [], None),
        (b"", [(b"", b""), (b"", b"x")], 0),
    ]
    chunked = encode_append_batches(
        pa.chunked_array([bodies[:1], bodies[1:]]), pa.chunked_array([headers]), None
    )
    assert parsed(chunked) == [
        ("hé".encode(), [(b"k", b"v")], None),
        (b"", [], None),
        (b"", [(b"", b""), (b"", b"x")], None),
    ]
    assert encode_append_batches(pa.array([], pa.binary())) == []
    large = encode_append_batches(pa.array([b"a"], pa.large_binary()), None, pa.array([7]))
    assert parsed(large) == [(b"a", [], 7)]
    u64 = pa.array([(1 << 64) - 1, None, 1 << 63], pa.uint64())
    got = encode_append_batches(pa.array([b"a", b"b", b"c"]), None, u64)
    assert parsed(got) == [(b"a", [], (1 << 64) - 1), (b"b", [], None), (b"c", [], 1 << 63)]


def test_bad_inputs_are_named(impl: str) -> None:
    with pytest.raises(TypeError, match="bodies must be a binary or string array"):
        encode_append_batches(pa.array([1, 2]))
    with pytest.raises(TypeError, match="headers must be a list<struct<name, value>>"):
        encode_append_batches(pa.array([b"a"]), pa.array([[1]]))
    with pytest.raises(ValueError, match="headers has 2 rows but bodies has 1"):
        encode_append_batches(pa.array([b"a"]), pa.array([[], []], HEADERS))
    with pytest.raises(ValueError, match="timestamp at row 1 is negative"):
        encode_append_batches(pa.array([b"a", b"b"]), None, pa.array([0, -1]))
    with pytest.raises(TypeError, match="timestamps must be"):
        encode_append_batches(pa.array([b"a"]), None, pa.array(["x"]))
    with pytest.raises(ValueError, match=r"max_records must be 1\.\.1000"):
        encode_append_batches(pa.array([b"a"]), max_records=1001)
    with pytest.raises(ValueError, match=r"max_bytes must be 1\.\.1048576"):
        encode_append_batches(pa.array([b"a"]), max_bytes=0)


def test_split_at_exactly_1000_records(impl: str) -> None:
    bodies = pa.array([b"r%d" % i for i in range(2500)])
    got = encode_append_batches(bodies)
    assert [b.count for b in got] == [1000, 1000, 500]
    assert [b.first_index for b in got] == [0, 1000, 2000]
    assert [b.count for b in encode_append_batches(bodies.slice(0, 1000))] == [1000]
    assert [b.count for b in encode_append_batches(bodies.slice(0, 1001))] == [1000, 1]
    assert MAX_BATCH_RECORDS == 1000


def test_split_at_exactly_1_mib_metered(impl: str) -> None:
    quarter = MAX_BATCH_BYTES // 4
    body = b"q" * (quarter - 8)  # metered exactly 256 KiB
    got = encode_append_batches(pa.array([body] * 4))
    assert [(b.count, b.metered_bytes) for b in got] == [(4, MAX_BATCH_BYTES)]
    got = encode_append_batches(pa.array([body] * 3 + [body + b"!"]))
    assert [(b.count, b.metered_bytes) for b in got] == [
        (3, 3 * quarter),
        (1, quarter + 1),
    ]
    headers = pa.array([[{"name": b"n", "value": b"v"}]] * 4, HEADERS)  # +4 each
    got = encode_append_batches(pa.array([body] * 4), headers)
    assert [b.count for b in got] == [3, 1]
    for b in got:
        assert len(b.to_append_input()) > b.metered_bytes - 8 * b.count


def test_oversize_record_raises_before_any_batch(impl: str) -> None:
    limit_body = b"x" * (MAX_RECORD_BYTES - 8)
    ok = encode_append_batches(pa.array([limit_body]))
    assert ok[0].metered_bytes == MAX_RECORD_BYTES
    rows = [b"a", b"b", b"c", limit_body + b"y", limit_body + b"zz"]
    with pytest.raises(RecordTooLargeError) as info:
        encode_append_batches(pa.array(rows))
    err = info.value
    assert err.metered_bytes == MAX_RECORD_BYTES + 1 and err.limit == MAX_RECORD_BYTES
    assert "row 3" in str(err) and str(MAX_RECORD_BYTES + 1) in str(err)
    assert str(MAX_RECORD_BYTES) in str(err)
    header_heavy = pa.array([[{"name": b"h", "value": b"v" * (MAX_RECORD_BYTES - 11)}]], HEADERS)
    with pytest.raises(RecordTooLargeError, match="row 0"):
        encode_append_batches(pa.array([b"b"]), header_heavy)
    with pytest.raises(RecordTooLargeError, match="row 1"):
        encode_records([(b"", [], None), (limit_body + b"y", [], None)])


def test_to_append_input_conditions() -> None:
    (batch,) = encode_records([(b"a", [(b"k", b"v")], 3)])
    msg: Any = s2_pb2.AppendInput.FromString(batch.to_append_input(0, ""))
    assert msg.HasField("match_seq_num") and msg.match_seq_num == 0
    assert msg.HasField("fencing_token") and msg.fencing_token == ""
    msg = s2_pb2.AppendInput.FromString(batch.to_append_input((1 << 64) - 1, "tök"))
    assert msg.match_seq_num == (1 << 64) - 1 and msg.fencing_token == "tök"
    msg = s2_pb2.AppendInput.FromString(batch.to_append_input())
    assert not msg.HasField("match_seq_num") and not msg.HasField("fencing_token")
    assert batch.to_append_input() == batch.records_payload
    with pytest.raises(ValueError, match="match_seq_num must be a u64"):
        batch.to_append_input(-1)
    assert "records_payload" not in repr(batch)


def test_encode_records_accepts_record_objects() -> None:
    @dataclass
    class R:
        body: bytes
        headers: tuple[tuple[bytes, bytes], ...] = ()
        timestamp: int | None = None

    objs = [R(b"x", ((b"a", b"b"),), 5), R(b"")]
    tuples: list[Rec] = [(b"x", [(b"a", b"b")], 5), (b"", [], None)]
    assert encode_records(objs) == encode_records(tuples)
    assert parsed(encode_records(objs)) == tuples
    assert encode_records([]) == []
    with pytest.raises(ValueError, match="u64 milliseconds"):
        encode_records([(b"x", [], -5)])


def test_metered_size() -> None:
    assert metered_size(b"") == 8
    assert metered_size(b"abc", [(b"n", b"vv"), (b"", b"")]) == 8 + 4 + 3 + 3
    got = encode_append_batches(
        pa.array([b"abc"]), pa.array([[("n", "vv"), ("", "")]], STR_HEADERS)
    )
    assert got[0].metered_bytes == 18
    assert int(np.int64(got[0].metered_bytes)) == 18


def test_client_records_encode_like_the_per_record_encoder() -> None:
    """The client's Arrow route gives the same bytes, u64 timestamps above 2**63 included."""
    from s2_spark.s2 import AppendRecord
    from s2_spark.s2._encode import encode_append_records

    records = [
        AppendRecord(b"a", headers=[(b"k", b"v")], timestamp=(1 << 64) - 1),
        AppendRecord(b"b"),
        AppendRecord(b"c", timestamp=(1 << 63) + 5),
        AppendRecord(b"d", timestamp=7),
    ]
    ours = encode_append_records(records)
    assert [b.records_payload for b in ours] == [
        b.records_payload for b in encode_records(records)
    ]


def _c_encode(n: int, *buffers: Any) -> tuple[bytes, list[int], list[int]]:
    assert A._fastwire is not None
    payload, ends, meters = A._fastwire.encode_records(n, *buffers)
    return payload, np.frombuffer(ends, np.int64).tolist(), np.frombuffer(meters, np.int64).tolist()


def _i64(*values: int) -> bytes:
    return np.array(values, np.int64).tobytes()


@pytest.mark.skipif(A._fastwire is None, reason="the C encoder is not built")
@pytest.mark.parametrize(
    ("n", "buffers"),
    [
        (-1, [_i64(0), b""]),
        (2, [_i64(0, 1), b"ab"]),  # fewer offsets than records
        (1, [_i64(0, 3), b"ab"]),  # past the end of the data
        (2, [_i64(0, 2, 1), b"ab"]),  # decreasing
        (1, [_i64(-1, 1), b"ab"]),  # negative
        (1, [_i64(0, 1), None]),
        (1, [_i64(0, 1), b"a", _i64(0, 1), _i64(0, 5), b"name", _i64(0, 0), b""]),
        (1, [_i64(0, 1), b"a", _i64(0, 1), _i64(0), b"n", _i64(0, 0), b""]),
        (1, [_i64(0, 1), b"a", _i64(0, 1), _i64(0, 1), b"n", _i64(0, 1), None]),
        (2, [_i64(0, 1, 1), b"a", None, None, None, None, None, _i64(5)]),  # timestamps short
        (1, [_i64(0, 1), b"a", None, None, None, None, None, None, b"\x01"]),  # validity alone
    ],
)
def test_c_encoder_refuses_buffers_out_of_bounds(n: int, buffers: list[Any]) -> None:
    """Whatever it is passed, the C encoder reads only inside its buffers (it used to trust
    its caller's offsets): bad ones are a ValueError, found by fuzzing it under ASan."""
    with pytest.raises(ValueError, match=r"bad (body|header|timestamp) buffers"):
        _c_encode(n, *buffers, *[None] * (9 - len(buffers)))


@pytest.mark.skipif(A._fastwire is None, reason="the C encoder is not built")
def test_c_encoder_takes_unaligned_and_offset_buffers() -> None:
    def unaligned(data: bytes) -> memoryview:
        return memoryview(bytearray(b"\0" + data))[1:]

    got = _c_encode(1, unaligned(_i64(0, 1, 3)[8:]), unaligned(b"xab"),
                    unaligned(_i64(1, 2)), unaligned(_i64(9, 0, 1)), b"n",
                    unaligned(_i64(9, 0, 2)), b"vv", unaligned(_i64(7)), None)
    entry, metered = A.encode_record(b"ab", [(b"n", b"vv")], 7)
    assert got == (entry, [len(entry)], [metered])


@settings(max_examples=100, deadline=None)
@given(sizes=st.lists(st.integers(0, 3000), min_size=1, max_size=60),
       per_append=st.integers(1, 20), max_bytes=st.integers(4000, 20000))
def test_batches_as_views_hold_the_bytes_copies_hold(
        sizes: list[int], per_append: int, max_bytes: int) -> None:
    """A writer takes each append's records as a view into the rows' encoding
    (`copy=False`, copied once when its mark and token are added): the same appends,
    the same bytes, none of them copied."""
    from s2_spark.wire.appends import encode_entries

    records = encode_entries(pa.array([b"b" * n for n in sizes], pa.binary()))
    copies = records.batches(per_append, max_bytes)
    views = records.batches(per_append, max_bytes, copy=False)
    assert [(b.count, b.metered_bytes, b.first_index) for b in views] == \
        [(b.count, b.metered_bytes, b.first_index) for b in copies]
    assert [bytes(b.records_payload) for b in views] == [b.records_payload for b in copies]
    assert all(isinstance(b.records_payload, memoryview) for b in views)
    assert all(isinstance(b.records_payload, bytes) for b in copies)


@settings(max_examples=200, deadline=None)
@given(sizes=st.lists(st.integers(0, 3000), min_size=0, max_size=80),
       cuts=st.lists(st.integers(0, 80), max_size=8),
       per_append=st.integers(1, 20), max_bytes=st.integers(4000, 20000))
def test_chunked_batches_are_the_concatenation_cut(
        sizes: list[int], cuts: list[int], per_append: int, max_bytes: int) -> None:
    """A writer cuts appends from its buffers as they are (`chunked_batches`) instead of
    concatenating them first: the same appends, records and bytes, whatever the chunks
    (empty ones too), the pieces from several chunks kept apart or joined."""
    from s2_spark.wire.appends import EncodedRecords, chunked_batches, encode_entries

    rows = [bytes([i % 251]) * n for i, n in enumerate(sizes)]
    records = encode_entries(pa.array(rows, pa.binary()))
    bounds = sorted({0, len(rows), *(min(c, len(rows)) for c in cuts)})
    chunks = [records.slice(lo, hi) for lo, hi in itertools.pairwise(bounds)]
    chunks.insert(len(chunks) // 2, records.slice(0, 0))
    whole = EncodedRecords.concat(chunks)
    expected = whole.batches(per_append, max_bytes)
    got = chunked_batches(chunks, per_append, max_bytes)
    assert [(b.count, b.metered_bytes, b.first_index) for b in got] == \
        [(b.count, b.metered_bytes, b.first_index) for b in expected]
    assert [b"".join(b.records_parts()) for b in got] == [b.records_payload for b in expected]
    assert [b.to_append_input(3, "t") for b in got] == \
        [b.to_append_input(3, "t") for b in expected]


def test_chunked_batches_keep_big_pieces_apart_and_join_small_ones() -> None:
    """Pieces of an append from several chunks are views of them (no copy), unless they
    are small; a record too large is refused first, as a whole buffer's would be."""
    from s2_spark.wire.appends import chunked_batches, encode_entries

    big = encode_entries(pa.array([b"x" * 5000] * 4, pa.binary()))
    small = encode_entries(pa.array([b"y" * 10] * 4, pa.binary()))
    (one,) = chunked_batches([big.slice(0, 2), big.slice(2)], 10, MAX_BATCH_BYTES)
    assert len(one.records_parts()) == 2
    assert all(isinstance(p, memoryview) for p in one.records_parts())
    (joined,) = chunked_batches([small.slice(0, 2), small.slice(2)], 10, MAX_BATCH_BYTES)
    assert joined.records_parts() == [small.payload.tobytes()]
    huge = encode_entries(pa.array([b"z" * MAX_RECORD_BYTES], pa.binary()))
    with pytest.raises(RecordTooLargeError):
        chunked_batches([small, huge], 10, MAX_BATCH_BYTES)


@settings(max_examples=300, deadline=None)
@given(meters=st.lists(st.integers(8, 5000), max_size=120),
       max_records=st.integers(1, 30), max_bytes=st.integers(5000, 40000))
def test_cuts_are_the_greedy_ones(meters: list[int], max_records: int, max_bytes: int) -> None:
    """However it finds them (every `max_records` records where they are small, else
    step by step), the split cuts where the plain greedy rule does: as many records as
    fit both limits, at least one."""
    expected = []
    start = 0
    while start < len(meters):
        stop, size = start + 1, meters[start]
        while (stop < len(meters) and stop - start < max_records
               and size + meters[stop] <= max_bytes):
            size += meters[stop]
            stop += 1
        expected.append((start, stop, size))
        start = stop
    starts, stops, metered = A._cuts(np.asarray(meters, np.int64), max_records, max_bytes)
    assert list(zip(starts.tolist(), stops.tolist(), metered.tolist(), strict=True)) == expected
