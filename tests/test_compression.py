"""Compressed answers, as s2-lite sends them, on every read path of the connector.

s2-lite compresses answers of 1 KiB or more by the request's Accept-Encoding (zstd or
gzip), except SSE and S2S bodies, and decompresses request bodies (tower-http's layers,
`lite/src/handlers/v1/mod.rs`); the local server does the same (`HttpCompression`). Here
each read path meets such answers, asked for on loopback through `S2Config.compression`
or option `compression`: unary reads (protobuf, JSON), `read_many`, check_tail and the list
calls, the tail watch over HTTP/1.1 and HTTP/2, a batch read of 300 streams and a
streaming query of several streams a micro-batch through Spark. Against s2-lite (the
suite's S2) the tests meet s2-lite's own compression, and the raw-socket cases show it
compresses; the local server counts the answers it compressed, so there (the tail watch's
test, marked `local_server`, and every test with `S2_TEST_SERVER=local`) each test also
proves that compression took place. A broken compressed body is a clear typed error, not
a protobuf or JSON parse error.
"""

from __future__ import annotations

import gzip
import http.client
import json
import logging
import threading
import uuid
import zlib
from functools import partial
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import zstandard
from _s2_target import is_local
from _waiting import wait_for as until

from s2_spark._http import BodyDecodingError, Response
from s2_spark._http._response import MAX_BODY_BYTES, MAX_DECODED_PIECE, BodyDecoder
from s2_spark.durable import DurableConfig, DurableStreamsClient
from s2_spark.errors import MalformedResponseError, OptionError, S2Error, S2UnavailableError
from s2_spark.s2 import AppendRecord, BasinClient, S2Client, S2Config, SmallRead
from s2_spark.s2._stream import records_path
from s2_spark.testing.serving.compression import preferred_coding

CODINGS = ["zstd", "gzip"]
BIG = 2048  # a record body: one record's answer is past the 1 KiB threshold


@pytest.fixture
def server(s2_server: Any) -> Any:
    """The test's S2: s2-lite, or the local server (which counts what it compressed)."""
    return s2_server


def new_basin(url: str, compression: str) -> tuple[S2Client, BasinClient]:
    client = S2Client(S2Config(endpoint=url, compression=compression))  # type: ignore[arg-type]
    name = f"cz-{uuid.uuid4().hex[:12]}"
    client.create_basin(name)
    return client, client.basin(name)


def body(stream: str, i: int, size: int = BIG) -> bytes:
    return f"{stream}/{i}/".encode().ljust(size, b"x")


def compressed(server: Any, coding: str) -> int | None:
    """Answers the server compressed in `coding` so far; None where it counts nothing."""
    return server.compressed_counts().get(coding, 0) if is_local(server) else None


def grew(server: Any, coding: str, before: int | None, by: int) -> bool:
    """Whether at least `by` more answers went compressed since `before` (where counted)."""
    now = compressed(server, coding)
    return now is None or before is None or now >= before + by


def raw_get(url: str, path: str, headers: dict[str, str]) -> tuple[int, dict[str, str], bytes]:
    """A GET over `http.client`, which leaves the body as it came (httpx would decode it)."""
    parts = urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname or "127.0.0.1", parts.port, timeout=10)
    try:
        conn.request("GET", path, headers=headers)
        resp = conn.getresponse()
        merged: dict[str, str] = {}
        for k, v in resp.getheaders():  # repeated fields as one, as HTTP allows
            merged[k.lower()] = f"{merged[k.lower()]}, {v}" if k.lower() in merged else v
        return resp.status, merged, resp.read()
    finally:
        conn.close()


def vary(headers: dict[str, str]) -> list[str]:
    """The fields a `Vary` header names (s2-lite's CORS layer names its own beside
    accept-encoding)."""
    return [name.strip() for name in headers.get("vary", "").split(",")]


def undo(coding: str, data: bytes) -> bytes:
    if coding == "gzip":
        return gzip.decompress(data)
    with zstandard.ZstdDecompressor().stream_reader(data) as reader:
        return reader.read()


# -- the server compresses as s2-lite does -------------------------------------------------


@pytest.mark.parametrize("coding", CODINGS)
def test_answers_of_1_kib_or_more_are_compressed_by_accept_encoding(
    server: Any, coding: str
) -> None:
    client, basin = new_basin(server.url, "none")
    with client:
        basin.create_stream("s")
        basin.stream("s").append([AppendRecord(body("s", i)) for i in range(3)])
        path = "/v1" + records_path("s") + "?seq_num=0&count=3"
        plain = raw_get(server.url, path, {"s2-basin": basin.name})
        status, headers, data = raw_get(server.url, path, {"s2-basin": basin.name,
                                                           "accept-encoding": coding})
    assert plain[0] == status == 200 and "content-encoding" not in plain[1]
    assert headers["content-encoding"] == coding
    assert "accept-encoding" in vary(headers)
    assert "content-length" not in headers and headers["transfer-encoding"] == "chunked"
    assert len(data) < len(plain[2]) // 4
    assert undo(coding, data) == plain[2]
    if coding == "zstd":  # streamed, as s2-lite's encoder writes it: no size up front
        assert zstandard.frame_content_size(data) == -1


def test_small_answers_and_sessions_are_never_compressed(server: Any) -> None:
    client, basin = new_basin(server.url, "none")
    with client:
        basin.create_stream("s")
        basin.stream("s").append([AppendRecord(body("s", i)) for i in range(3)])
        hdrs = {"s2-basin": basin.name, "accept-encoding": "zstd, gzip"}
        small = raw_get(server.url, "/v1" + records_path("s") + "/tail", hdrs)
        sse = raw_get(server.url, "/v1" + records_path("s") + "?seq_num=0&count=3",
                      {**hdrs, "accept": "text/event-stream"})
        s2s = raw_get(server.url, "/v1" + records_path("s") + "?seq_num=0&count=3",
                      {**hdrs, "content-type": "s2s/proto", "accept": "s2s/proto"})
    assert small[0] == 200 and "content-encoding" not in small[1]
    assert int(small[1]["content-length"]) < 1024
    assert sse[0] == 200 and "content-encoding" not in sse[1] and b"event: batch" in sse[2]
    # S2S frames carry their own compression (the flag byte's CC bits), never HTTP's.
    assert s2s[0] == 200 and "content-encoding" not in s2s[1]
    assert s2s[2][3] & 0x60 == 0x20


def test_the_coding_is_chosen_as_tower_http_chooses_it(server: Any) -> None:
    cases = {
        "": "identity", "identity": "identity", "gzip": "gzip", "zstd, gzip": "zstd",
        "gzip, zstd": "zstd", "identity, gzip": "gzip", "gzip;q=0.5, zstd;q=0.4": "gzip",
        "br, deflate": "identity", "zstd;q=0": "identity", "*": "zstd",
        "*, zstd;q=0": "gzip", "gzip;q=2": "identity", "identity;q=0": None, "*;q=0": None,
    }
    assert {k: preferred_coding([k] if k else []) for k in cases} == cases
    client, basin = new_basin(server.url, "none")
    with client:
        basin.create_stream("s")
        basin.stream("s").append([AppendRecord(body("s", 0))])
        # Nothing acceptable: the answer as it was, its status 406 (tower-http's rule).
        status, headers, data = raw_get(
            server.url, "/v1" + records_path("s") + "?seq_num=0&count=1",
            {"s2-basin": basin.name, "accept-encoding": "identity;q=0"})
    assert status == 406 and "accept-encoding" in vary(headers)
    assert "content-encoding" not in headers and body("s", 0).decode() in data.decode()


@pytest.mark.parametrize("coding", CODINGS)
def test_request_bodies_are_decompressed_and_other_codings_refused(
    server: Any, coding: str
) -> None:
    client, basin = new_basin(server.url, "none")
    parts = urlsplit(server.url)
    payload = json.dumps({"records": [{"body": "compressed-request"}]}).encode()
    packed = (gzip.compress(payload) if coding == "gzip"
              else zstandard.ZstdCompressor().compress(payload))
    path = "/v1" + records_path("s")

    def post(data: bytes, encoding: str) -> tuple[int, dict[str, str], bytes]:
        conn = http.client.HTTPConnection(parts.hostname or "127.0.0.1", parts.port,
                                          timeout=10)
        try:
            conn.request("POST", path, body=data, headers={
                "s2-basin": basin.name, "content-type": "application/json",
                "content-encoding": encoding})
            resp = conn.getresponse()
            return resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read()
        finally:
            conn.close()

    with client:
        basin.create_stream("s")
        assert post(packed, coding)[0] == 200
        refused = post(payload, "br")
        corrupt = post(packed[: len(packed) // 2] + b"\x00" * 8, coding)
        got = basin.stream("s").read(seq_num=0)
    assert got.batch.column("body").to_pylist() == [b"compressed-request"]
    assert refused[0] == 415 and refused[1]["accept-encoding"] == "zstd,gzip"
    assert refused[2] == b""
    # A JSON body that cannot be read: s2-lite's JSON extractor, 400 `bad_json`.
    assert corrupt[0] == 400 and json.loads(corrupt[2])["code"] == "bad_json"


# -- every read path of the client, against compressed answers ------------------------------


@pytest.mark.parametrize("coding", CODINGS)
def test_unary_reads_protobuf_and_json_give_the_records(
    server: Any, coding: str
) -> None:
    client, basin = new_basin(server.url, coding)
    with client:
        basin.create_stream("s")
        bodies = [body("s", i) for i in range(5)]
        basin.stream("s").append([AppendRecord(b) for b in bodies])  # a compressed body
        before = compressed(server, coding)
        batch = basin.stream("s").read(seq_num=0, count=5)
        assert batch.batch.column("body").to_pylist() == bodies
        answer = basin._transport.request(
            "GET", records_path("s"), basin=basin.name, target="stream 's'",
            params={"seq_num": 1, "count": 4})
        assert [r["body"].encode() for r in answer.json()["records"]] == bodies[1:]
        assert basin.stream("s").check_tail().seq_num == 5
        assert grew(server, coding, before, 2)


@pytest.mark.parametrize("coding", CODINGS)
def test_read_many_and_check_tails_give_what_single_calls_give(
    server: Any, coding: str
) -> None:
    client, basin = new_basin(server.url, coding)
    names = [f"m{k:02d}" for k in range(20)]
    with client:
        basin.create_streams(names)
        for k, name in enumerate(names):
            basin.stream(name).append([AppendRecord(body(name, i)) for i in range(k % 3 + 1)])
        before = compressed(server, coding)
        got = basin.read_many([SmallRead(n, 0, 3) for n in names], include_headers=False)
        tails = basin.check_tails([*names, "missing"])
        assert grew(server, coding, before, len(names))
    for k, (name, batch) in enumerate(zip(names, got, strict=True)):
        assert not isinstance(batch, Exception), batch
        assert batch.batch.column("body").to_pylist() == [body(name, i)
                                                          for i in range(k % 3 + 1)]
    assert {n: p.seq_num for n, p in tails.items() if p is not None} == {
        n: k % 3 + 1 for k, n in enumerate(names)}
    assert tails["missing"] is None


@pytest.mark.parametrize("coding", CODINGS)
def test_list_calls_page_through_compressed_listings(
    server: Any, coding: str
) -> None:
    client, basin = new_basin(server.url, coding)
    prefix = f"lst-{uuid.uuid4().hex[:8]}-"
    names = [f"{prefix}{'n' * 30}-{k:03d}" for k in range(60)]
    basins = [f"{prefix}{k:02d}-{'b' * 24}" for k in range(20)]
    with client:
        basin.create_streams(names)
        for name in basins:
            client.create_basin(name)
        before = compressed(server, coding)
        assert [s.name for s in basin.list_streams(prefix=prefix)] == names
        assert [b.name for b in client.list_basins(prefix=prefix)] == basins
        assert grew(server, coding, before, 2)


@pytest.mark.local_server  # its request counts tell when both polls wait at the server
@pytest.mark.parametrize("coding", CODINGS)
@pytest.mark.parametrize("own", [8, 0], ids=["http1", "http2"])
def test_the_tail_watch_learns_tails_from_compressed_answers(
    server: Any, coding: str, own: int
) -> None:
    """A poll answered with a record learns the tail from the answer (`news_tails`), which
    a poll whose answer did not decode never does (it fails, and is retried)."""
    client, basin = new_basin(server.url, coding)

    def polls() -> int:
        return server.request_counts().get("read_wait", 0)

    with client:
        basin.create_streams(["a", "b"])
        waiting = polls()
        with basin.watch_tails(wait=10, own_connections=own) as watch:
            positions = {"a": 0, "b": 0}
            watch.watch(positions)
            # Over HTTP/1.1, a connection each (and, perhaps, the one that asked whether
            # the server speaks HTTP/2); over HTTP/2 one connection for both. Both polls
            # waiting at the server: a record that comes while a read waits comes with the
            # tail (one that was there when the read came, without).
            def settled() -> bool:
                used = watch.connections()
                on_own = used["http/1.1"] == 2 if own else used == {"h2": 1, "http/1.1": 0}
                return on_own and watch.quiet(positions) == {"a", "b"} and polls() >= waiting + 2

            until(settled, "both polls waiting, over HTTP/1.1" if own else "over HTTP/2")
            before = compressed(server, coding)
            basin.stream("b").append([AppendRecord(body("b", 0)), AppendRecord(body("b", 1))])
            until(lambda: watch.news_tails({"a", "b"}) == {"b": 2}, "b's tail is told")
            assert watch.quiet(positions) == {"a"}
            assert grew(server, coding, before, 1)


# -- a body that does not decode: a clear error -------------------------------------------


class BrokenEncodings:
    """A server answering every GET 200 with a body that does not decode by the
    Content-Encoding it names: `corrupt` (not that coding at all) or `cut` (a right one,
    cut short). It counts the requests it answered."""

    def __init__(self, coding: str, fault: str, content_type: str) -> None:
        valid = json.dumps({"tail": {"seq_num": 1, "timestamp": 1}}).encode() * 40
        packed = (gzip.compress(valid) if coding == "gzip"
                  else zstandard.ZstdCompressor().compress(valid))
        self.body = packed[:4] + b"\xff" * 64 if fault == "corrupt" else packed[:-12]
        self.headers = {"content-type": content_type, "content-encoding": coding}
        self.requests = 0
        broken = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_GET(self) -> None:
                broken.requests += 1
                self.send_response(200)
                for name, value in broken.headers.items():
                    self.send_header(name, value)
                self.send_header("content-length", str(len(broken.body)))
                self.end_headers()
                self.wfile.write(broken.body)

            def log_message(self, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, args=(0.05,),
                                        daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def __enter__(self) -> BrokenEncodings:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()


def _is_the_clear_error(err: BaseException, coding: str) -> bool:
    """S2's own error, not retryable, naming the coding, what is wrong and what to do."""
    text = str(err)
    return (isinstance(err, S2Error) and not isinstance(err, S2UnavailableError)
            and err.code == "response_compression" and "could not be decoded" in text
            and (f"corrupt {coding}" in text or "cut short" in text)
            and "compression=none" in text)


@pytest.mark.parametrize("coding", CODINGS)
@pytest.mark.parametrize("fault", ["corrupt", "cut"])
def test_a_broken_compressed_answer_is_a_clear_error_never_retried(
    coding: str, fault: str
) -> None:
    with BrokenEncodings(coding, fault, "application/protobuf") as broken, \
            S2Client(S2Config(endpoint=broken.url, compression=coding)) as client:  # type: ignore[arg-type]
        stream = client.basin("broken-basin").stream("s")
        with pytest.raises(S2Error) as info:
            stream.read(seq_num=0, count=1)
        assert _is_the_clear_error(info.value, coding), info.value
        assert isinstance(info.value.__cause__, BodyDecodingError)
        assert broken.requests == 1  # not retried
        # The fan-out's answer does not decode: read again alone, it fails the same way.
        [got] = client.basin("broken-basin").read_many([SmallRead("s", 0, 1)])
        assert isinstance(got, S2Error) and _is_the_clear_error(got, coding), got
        assert broken.requests == 3
        with pytest.raises(S2Error) as info:
            stream.check_tail()
        assert _is_the_clear_error(info.value, coding), info.value


def test_a_tail_watch_whose_answers_do_not_decode_says_so(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Its streams are not quiet after each such answer (the caller looks them up; a
    stream is quiet again only while a retry, after a growing pause, is out), and the
    first such answer is a warning naming what was wrong: not a failure nobody sees."""
    with BrokenEncodings("zstd", "corrupt", "application/protobuf") as broken, \
            S2Client(S2Config(endpoint=broken.url, compression="zstd")) as client, \
            caplog.at_level(logging.WARNING, logger="s2_spark.watch"), \
            client.basin("broken-basin").watch_tails(wait=1) as watch:
        watch.watch({"s": 0, "t": 0})
        until(lambda: broken.requests >= 4, "polls answered, and sent again")
        until(lambda: watch.quiet({"s": 0, "t": 0}) == set(), "both streams not quiet")
    said = [r.getMessage() for r in caplog.records if "cannot read" in r.getMessage()]
    assert len(said) == 1, said
    assert "BodyDecodingError" in said[0] and "corrupt zstd data" in said[0]


def test_the_seam_decodes_every_way_an_answer_may_be_compressed() -> None:
    data = b"s2 " * 1000
    zstd_streamed = zstandard.ZstdCompressor(write_content_size=False).compress(data)
    twice = gzip.compress(data[:1000]) + gzip.compress(data[1000:])  # two gzip members
    layered = zstandard.ZstdCompressor().compress(gzip.compress(data))
    for coding, packed in [("zstd", zstd_streamed), ("gzip", twice), ("x-gzip", twice),
                           ("deflate", zlib.compress(data)), ("gzip, zstd", layered),
                           ("identity", data)]:
        whole = Response(200, [(b"Content-Encoding", coding.encode())], content=packed)
        assert whole.content == data, coding
        pieces = iter([packed[i:i + 100] for i in range(0, len(packed), 100)])
        streamed = Response(200, [(b"content-encoding", coding.encode())], chunks=pieces)
        assert streamed.read() == data, coding
    with pytest.raises(BodyDecodingError, match="'br', which this client does not take"):
        Response(200, [(b"content-encoding", b"br")], content=b"x")
    cut = Response(200, [(b"content-encoding", b"gzip")], chunks=iter([twice[:-5]]))
    with pytest.raises(BodyDecodingError, match="cut short"):
        cut.read()
    # A poll that needs only the head of a body decodes as far as it goes.
    head = Response(200, [(b"content-encoding", b"gzip")], content=twice[:40], prefix=True)
    assert data.startswith(head.content)


@pytest.mark.parametrize("coding", ["zstd", "gzip", "deflate", "gzip, zstd"])
def test_an_answer_that_decodes_past_the_limit_fails_before_it_is_held(coding: str) -> None:
    """Decompression bombs: 256 MiB of zeros in a few hundred KB (zstd: 8 KB) fail at
    `MAX_BODY_BYTES` decoded, held whole or streamed a piece at a time (then at
    `MAX_DECODED_PIECE` a piece), before the decoder makes much more than the limit."""
    zeros = b"\0" * (256 << 20)
    packed = {"zstd": zstandard.ZstdCompressor(write_content_size=False).compress(zeros),
              "gzip": gzip.compress(zeros, compresslevel=1),
              "deflate": zlib.compress(zeros, 1)}.get(coding) or \
        zstandard.ZstdCompressor().compress(gzip.compress(zeros, compresslevel=1))
    del zeros
    headers = [(b"content-encoding", coding.encode())]
    with pytest.raises(BodyDecodingError, match=f"decodes to more than {MAX_BODY_BYTES} bytes"):
        Response(200, headers, content=packed)
    decoder = BodyDecoder(coding)
    with pytest.raises(BodyDecodingError,
                       match=f"decodes to more than {MAX_DECODED_PIECE} bytes"):
        decoder.decode(packed)
    # Just under the limit, whole: decoded as before.
    fits = b"\0" * MAX_BODY_BYTES
    packed = zstandard.ZstdCompressor().compress(fits) if "zstd" in coding else gzip.compress(fits)
    coding = "zstd" if "zstd" in coding else "gzip"
    assert Response(200, [(b"content-encoding", coding.encode())], content=packed).content == fits


def test_durable_streams_answers_that_do_not_decode_are_malformed_responses() -> None:
    with BrokenEncodings("gzip", "corrupt", "application/octet-stream") as broken, \
            DurableStreamsClient(DurableConfig(base_url=broken.url, compression=True)) as ds, \
            pytest.raises(MalformedResponseError) as info:
        ds.stream("/s").get()
    assert info.value.code == "response_compression" and "corrupt gzip" in str(info.value)
    assert broken.requests == 1


# -- through Spark ---------------------------------------------------------------------------


def test_option_compression_takes_the_four_values(server: Any) -> None:
    from s2_spark.backends.s2.options import parse_s2_connection
    from s2_spark.spark.s2.source import S2DataSource

    for value in ("auto", "none", "zstd", "GZIP"):
        settings = parse_s2_connection({"basin": "b", "compression": value}, purpose="read")
        assert settings.config().compression == value.lower()
    with pytest.raises(OptionError):
        parse_s2_connection({"basin": "b", "compression": ""}, purpose="write")
    # Checked where Spark checks a source's options, before any task runs.
    with pytest.raises(OptionError) as info:
        S2DataSource({"endpoint": server.url, "basin": "b", "stream": "s",
                      "compression": "lz4"}).schema()
    assert str(info.value) == ("option compression='lz4' is not accepted: use auto, none, "
                               "zstd, gzip (auto: none on loopback, zstd otherwise)")


@pytest.mark.spark
@pytest.mark.parametrize("coding", CODINGS)
def test_a_batch_read_of_300_streams_through_spark(
    server: Any, spark: Any, coding: str
) -> None:
    client, basin = new_basin(server.url, coding)
    names = [f"b{k:03d}" for k in range(300)]
    with client:
        basin.create_streams(names)
        for name in names:
            basin.stream(name).append([AppendRecord(body(name, i, 600)) for i in range(3)])
    before = compressed(server, coding)
    df = spark.read.format("s2").options(endpoint=server.url, basin=basin.name,
                                         streamPrefix="b", compression=coding).load()
    got = sorted((r.stream, r.seq_num, bytes(r.body)) for r in df.collect())
    assert got == [(n, i, body(n, i, 600)) for n in names for i in range(3)]
    assert grew(server, coding, before, len(names))
    # Written back to 300 streams of another basin, routed by the stream column: the
    # appends of 1 KiB or more go compressed too.
    copy = f"cz-copy-{uuid.uuid4().hex[:8]}"
    with S2Client(S2Config(endpoint=server.url)) as plain:
        plain.create_basin(copy)
        sent = server.decompressed_counts().get(coding, 0) if is_local(server) else None
        df.select("stream", "body").write.format("s2").mode("append").options(
            endpoint=server.url, basin=copy, createStreams="true", compression=coding).save()
        if sent is not None:
            assert server.decompressed_counts().get(coding, 0) >= sent + len(names)
        copied = plain.basin(copy).read_many([SmallRead(n, 0, 3) for n in names],
                                             include_headers=False)
    for name, batch in zip(names, copied, strict=True):
        assert not isinstance(batch, Exception), batch
        assert batch.batch.column("body").to_pylist() == [body(name, i, 600) for i in range(3)]


@pytest.mark.spark
def test_a_streaming_query_with_several_streams_a_micro_batch(
    server: Any, spark: Any, tmp_path: Path
) -> None:
    """2 KiB appends to 5 streams: while the query runs, asking for zstd (the tail watch
    tells it); then while it is stopped, and it restarts asking for gzip, so that its next
    micro-batch holds all five."""
    client, basin = new_basin(server.url, "gzip")
    names = [f"s{k}" for k in range(5)]
    batches: dict[int, list[tuple[str, int, bytes]]] = {}

    def sink(df: Any, batch_id: int) -> None:
        batches[batch_id] = [(r.stream, r.seq_num, bytes(r.body)) for r in df.collect()]

    def start(coding: str) -> Any:
        return (spark.readStream.format("s2")
                .options(endpoint=server.url, basin=basin.name, streamPrefix="s",
                         compression=coding).load()
                .writeStream.foreachBatch(sink)
                .option("checkpointLocation", str(tmp_path / "ckpt")).start())

    def append_round(i: int) -> None:
        for name in names:
            basin.stream(name).append([AppendRecord(body(name, i))])

    def rows() -> list[tuple[str, int, bytes]]:
        return sorted(row for batch in batches.values() for row in batch)

    def read_up_to(query: Any, n: int) -> bool:
        query.processAllAvailable()
        return rows() == sorted((name, i, body(name, i)) for name in names for i in range(n))

    with client:
        basin.create_streams(names)
        before = {c: compressed(server, c) for c in CODINGS}
        query = start("zstd")
        try:
            query.processAllAvailable()
            append_round(0)
            until(partial(read_up_to, query, 1), "the records appended while it ran", 60)
        finally:
            query.stop()
        assert query.exception() is None
        append_round(1)
        seen = set(batches)
        query = start("gzip")
        try:
            until(partial(read_up_to, query, 2), "the records appended while it was stopped",
                  60)
        finally:
            query.stop()
        assert query.exception() is None
    after_restart = [batches[b] for b in sorted(set(batches) - seen) if batches[b]]
    assert {s for s, _, _ in after_restart[0]} == set(names)  # five streams, one batch
    # The watch's answers and the reads of the first run, the reads after the restart.
    assert grew(server, "zstd", before["zstd"], 6)
    assert grew(server, "gzip", before["gzip"], 5)
