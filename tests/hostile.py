"""Servers that misbehave on purpose, one behaviour each, on `raw_server.RawServer`: what
a compromised proxy, a wrong endpoint or a buggy service could send a client. HTTP/2 ones
answer the preface with SETTINGS and wait for a request first; HTTP/1.1 ones read a
request head first (a Durable Streams SSE read's HEAD is answered as the protocol has it).
"""

from __future__ import annotations

import socket
from collections.abc import Callable

from http_proxy import read_head
from hyperframe.frame import (
    ContinuationFrame,
    DataFrame,
    HeadersFrame,
    PingFrame,
    SettingsFrame,
)
from raw_server import RawServer

__all__ = [
    "HTTP1",
    "HTTP2",
    "ContinuationFlood",
    "DataOnAnUnopenedStream",
    "EndlessBodyInWindow",
    "EndlessChunkedBody",
    "EndlessHead",
    "EndlessInformationalHeads",
    "EndlessSSELine",
    "EndlessTrailers",
    "Http1Server",
    "PingFlood",
    "Scripted",
    "SendingAfterTheReset",
    "SettingsFlood",
]

_OK = b"\x88"  # :status 200, from HPACK's static table


class Http2Server(RawServer):
    """Answers the preface with SETTINGS, waits for a request, then does `misbehave`."""

    def serve(self, conn: socket.socket) -> None:
        conn.sendall(SettingsFrame(0).serialize())
        sid = _first_request(conn)
        if sid:
            self.misbehave(conn, sid)

    def misbehave(self, conn: socket.socket, sid: int) -> None:
        raise NotImplementedError


def _first_request(conn: socket.socket) -> int:
    """The stream id of the client's first HEADERS frame (0: it left first)."""
    heard = b""
    while True:
        pos = 24 if heard.startswith(b"PRI") else 0
        while len(heard) - pos >= 9:
            length, kind = int.from_bytes(heard[pos:pos + 3], "big"), heard[pos + 3]
            if kind == 0x1:
                return int.from_bytes(heard[pos + 5:pos + 9], "big") & 0x7FFFFFFF
            pos += 9 + length
        chunk = conn.recv(65536)
        if not chunk:
            return 0
        heard += chunk


class Scripted(Http2Server):
    """Answers the request with the frames `script(sid)` makes, then waits for the
    client to leave."""

    def __init__(self, script: Callable[[int], bytes]) -> None:
        super().__init__()
        self.script = script

    def misbehave(self, conn: socket.socket, sid: int) -> None:
        conn.sendall(self.script(sid))
        while conn.recv(65536):
            pass


class ContinuationFlood(Http2Server):
    """A header block never ended: CONTINUATION frames of 16 KiB (the 2024 advisories)."""

    def misbehave(self, conn: socket.socket, sid: int) -> None:
        conn.sendall(HeadersFrame(sid, data=_OK).serialize())  # no END_HEADERS
        self.send_until_cap(conn, ContinuationFrame(sid, data=b"\x00" * 16384).serialize())


class PingFlood(Http2Server):
    """PINGs whose answers it never reads."""

    def misbehave(self, conn: socket.socket, sid: int) -> None:
        self.send_until_cap(conn, PingFrame(0, opaque_data=b"12345678").serialize() * 4096)


class SettingsFlood(Http2Server):
    """SETTINGS frames whose acknowledgements it never reads."""

    def misbehave(self, conn: socket.socket, sid: int) -> None:
        self.send_until_cap(conn, SettingsFrame(0, settings={4: 65535}).serialize() * 4096)


class DataOnAnUnopenedStream(Http2Server):
    """DATA on the stream after the request's, which the client never opened."""

    def misbehave(self, conn: socket.socket, sid: int) -> None:
        conn.sendall(DataFrame(sid + 2, data=b"x" * 100).serialize())
        conn.recv(65536)


class SendingAfterTheReset(Http2Server):
    """An answer whose body never ends, sent as fast as the socket takes it: past the
    body limit the client resets the stream, and this goes on sending regardless."""

    def misbehave(self, conn: socket.socket, sid: int) -> None:
        conn.sendall(HeadersFrame(sid, data=_OK, flags=["END_HEADERS"]).serialize())
        self.send_until_cap(conn, DataFrame(sid, data=b"x" * 16384).serialize() * 16)


class EndlessBodyInWindow(Http2Server):
    """A body without end that keeps to the windows: half the stream's window, then more
    once the client sent anything (its WINDOW_UPDATE); it stops at the client's reset."""

    def misbehave(self, conn: socket.socket, sid: int) -> None:
        conn.sendall(HeadersFrame(sid, data=_OK, flags=["END_HEADERS"]).serialize())
        half = DataFrame(sid, data=b"x" * 16384).serialize() * 32
        while self.sent < self.cap:
            conn.sendall(half)
            self.sent += len(half)
            heard = conn.recv(65536)
            if not heard or heard[3] == 0x3:  # closed, or RST_STREAM first
                return


class Http1Server(RawServer):
    """Reads a request head, then answers `head`, then `body` again and again."""

    head, body = b"", b""

    def serve(self, conn: socket.socket) -> None:
        read_head(conn)
        conn.sendall(self.head)
        self.send_until_cap(conn, self.body)


class EndlessChunkedBody(Http1Server):
    head = (b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
            b"transfer-encoding: chunked\r\n\r\n")
    body = b"4000\r\n" + b"x" * 16384 + b"\r\n"


class EndlessJSONMessage(Http1Server):
    """A Durable Streams JSON answer whose first message never ends."""

    head = (b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\nstream-next-offset: 1\r\n"
            b"transfer-encoding: chunked\r\n\r\n2\r\n[\"\r\n")
    body = EndlessChunkedBody.body


class EndlessTrailers(Http1Server):
    head = b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\n"
    body = b"x-trailer: " + b"y" * 100 + b"\r\n"


class EndlessInformationalHeads(Http1Server):
    body = b"HTTP/1.1 100 Continue\r\n\r\n"


class EndlessHead(Http1Server):
    head = b"HTTP/1.1 200 OK\r\n"
    body = b"x-header: " + b"y" * 100 + b"\r\n"


class EndlessSSELine(RawServer):
    """Answers a Durable Streams SSE read with one `data:` line that never ends, in
    chunks of 64 KiB (a HEAD first, for the stream's content type)."""

    def serve(self, conn: socket.socket) -> None:
        if read_head(conn)[0].startswith(b"HEAD "):
            conn.sendall(b"HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\n"
                         b"stream-next-offset: 0_0\r\ncontent-length: 0\r\n\r\n")
            read_head(conn)
        conn.sendall(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
                     b"transfer-encoding: chunked\r\n\r\n6\r\ndata: \r\n")
        self.send_until_cap(conn, b"10000\r\n" + b"x" * 65536 + b"\r\n")


HTTP2 = [ContinuationFlood, PingFlood, SettingsFlood, DataOnAnUnopenedStream,
         SendingAfterTheReset, EndlessBodyInWindow]
HTTP1 = [EndlessChunkedBody, EndlessTrailers, EndlessInformationalHeads, EndlessHead]
