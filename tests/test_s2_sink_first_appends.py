"""A writer's first appends to many streams, built in bulk (`backends.s2._first_appends`):
byte for byte what the per-stream path (`StreamSink`) leaves in each stream, whatever
happens to them (refusals, missing streams, flushes while rows come, long streams, cut
connections); and the C builder and ack reader against their Python references.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from fuzz_targets import TARGETS, _ack_reference, _bulk_c, h1_answer
from hypothesis import given, settings
from hypothesis import strategies as st
from test_s2_sink import all_records, wid
from test_s2_sink_many_streams import Plan, assert_written_once, feed, new_streams, plan_rows

from s2_spark._proto import s2_pb2
from s2_spark.backends.s2._first_appends import (
    first_bodies,
    first_bodies_python,
    token_suffix,
)
from s2_spark.backends.s2.sink import PartitionWriter, SinkSettings
from s2_spark.s2 import S2Client, S2Config
from s2_spark.s2._append_session import ack_objects, ack_of, acks_of
from s2_spark.testing import TcpProxy
from s2_spark.wire._accelerator import fastwire
from s2_spark.wire.appends import encode_entries
from s2_spark.wire.records import HEADER_TYPE

pytestmark = pytest.mark.backend


class CountingBasin:
    """A basin that counts the streams of its bulk first appends (`append_bodies`)."""

    def __init__(self, basin: Any) -> None:
        self._basin = basin
        self.bulk: list[str] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self._basin, name)

    def append_bodies(self, streams: list[str], *args: Any, **kw: Any) -> Any:
        self.bulk += streams
        return self._basin.append_bodies(streams, *args, **kw)


def _setup(basin: Any) -> dict[str, list[str]]:
    """The same streams in every basin: written by the run (its token), missing, fenced
    by another query, created but never written, and a long one and a flushing one."""
    kinds = {"w": [f"w{k:02d}" for k in range(30)], "n": [f"n{k:02d}" for k in range(8)],
             "o": [f"o{k:02d}" for k in range(4)], "e": [f"e{k:02d}" for k in range(4)],
             "big": ["big"], "flush": ["flush"]}
    for name in kinds["w"] + kinds["big"] + kinds["flush"]:
        basin.create_stream(name)
        basin.stream(name).fence(wid().run_token())
    for name in kinds["o"]:
        basin.create_stream(name)
        basin.stream(name).fence("rsxyz" + "k" * 8)
    for name in kinds["e"]:
        basin.create_stream(name)
    return kinds


def _columns(rows: list[tuple[bytes, list[tuple[bytes, bytes]], int | None, str]]
             ) -> tuple[pa.Array, pa.Array, pa.Array, pa.Array]:
    return (pa.array([b for b, _, _, _ in rows], pa.binary()),
            pa.array([[{"name": n, "value": v} for n, v in h] for _, h, _, _ in rows],
                     HEADER_TYPE),
            pa.array([t for _, _, t, _ in rows], pa.int64()),
            pa.array([s for _, _, _, s in rows], pa.string()))


def _rows(kinds: dict[str, list[str]], batch: int
          ) -> list[tuple[bytes, list[tuple[bytes, bytes]], int | None, str]]:
    """Rows of one micro-batch: a few for each small stream, spread over the batches;
    250 for `big` (more than one append), 400 for `flush` (a flush while rows come)."""
    small = [s for k in ("w", "n", "o", "e") for s in kinds[k]]
    targets = [small[(i * 7) % len(small)] for i in range(3 * len(small))]
    targets += ["big"] * 250 + ["flush"] * 400
    order = np.random.default_rng(batch).permutation(len(targets)).tolist()
    base = 4_000_000_000_000 + 10_000 * batch  # after any arrival time: kept as given
    return [(f"b{batch}-{i}".encode() * (1 + i % 3), [(b"i", str(i).encode())] if i % 2 else [],
             base + i if i % 5 else None, targets[i]) for i in order]


def _write(basin: Any, rows: list[Any], batch: int, partition: int, *, bulk: bool) -> Any:
    w = PartitionWriter(basin, wid(batch=batch, partition=partition),
                        SinkSettings(create_streams=True, max_records=100, flush_records=300))
    if not bulk:
        w._fresh = None  # every stream through its own StreamSink, as before
    for start in range(0, len(rows), 97):
        w.add(*_columns(rows[start:start + 97]))
    return w.close()


def _records(basin: Any, name: str) -> list[tuple[Any, ...]]:
    """Every record, marks and tokens included; timestamps but those the server stamped
    (the setup's fences, records written without one)."""
    out = []
    for r in all_records(basin, name):
        ms = round(r["timestamp"].timestamp() * 1000)
        out.append((r["seq_num"], ms if ms >= 4_000_000_000_000 else None, r["headers"],
                    r["body"]))
    return out


def test_bulk_first_appends_write_what_the_stream_sinks_write(
        s2_server: Any, unique: Callable[[str], str]) -> None:
    """Two micro-batches (partitions 0 then 1) written through the bulk first appends in
    one basin and through per-stream sinks in another: every stream holds the same
    records, byte for byte (data, marks, tokens, positions), and the writers report the
    same; most streams went in bulk, the odd ones (refused, missing, long, flushing)
    through their sinks."""
    with S2Client(S2Config(endpoint=s2_server.url)) as client:
        basins = {}
        for bulk in (True, False):
            name = unique("bulk" if bulk else "sinks")
            client.create_basin(name)
            basins[bulk] = client.basin(name)
        kinds = {bulk: _setup(b) for bulk, b in basins.items()}
        counting = CountingBasin(basins[True])
        for batch, partition in ((3, 0), (4, 1)):
            rows = _rows(kinds[True], batch)
            got = _write(counting, rows, batch, partition, bulk=True)
            want = _write(basins[False], rows, batch, partition, bulk=False)
            assert got == want
        for name in sorted(s for names in kinds[True].values() for s in names):
            assert _records(basins[True], name) == _records(basins[False], name), name
        assert set(counting.bulk) >= set(kinds[True]["w"])  # both micro-batches
        assert not {"big", "flush"} & set(counting.bulk)


def test_cut_connections_during_bulk_first_appends(
        s2_server: Any, basin: Any, unique: Callable[[str], str]) -> None:
    """Connections cut every 4-32 KiB while 300 small streams get their first appends in
    bulk: an append whose outcome is unknown goes to the stream's sink, which bumps and
    reads the marks; each row lands once, in order."""
    names = new_streams(basin, unique, 300, written=True)
    plan: Plan = plan_rows(900, lambda i: names[(i * 7) % 300], pad=2000)
    with TcpProxy(s2_server.url, cut_after=(4 << 10, 32 << 10), seed=5) as proxy, \
            S2Client(S2Config(endpoint=proxy.url)) as client:
        w = PartitionWriter(client.basin(basin.name), wid(), SinkSettings())
        feed(w, plan, [450])
        results = w.close()
        assert proxy.cuts >= 3
    assert sum(r.appended + r.skipped for r in results) == 900
    assert_written_once(basin, plan)


def test_fresh_rows_hand_over_in_order_and_let_go_of_batches() -> None:
    """A stream whose rows reach a flush is due; its sink takes its rows of every batch,
    in order, and a batch none of whose streams is left is let go of (a long task's
    flushed rows are not held to its end)."""
    from s2_spark.backends.s2._first_appends import FreshRows

    fresh, rules = FreshRows(), SinkSettings(flush_records=5)
    one = encode_entries(pa.array([b"x0", b"x1", b"y0", b"y1"]))
    two = encode_entries(pa.array([b"x2", b"x3", b"x4"]))
    assert fresh.add(one, fresh.number(["x", "y"]), np.array([0, 2]), np.array([2, 2]),
                     rules) == []
    assert fresh.add(two, fresh.number(["x"]), np.array([0]), np.array([3]), rules) == ["x"]
    (chunks,) = fresh.take(["x"])
    assert [bytes(c.payload) for c in chunks] == [bytes(one.slice(0, 2).payload),
                                                 bytes(two.payload)]
    assert fresh._batches[0] is one and len(fresh._batches[1]) == 0  # y still in one
    first = fresh.first_appends(wid(), SinkSettings(), ("http://s2", "b"), backwards=False)
    assert (first.names, first.counts, first.others) == (["y"], [2], [])
    assert first.bodies[0].startswith(bytes(one.slice(2, 4).payload))


# -- the builder and the ack reader, C against Python --------------------------------------

needs_c = pytest.mark.skipif(fastwire is None, reason="the C accelerator is not built")


@st.composite
def _bodies_args(draw: st.DrawFn) -> list[Any]:
    """`first_bodies` arguments: records of several input batches, each stream's rows in
    one or more of them, marks of any length that fits, one or two tokens."""
    batches = draw(st.lists(st.lists(st.binary(max_size=40), min_size=1, max_size=12),
                            min_size=1, max_size=3))
    encoded = [encode_entries(pa.array(rows, pa.binary())) for rows in batches]
    n = draw(st.integers(0, 8))
    seg_payload, seg_lo, seg_hi, firsts, counts = [], [], [], [0], []
    for _ in range(n):
        rows = 0
        for _ in range(draw(st.integers(0, 3))):
            b = draw(st.integers(0, len(encoded) - 1))
            ends = encoded[b].ends
            first = draw(st.integers(0, len(ends) - 1))
            stop = draw(st.integers(first + 1, len(ends)))
            seg_payload.append(b)
            seg_lo.append(int(ends[first - 1]) if first else 0)
            seg_hi.append(int(ends[stop - 1]))
            rows += stop - first
        firsts.append(len(seg_payload))
        counts.append(rows + draw(st.sampled_from([0, 0, 997, 36**4])))
    head = draw(st.text("abcdefghijklmnopqrstuvwxyz0123456789.", max_size=34))
    tokens = draw(st.lists(st.tuples(st.text("rsn.0123456789abc", max_size=36),
                                     st.text("rsn.0123456789abc", max_size=36)),
                           min_size=1, max_size=2))
    suffixes = [token_suffix(sets, cond)[0] for sets, cond in tokens]
    suffix_of = [draw(st.integers(0, len(suffixes) - 1)) for _ in range(n)]
    return [[e.payload for e in encoded], *(np.asarray(a, np.int64) for a in (
        seg_payload, seg_lo, seg_hi, firsts, counts)), head, suffixes,
        np.asarray(suffix_of, np.int64)]


@needs_c
@settings(max_examples=300, deadline=None)
@given(_bodies_args())
def test_c_bodies_are_the_python_ones(args: list[Any]) -> None:
    """`_fastwire.sink_bodies` against the sink's own mark, digest and fence records."""
    from s2_spark.errors import S2SparkError

    try:
        want = first_bodies_python(*args)
    except S2SparkError:  # a mark over 36 bytes: the C one refuses it too
        with pytest.raises(ValueError, match="mark exceeds"):
            first_bodies(*args)
        return
    assert first_bodies(*args) == want


def _position(draw: st.DrawFn) -> dict[str, int]:
    return {k: draw(st.integers(0, 2**64 - 1)) for k in ("seq_num", "timestamp")
            if draw(st.booleans())}


@st.composite
def _answers(draw: st.DrawFn) -> bytes:
    """AppendAck answers: any positions, fields repeated (merged), unknown fields, or
    damaged (cut short, a byte changed)."""
    ack = s2_pb2.AppendAck(**{k: s2_pb2.StreamPosition(**_position(draw))
                              for k in ("start", "end", "tail") if draw(st.booleans())})
    raw = ack.SerializeToString()
    if draw(st.booleans()):
        raw += s2_pb2.AppendAck(start=s2_pb2.StreamPosition(**_position(draw))).SerializeToString()
    if draw(st.booleans()):
        raw += draw(st.sampled_from([b"\x20\x01", b"\x2a\x00", b"\x0d\x01\x02\x03\x04"]))
    if raw and draw(st.integers(0, 3)) == 0:
        at = draw(st.integers(0, len(raw) - 1))
        raw = raw[:at] + bytes([draw(st.integers(0, 255))]) + raw[at + 1:]
    if raw and draw(st.integers(0, 3)) == 0:
        raw = raw[:draw(st.integers(0, len(raw) - 1))]
    return raw


@settings(max_examples=300, deadline=None)
@given(st.lists(_answers(), max_size=6))
def test_acks_read_in_bulk_are_ack_of_s(answers: list[bytes]) -> None:
    """`acks_of` (one C call for all answers) gives each answer's start and end as
    `ack_of` reads it, and `ack_objects` its whole ack, or both raise as `ack_of` raises
    on the first answer it cannot read."""
    from google.protobuf.message import DecodeError

    try:
        acks = [ack_of(a) for a in answers]
    except DecodeError:
        with pytest.raises(DecodeError):
            acks_of(answers)
        with pytest.raises(DecodeError):
            ack_objects(answers)
        return
    assert acks_of(answers) == ([a.start.seq_num for a in acks], [a.end.seq_num for a in acks])
    assert ack_objects(answers) == acks


_PLAIN = b"HTTP/1.1 200 OK\r\ncontent-type: application/protobuf\r\n"  # a plain answer's head
_HEADS = {  # the answers of another kind a connection may carry between plain acks
    "404": b"HTTP/1.1 404 Not Found\r\ncontent-type: application/json\r\n",
    "412": b"HTTP/1.1 412 Precondition Failed\r\ncontent-type: application/json\r\n",
    "close": b"HTTP/1.1 200 OK\r\nconnection: close\r\n",
    "1.0": b"HTTP/1.0 200 OK\r\n",
}


@st.composite
def _connection(draw: st.DrawFn) -> tuple[bytes, int]:
    """Append answers on one connection: plain 200s of `_answers` bodies (damaged ones
    too), answers of other kinds (an error status, chunked, closing, HTTP/1.0) between
    them, and the bytes cut anywhere; and how many plain acks lead them whole."""
    raw, ends = b"", []  # where each leading plain ack ends
    plain = True
    for _ in range(draw(st.integers(0, 6))):
        body = draw(_answers())
        kind = draw(st.sampled_from(["plain", "plain", "plain", "chunked", *_HEADS]))
        raw += h1_answer(None if kind == "chunked" else _HEADS.get(kind, _PLAIN), body)
        plain = plain and kind == "plain" and _ack_reference(body) is not None
        if plain:
            ends.append(len(raw))
    cut = draw(st.integers(0, len(raw))) if draw(st.booleans()) else len(raw)
    return raw[:cut], sum(end <= cut for end in ends)


@settings(max_examples=300, deadline=None)
@given(_connection(), st.integers(0, 255), st.integers(0, 255))
def test_acks_read_in_bulk_off_a_connection_are_the_python_readers(
        answers: tuple[bytes, int], count: int, cuts: int) -> None:
    """`_fastwire.h1_acks` against its Python reference (`fuzz_targets.bulk_python`,
    `ResponseReader` and protobuf), fed at once and in pieces: every ack C takes is a
    plain 200 AppendAck to Python too, with the same numbers; C takes every leading plain
    ack of a whole connection (up to its count); the rest is left to `ResponseReader`."""
    raw, leading = answers
    TARGETS["h1_acks"](bytes([count, cuts]) + raw)
    most = count % 8 + 1  # as the target reads its count
    assert _bulk_c("h1_acks", [raw], most, 16 << 10)[0] == min(most, leading)
