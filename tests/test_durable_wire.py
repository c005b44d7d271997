"""Durable Streams wire parsing (no I/O) and malformed server answers.

Malformed answers come from httpx.MockTransport: the reference server cannot produce them.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Callable
from typing import Any

import httpx
import pytest
from hostile import EndlessSSELine
from hypothesis import given, settings
from hypothesis import strategies as st

from s2_spark.durable import (
    DurableConfig,
    DurableStreamsClient,
    IdempotentProducer,
    RetryPolicy,
)
from s2_spark.errors import MalformedResponseError, SequenceGapError, StreamUnavailableError
from s2_spark.wire.durable import (
    IMPLEMENTATION,
    JsonArrayPieces,
    SSEEvent,
    SSEParser,
    json_batch,
    parse_control,
    split_json_array,
    split_json_array_numpy,
)

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=12,
)
spaces = st.sampled_from(["", " ", "\n", "\t ", "\r\n"])


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(json_values, spaces, spaces, st.booleans()), max_size=8), spaces)
def test_json_splitter_returns_each_message_text(items: list[Any], pad: str) -> None:
    texts = [
        json.dumps(v, ensure_ascii=ascii_only, separators=(",", ":"))
        for v, _, _, ascii_only in items
    ]
    body = pad + "[" + ",".join(a + t + b for t, (_, a, b, _) in zip(texts, items, strict=True))
    body += pad + "]" + pad
    column = json_batch(body.encode()).column(0).to_pylist()
    assert column == texts
    assert [json.loads(t) for t in column] == [v for v, *_ in items]
    offsets, values = split_json_array_numpy(body.encode())
    c_offsets, c_values = split_json_array(body.encode())
    assert offsets.tolist() == c_offsets.tolist() and values.tobytes() == c_values.tobytes()


@settings(max_examples=150, deadline=None)
@given(st.lists(json_values, min_size=1, max_size=5), st.data())
def test_json_splitter_rejects_truncated_bodies(values: list[Any], data: Any) -> None:
    body = json.dumps(values).encode()
    cut = data.draw(st.integers(1, len(body) - 1))
    truncated = body[:cut]
    for split in (split_json_array, split_json_array_numpy):
        with pytest.raises(MalformedResponseError):
            split(truncated)


@pytest.mark.parametrize(
    "body",
    [b"", b"{}", b"[1,,2]", b"[,]", b'["a]', b"[1]]", b"[[1]", b"[x]", b"[1] [2]", b"[\xff]"],
)
def test_json_splitter_rejects_invalid_bodies(body: bytes) -> None:
    with pytest.raises(MalformedResponseError):
        json_batch(body)
    with pytest.raises(MalformedResponseError):
        split_json_array_numpy(body)


def split_in_pieces(body: bytes, cuts: list[int]) -> list[str]:
    """Messages of `body` fed to JsonArrayPieces cut at `cuts` (sorted byte positions)."""
    pieces = JsonArrayPieces()
    out: list[str] = []
    for lo, hi in zip([0, *cuts], [*cuts, len(body)], strict=True):
        out += pieces.feed(body[lo:hi]).to_pylist()
    return out + pieces.finish().to_pylist()


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(json_values, spaces, st.booleans()), max_size=8), st.data())
def test_json_pieces_give_the_same_messages_wherever_the_body_is_cut(
    items: list[Any], data: Any
) -> None:
    texts = [json.dumps(v, ensure_ascii=a, separators=(",", ":")) for v, _, a in items]
    body = ("[" + ",".join(pad + t for t, (_, pad, _) in zip(texts, items, strict=True))
            + "]\n").encode()
    cuts = sorted(data.draw(st.sets(st.integers(1, len(body) - 1), max_size=12)))
    assert split_in_pieces(body, cuts) == json_batch(body).column(0).to_pylist() == texts


@pytest.mark.parametrize(
    "body",
    [b"{}", b"[1,,2]", b"[,]", b"[1,]", b'["a]', b"[1]]", b"[[1]", b"[x]", b"[1] [2]",
     b"[\xff]", b"[1,2"],
)
def test_json_pieces_reject_invalid_bodies_wherever_cut(body: bytes) -> None:
    for cut in range(1, len(body)):
        with pytest.raises(MalformedResponseError):
            split_in_pieces(body, [cut])


@pytest.mark.parametrize(
    "body",
    [
        b'["a\x01b"]',  # raw control characters inside strings (RFC 8259 forbids them)
        b'["tab\there"]',
        b'[{"k": "line\nbreak"}]',
        b'["\\\x1f"]',  # escaped by a backslash: still a raw control character
        b"[[,{]},[[]],\"\"]",  # brackets of different kinds closing each other (fuzzing)
        b"[{]}",
        b"[" * 1025 + b"]" * 1025,  # nested deeper than 1024 levels
    ],
    ids=["ctrl", "tab", "newline", "escaped-ctrl", "kinds-fuzzed", "kinds", "too-deep"],
)
def test_both_splitters_refuse_what_json_forbids(body: bytes) -> None:
    """The C and numpy splitters accept exactly the same bodies: a machine without the
    compiled extension must not accept what one with it refuses."""
    for split in (split_json_array, split_json_array_numpy):
        with pytest.raises(MalformedResponseError, match="invalid JSON-mode body"):
            split(body)
    for cut in range(1, len(body), 7):
        with pytest.raises(MalformedResponseError):
            split_in_pieces(body, [cut])


def test_both_splitters_take_1024_levels() -> None:
    body = b"[" * 1024 + b"]" * 1024
    assert json_batch(body).column(0).to_pylist() == ["[" * 1023 + "]" * 1023]
    offsets, values = split_json_array_numpy(body)
    assert values.tobytes() == b"[" * 1023 + b"]" * 1023 and offsets.tolist() == [0, 2046]


def test_json_pieces_of_an_empty_body_are_no_messages() -> None:
    assert split_in_pieces(b"", []) == [] and split_in_pieces(b" []", [1]) == []


def test_c_splitter_is_in_use_where_built() -> None:
    # The wheel build compiles it; only a machine without a C compiler uses numpy.
    assert IMPLEMENTATION == "c"


sse_text = st.text(
    alphabet=st.characters(blacklist_characters="\r\n", blacklist_categories=("Cs",)), max_size=20
)


@settings(max_examples=150, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["data", "control", "x"]), st.lists(sse_text, min_size=1, max_size=3)
        ),
        max_size=6,
    ),
    st.sampled_from(["\n", "\r\n", "\r"]),
    st.lists(st.integers(1, 7), min_size=1, max_size=20),
)
def test_sse_parser_any_line_ending_any_split(
    events: list[tuple[str, list[str]]], eol: str, cuts: list[int]
) -> None:
    wire = ""
    for name, lines in events:
        wire += f"event: {name}{eol}" + "".join(f"data: {line}{eol}" for line in lines) + eol
    raw = wire.encode()
    parser = SSEParser()
    got: list[SSEEvent] = []
    i = 0
    for cut in cuts * (len(raw) // max(sum(cuts), 1) + 1):
        got += parser.feed(raw[i : i + cut])
        i += cut
        if i >= len(raw):
            break
    got += parser.feed(raw[i:])
    assert got == [SSEEvent(name, "\n".join(lines)) for name, lines in events]
    assert parser.finish()


def test_sse_parser_keeps_a_crlf_split_by_an_empty_chunk() -> None:
    """A CR ending one chunk and the LF starting a later one are one line end, even with
    an empty chunk between them (found by fuzzing: the empty chunk made the LF a blank
    line, which dispatched the event early)."""
    parser = SSEParser()
    got = [e for chunk in (b"data: a\r", b"", b"\ndata: b\n", b"\n") for e in parser.feed(chunk)]
    assert got == [SSEEvent("message", "a\nb")] and parser.finish()


def test_sse_parser_keeps_unicode_separators_and_strips_one_space() -> None:
    events = SSEParser().feed("data:  two\ndata:a\u2028b\u0085c\n\n".encode())
    assert events == [SSEEvent("message", " two\na\u2028b\u0085c")]


def test_control_event_requires_next_offset() -> None:
    assert parse_control('{"streamNextOffset":"a_1","streamClosed":true}').closed
    for bad in ["", "{", "[]", '{"streamCursor":"x"}', '{"streamNextOffset":7}']:
        with pytest.raises(MalformedResponseError):
            parse_control(bad)


# -- malformed answers through the client ----------------------------------------------------

Handler = Callable[[httpx.Request], httpx.Response]


def client_for(handler: Handler) -> DurableStreamsClient:
    config = DurableConfig(
        base_url="http://ds.test", retry=RetryPolicy(max_attempts=2, initial_backoff=0.01)
    )
    return DurableStreamsClient(config, http_transport=httpx.MockTransport(handler))


JSON_HEADERS = {"content-type": "application/json", "stream-up-to-date": "true"}


def test_read_without_next_offset_is_malformed() -> None:
    c = client_for(lambda r: httpx.Response(200, headers=JSON_HEADERS, content=b"[1]"))
    with pytest.raises(MalformedResponseError, match="Stream-Next-Offset"):
        list(c.stream("/s").read("-1"))


def test_invalid_json_body_is_malformed() -> None:
    headers = {**JSON_HEADERS, "stream-next-offset": "a_1"}
    c = client_for(lambda r: httpx.Response(200, headers=headers, content=b'[{"a":1}'))
    with pytest.raises(MalformedResponseError, match="invalid JSON-mode body"):
        list(c.stream("/s").read("-1"))  # split as it arrives
    chunk = c.stream("/s").get("-1")  # held whole, as it came
    with pytest.raises(MalformedResponseError):
        chunk.batch()
    with pytest.raises(MalformedResponseError):
        chunk.messages()


def test_non_integer_producer_header_is_malformed() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(403, headers={"producer-epoch": "soon"})

    c = client_for(handler)
    with pytest.raises(MalformedResponseError, match="producer-epoch"):
        c.stream("/s", content_type="application/json").append(
            b"[1]", headers={"producer-id": "p", "producer-epoch": "0", "producer-seq": "0"}
        )


def test_truncated_body_retries_then_raises_typed_error() -> None:
    calls = []

    def handler(request: httpx.Request) -> httpx.Response:
        calls.append(request)
        raise httpx.RemoteProtocolError("peer closed connection without sending complete body")

    with pytest.raises(StreamUnavailableError, match="in transit"):
        list(client_for(handler).stream("/s").read("-1"))
    assert len(calls) == 2


def sse_client(body: bytes, encoding: str | None = None) -> DurableStreamsClient:
    headers = {"content-type": "text/event-stream"}
    if encoding:
        headers["stream-sse-data-encoding"] = encoding
    return client_for(lambda r: httpx.Response(200, headers=headers, content=body))


def test_invalid_base64_sse_data_is_malformed() -> None:
    body = b'event: data\ndata: !!!!\n\nevent: control\ndata: {"streamNextOffset":"a_1"}\n\n'
    c = sse_client(body, "base64")
    with pytest.raises(MalformedResponseError, match="base64"):
        list(c.stream("/s", content_type="application/octet-stream").read("-1", live="sse"))


def test_base64_sse_data_split_over_lines_decodes() -> None:
    payload = bytes(range(256))
    text = base64.b64encode(payload).decode()
    lines = "".join(f"data: {text[i : i + 50]}\n" for i in range(0, len(text), 50))
    body = (
        "event: data\n" + lines + "\nevent: control\n"
        'data: {"streamNextOffset":"a_9","streamClosed":true}\n\n'
    ).encode()
    c = sse_client(body, "base64")
    chunks = list(c.stream("/s", content_type="application/octet-stream").read("-1", live="sse"))
    assert chunks[-1].data == payload and chunks[-1].closed


def test_sse_control_without_offset_is_malformed() -> None:
    body = b'event: data\ndata: [1]\n\nevent: control\ndata: {"upToDate":true}\n\n'
    c = sse_client(body)
    with pytest.raises(MalformedResponseError, match="streamNextOffset"):
        list(c.stream("/s", content_type="application/json").read("-1", live="sse"))


# ------------------------------------------------------------ SSE without end: bounded


def test_sse_parser_refuses_a_line_over_its_limit_and_an_event_over_it() -> None:
    """A line without end and an event of many lines each fail once past `max_event`,
    naming the limit; an event just under it parses."""
    parser = SSEParser(max_event=4096)
    parser.feed(b"data: ")
    with pytest.raises(MalformedResponseError, match="SSE event over 4096 bytes"):
        for _ in range(100):
            parser.feed(b"x" * 100)
    parser = SSEParser(max_event=4096)
    with pytest.raises(MalformedResponseError, match="SSE event over 4096 bytes"):
        parser.feed(b"data: " + b"y" * 1000 + b"\n" * 1 + (b"data: " + b"y" * 1000 + b"\n") * 4)
    assert SSEParser(max_event=4096).feed(b"data: " + b"z" * 4000 + b"\n\n") == [
        SSEEvent("message", "z" * 4000)]


def test_an_sse_read_whose_line_never_ends_fails_at_the_limit() -> None:
    """Seen before the limit: a `data:` line without end grew the reader by 200 MiB in
    30 s, with no error. Now the read fails naming the limit, the server having sent not
    much more than it."""
    with EndlessSSELine(cap=512 << 20) as server:
        config = DurableConfig(base_url=server.url, max_read_bytes=1 << 20)
        with DurableStreamsClient(config) as client, \
                pytest.raises(MalformedResponseError) as info:
            list(client.stream("s").read("-1", live="sse"))
        assert f"SSE event over {1 << 20} bytes" in str(info.value)
        assert "max_read_bytes" in str(info.value)
        assert server.sent < server.cap


@pytest.mark.parametrize("bad", [0, 1023, -1, 1.5, True, "1"])
def test_max_read_bytes_must_be_a_number_of_bytes(bad: Any) -> None:
    with pytest.raises(ValueError, match=r"max_read_bytes must be a number of bytes >= 1024"):
        DurableConfig(max_read_bytes=bad)


# -- servers differ: the client must not care --------------------------------------------------


class CaddyShaped:
    """A Durable Streams server in the forms Durable Streams' Caddy server answers in,
    where the reference server answers otherwise: offsets `16digits_16digits` counting
    message bytes, an ETag of `"<end offset>"` on GET only (none on HEAD), bodies with
    Content-Length, `Stream-Next-Offset` on a duplicate idempotent append (204) and on a
    409 sequence gap, error bodies in `text/plain; charset=utf-8` with its own wording."""

    def __init__(self) -> None:
        self.messages: list[bytes] = []
        self.seqs: dict[str, int] = {}

    def offset(self, n: int) -> str:
        return f"{0:016d}_{sum(len(m) for m in self.messages[:n]):016d}"

    def __call__(self, request: httpx.Request) -> httpx.Response:
        tail = {"stream-next-offset": self.offset(len(self.messages))}
        if request.method == "PUT":
            return httpx.Response(201, headers=tail)
        if request.method == "HEAD":
            return httpx.Response(200, headers={**tail, "content-type": "application/json"})
        if request.method == "POST":
            return self._append(request)
        at = request.url.params["offset"]
        start = 0 if at == "-1" else [self.offset(n) for n in range(len(self.messages) + 1)
                                      ].index(at)
        etag = f'"{tail["stream-next-offset"]}"'
        head = {**tail, "etag": etag, "content-type": "application/json",
                "stream-up-to-date": "true"}
        if request.headers.get("if-none-match") == etag:
            return httpx.Response(304, headers=head)
        if start == len(self.messages) and request.url.params.get("live") == "long-poll":
            return httpx.Response(204, headers={**tail, "stream-up-to-date": "true"})
        return httpx.Response(200, headers=head,
                              content=b"[" + b",".join(self.messages[start:]) + b"]")

    def _append(self, request: httpx.Request) -> httpx.Response:
        producer, seq = request.headers.get("producer-id"), request.headers.get("producer-seq")
        new = [m.encode() for m in json_batch(request.content).column(0).to_pylist()]
        if producer is not None and seq is not None:
            expected = self.seqs.get(producer, 0)
            tail = {"stream-next-offset": self.offset(len(self.messages))}
            if int(seq) < expected:
                return httpx.Response(204, headers=tail)
            if int(seq) > expected:
                return httpx.Response(409, headers={
                    **tail, "producer-expected-seq": str(expected), "producer-received-seq": seq,
                    "content-type": "text/plain; charset=utf-8"}, content=b"sequence gap\n")
            self.seqs[producer] = expected + 1
        self.messages += new
        tail = {"stream-next-offset": self.offset(len(self.messages))}
        return httpx.Response(200 if producer is not None else 204, headers=tail)


def test_a_server_in_other_forms_reads_and_writes_the_same() -> None:
    """Offsets are only echoed and compared, ETags only echoed, the 204 and 409 of an
    idempotent producer taken with or without a tail, bodies sized or chunked."""
    server = CaddyShaped()
    c = DurableStreamsClient(DurableConfig(base_url="http://ds.test"),
                             http_transport=httpx.MockTransport(server))
    s = c.stream("/s", content_type="application/json")
    s.create("application/json")
    assert s.append_json([{"a": 1}, {"a": 2}]).next_offset == "0000000000000000_0000000000000014"
    producer = IdempotentProducer(s, "p")
    producer.append({"b": 3})
    producer.flush()
    producer.seq = 0
    again = producer.send(b'[{"b":3}]')  # the same batch again: a duplicate, with a tail
    assert again.duplicate and again.next_offset == "0000000000000000_0000000000000021"
    producer.seq = 5
    with pytest.raises(SequenceGapError) as gap:
        producer.send(b"[9]")
    assert (gap.value.expected_seq, gap.value.received_seq) == (1, 5)
    info = s.head()
    assert (info.next_offset, info.etag) == ("0000000000000000_0000000000000021", None)
    chunks = list(s.read("-1"))
    assert [m for ch in chunks for m in ch.messages()] == [{"a": 1}, {"a": 2}, {"b": 3}]
    assert chunks[-1].next_offset == info.next_offset and chunks[-1].up_to_date
    middle = server.offset(1)
    assert [m for ch in s.read(middle) for m in ch.messages()] == [{"a": 2}, {"b": 3}]
    whole = s.get("-1")
    assert whole.etag == f'"{info.next_offset}"'
    assert s.get("-1", if_none_match=whole.etag).not_modified
    polled = s.get(info.next_offset, live="long-poll")
    assert (polled.data, polled.next_offset, polled.up_to_date) == (b"", info.next_offset, True)
