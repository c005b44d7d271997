"""A client that never ends what it sends, for tests of what a server bounds: a request
head or HTTP/2 header block that goes on forever, or a body that does. Each call sends
until the server answers or hangs up, at most `CAP` bytes (a server still reading then
fails the test: it would have read on forever) and within a deadline, and measures the
growth of the server process's resident memory (`rss`) while it did.
"""

from __future__ import annotations

import select
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass
from urllib.parse import urlsplit

import h2.config
import h2.connection
import h2.events
import h2.exceptions
import hpack
from hyperframe.frame import ContinuationFrame, HeadersFrame, SettingsFrame

__all__ = [
    "CAP",
    "Answer",
    "H2Answer",
    "continuation_flood",
    "endless_h1",
    "endless_h2_body",
    "h2_request",
    "rss",
]

MiB = 1 << 20
#: The most a case sends: 32 times the largest body a server takes (2 MiB), so a server
#: that buffers what it gets, or drains it forever, is caught by the memory bound or here.
CAP = 64 * MiB
#: Every case ends within this, answered or not.
DEADLINE = 60.0
_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"


def rss(pid: int) -> int:
    """The resident memory of process `pid`, in bytes (`VmRSS` of /proc/PID/status)."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmRSS for process {pid}")


class _Meter:
    """Bytes sent, and the peak of a process's memory growth, sampled every MiB sent."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.base = self.peak = rss(pid)
        self.sent = 0

    def count(self, n: int) -> None:
        if (self.sent + n) // MiB != self.sent // MiB:
            self.peak = max(self.peak, rss(self.pid))
        self.sent += n

    def growth(self) -> int:
        """The peak growth so far, sampled once more now."""
        self.peak = max(self.peak, rss(self.pid))
        return self.peak - self.base


@dataclass
class Answer:
    """What an HTTP/1.1 server said to an endless request, and what it cost it."""

    status: int
    headers: dict[str, str]
    body: bytes
    closed: bool  # the server closed the connection after answering
    sent: int  # bytes the client had sent when the answer came
    growth: int  # the server's peak memory growth, in bytes


def _connect(url: str) -> socket.socket:
    parts = urlsplit(url)
    return socket.create_connection((parts.hostname or "127.0.0.1", parts.port or 80), 10)


def _wait(sock: socket.socket, deadline: float, write: bool) -> bool:
    """Wait until `sock` is readable (True) or, if `write`, writable (False)."""
    while True:
        left = deadline - time.monotonic()
        assert left > 0, "the server neither answered nor took more within the deadline"
        readable, writable, _ = select.select([sock], [sock] if write else [], [], min(left, 1))
        if readable:
            return True
        if writable:
            return False


def _send_until(sock: socket.socket, first: bytes, piece: bytes, meter: _Meter,
                deadline: float, pace: float, heard: Callable[[bytes], bool]
                ) -> tuple[bytes, bool]:
    """Send `first`, then `piece` again and again, until what the server said is `heard`
    (an answer) or it closes: (what it said, whether it closed)."""
    pending = memoryview(first)
    got = bytearray()
    sock.setblocking(False)
    while True:
        if _wait(sock, deadline, write=True):
            data = _recv(sock)
            got += data
            if not data or heard(bytes(got)):
                return bytes(got), not data
            continue
        if not pending:
            assert meter.sent < CAP, f"the server took {meter.sent} bytes without answering"
            pending = memoryview(piece)
            if pace:
                time.sleep(pace)  # a slow client: the answer must not wait for its end
        try:
            n = sock.send(pending)
        except (BrokenPipeError, ConnectionResetError):
            n = 0  # closed: what it said first is read next
        meter.count(n)
        pending = pending[n:]


def _recv(sock: socket.socket) -> bytes:
    """What the server sent next; b"" when it closed (or reset) the connection."""
    try:
        return sock.recv(65536)
    except ConnectionResetError:
        return b""


def _read_to_close(sock: socket.socket, deadline: float) -> tuple[bytes, bool]:
    """What the server sends until it closes (True) or goes quiet for 5 s (False)."""
    got = bytearray()
    quiet = min(deadline, time.monotonic() + 5)
    while time.monotonic() < quiet:
        if not select.select([sock], [], [], 0.2)[0]:
            continue
        data = _recv(sock)
        if not data:
            return bytes(got), True
        got += data
        quiet = min(deadline, time.monotonic() + 5)
    return bytes(got), False


def _parse(raw: bytes) -> tuple[int, dict[str, str], bytes]:
    head, _, rest = raw.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    assert lines[0].startswith("HTTP/1.1 "), f"not an HTTP/1.1 answer: {raw[:200]!r}"
    headers = {}
    for line in lines[1:]:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    length = headers.get("content-length")
    return int(lines[0].split()[1]), headers, rest if length is None else rest[: int(length)]


def endless_h1(url: str, pid: int, first: bytes, piece: bytes, *, pace: float = 0.0,
               until_closed: bool = False) -> Answer:
    """Send the request start `first`, then `piece` forever (header lines, body chunks),
    until the server answers (or, `until_closed`, hangs up: for an answer that streams);
    read its answer to the end of the connection."""
    deadline = time.monotonic() + DEADLINE
    meter = _Meter(pid)
    with _connect(url) as sock:
        heard: Callable[[bytes], bool] = (lambda _: False) if until_closed else bool
        said, closed = _send_until(sock, first, piece, meter, deadline, pace, heard)
        sent = meter.sent
        rest, closed = (b"", True) if closed else _read_to_close(sock, deadline)
    status, headers, body = _parse(said + rest)
    return Answer(status, headers, body, closed, sent, meter.growth())


# -- HTTP/2 ---------------------------------------------------------------------------


@dataclass
class H2Answer:
    """What an HTTP/2 server did with an endless header block or body."""

    sent: int
    growth: int
    goaway: int | None = None  # the error code of its GOAWAY
    closed: bool = False
    status: int | None = None
    body: bytes = b""
    reset: int | None = None  # the error code of its RST_STREAM for the request
    next_status: int | None = None  # a later request's on the same connection


def _frames(buf: bytearray) -> list[tuple[int, int, bytes]]:
    """Whole frames (type, stream, payload) taken from the front of `buf`."""
    out = []
    while len(buf) >= 9:
        length = int.from_bytes(buf[:3], "big")
        if len(buf) < 9 + length:
            break
        out.append((buf[3], int.from_bytes(buf[5:9], "big") & 0x7FFFFFFF, bytes(buf[9:9 + length])))
        del buf[: 9 + length]
    return out


def _server_max_frame(sock: socket.socket) -> int:
    """Read the server's SETTINGS and acknowledge them: its largest frame size."""
    buf = bytearray()
    while True:
        data = sock.recv(65536)
        assert data, "the server closed before its SETTINGS"
        buf += data
        for kind, _, payload in _frames(buf):
            if kind == 0x4:
                sock.sendall(SettingsFrame(0, flags=["ACK"]).serialize())
                values = {int.from_bytes(payload[i:i + 2], "big"):
                          int.from_bytes(payload[i + 2:i + 6], "big")
                          for i in range(0, len(payload), 6)}
                return values.get(0x5, 16384)


def _filler(size: int) -> bytes:
    """HPACK for headers never indexed, `x-filler: aaa...` again and again, ~`size` bytes:
    valid header fields that only add up."""
    one = hpack.Encoder().encode([hpack.NeverIndexedHeaderTuple("x-filler", "a" * 1000)],
                                 huffman=False)
    return one * max(1, size // len(one))


def _endless_value() -> bytes:
    """The start of an HPACK literal never indexed, `x-filler`, whose value says it is
    64 MiB long: a decoder can only hold its bytes until they end."""
    out = bytearray(b"\x10\x08x-filler\x7f")  # the length: 127 + a varint of the rest
    rest = (64 << 20) - 127
    while rest >= 0x80:
        out.append(rest & 0x7F | 0x80)
        rest >>= 7
    return bytes(out) + bytes([rest])


def _request_head(url: str, path: str, headers: dict[str, str]) -> list[tuple[str, str]]:
    return [(":method", "POST"), (":scheme", "http"), (":authority", urlsplit(url).netloc),
            (":path", path), *headers.items()]


def continuation_flood(url: str, pid: int, path: str, headers: dict[str, str], *,
                       one_value: bool = False) -> H2Answer:
    """h2c: a request's HEADERS, then CONTINUATION frames as large as the server takes,
    forever (never END_HEADERS), until the server sends GOAWAY or closes. They carry
    header fields, or (`one_value`) the bytes of one value that never ends."""
    deadline = time.monotonic() + DEADLINE
    with _connect(url) as sock:
        sock.sendall(_PREFACE + SettingsFrame(0).serialize())
        size = _server_max_frame(sock)
        meter = _Meter(pid)
        block = hpack.Encoder().encode(_request_head(url, path, headers))
        first = HeadersFrame(1, block + (_endless_value() if one_value else b""),
                             flags=["END_STREAM"]).serialize()
        fill = b"a" * size if one_value else _filler(size - 1100)
        piece = ContinuationFrame(1, fill).serialize()
        said, closed = _send_until(sock, first, piece, meter, deadline, 0.0,
                                   lambda got: _goaway(got) is not None)
        answer = H2Answer(meter.sent, 0, _goaway(said))
        answer.closed = closed or _read_to_close(sock, deadline)[1]
    answer.growth = meter.growth()
    return answer


def _goaway(raw: bytes) -> int | None:
    """The error code of the first GOAWAY among these frames, if there is one."""
    return next((int.from_bytes(payload[4:8], "big")
                 for kind, _, payload in _frames(bytearray(raw)) if kind == 0x7), None)


class _H2Client:
    """An h2c connection through the `h2` library, which keeps flow control. It starts
    once the server's SETTINGS are acknowledged: python-h2 (hypercorn) applies its own
    limits from then on."""

    def __init__(self, url: str, deadline: float) -> None:
        self.url, self.deadline = url, deadline
        self.closed = False
        self.sock = _connect(url)
        self.conn = h2.connection.H2Connection(
            h2.config.H2Configuration(client_side=True, header_encoding="utf-8"))
        self.conn.initiate_connection()
        self.flush()
        while not any(isinstance(e, h2.events.RemoteSettingsChanged) for e in self.events()):
            assert not self.closed, "the server closed the connection before its SETTINGS"

    def flush(self) -> None:
        try:
            self.sock.sendall(self.conn.data_to_send())
        except (BrokenPipeError, ConnectionResetError):
            self.closed = True

    def events(self) -> list[h2.events.Event]:
        """The events of what the server sends next (waiting for it); none once it closed
        the connection (`closed`)."""
        assert _wait(self.sock, self.deadline, write=False)
        data = _recv(self.sock)
        if not data:
            self.closed = True
            return []
        events = self.conn.receive_data(data)
        for event in events:
            if isinstance(event, h2.events.DataReceived):
                self.conn.acknowledge_received_data(event.flow_controlled_length,
                                                    event.stream_id)
        self.flush()
        return events


def _take(answer: H2Answer, events: list[h2.events.Event], sid: int) -> bool:
    """Note in `answer` what `events` say of stream `sid`; whether they end it."""
    ended = False
    for event in events:
        if getattr(event, "stream_id", sid) != sid:
            continue
        if isinstance(event, h2.events.ResponseReceived):
            answer.status = int(dict(event.headers)[":status"])
        elif isinstance(event, h2.events.DataReceived):
            answer.body += event.data
        elif isinstance(event, h2.events.StreamReset):
            answer.reset = event.error_code
        elif isinstance(event, h2.events.ConnectionTerminated):
            answer.goaway = event.error_code
        ended = ended or isinstance(event, h2.events.StreamEnded)
    return ended


def _get(client: _H2Client, sid: int, path: str, headers: dict[str, str]) -> H2Answer:
    """A GET on stream `sid`, until it ends or is reset, or the connection ends."""
    answer = H2Answer(0, 0)
    head = [(":method", "GET"), (":scheme", "http"),
            (":authority", urlsplit(client.url).netloc), (":path", path), *headers.items()]
    client.conn.send_headers(sid, head, end_stream=True)
    client.flush()
    ended = False
    while not (ended or client.closed or answer.reset is not None):
        ended = _take(answer, client.events(), sid)
    answer.closed = client.closed
    return answer


def endless_h2_body(url: str, pid: int, path: str, headers: dict[str, str]) -> H2Answer:
    """h2c: a request whose DATA never ends (within flow control), until the server resets
    its stream; then a GET on the same connection, to see the connection still serves."""
    client = _H2Client(url, time.monotonic() + DEADLINE)
    meter = _Meter(pid)
    answer = H2Answer(0, 0)
    with client.sock:
        client.conn.send_headers(1, _request_head(url, path, headers))
        while answer.reset is None and answer.goaway is None:
            _send_or_take(client, answer, meter)
        answer.sent = meter.sent
        if answer.goaway is None:
            answer.next_status = _get(client, 3, "/v1/basins", {}).status
    answer.growth = meter.growth()
    return answer


def _send_or_take(client: _H2Client, answer: H2Answer, meter: _Meter) -> None:
    """Send DATA as far as the windows go; when they are shut, take what the server said."""
    room = min(client.conn.local_flow_control_window(1), client.conn.max_outbound_frame_size)
    if room <= 0 or select.select([client.sock], [], [], 0)[0]:
        _take(answer, client.events(), 1)
        return
    assert meter.sent < CAP, f"the server took {meter.sent} bytes without refusing them"
    try:
        client.conn.send_data(1, b"a" * room)
    except h2.exceptions.StreamClosedError:
        return
    meter.count(room)
    client.flush()


def h2_request(url: str, path: str, headers: dict[str, str]) -> H2Answer:
    """One h2c GET with these headers, until its stream ends or is reset, or the server
    ends the connection."""
    client = _H2Client(url, time.monotonic() + DEADLINE)
    with client.sock:
        return _get(client, 1, path, headers)
