"""The tail watch's HTTP/2 path when the server misbehaves: a request the server did not
process (GOAWAY past it, REFUSED_STREAM) is sent again, each time on a newer connection,
and after `_SENDS` sends the caller gets `Unprocessed` saying so; a request the server did
process is never sent again (its answer still comes in a graceful shutdown, else the
caller gets an error); an origin that speaks only HTTP/1.1 is polled over HTTP/1.1 and
remembered; a server killed and restarted under waiting polls is polled again.

The misbehaving server is `h2_peer.H2Peer`, a small h2c server over a real socket."""

from __future__ import annotations

import asyncio
import json
import ssl
import struct
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import hpack
import httpx
import pytest
from _waiting import wait_for as until
from h2_peer import H2Peer
from hostile import (
    ContinuationFlood,
    DataOnAnUnopenedStream,
    EndlessBodyInWindow,
    PingFlood,
    Scripted,
    SendingAfterTheReset,
    SettingsFlood,
)
from raw_server import RawServer

from s2_spark._http import AsyncTimeouts, Response, _h2_origin
from s2_spark._http._h2_connection import MAX_HEADER_BLOCK, MAX_UNSENT, Unprocessed
from s2_spark._http._h2_origin import _SENDS, Http2Origin
from s2_spark._http._response import MAX_BODY_BYTES, BodyTooLargeError
from s2_spark._long_poll import watch_limit
from s2_spark.durable import DurableConfig, DurableStream, DurableStreamsClient
from s2_spark.s2 import AppendRecord, S2Client, S2Config
from s2_spark.testing import ServerProcess

TIMEOUTS = AsyncTimeouts(connect=10.0, read=10.0)
SLOW = AsyncTimeouts(connect=10.0, read=600.0)


@pytest.fixture(autouse=True)
def nothing_known_of_origins(monkeypatch: pytest.MonkeyPatch) -> None:
    """Whether an origin speaks HTTP/2 is remembered per process: start from nothing."""
    monkeypatch.setattr(_h2_origin, "_SPEAKS", {})


def get(url: str, target: str = "/poll?n=1", timeouts: AsyncTimeouts = TIMEOUTS) -> Response:
    """One GET of `target` over HTTP/2 by a new `Http2Origin` of `url`."""
    async def run() -> Response:
        origin = Http2Origin(url, ssl.create_default_context)
        try:
            return await asyncio.wait_for(origin.request(b"GET", target, [], timeouts),
                                          timeouts.read + 20)
        finally:
            origin.close()

    return asyncio.run(run())


def answer_of(resp: Response) -> Any:
    assert resp.status_code == 200
    return json.loads(resp.content)


@pytest.mark.parametrize("plan", ["goaway", "refuse"])
def test_a_request_the_server_did_not_process_is_answered_once_on_a_newer_connection(
    plan: str,
) -> None:
    with H2Peer([plan, "answer"]) as peer:
        assert answer_of(get(peer.url)) == {"path": "/poll?n=1", "connection": 2}
        # Sent twice, once on each connection: the one that did not process it is not
        # asked again, even where it still takes requests (after REFUSED_STREAM).
        assert peer.seen == [(1, 1, "/poll?n=1"), (2, 1, "/poll?n=1")]
        assert peer.connections == 2


@pytest.mark.parametrize(("plan", "why"), [
    ("goaway", "the server went away (GOAWAY)"),
    ("refuse", "the server reset the stream (<ErrorCodes.REFUSED_STREAM: 7>)"),
])
def test_a_request_never_processed_in_its_sends_is_an_unprocessed_error_saying_so(
    plan: str, why: str,
) -> None:
    with H2Peer([plan]) as peer:
        with pytest.raises(Unprocessed) as e:
            get(peer.url)
        assert str(e.value) == (f"the server did not process the request in {_SENDS} "
                                f"sends, each on a newer connection: {why}")
        assert isinstance(e.value, httpx.RemoteProtocolError)  # the watch's FAILED
        assert peer.seen == [(n, 1, "/poll?n=1") for n in range(1, _SENDS + 1)]
        assert peer.connections == _SENDS


def test_a_request_a_goaway_says_was_processed_is_not_sent_again() -> None:
    """The server closes without answering it: the caller gets the error, not a second
    request (which, for anything but a long-poll, could do its work twice)."""
    with H2Peer(["goaway-then-close", "answer"]) as peer:
        with pytest.raises(httpx.ReadError, match="the server closed the connection"):
            get(peer.url)
        assert peer.seen == [(1, 1, "/poll?n=1")]
        assert peer.connections == 1


def test_a_request_a_goaway_says_was_processed_gets_its_answer_in_a_graceful_shutdown(
) -> None:
    """GOAWAY, then the answers to the streams it names as processed, then close (RFC
    9113, 6.8): the answer arrives, once, over the one connection."""
    with H2Peer(["goaway-then-answer", "answer"]) as peer:
        assert answer_of(get(peer.url)) == {"path": "/poll?n=1", "connection": 1}
        assert peer.seen == [(1, 1, "/poll?n=1")]
        assert peer.connections == 1


def test_in_a_graceful_shutdown_the_processed_request_is_answered_and_the_next_resent(
) -> None:
    """Two requests on one connection; the GOAWAY names the first as processed and the
    second not: the first is answered on that connection, the second on a new one, each
    once."""
    async def both(url: str) -> list[Response]:
        origin = Http2Origin(url, ssl.create_default_context)
        try:
            asks = [origin.request(b"GET", f"/poll?n={n}", [], TIMEOUTS) for n in (1, 2)]
            return await asyncio.wait_for(asyncio.gather(*asks), 30)
        finally:
            origin.close()

    with H2Peer(["goaway-then-answer", "answer"]) as peer:
        answers = sorted((answer_of(r) for r in asyncio.run(both(peer.url))),
                         key=lambda a: a["connection"])
        assert [a["connection"] for a in answers] == [1, 2]
        assert {a["path"] for a in answers} == {"/poll?n=1", "/poll?n=2"}
        assert peer.connections == 2
        # The second connection got just the request the first did not process.
        assert [(c, p) for c, _, p in peer.seen if c == 2] == [(2, answers[1]["path"])]


def test_an_answer_sent_the_long_way_is_read_whole() -> None:
    """An informational 103 first, a head in HEADERS and CONTINUATION frames, the body in
    padded DATA frames, then trailers: the answer is the final head and the body, exact,
    and the connection takes the next request (its header table still in step)."""
    async def two(url: str) -> list[Response]:
        origin = Http2Origin(url, ssl.create_default_context)
        try:
            return [await asyncio.wait_for(origin.request(b"GET", f"/e?n={n}", [], TIMEOUTS),
                                           30) for n in (1, 2)]
        finally:
            origin.close()

    with H2Peer(["elaborate"]) as peer:
        first, second = asyncio.run(two(peer.url))
        for n, resp in ((1, first), (2, second)):
            assert answer_of(resp) == {"path": f"/e?n={n}", "connection": 1}
            assert resp.headers["x-big"] == "b" * 20000
            assert "x-trailer" not in resp.headers and "link" not in resp.headers
        assert peer.connections == 1


def test_a_request_never_answered_times_out_even_behind_one_that_waits_longer() -> None:
    """Read timeouts hold whatever was sent before on the connection: a request with a
    short one, sent after one with a long one, times out first; then the long one does."""
    async def run(url: str) -> tuple[bool, BaseException | None]:
        origin = Http2Origin(url, ssl.create_default_context)
        try:
            long = asyncio.ensure_future(
                origin.request(b"GET", "/long", [], AsyncTimeouts(connect=10.0, read=4.0)))
            await asyncio.sleep(0.2)
            with pytest.raises(httpx.ReadTimeout):
                await origin.request(b"GET", "/short", [], AsyncTimeouts(10.0, 0.5))
            long_pending = not long.done()
            await asyncio.wait([long], timeout=60)
            return long_pending, long.exception()
        finally:
            origin.close()

    with H2Peer(["silent"]) as peer:
        long_pending, failure = asyncio.run(run(peer.url))
    assert long_pending
    assert isinstance(failure, httpx.ReadTimeout)


def test_a_header_block_without_end_ends_the_connection_at_its_limit() -> None:
    """The 2024 "CONTINUATION flood": a server that never ends a header block gets a
    protocol error naming the limit once the block passes `MAX_HEADER_BLOCK`, not a
    client that holds every fragment (5 GiB in 15 s before the limit)."""
    with ContinuationFlood() as flood:
        with pytest.raises(httpx.RemoteProtocolError) as info:
            get(flood.url)
        assert f"a header block over MAX_HEADER_BLOCK ({MAX_HEADER_BLOCK} bytes)" in str(
            info.value)
        assert flood.sent < flood.cap


@pytest.mark.parametrize("flood", [PingFlood, SettingsFlood])
def test_a_flood_of_frames_to_answer_from_a_server_that_never_reads_ends_the_connection(
    flood: type[RawServer],
) -> None:
    """The answers a server asks for but does not read stop at `MAX_UNSENT`: a protocol
    error naming it, not a client output buffer that grows with the flood."""
    with flood() as server:
        with pytest.raises(httpx.RemoteProtocolError) as info:
            get(server.url, timeouts=SLOW)  # each frame is answered, the flood is long
        assert f"over MAX_UNSENT, {MAX_UNSENT} bytes, unsent" in str(info.value)
        assert server.sent < server.cap


def test_data_on_a_stream_never_opened_ends_the_connection() -> None:
    with DataOnAnUnopenedStream() as hostile:
        with pytest.raises(httpx.RemoteProtocolError) as info:
            get(hostile.url)
        assert "a frame of type 0 on stream 3, which this client did not open" in str(
            info.value)


def test_a_server_that_sends_on_after_a_reset_loses_the_connection() -> None:
    """The request fails at `MAX_BODY_BYTES` and its stream is reset; the server sends on
    regardless, and once past the stream's window the connection ends (it would have
    been given its window back for as long as it sent)."""
    async def run(hostile: RawServer) -> None:
        origin = Http2Origin(hostile.url, ssl.create_default_context)
        try:
            with pytest.raises(BodyTooLargeError, match=r"a body over \d+ bytes"):
                await origin.request(b"GET", "/poll", [], TIMEOUTS)
            while not hostile.finished:  # the origin is open: the client ended it
                await asyncio.sleep(0.05)
        finally:
            origin.close()

    with SendingAfterTheReset() as hostile:
        asyncio.run(asyncio.wait_for(run(hostile), 120))
        assert hostile.sent < hostile.cap


def test_a_body_without_end_fails_its_request_at_the_limit() -> None:
    with EndlessBodyInWindow() as hostile:
        with pytest.raises(BodyTooLargeError) as info:
            get(hostile.url)
        assert str(info.value) == f"a body over {MAX_BODY_BYTES} bytes (MAX_BODY_BYTES)"
        assert hostile.sent < 2 * MAX_BODY_BYTES


def _frame(kind: int, flags: int, sid: int, payload: bytes) -> bytes:
    return len(payload).to_bytes(3, "big") + bytes((kind, flags)) + sid.to_bytes(4, "big") \
        + payload


def _head(*fields: tuple[str, str], flags: int = 0x4) -> Callable[[int], bytes]:
    """HEADERS with END_HEADERS (and `flags`), its block the `fields` HPACK-encoded."""
    return lambda sid: _frame(0x1, flags, sid, hpack.Encoder().encode(list(fields)))


def _then(*parts: Callable[[int], bytes]) -> Callable[[int], bytes]:
    return lambda sid: b"".join(part(sid) for part in parts)


def _on_zero(frame: bytes) -> Callable[[int], bytes]:
    return lambda sid: frame


_OK_HEAD = _head((":status", "200"))
_SETTING = struct.Struct(">HI")

#: What RFC 9113 makes a malformed answer or a connection error, found by the `h2_frames`
#: fuzz target (its inputs are kept in tests/data/fuzz/h2_frames/): each ends the
#: connection with the error it names, the answer never delivered.
MALFORMED = {
    "no-status": (_head(("x-id", "1"), flags=0x5), "a malformed response head"),
    "status-not-three-digits": (_head((":status", " 200"), flags=0x5),
                                "a malformed response head"),
    "a-pseudo-header-after-status": (_head((":status", "200"), (":path", "/"), flags=0x5),
                                     "a malformed response head"),
    "data-before-the-head": (lambda sid: _frame(0x0, 0x1, sid, b"x"),
                             "DATA before the answer's head on stream 1"),
    "informational-that-ends-the-stream": (_head((":status", "103"), flags=0x5),
                                           "an informational answer (103) that ends stream 1"),
    "trailers-without-end-stream": (_then(_OK_HEAD, _head(("x-trailer", "1"))),
                                    "trailers without END_STREAM, or with a pseudo-header "
                                    "field, on stream 1"),
    "a-status-in-the-trailers": (_then(_OK_HEAD, _head((":status", "100"), flags=0x5)),
                                 "trailers without END_STREAM, or with a pseudo-header "
                                 "field, on stream 1"),
    "body-shorter-than-its-content-length": (
        _then(_head((":status", "200"), ("content-length", "5")),
              lambda sid: _frame(0x0, 0x1, sid, b"abc")),
        "3 bytes of body on stream 1 at its end, its content-length 5"),
    "content-length-not-digits": (_head((":status", "200"), ("content-length", "+5")),
                                  "a content-length of b'+5'"),
    "ping-on-a-stream": (lambda sid: _frame(0x6, 0, sid, bytes(8)),
                         "a frame of type 6 on stream 1, not the connection's"),
    "ping-of-9-bytes": (_on_zero(_frame(0x6, 0, 0, bytes(9))), "a PING of 9 bytes, not 8"),
    "settings-ack-with-payload": (_on_zero(_frame(0x4, 0x1, 0, _SETTING.pack(3, 10))),
                                  "a SETTINGS acknowledgement with a payload"),
    "goaway-of-4-bytes": (_on_zero(_frame(0x7, 0, 0, bytes(4))), "a GOAWAY of 4 bytes"),
    "enable-push-1": (_on_zero(_frame(0x4, 0, 0, _SETTING.pack(2, 1))),
                      "SETTINGS_ENABLE_PUSH 1 from a server"),
    "window-over-2-31": (_on_zero(_frame(0x4, 0, 0, _SETTING.pack(4, 1 << 31))),
                         "SETTINGS_INITIAL_WINDOW_SIZE 2147483648, over 2^31-1"),
    "max-frame-size-8": (_on_zero(_frame(0x4, 0, 0, _SETTING.pack(5, 8))),
                         "SETTINGS_MAX_FRAME_SIZE 8, not within 16384-16777215"),
    "headers-too-short-for-priority": (lambda sid: _frame(0x1, 0x25, sid, b"\x88"),
                                       "a frame shorter than its 5 bytes of fixed fields"),
    "padding-over-the-priority-fields": (lambda sid: _frame(0x1, 0x2D, sid, b"\x03" + bytes(5)),
                                         "padding longer than the frame"),
}


@pytest.mark.parametrize("case", list(MALFORMED))
def test_an_answer_rfc_9113_calls_malformed_ends_the_connection_with_why(case: str) -> None:
    script, why = MALFORMED[case]
    with Scripted(script) as server:
        with pytest.raises(httpx.RemoteProtocolError) as info:
            get(server.url)
        assert why in str(info.value)


# -- an origin that speaks HTTP/1.1 only: the Durable Streams reference server -------------


@pytest.fixture
def durable(ds_server: Any) -> Iterator[DurableStreamsClient]:
    with DurableStreamsClient(DurableConfig(base_url=ds_server.url)) as c:
        yield c


def at_tail(s: DurableStream) -> dict[str, Any]:
    return {"offset": s.head().next_offset, "skip": 0}


@pytest.mark.parametrize("limit", [None, 100], ids=["probed", "learnt-by-the-polls"])
def test_a_watch_on_http2_falls_back_to_http1_where_the_origin_speaks_only_that(
    durable: DurableStreamsClient, ds_server: Any, limit: int | None,
) -> None:
    """Forced onto HTTP/2 (`own_connections=0`), every stream is polled over HTTP/1.1
    instead, and each append is seen. With no `limit` the watch asks the origin first;
    with one, the polls all start on HTTP/2 at once and each falls back on its own."""
    streams: dict[str, DurableStream] = {}
    for _ in range(6):
        name = f"/h2-fallback-{uuid.uuid4().hex[:12]}"
        streams[name] = durable.stream(name)
        assert streams[name].create("application/json").created
    with durable.watch_tails(limit=limit, own_connections=0) as watch:
        positions = {name: at_tail(s) for name, s in streams.items()}
        assert watch.watch(positions) == set()
        # (A stream is quiet as its poll goes out: over HTTP/2 first, here.)
        until(lambda: watch.quiet(positions) == set(streams)
              and watch.connections() == {"h2": 0, "http/1.1": 6},
              "all six are quiet, each on an HTTP/1.1 connection")
        assert Http2Origin(ds_server.url, ssl.create_default_context).speaks_h2 is False
        assert watch.limit == (limit or watch_limit())
        for name, s in streams.items():
            s.append_json([{"name": name}])
        until(lambda: watch.quiet(positions) == set(), "each append is seen")


# -- the local S2 server killed and restarted under waiting polls ---------------------------


def test_a_watch_over_http2_polls_again_after_the_server_is_killed_and_restarted(
    tmp_path: Path,
) -> None:
    server = ServerProcess(data_dir=tmp_path / "data", heartbeat_interval=0.5).start()
    names = ["a", "b", "c"]
    try:
        with S2Client(S2Config(endpoint=server.url)) as client:
            basin = client.basin(f"restart-{uuid.uuid4().hex[:10]}")
            client.create_basin(basin.name)
            for name in names:
                basin.create_stream(name)
            with basin.watch_tails(wait=30, own_connections=0) as watch:
                positions = dict.fromkeys(names, 0)
                watch.watch(positions)
                until(lambda: watch.quiet(positions) == set(names), "all quiet")
                assert watch.connections() == {"h2": 1, "http/1.1": 0}
                server.kill()  # mid-wait: every poll on the connection fails
                until(lambda: watch.quiet(positions) == set(), "none quiet while it is down")
                server.start()  # same port, same data
                until(lambda: watch.connections()["h2"] == 1
                      and watch.quiet(positions) == set(names),
                      "all quiet again, on a new connection")
                basin.stream("b").append([AppendRecord(b"after the restart")])
                until(lambda: watch.quiet(positions) == {"a", "c"}, "b has news")
                assert watch.connections() == {"h2": 1, "http/1.1": 0}  # no HTTP/1.1 fallback
    finally:
        server.stop()
