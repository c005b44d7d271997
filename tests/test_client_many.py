"""Many streams at once: tail lookups and small reads sent together (the client's fan-out)
give exactly what the single-stream calls give, missing streams and reads past the tail
included, and still do over a network that cuts connections (the packed Spark reads over
such a network: tests/test_spark_network.py)."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from _s2_target import s2_config
from fuzz_targets import TARGETS, _bulk_c, h1_answer
from hypothesis import given, settings
from hypothesis import strategies as st

from s2_spark.errors import NotFoundError, Position, ReadPastTailError
from s2_spark.s2 import AppendRecord, RetryPolicy, S2Client, S2Config, SmallRead
from s2_spark.s2._many import _tail_of
from s2_spark.testing import TcpProxy


def _bodies(batch: Any) -> list[bytes]:
    return batch.batch.column("body").to_pylist()


def _body(k: int, i: int) -> bytes:
    """Record i of stream k: 256 bytes, so that an answer of 4 or more is past the 1 KiB
    over which the server compresses (when asked to), as s2-lite does."""
    return f"{k}/{i}/".encode().ljust(256, b".")


@pytest.fixture
def streams(s2_server: Any, unique: Callable[[str], str]) -> Iterator[tuple[str, dict[str, int]]]:
    """A basin of 40 streams, stream k holding k records; (basin, tails)."""
    basin = unique("many")
    with S2Client(s2_config(s2_server.url)) as c:
        c.create_basin(basin)
        b = c.basin(basin)
        for k in range(40):
            b.create_stream(f"s{k:02d}")
            if k:
                b.stream(f"s{k:02d}").append([AppendRecord(_body(k, i)) for i in range(k)])
    yield basin, {f"s{k:02d}": k for k in range(40)}


def test_tails_of_many_streams_at_once_and_none_for_a_missing_one(
    s2_server: Any, streams: tuple[str, dict[str, int]]
) -> None:
    basin, tails = streams
    with S2Client(s2_config(s2_server.url)) as c:
        b = c.basin(basin)
        got = b.check_tails([*tails, "nope"])
        assert {s: p.seq_num for s, p in got.items() if p is not None} == tails
        assert got == {**{s: b.stream(s).check_tail() for s in tails}, "nope": None}
        assert isinstance(got["s07"], Position)


@pytest.mark.local_server  # counts what the local server compressed
@pytest.mark.parametrize("compression", ["none", "zstd", "gzip"])
def test_many_small_reads_give_what_single_reads_give(
    s2_server: Any, streams: tuple[str, dict[str, int]], compression: Any
) -> None:
    basin, _ = streams
    reads = [SmallRead(f"s{k:02d}", 1, 5) for k in range(2, 40)]
    with S2Client(s2_config(s2_server.url, compression=compression)) as c:
        b = c.basin(basin)
        before = s2_server.compressed_counts().get(compression, 0)
        got = b.read_many([*reads, SmallRead("s01", 1, 1), SmallRead("nope", 0, 1)],
                          include_headers=False)
        if compression != "none":  # the answers of 4 records or more (streams 5 to 39)
            assert s2_server.compressed_counts()[compression] >= before + 35
        for r, batch in zip(reads, got, strict=False):
            single = b.stream(r.stream).read(seq_num=1, count=5, include_headers=False)
            assert not isinstance(batch, Exception)
            assert _bodies(batch) == _bodies(single)
            assert (batch.first_seq_num, batch.last_seq_num) == (1, min(5, int(r.stream[1:]) - 1))
        assert isinstance(got[-2], ReadPastTailError)  # s01 holds one record: 1 is its tail
        assert isinstance(got[-1], NotFoundError)


@pytest.mark.local_server
@pytest.mark.parametrize("compression", ["none", "zstd"])
def test_over_a_network_that_cuts_connections_the_answers_are_the_same(
    s2_server: Any, streams: tuple[str, dict[str, int]], compression: Any
) -> None:
    """Answers cut short: an uncompressed one keeps the records that arrived whole, a
    compressed one (which cannot be read in part) is asked for again."""
    basin, tails = streams
    with TcpProxy(s2_server.url, cut_after=(300, 2000), seed=3) as proxy, S2Client(
        S2Config(endpoint=proxy.url, retry=RetryPolicy(initial_backoff=0.01),
                 compression=compression)
    ) as c:
        b = c.basin(basin)
        got = b.check_tails(list(tails))
        reads = b.read_many([SmallRead(s, 0, n) for s, n in tails.items() if n])
        assert proxy.cuts > 0
    assert {s: p.seq_num for s, p in got.items() if p is not None} == tails
    # As from `StreamClient.read`: a read cut short keeps the records that arrived whole.
    for r, n in zip(reads, [n for n in tails.values() if n], strict=True):
        got_bodies = _bodies(r)
        assert got_bodies and got_bodies == [_body(n, i) for i in range(len(got_bodies))]
        if compression != "none" and n >= 4:  # past 1 KiB: compressed, never kept in part
            assert len(got_bodies) == n


@pytest.mark.local_server
def test_appends_to_many_streams_create_the_missing_ones_at_once(
    s2_server: Any, streams: tuple[str, dict[str, int]]
) -> None:
    """append_each with create_missing: 10 existing and 10 missing streams, one append
    each. A missing one is created (one request) and its append sent again under the
    empty token; every append lands once. Without create_missing a missing stream's
    append is a NotFoundError and nothing is created."""
    from s2_spark.errors import FencingTokenMismatchError
    from s2_spark.s2 import SingleAppend
    from s2_spark.wire.appends import encode_records

    basin, tails = streams
    names = [*list(tails)[:10], *(f"new{k:02d}" for k in range(10))]
    batch = encode_records([(b"x", [], None)])[0]
    with S2Client(s2_config(s2_server.url)) as c:
        b = c.basin(basin)
        assert all(isinstance(o, NotFoundError) for o in b.append_each(
            [SingleAppend(n, batch) for n in names[10:]]))
        before = s2_server.request_counts().get("create_stream", 0)
        outcomes = b.append_each([SingleAppend(n, batch, fencing_token="") for n in names],
                                 create_missing=True)
        assert s2_server.request_counts()["create_stream"] - before == 10
        for name, outcome in zip(names, outcomes, strict=True):
            start = tails.get(name, 0)
            assert (outcome.start.seq_num, outcome.end.seq_num) == (start, start + 1), name
        # A stream created by someone else a moment before keeps its token: refused.
        b.create_stream("taken")
        b.stream("taken").fence("theirs")
        (refused,) = b.append_each([SingleAppend("taken", batch, fencing_token="mine")],
                                   create_missing=True)
        assert isinstance(refused, FencingTokenMismatchError)
        assert refused.expected_token == "theirs"


@pytest.mark.parametrize("body", [
    b'{"tail":{"seq_num":0,"timestamp":0}}',
    b'{"tail":{"seq_num":18446744073709551615,"timestamp":1764363615123}}',
    b'{"tail":{"seq_num":123456789012345678901,"timestamp":1}}',  # past u64: as JSON reads
    b'{ "tail": {"timestamp": 5, "seq_num": 7} }',
    b'{"tail":{"seq_num":7,"timestamp":5},"extra":1}',
])
def test_a_tail_answer_reads_as_json_reads_it(body: bytes) -> None:
    tail = json.loads(body)["tail"]
    assert _tail_of(body) == Position(tail["seq_num"], tail["timestamp"])


@pytest.mark.parametrize("body", [b'{"tail":{"seq_num":07,"timestamp":5}}', b'{"tail":{}}'])
def test_a_tail_answer_json_refuses_is_refused(body: bytes) -> None:
    with pytest.raises((json.JSONDecodeError, KeyError)):
        _tail_of(body)


# -- appends in bulk (`append_bodies`: `Fanout.run_appends`) -------------------------------

def _inputs(n: int, token: str | None) -> tuple[list[bytes], list[int]]:
    """n AppendInput bodies of one record each, conditioned on `token` (if any), and the
    size of that condition (the last field)."""
    from s2_spark.wire.appends import encode_records

    batch = encode_records([(b"x", [], None)])[0]
    size = 0 if token is None else 2 + len(token.encode())
    return [batch.to_append_input(None, token)] * n, [size] * n


def _outcomes(acks: Any) -> list[Any]:
    """Each append's (start, end), or its error's type and the token it names."""
    return [(type(o).__name__, getattr(o, "expected_token", None)) if (o := acks.others.get(i))
            else (s, e) for i, (s, e) in enumerate(zip(acks.starts, acks.ends, strict=True))]


def _appends_basin(client: S2Client, name: str) -> Any:
    """30 new streams (stream k holding k % 4 records), 5 fenced by another writer; the
    5 named m.. do not exist."""
    client.create_basin(name)
    b = client.basin(name)
    b.create_streams([f"w{k:02d}" for k in range(30)] + [f"f{k}" for k in range(5)])
    for k in range(30):
        if k % 4:
            b.stream(f"w{k:02d}").append([AppendRecord(b"r")] * (k % 4))
    for k in range(5):
        b.stream(f"f{k}").fence("theirs")
    return b


@pytest.mark.parametrize("where", ["target", pytest.param("local", marks=pytest.mark.local_server)])
@pytest.mark.parametrize("create_missing", [False, True])
def test_appends_in_bulk_give_what_the_fanout_gives(
    s2_server: Any, unique: Callable[[str], str], monkeypatch: pytest.MonkeyPatch,
    where: str, create_missing: bool,
) -> None:
    """The same appends to the same streams of two basins, in bulk and through the fan-out
    (`BULK_TAILS` off): the same acks and the same errors, a few in flight at once
    (refused: fenced by another writer; missing: created on the way when asked)."""
    from s2_spark.s2 import _many

    names = [f"w{k:02d}" for k in range(30)] + [f"f{k}" for k in range(5)] + [
        f"m{k}" for k in range(5)]
    bodies, sizes = _inputs(len(names), "")
    got = {}
    with S2Client(s2_config(s2_server.url)) as c:
        for bulk in (True, False):
            b = _appends_basin(c, unique("bulk-appends"))
            monkeypatch.setattr(_many, "BULK_TAILS", bulk)
            got[bulk] = _outcomes(b.append_bodies(names, bodies, sizes, in_flight=3,
                                                  create_missing=create_missing))
    assert got[True] == got[False]
    assert got[True][:30] == [(k % 4, k % 4 + 1) for k in range(30)]
    assert got[True][30:35] == [("FencingTokenMismatchError", "theirs")] * 5
    assert got[True][35:] == ([(0, 1)] * 5 if create_missing else [("S2NotFoundError", None)] * 5)


@pytest.mark.parametrize("compression", ["zstd", "gzip"])
def test_compressed_appends_in_bulk_go_through_the_fanout(
    s2_server: Any, unique: Callable[[str], str], compression: Any
) -> None:
    """A compressing client's bodies are compressed one by one: the fan-out sends them,
    with the same outcomes."""
    names = [f"w{k:02d}" for k in range(30)] + [f"f{k}" for k in range(5)] + [
        f"m{k}" for k in range(5)]
    bodies, sizes = _inputs(len(names), "")
    with S2Client(s2_config(s2_server.url, compression=compression)) as c:
        b = _appends_basin(c, unique("bulk-appends"))
        got = _outcomes(b.append_bodies(names, bodies, sizes, in_flight=64,
                                        create_missing=True))
    assert got == [(k % 4, k % 4 + 1) for k in range(30)] + [
        ("FencingTokenMismatchError", "theirs")] * 5 + [(0, 1)] * 5


def test_appends_in_bulk_over_cut_connections_land_at_most_once(
    s2_server: Any, unique: Callable[[str], str]
) -> None:
    """Connections cut every 2-8 KiB while 400 unconditioned appends go in bulk: none is
    sent twice (each stream holds at most its one record), each acknowledged one landed
    where its ack says, and those whose answer was lost are unknown outcomes (errors),
    as the fan-out reports them."""
    from s2_spark.errors import S2UnavailableError

    names = [f"s{k:03d}" for k in range(400)]
    basin = unique("bulk-cut")
    bodies, sizes = _inputs(len(names), None)
    with S2Client(s2_config(s2_server.url)) as c:
        c.create_basin(basin)
        c.basin(basin).create_streams(names)
    with TcpProxy(s2_server.url, cut_after=(2 << 10, 8 << 10), seed=11) as proxy, S2Client(
        S2Config(endpoint=proxy.url, retry=RetryPolicy(initial_backoff=0.01))
    ) as c:
        acks = c.basin(basin).append_bodies(names, bodies, sizes, in_flight=64)
        assert proxy.cuts > 0
    assert acks.others and all(isinstance(e, S2UnavailableError) for e in acks.others.values())
    with S2Client(s2_config(s2_server.url)) as c:
        tails = c.basin(basin).check_tails(names)
    for i, name in enumerate(names):
        tail = tails[name]
        assert tail is not None and tail.seq_num <= 1, name
        if i not in acks.others:
            assert (acks.starts[i], acks.ends[i], tail.seq_num) == (0, 1, 1), name


# -- small reads in bulk (`read_many`: `Fanout.run_reads`) ----------------------------------

def _read_view(got: Any) -> Any:
    """A read's batch as plain values (rows, headers and all, tail, counts), or its
    error's type and message."""
    if isinstance(got, Exception):
        return type(got).__name__, str(got)
    return (got.batch.to_pylist(), got.batch.schema, got.tail, got.count, got.first_seq_num,
            got.last_seq_num, got.metered_bytes)


@pytest.mark.parametrize("where", ["target", pytest.param("local", marks=pytest.mark.local_server)])
@pytest.mark.parametrize("compression", ["none", "zstd"])
def test_reads_in_bulk_give_what_the_fanout_gives(
    s2_server: Any, streams: tuple[str, dict[str, int]], monkeypatch: pytest.MonkeyPatch,
    where: str, compression: Any,
) -> None:
    """The same reads in bulk and through the fan-out (`BULK_TAILS` off): the same
    batches (records, seq nums, timestamps, headers, tails) and the same errors: streams
    with records (a count limit on some), an empty one, one read at its tail, a missing
    one; compressed answers (over 1 KiB) are others of the run, decoded as before."""
    from s2_spark.s2 import _many

    basin, tails = streams
    reads = [SmallRead(s, k % 3, 3 if k % 2 else 100) for k, s in enumerate(tails)] + [
        SmallRead("s00", 0, 5), SmallRead("s01", 1, 1), SmallRead("nope", 0, 1)]
    with S2Client(s2_config(s2_server.url, compression=compression)) as c:
        b = c.basin(basin)
        b.stream("s07").append([AppendRecord(b"h", headers=[(b"k", b"v")])])
        got = {}
        for bulk in (True, False):
            monkeypatch.setattr(_many, "BULK_TAILS", bulk)
            for headers in (True, False):
                got[bulk, headers] = [_read_view(r) for r in b.read_many(
                    reads, include_headers=headers, include_command_records=True)]
    for headers in (True, False):
        assert got[True, headers] == got[False, headers]
    views = got[True, True]
    assert views[-1][0] == "S2NotFoundError" and views[-2][0] == "ReadPastTailError"
    for k, view in enumerate(views[:40]):  # k records (s07 one more) read from k % 3
        left = k + (k == 7) - k % 3
        assert view[3] == min(3 if k % 2 else 100, left) if left > 0 else (
            view[0] == "ReadPastTailError"), k


_PLAIN = b"HTTP/1.1 200 OK\r\ncontent-type: x\r\n"  # a plain answer's head
_OTHER_HEADS = {  # the answers of another kind a connection may carry between plain ones
    "404": b"HTTP/1.1 404 Not Found\r\ncontent-type: application/json\r\n",
    "coded": b"HTTP/1.1 200 OK\r\ncontent-encoding: zstd\r\n",
    "close": b"HTTP/1.1 200 OK\r\nconnection: close\r\n",
    "1.0": b"HTTP/1.0 200 OK\r\n",
}


@st.composite
def _read_connection(draw: st.DrawFn) -> tuple[bytes, list[bytes], bool]:
    """Small reads' answers on one connection: plain 200s of any body (`h1_bodies` reads
    none: a damaged ReadBatch is `decode_read_many`'s to refuse), answers of other kinds
    between them (an error status, chunked, coded, closing, HTTP/1.0), the bytes cut
    anywhere or a byte of them changed; the bodies of the plain answers leading them
    whole, and whether those are known (nothing changed)."""
    raw, leading, ends, plain = b"", [], [], True
    for _ in range(draw(st.integers(0, 6))):
        body = draw(st.binary(max_size=80))
        kind = draw(st.sampled_from(["plain", "plain", "plain", "chunked", *_OTHER_HEADS]))
        raw += h1_answer(None if kind == "chunked" else _OTHER_HEADS.get(kind, _PLAIN), body)
        plain = plain and kind == "plain"
        if plain:
            leading.append(body)
            ends.append(len(raw))
    cut = draw(st.integers(0, len(raw))) if draw(st.booleans()) else len(raw)
    raw = raw[:cut]
    known = not (raw and draw(st.integers(0, 3)) == 0)
    if not known:
        at = draw(st.integers(0, len(raw) - 1))
        raw = raw[:at] + bytes([draw(st.integers(0, 255))]) + raw[at + 1:]
    return raw, [b for b, end in zip(leading, ends, strict=True) if end <= cut], known


@settings(max_examples=300, deadline=None)
@given(_read_connection(), st.integers(0, 255), st.integers(0, 255))
def test_bodies_read_in_bulk_off_a_connection_are_the_python_readers(
        answers: tuple[bytes, list[bytes], bool], count: int, cuts: int) -> None:
    """`_fastwire.h1_bodies` against its Python reference (`fuzz_targets.bulk_python`,
    `ResponseReader`), fed at once and in pieces: every body C takes is a kept-alive,
    uncoded 200's to Python too; C takes every leading plain answer of a whole connection
    (up to its count, and its body limit); the rest is left to `ResponseReader`."""
    raw, leading, known = answers
    TARGETS["h1_bodies"](bytes([count, cuts]) + raw)
    most, max_body = count % 8 + 1, 64 if cuts & 1 else 16 << 10  # as the target reads them
    if known:
        short = next((k for k, b in enumerate(leading) if len(b) > max_body), len(leading))
        assert _bulk_c("h1_bodies", [raw], most, max_body)[3] == leading[:min(most, short)]
