"""Servers that misbehave on purpose, against this project's client paths run as a user
runs them, each in a process of its own (`_hostile_client.py`) whose memory is measured:
whatever a server sends, the client grows by a bounded amount over its baseline and
either carries on (a watch polls again, after a pause) or ends in a typed error naming
the limit it hit.

Each server (`hostile`) has one behaviour: HTTP/2 floods and frames the protocol forbids,
HTTP/1.1 answers without end (a body, trailers, informational heads, a head), an SSE line
without end. Before the limits, a CONTINUATION flood grew a
watch by 5 GiB in 15 s and an endless SSE line a reader by 200 MiB in 30 s."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest
from _waiting import wait_for
from hostile import (
    HTTP1,
    HTTP2,
    EndlessChunkedBody,
    EndlessHead,
    EndlessInformationalHeads,
    EndlessJSONMessage,
    EndlessSSELine,
    EndlessTrailers,
    Http1Server,
)
from raw_server import RawServer

from s2_spark._http._bulk import BULK_WIDTH
from s2_spark._http._h1 import MAX_HEAD_BYTES, BodyReader, ResponseReader
from s2_spark._http._response import MAX_BODY_BYTES, BodyTooLargeError
from s2_spark.s2._many import SMALL_ANSWER

CHILD = Path(__file__).with_name("_hostile_client.py")
#: What a client may grow by while a server misbehaves, in KiB: the largest limit a case
#: can fill (`MAX_BODY_BYTES`, or `MAX_UNSENT` of answers: 4 MiB each), held twice while
#: it is joined, and a margin for the allocator.
GROWTH = 16 << 10
#: What small reads in bulk may grow by (KiB): `MAX_BODY_BYTES` an answer, as the
#: fan-out's reads took, on each of `BULK_WIDTH` connections, held twice, and `GROWTH`.
READS_BOUND = 2 * BULK_WIDTH * (MAX_BODY_BYTES >> 10) + GROWTH
#: Seconds a client has to reach the state a test waits for.
DEADLINE = 120.0


# -- the HTTP/1.1 reader alone ----------------------------------------------------------------


@pytest.mark.parametrize(("server", "error"), [
    (EndlessChunkedBody, f"a body over {MAX_BODY_BYTES} bytes (MAX_BODY_BYTES)"),
    (EndlessTrailers, "malformed HTTP/1.1 response: "
                      f"trailers over MAX_HEAD_BYTES ({MAX_HEAD_BYTES} bytes)"),
    (EndlessInformationalHeads, "malformed HTTP/1.1 response: "
                                f"the head is over MAX_HEAD_BYTES ({MAX_HEAD_BYTES} bytes)"),
    (EndlessHead, "malformed HTTP/1.1 response: "
                  f"the head is over MAX_HEAD_BYTES ({MAX_HEAD_BYTES} bytes)"),
])
def test_the_http1_reader_stops_what_never_ends_at_its_limit(
    server: type[Http1Server], error: str,
) -> None:
    """What each server sends, fed to the reader the watch and the fan-out use: the error
    names the limit, once not much more than it was fed; a body over its limit is a
    `BodyTooLargeError` (never retried), the rest protocol errors."""
    reader, fed = ResponseReader(), 0
    with pytest.raises((httpx.RemoteProtocolError, BodyTooLargeError)) as info:
        if server.head:
            reader.feed(server.head)
        while fed < 2 * MAX_BODY_BYTES:
            reader.feed(server.body * 64)
            fed += len(server.body) * 64
    assert str(info.value) == error
    assert isinstance(info.value, BodyTooLargeError) == (server is EndlessChunkedBody)
    assert not reader.done


def test_the_streamed_body_reader_stops_endless_trailers() -> None:
    """A read session's body reader, at the same limit."""
    reader = BodyReader("chunked")
    with pytest.raises(httpx.RemoteProtocolError, match="trailers over MAX_HEAD_BYTES"):
        reader.feed(memoryview(EndlessTrailers.head.split(b"\r\n\r\n", 1)[1]))
        for _ in range(1000):
            reader.feed(memoryview(EndlessTrailers.body * 64))


def test_a_body_declared_longer_than_the_limit_fails_at_its_head() -> None:
    with pytest.raises(BodyTooLargeError, match=f"a body of {1 << 40} bytes, over"):
        ResponseReader().feed(b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n" % (1 << 40))


# -- the client, in a process of its own ------------------------------------------------------


class Client:
    """`_hostile_client.py` running `path` against `url`."""

    def __init__(self, path: str, url: str) -> None:
        self.proc = subprocess.Popen([sys.executable, str(CHILD), path, url],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        assert self.proc.stdout is not None
        assert self.proc.stdout.readline() == "ready\n"

    def result(self, *, stop: bool = False) -> dict[str, Any]:
        """What it printed last (`stop`: tell it to stop first); growth in KiB."""
        out, _ = self.proc.communicate("stop\n" if stop else None, timeout=DEADLINE)
        result: dict[str, Any] = json.loads(out.splitlines()[-1])
        result["growth"] = result["peak"] - result["baseline"]
        return result

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def run_until(path: str, server: RawServer, condition: Any) -> dict[str, Any]:
    """Run `path` until `condition()` holds (within `DEADLINE`), then stop it."""
    client = Client(path, server.url)
    try:
        wait_for(condition, timeout=DEADLINE, what=f"{path} against {type(server).__name__}")
        return client.result(stop=True)
    finally:
        client.kill()


def run_to_end(path: str, server: RawServer) -> dict[str, Any]:
    client = Client(path, server.url)
    try:
        return client.result()
    finally:
        client.kill()


# -- the tests ----------------------------------------------------------------------------------


@pytest.mark.parametrize("server", HTTP2)
def test_a_watch_over_http2_carries_on_through_a_hostile_server(server: type) -> None:
    """The connection (or the request) ends at the limit it passed and the watch polls
    again, on a new connection: the client grown by less than `GROWTH` meanwhile."""
    with server() as hostile:
        result = run_until("s2_watch", hostile, lambda: hostile.connections >= 2)
    assert result["outcome"] == "carried-on"
    assert result["growth"] < GROWTH, result
    assert hostile.sent < hostile.cap


@pytest.mark.parametrize("server", HTTP1)
def test_a_watch_over_http1_carries_on_through_a_hostile_server(server: type) -> None:
    """As over HTTP/2: the watch asks for HTTP/2 first, is answered in HTTP/1.1, and
    polls over it; each answer fails at its limit and the next poll takes a new
    connection."""
    with server() as hostile:
        result = run_until("s2_watch", hostile, lambda: hostile.connections >= 3)
    assert result["outcome"] == "carried-on"
    assert result["growth"] < GROWTH, result
    assert hostile.sent < hostile.cap


def test_a_durable_watch_reads_no_more_of_an_endless_answer_than_it_needs() -> None:
    """A poll takes the first bytes of an answer: the rest is never read."""
    with EndlessChunkedBody() as hostile:
        result = run_until("durable_watch", hostile, lambda: hostile.finished >= 1)
    assert result["outcome"] == "carried-on"
    assert result["growth"] < GROWTH, result


@pytest.mark.parametrize(("path", "server", "error", "requests", "bound"), [
    ("s2_check_tails", EndlessChunkedBody,
     ("S2Error", f"a body over {SMALL_ANSWER} bytes (the most this request takes)"),
     64, 2 * GROWTH),
    ("s2_append_bodies", EndlessChunkedBody,
     ("S2Error", f"a body over {SMALL_ANSWER} bytes (the most this request takes)"),
     64, 2 * GROWTH),
    ("s2_read_many", EndlessChunkedBody,
     ("S2Error", f"a body over {MAX_BODY_BYTES} bytes (MAX_BODY_BYTES)"), 16, READS_BOUND),
    ("s2_list_basins", EndlessChunkedBody,
     ("S2Error", f"a body over {MAX_BODY_BYTES} bytes (MAX_BODY_BYTES)"), 1, GROWTH),
    ("durable_get", EndlessChunkedBody,
     ("MalformedResponseError", f"is over {1 << 20} bytes, the most held of one answer "
                                "(DurableConfig.max_read_bytes)"), 1, GROWTH),
    ("durable_read", EndlessJSONMessage,
     ("MalformedResponseError", f"a message over {1 << 20} bytes "
                                "(DurableConfig.max_read_bytes)"), 1, GROWTH),
])
def test_a_body_without_end_fails_the_call_at_its_limit(
    path: str, server: type[Http1Server], error: tuple[str, str], requests: int, bound: int,
) -> None:
    """The limit holds per answer and fails the call at once, naming it: a server that
    sent too much once would send it again, so nothing is asked twice. The fan-out
    (`check_tails` of 64 streams, all in flight) takes `SMALL_ANSWER` of each; its bound
    allows for 64 connections read up to 256 KiB at a time (asyncio's reads) before each
    sees its limit: 16.5 MiB seen once; with `MAX_BODY_BYTES` a call, 129 MiB. A read as
    it arrives fails on one message over the limit, not on the answer's length. Appends
    in bulk (64 in flight, one a connection) fail each at its limit, never sent again.
    Small reads in bulk take `MAX_BODY_BYTES` of each, as the fan-out's did, on at most
    `BULK_WIDTH` connections at a time: a GET behind a failed one goes again, so each
    fails at its limit on a connection of its own."""
    with server() as hostile:
        result = run_to_end(path, hostile)
    assert result["outcome"]["type"] == error[0], result
    assert error[1] in result["outcome"]["text"], result
    assert hostile.connections == requests
    assert result["growth"] < bound, result
    assert hostile.sent < hostile.cap


def test_an_sse_line_without_end_fails_the_read_at_its_limit() -> None:
    with EndlessSSELine() as hostile:
        result = run_to_end("durable_sse", hostile)
    assert result["outcome"] == {
        "type": "MalformedResponseError",
        "text": f"the server sent an SSE event over {1 << 20} bytes "
                "(DurableConfig.max_read_bytes)"}, result
    assert result["growth"] < GROWTH, result


def test_the_growth_measured_is_the_client_s() -> None:
    """The measure itself: a path that holds 32 MiB shows it."""
    with EndlessHead() as unused:
        result = run_to_end("hold_32_mib", unused)
    assert (30 << 10) <= result["growth"] < (32 << 10) + GROWTH, result
