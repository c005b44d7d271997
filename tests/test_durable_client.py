"""The Durable Streams client against the real reference server (npm @durable-streams/server)."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest

from s2_spark.durable import (
    DurableConfig,
    DurableStream,
    DurableStreamsClient,
    IdempotentProducer,
    RetryPolicy,
)
from s2_spark.errors import (
    MalformedResponseError,
    SequenceGapError,
    StaleEpochError,
    StreamBadRequestError,
    StreamClosedError,
    StreamConflictError,
    StreamNotFoundError,
)


@pytest.fixture
def client(ds_server: Any) -> Iterator[DurableStreamsClient]:
    with DurableStreamsClient(base_url=ds_server.url) as c:
        yield c


@pytest.fixture
def new_stream(
    client: DurableStreamsClient, unique: Callable[[str], str]
) -> Callable[..., DurableStream]:
    def make(content_type: str = "application/json", **kw: Any) -> DurableStream:
        s = client.stream("/" + unique("ds"))
        assert s.create(content_type, **kw).created
        return s

    return make


def read_all(s: DurableStream, offset: str = "-1") -> tuple[list[Any], str]:
    messages: list[Any] = []
    last = offset
    for chunk in s.read(offset):
        messages += chunk.messages()
        last = chunk.next_offset
    return messages, last


def test_json_append_flattens_one_level_and_reads_back(new_stream: Any) -> None:
    s = new_stream()
    first = s.append_json([{"a": 1}, [1, 2]])
    s.append('{"b":"x"}')
    assert read_all(s)[0] == [{"a": 1}, [1, 2], {"b": "x"}]
    chunks = list(s.read("-1"))
    assert len(chunks) == 1 and chunks[0].up_to_date and not chunks[0].closed
    batch = chunks[0].batch()
    assert batch.schema.names == ["value"]
    assert batch.column(0).to_pylist() == ['{"a":1}', "[1,2]", '{"b":"x"}']
    # Reading from the first append's offset gives exactly what followed it.
    assert read_all(s, first.next_offset)[0] == [{"b": "x"}]


def test_create_is_idempotent_and_conflicts_on_other_config(
    client: DurableStreamsClient, unique: Callable[[str], str]
) -> None:
    s = client.stream("/" + unique("ds"))
    assert s.create("application/json").created
    assert not s.create("application/json").created
    with pytest.raises(StreamConflictError):
        s.create("text/plain")


def test_byte_stream_reads_exact_bytes_and_arrow_shape(new_stream: Any) -> None:
    s = new_stream("application/octet-stream")
    s.append(b"\x00\x01")
    s.append(b"\xff")
    chunk = s.get("-1")
    assert chunk.data == b"\x00\x01\xff"
    assert chunk.batch().column(0).to_pylist() == [b"\x00\x01\xff"]


def test_initial_body_ttl_and_head(new_stream: Any) -> None:
    s = new_stream("text/plain", ttl=3600, body=b"hello")
    info = s.head()
    assert info.content_type is not None and info.content_type.startswith("text/plain")
    assert info.ttl == 3600 and not info.closed
    assert s.get("-1").data == b"hello"
    with pytest.raises(ValueError, match="ttl or expires_at"):
        s.create("text/plain", ttl=1, expires_at="2030-01-01T00:00:00Z")


def test_close_with_final_body_then_append_is_typed_error(new_stream: Any) -> None:
    s = new_stream()
    s.append_json([1])
    s.close(b"[2]")
    assert s.head().closed
    with pytest.raises(StreamClosedError) as info:
        s.append_json([3])
    assert info.value.final_offset == s.head().next_offset
    messages, _ = read_all(s)
    assert messages == [1, 2]
    assert list(s.read("-1"))[-1].closed


def test_close_without_body_is_eof_for_long_poll(new_stream: Any) -> None:
    s = new_stream()
    s.append_json(["x"])
    s.close()
    chunks = list(s.read("-1", live="long-poll"))
    assert chunks[-1].closed
    assert [m for c in chunks for m in c.messages()] == ["x"]


def test_delete_then_not_found(new_stream: Any) -> None:
    s = new_stream()
    s.delete()
    with pytest.raises(StreamNotFoundError):
        s.head()
    with pytest.raises(StreamNotFoundError):
        s.get("-1")


def test_offset_now_and_etag_304(new_stream: Any) -> None:
    s = new_stream()
    s.append_json([1, 2])
    now = s.get("now")
    assert now.data in (b"", b"[]") and now.up_to_date
    assert now.next_offset == s.head().next_offset
    full = s.get("-1")
    assert full.etag
    again = s.get("-1", if_none_match=full.etag)
    assert again.not_modified and again.data == b""


def test_long_poll_tail_receives_later_appends_with_cursor(new_stream: Any) -> None:
    s = new_stream()
    s.append_json(["before"])
    received: list[Any] = []
    reader = s.read("-1", live="long-poll")
    # Joined before the test ends: the client it appends with is closed after the test.
    appender = threading.Thread(target=lambda: s.append_json(["after"]))
    for chunk in reader:
        received += chunk.messages()
        if received == ["before"] and chunk.up_to_date:
            appender.start()
        if len(received) == 2:
            break
    reader.close()
    appender.join(timeout=30)
    assert not appender.is_alive()
    assert received == ["before", "after"]
    assert reader.cursor is not None


def test_sse_json_and_text(new_stream: Any) -> None:
    s = new_stream()
    s.append_json([{"k": "v"}, {"k": "w"}])
    s.close()
    chunks = list(s.read("-1", live="sse"))
    assert [m for c in chunks for m in c.messages()] == [{"k": "v"}, {"k": "w"}]
    assert chunks[-1].closed and chunks[-1].next_offset == s.head().next_offset
    t = new_stream("text/plain")
    t.append("line one\nline two")
    t.close()
    assert b"".join(c.data for c in t.read("-1", live="sse")) == b"line one\nline two"


def test_sse_binary_arrives_base64_and_decodes(new_stream: Any) -> None:
    s = new_stream("application/octet-stream")
    payload = bytes(range(256)) * 3
    s.append(payload)
    s.close()
    assert b"".join(c.data for c in s.read("-1", live="sse")) == payload


def test_stream_seq_regression_conflicts(new_stream: Any) -> None:
    s = new_stream()
    s.append_json([1], seq="002")
    with pytest.raises(StreamConflictError):
        s.append_json([2], seq="001")


def test_empty_json_append_rejected_before_sending(new_stream: Any) -> None:
    s = new_stream()
    with pytest.raises(StreamBadRequestError, match="at least one message"):
        s.append_json([])


def test_producer_batches_duplicates_and_fencing(new_stream: Any) -> None:
    s = new_stream()
    p = IdempotentProducer(s, "writer-1", max_batch_messages=2)
    for i in range(5):
        p.append({"i": i})
    p.flush()
    assert p.seq == 3
    # Re-sending seq 2 (an unknown outcome retried) is a duplicate: success, not data.
    p.seq = 2
    assert p.send(b'[{"i":4}]').duplicate
    assert [m["i"] for m in read_all(s)[0]] == [0, 1, 2, 3, 4]
    # A gap names expected and received seqs.
    p.seq = 7
    with pytest.raises(SequenceGapError) as gap:
        p.send(b"[9]")
    assert (gap.value.expected_seq, gap.value.received_seq) == (3, 7)
    # A new epoch must start at seq 0.
    p.epoch, p.seq = 1, 5
    with pytest.raises(StreamBadRequestError):
        p.send(b"[9]")
    newer = IdempotentProducer(s, "writer-1", epoch=1)
    newer.append("fresh")
    newer.flush()
    zombie = IdempotentProducer(s, "writer-1", epoch=0)
    zombie.append("stale")
    with pytest.raises(StaleEpochError) as stale:
        zombie.flush()
    assert stale.value.current_epoch == 1
    claimer = IdempotentProducer(s, "writer-1", auto_claim=True)
    claimer.append("claimed")
    claimer.flush()
    assert claimer.epoch == 2
    assert read_all(s)[0][-2:] == ["fresh", "claimed"]


def test_producer_close_stream_with_final_message(new_stream: Any) -> None:
    s = new_stream()
    p = IdempotentProducer(s, "closer")
    p.append(1)
    p.close_stream(final=2)
    assert s.head().closed
    assert read_all(s)[0] == [1, 2]
    assert json.loads(s.get("-1").data) == [1, 2]


def test_pipelined_producer_delivers_every_batch_once_in_order(new_stream: Any) -> None:
    s = new_stream()
    with IdempotentProducer(s, "pipe", max_batch_messages=7, max_in_flight=4) as p:
        for i in range(500):
            p.append(i)
    assert p.seq == 72  # ceil(500 / 7) batches, one seq each
    assert read_all(s)[0] == list(range(500))
    # The same batches again from a fresh producer at the same epoch: all duplicates.
    with IdempotentProducer(s, "pipe", max_batch_messages=7, max_in_flight=4) as again:
        for i in range(500):
            again.append(i)
    assert again.last_result is not None and again.last_result.duplicate
    assert read_all(s)[0] == list(range(500))


def test_pipelined_producer_opens_a_new_epoch_with_seq_0_alone(new_stream: Any) -> None:
    """The server rejects seq > 0 of an epoch it has not seen (400), so seq 0 of a new epoch
    is acknowledged before later batches are pipelined behind it."""
    s = new_stream()
    with IdempotentProducer(s, "epochs", max_batch_messages=1, max_in_flight=4) as first:
        for i in range(20):
            first.append(i)
    p = IdempotentProducer(s, "epochs", epoch=1, max_batch_messages=1, max_in_flight=4)
    p.append(100)
    p.append(101)  # sends [100] as seq 0 of epoch 1, and waits for its answer
    assert p.acknowledged == 1 and p.last_result is not None and not p.last_result.duplicate
    p.append_encoded(b"[102,103]")  # a caller-encoded batch: the next seq, pipelined
    for i in range(104, 160):
        p.append(i)
    p.close()
    assert (p.seq, p.acknowledged, p.duplicates) == (59, 59, 0)
    assert read_all(s)[0] == list(range(20)) + list(range(100, 160))
    # The same epoch again (a retried writer): every batch is a duplicate, nothing is added.
    with IdempotentProducer(s, "epochs", epoch=1, max_batch_messages=1, max_in_flight=4) as again:
        again.append(100)
        again.append(101)
        again.append_encoded(b"[102,103]")
        for i in range(104, 160):
            again.append(i)
    assert (again.acknowledged, again.duplicates) == (59, 59)
    assert read_all(s)[0] == list(range(20)) + list(range(100, 160))


class _CutOnce(httpx.HTTPTransport):
    """The real network transport, except that the first `cuts` read answers lose their
    connection after `after` bytes of body (what a dropped connection looks like)."""

    def __init__(self, after: int, cuts: int = 1) -> None:
        super().__init__()
        self.after, self.cuts = after, cuts

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        resp = super().handle_request(request)
        if request.method != "GET" or self.cuts == 0:
            return resp
        self.cuts -= 1
        inner, after = resp.stream, self.after

        class Cut(httpx.SyncByteStream):
            def __iter__(self) -> Iterator[bytes]:
                sent = 0
                for part in inner:  # type: ignore[union-attr]
                    if sent + len(part) >= after:
                        yield part[: after - sent]
                        raise httpx.ReadError("connection reset by peer")
                    sent += len(part)
                    yield part

            def close(self) -> None:
                inner.close()  # type: ignore[union-attr]

        return httpx.Response(resp.status_code, headers=resp.headers, stream=Cut(),
                              extensions=resp.extensions)


def pieces_of(s: DurableStream, offset: str = "-1", **kw: Any) -> tuple[list[Any], list[Any]]:
    """(every piece's units as Python values, the last pieces' next offsets)."""
    units: list[Any] = []
    ends: list[Any] = []
    with s.read_pieces(offset, **kw) as reader:
        for piece in reader:
            units += piece.messages.to_pylist() if piece.json_mode else list(piece.data)
            if piece.last:
                ends.append((piece.next_offset, piece.up_to_date, piece.closed))
    return units, ends


def test_read_pieces_hold_bounded_parts_of_one_answer(new_stream: Any) -> None:
    s = new_stream()
    messages = [{"i": i, "pad": "x" * (i % 50)} for i in range(3000)]
    s.append_json(messages[:1000])
    middle = s.append_json(messages[1000:2000])
    end = s.append_json(messages[2000:])
    with s.read_pieces("-1", piece_bytes=4096) as reader:
        pieces = list(reader)
    assert len(pieces) > 20 and all(p.offset == "-1" for p in pieces)  # one answer
    assert max(len(p.messages) for p in pieces) < 200  # never the whole answer at once
    got = [json.loads(m) for p in pieces for m in p.messages.to_pylist()]
    assert got == messages
    assert [p.last for p in pieces] == [False] * (len(pieces) - 1) + [True]
    assert pieces[-1].next_offset == end.next_offset and pieces[-1].up_to_date
    assert [json.loads(m) for m in pieces_of(s, middle.next_offset, piece_bytes=100)[0]] \
        == messages[2000:]


@pytest.mark.parametrize("after", [1, 5000, 40000])
def test_read_pieces_resume_a_cut_answer_without_repeating(
    ds_server: Any, unique: Callable[[str], str], after: int
) -> None:
    messages = [{"i": i, "s": "y" * (i % 30)} for i in range(2000)]
    path = "/" + unique("ds")
    with DurableStreamsClient(base_url=ds_server.url) as plain:
        plain.stream(path).create("application/json")
        end = plain.stream(path).append_json(messages)
    with DurableStreamsClient(base_url=ds_server.url,
                              http_transport=_CutOnce(after, cuts=2)) as c:
        got, ends = pieces_of(c.stream(path), piece_bytes=1024)
    assert [json.loads(m) for m in got] == messages
    assert ends == [(end.next_offset, True, False)]


def test_read_pieces_of_a_byte_stream_resume_a_cut_answer(
    ds_server: Any, unique: Callable[[str], str]
) -> None:
    data = bytes(range(256)) * 40
    path = "/" + unique("ds")
    with DurableStreamsClient(base_url=ds_server.url) as plain:
        plain.stream(path).create("application/octet-stream")
        plain.stream(path).append(data)
        end = plain.stream(path).close()
    with DurableStreamsClient(base_url=ds_server.url, http_transport=_CutOnce(3000)) as c:
        got, ends = pieces_of(c.stream(path), piece_bytes=700)
    assert bytes(got) == data
    assert ends == [(end.next_offset, True, True)]


class _Counting(httpx.HTTPTransport):
    """The real network transport, counting the requests sent through it."""

    def __init__(self) -> None:
        super().__init__()
        self.requests = 0

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        self.requests += 1
        return super().handle_request(request)


LIMIT = 1 << 20  # max_read_bytes in the tests of answers longer than it


def _limited(ds_server: Any, transport: httpx.BaseTransport) -> DurableStreamsClient:
    config = DurableConfig(base_url=ds_server.url, max_read_bytes=LIMIT,
                           retry=RetryPolicy(timeout=10.0))
    return DurableStreamsClient(config, http_transport=transport)


@pytest.mark.parametrize("content_type", ["application/json", "application/octet-stream"])
def test_read_takes_an_answer_longer_than_max_read_bytes_as_it_arrives(
    new_stream: Any, ds_server: Any, content_type: str
) -> None:
    """The server answers the whole 3 MiB backlog at once; with `max_read_bytes` at 1 MiB
    `read()` yields it in chunks of at most about a MiB, all but the last `partial` (at
    the answer's start), every message once, in one request."""
    s = new_stream(content_type)
    if content_type == "application/json":
        messages = [{"i": i, "pad": "z" * 90} for i in range(30_000)]
        ends = [s.append_json(messages[k:k + 10_000]) for k in range(0, 30_000, 10_000)]
    else:
        data = bytes(range(256)) * (3 * 4096)
        ends = [s.append(data[k:k + LIMIT]) for k in range(0, len(data), LIMIT)]
    counting = _Counting()
    with _limited(ds_server, counting) as c:
        chunks = list(c.stream(s.url).read("-1"))
    assert counting.requests == 1
    assert len(chunks) >= 3 and max(len(ch.data) for ch in chunks) <= 2 * LIMIT
    assert [ch.partial for ch in chunks] == [True] * (len(chunks) - 1) + [False]
    assert all(ch.next_offset == "-1" and not ch.up_to_date for ch in chunks[:-1])
    assert chunks[-1].next_offset == ends[-1].next_offset and chunks[-1].up_to_date
    if content_type == "application/json":
        assert [m for ch in chunks for m in ch.messages()] == messages
    else:
        assert b"".join(ch.data for ch in chunks) == data


def test_read_resumes_a_cut_answer_after_what_it_yielded(
    ds_server: Any, unique: Callable[[str], str]
) -> None:
    """A connection lost in the middle of an answer: the answer is read again from its
    start and the messages already yielded are dropped from it."""
    messages = [{"i": i, "s": "y" * (i % 30)} for i in range(2000)]
    path = "/" + unique("ds")
    with DurableStreamsClient(base_url=ds_server.url) as plain:
        plain.stream(path).create("application/json")
        end = plain.stream(path).append_json(messages)
    config = DurableConfig(base_url=ds_server.url, max_read_bytes=1024)
    with DurableStreamsClient(config, http_transport=_CutOnce(5000, cuts=2)) as c:
        reader = c.stream(path).read("-1")
        got = [m for chunk in reader for m in chunk.messages()]
    assert got == messages
    assert (reader.offset, reader.up_to_date, reader.reconnects) == (end.next_offset, True, 2)


def test_get_of_an_answer_over_max_read_bytes_fails_at_once_naming_it(
    new_stream: Any, ds_server: Any
) -> None:
    """`get()` holds an answer whole: over the limit it fails on the first answer, not
    retried, and names the setting and `read()`."""
    s = new_stream()
    s.append_json([{"pad": "z" * 1000} for _ in range(2000)])
    counting = _Counting()
    with _limited(ds_server, counting) as c, pytest.raises(MalformedResponseError) as info:
        c.stream(s.url).get("-1")
    assert counting.requests == 1
    assert info.value.code == "response_too_large"
    assert str(info.value) == (
        f"the answer for stream {'/' + s.url.rsplit('/', 1)[1]!r} is over {LIMIT} bytes, the most "
        "held of one answer (DurableConfig.max_read_bytes): raise it to hold more, or read "
        "with read(), which takes answers of any length as they arrive; not retried")


def test_a_message_over_max_read_bytes_fails_a_read_at_once(
    new_stream: Any, ds_server: Any
) -> None:
    s = new_stream()
    s.append_json([{"small": 1}, {"large": "z" * (LIMIT + 10)}, {"small": 2}])
    counting = _Counting()
    with _limited(ds_server, counting) as c, pytest.raises(MalformedResponseError) as info:
        list(c.stream(s.url).read("-1"))
    assert counting.requests == 1
    assert str(info.value) == f"the server sent a message over {LIMIT} bytes " \
        "(DurableConfig.max_read_bytes)"
