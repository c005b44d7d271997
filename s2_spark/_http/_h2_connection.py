"""One HTTP/2 connection on asyncio: many requests without a body at once, each on its own
HTTP/2 stream, the frames read and written here (RFC 9113), header blocks decoded by
`hpack` (the `h2` package's decoder).

A tail watch keeps one long-poll waiting per watched stream: over HTTP/1.1 that is a
connection, so a file descriptor, each, and a process may open only so many. Over HTTP/2
one connection carries as many requests as the server's SETTINGS_MAX_CONCURRENT_STREAMS
allows (`Http2Origin` opens more connections beyond that).

Why not `h2`'s state machine: a client that only sends bodiless requests and reads their
answers needs little of it, and a waiting request there costs a stream object, its state
machine and its flow-control window (about 1.5 KB each, kept in every connection's table
of closed streams for a while after), and 0.3 ms of CPU per request: more than all the
rest of a poll, for thousands of polls. Here a request is its HEADERS frame (the header
block written without HPACK's dynamic table, so blocks are independent of each other) and
an `_Exchange` until its answer ends: about a tenth of the CPU, a few hundred bytes.

What it reads of the server: SETTINGS (acknowledged; MAX_CONCURRENT_STREAMS and
MAX_FRAME_SIZE kept), PING (answered), GOAWAY (no new requests; the streams past its last
id failed as `Unprocessed`, the others answered as they come), RST_STREAM, and each
request's HEADERS (informational ones skipped, trailers read and dropped), CONTINUATION
and DATA (the connection's and the stream's windows given back as they are used).
Anything else the protocol forbids a server to send here ends the connection, as the RFC
has it: PUSH_PROMISE (push is off); frames on streams this client never opened, or
connection frames on a stream; DATA on a stream that ended, or past the windows it gave, a
reset stream's included (`DRAINING`); frames of the wrong size, settings out of range; a
header block that does not decode or grows past `MAX_HEADER_BLOCK`; an answer RFC 9113
8.1.1 calls malformed (no `:status` of three digits first, DATA before the head, a 1xx
ending the stream, trailers not ending it or with a pseudo-header, a body other than its
content-length), which the RFC lets a client treat as a stream error, but a server that
sends one is broken. No answer is delivered that h2 would refuse (the `h2_frames` fuzz
target checks it). A body past `MAX_BODY_BYTES` fails its request (`BodyTooLargeError`;
the stream is reset).
What goes wrong is typed as `AsyncConnection` types it (httpx's exceptions); `Unprocessed`
marks a request the server says it never looked at (a GOAWAY past it, or REFUSED_STREAM):
safe to send again.
"""

from __future__ import annotations

import asyncio
import enum
import math
import struct
from typing import Any

import hpack
import httpx

from ._response import MAX_BODY_BYTES, BodyTooLargeError, Done, Response, settle

__all__ = ["H2Connection", "NotHttp2", "Unprocessed"]

Headers = list[tuple[bytes, bytes]]

#: Flow-control window per stream and for the connection: a long-poll answer is small,
#: but a slow reader must never stall the others sharing the connection.
STREAM_WINDOW = 1 << 20
CONNECTION_WINDOW = 1 << 26
#: The part of the server's SETTINGS_MAX_CONCURRENT_STREAMS used (see `max_streams`).
HEADROOM = 0.9
#: Seconds between two looks at the requests' deadlines: a request times out up to this
#: much late.
SWEEP = 1.0
#: Streams this client reset whose window it keeps counting down: DATA the server sent
#: before it saw the reset is taken, up to the window; more is a flow-control error
#: (a server that sends on regardless would otherwise be given its window back forever).
#: Past this many, the oldest are forgotten (and DATA on them ignored, as before).
DRAINING = 4096
#: Headers HTTP/2 forbids (RFC 9113, 8.2.2) or carries as pseudo-headers (`host`).
_HOP_BY_HOP = frozenset({b"connection", b"host", b"keep-alive", b"proxy-connection",
                         b"transfer-encoding", b"upgrade", b"te"})
#: Header names whose values are sent "never indexed" (RFC 7541, 7.1.3).
_SENSITIVE = frozenset({b"authorization", b"proxy-authorization", b"cookie"})

_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
_DATA, _HEADERS, _PRIORITY, _RST_STREAM, _SETTINGS = 0, 1, 2, 3, 4
_PUSH_PROMISE, _PING, _GOAWAY, _WINDOW_UPDATE, _CONTINUATION = 5, 6, 7, 8, 9
_END_STREAM, _ACK, _END_HEADERS, _PADDED, _PRIORITY_FLAG = 0x1, 0x1, 0x4, 0x8, 0x20
_ENABLE_PUSH, _MAX_CONCURRENT_STREAMS, _INITIAL_WINDOW_SIZE = 2, 3, 4
_MAX_FRAME_SIZE, _MAX_HEADER_LIST_SIZE, _ENABLE_CONNECT_PROTOCOL = 5, 6, 8
#: The frames this client accepts: SETTINGS_MAX_FRAME_SIZE's default, never changed.
_MAX_FRAME = 16384
#: What SETTINGS_MAX_FRAME_SIZE may be (RFC 9113, 6.5.2).
_LARGEST_FRAME = (1 << 24) - 1
#: The largest header block (HEADERS and its CONTINUATION frames, encoded) taken from the
#: server, advertised as SETTINGS_MAX_HEADER_LIST_SIZE. The answers polled carry a few
#: hundred bytes of headers; a block without end (the 2024 "CONTINUATION flood") ends
#: the connection at this size instead of growing the process without bound.
MAX_HEADER_BLOCK = 1 << 16
#: The bytes this client lets wait unsent (its queue and the socket's) when the server
#: asks for an answer (PING, SETTINGS): a server that floods those without reading the
#: answers ends the connection here instead of growing the client's output.
MAX_UNSENT = 4 << 20
_LAST_STREAM_ID = (1 << 31) - 1
_FRAME_HEAD = struct.Struct(">BHBBI")  # length (24 bits as 8 + 16), type, flags, stream id


def _frame(kind: int, flags: int, sid: int, payload: bytes = b"") -> bytes:
    n = len(payload)
    return _FRAME_HEAD.pack(n >> 16, n & 0xFFFF, kind, flags, sid) + payload


def _hpack_int(value: int, prefix_bits: int, first: int) -> bytes:
    """An HPACK integer with an N-bit prefix (RFC 7541, 5.1), `first` holding the bits
    of the first byte above the prefix."""
    most = (1 << prefix_bits) - 1
    if value < most:
        return bytes((first | value,))
    out = bytearray((first | most,))
    value -= most
    while value >= 128:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _hpack_string(value: bytes) -> bytes:
    return _hpack_int(len(value), 7, 0) + value  # not Huffman-coded


def _literal(name: bytes | int, value: bytes, *, never: bool = False) -> bytes:
    """A field "without indexing" (or "never indexed"): nothing enters the dynamic
    table, so every header block stands alone. `name`: a static table index or the name."""
    first = 0x10 if never else 0x00
    if isinstance(name, int):
        return _hpack_int(name, 4, first) + _hpack_string(value)
    return bytes((first,)) + _hpack_string(name) + _hpack_string(value)


def _check_setting(code: int, value: int) -> None:
    """A setting's value as RFC 9113 6.5.2 (and RFC 8441 for 8) allows it from a server."""
    if code == _ENABLE_PUSH and value:
        raise _ProtocolError(f"SETTINGS_ENABLE_PUSH {value} from a server")
    if code == _INITIAL_WINDOW_SIZE and value > _LAST_STREAM_ID:
        raise _ProtocolError(f"SETTINGS_INITIAL_WINDOW_SIZE {value}, over 2^31-1 "
                             f"(FLOW_CONTROL_ERROR)")
    if code == _MAX_FRAME_SIZE and not _MAX_FRAME <= value <= _LARGEST_FRAME:
        raise _ProtocolError(f"SETTINGS_MAX_FRAME_SIZE {value}, not within "
                             f"{_MAX_FRAME}-{_LARGEST_FRAME}")
    if code == _ENABLE_CONNECT_PROTOCOL and value > 1:
        raise _ProtocolError(f"SETTINGS_ENABLE_CONNECT_PROTOCOL {value}, not 0 or 1")


def _status(fields: list[tuple[bytes, bytes]]) -> int:
    """The status of a response head, well formed (RFC 9113 8.3): one pseudo-header
    field, first, `:status` of three digits."""
    if (not fields or fields[0][0] != b":status" or len(fields[0][1]) != 3
            or not fields[0][1].isdigit() or any(n[:1] == b":" for n, _ in fields[1:])):
        raise _ProtocolError(f"a malformed response head: {[n for n, _ in fields][:8]}")
    return int(fields[0][1])


def _content_length(fields: list[tuple[bytes, bytes]]) -> int | None:
    """The block's content-length: digits only, and every one the same."""
    found = None
    for name, value in fields:
        if name == b"content-length":
            if not value.isdigit() or (found is not None and int(value) != found):
                raise _ProtocolError(f"a content-length of {value[:32]!r}")
            found = int(value)
    return found


class ErrorCodes(enum.IntEnum):
    """HTTP/2's error codes (RFC 9113, 7)."""

    NO_ERROR = 0x0
    PROTOCOL_ERROR = 0x1
    INTERNAL_ERROR = 0x2
    FLOW_CONTROL_ERROR = 0x3
    SETTINGS_TIMEOUT = 0x4
    STREAM_CLOSED = 0x5
    FRAME_SIZE_ERROR = 0x6
    REFUSED_STREAM = 0x7
    CANCEL = 0x8
    COMPRESSION_ERROR = 0x9
    CONNECT_ERROR = 0xA
    ENHANCE_YOUR_CALM = 0xB
    INADEQUATE_SECURITY = 0xC
    HTTP_1_1_REQUIRED = 0xD


def _reason(code: int) -> Any:
    try:
        return ErrorCodes(code)
    except ValueError:
        return code


class NotHttp2(Exception):
    """The server answered the HTTP/2 preface with something else (an HTTP/1.1-only
    server), or chose another protocol by ALPN."""


class Unprocessed(httpx.RemoteProtocolError):
    """The server did not process the request (GOAWAY past its stream, REFUSED_STREAM)."""


class _ProtocolError(Exception):
    """The server broke HTTP/2: the connection ends."""


class _Exchange:
    """One request until its answer ended."""

    __slots__ = ("body", "deadline", "done", "expected", "head_only", "headers", "received",
                 "status", "timer")

    def __init__(self, done: Done, head_only: int | None, deadline: float) -> None:
        self.done = done
        self.head_only = head_only
        self.deadline = deadline  # loop time (inf: none)
        self.status = 0
        self.headers: Headers | tuple[()] = ()
        self.body: bytes | bytearray = b""
        self.expected: int | None = None  # the head's content-length
        self.received = 0  # DATA bytes, padding included, since the window was given back
        self.timer: asyncio.TimerHandle | None = None  # only where `_sweep` cannot tell


class H2Connection(asyncio.Protocol):
    """The protocol of one HTTP/2 connection. `start` once the transport is there (after
    TLS, and ALPN said h2); `ready` resolves with the server's first SETTINGS. Loop
    thread only."""

    def __init__(self) -> None:
        self._loop = asyncio.get_running_loop()
        self.transport: asyncio.Transport | None = None
        self.ready: asyncio.Future[None] = self._loop.create_future()
        self._exchanges: dict[int, _Exchange] = {}
        self._next_sid = 1
        self._started = False
        self._heard = False  # any bytes from the server
        self._framed = False  # its first frame was SETTINGS, as HTTP/2 has it
        self._closing = False  # GOAWAY received, or the connection failed: no new requests
        self._in = bytearray()
        self._out = bytearray()
        self._flush_soon = False
        self._decoder = hpack.Decoder(max_header_list_size=MAX_HEADER_BLOCK)  # decoded, too
        # Header blocks made only of indexed fields (a server's answers after the first
        # mostly are: a few bytes), decoded: such a block leaves the dynamic table as it
        # is, so its fields stay what they were until a block that changes the table.
        self._indexed: dict[bytes, list[tuple[bytes, bytes]]] = {}
        self._usable = False  # set by the server's first SETTINGS, cleared for good
        self._latest = -math.inf  # the latest deadline of a request sent so far
        self._sweeping: asyncio.TimerHandle | None = None
        self._room = 1 << 31  # requests at once: `max_streams`
        self._block: tuple[int, int, bytearray] | None = None  # sid, flags, fragments
        self._draining: dict[int, int] = {}  # reset stream -> its window left (`DRAINING`)
        self._forgotten = 0  # the latest stream dropped from `_draining`
        self._unacked = 0  # connection window used and not given back yet
        self._max_frame = _MAX_FRAME  # the server's SETTINGS_MAX_FRAME_SIZE
        # (method, authority, scheme, headers) -> the header block around the :path
        self._blocks: dict[Any, tuple[bytes, bytes]] = {}
        self.serial = 0  # set by the owner: the order connections were opened in

    # -- what `Http2Origin` asks -------------------------------------------------------------

    @property
    def usable(self) -> bool:
        """Whether it takes new requests: ready, not going away, stream ids left."""
        return self._usable

    @property
    def in_flight(self) -> int:
        return len(self._exchanges)

    @property
    def max_streams(self) -> int:
        """Requests this connection takes at once: `HEADROOM` of the server's limit. At
        exactly the limit, hypercorn 0.18 (the local server's fallback) left answers
        undelivered until the client's read timeout (seen at 1,000 of 1,000; never at
        999)."""
        return self._room

    def start(self, transport: asyncio.Transport) -> None:
        """Send the preface, this client's settings and the connection's window."""
        self.transport = transport
        self._started = True
        settings = struct.pack(">HIHIHI", 2, 0, 4, STREAM_WINDOW,  # no push; stream window
                               _MAX_HEADER_LIST_SIZE, MAX_HEADER_BLOCK)
        self._out += _PREFACE + _frame(_SETTINGS, 0, 0, settings)
        self._out += _frame(_WINDOW_UPDATE, 0, 0, struct.pack(">I", CONNECTION_WINDOW - 65535))
        self._flush()

    async def request(self, method: bytes, authority: bytes, scheme: bytes, path: bytes,
                      headers: Headers, read_timeout: float | None,
                      head_only: int | None = None) -> Response:
        """`send`, awaited (cancelling it resets the stream)."""
        answer: asyncio.Future[Response] = self._loop.create_future()

        sid = self.send(method, authority, scheme, path, headers, read_timeout,
                        settle(answer), head_only)
        try:
            return await answer
        except asyncio.CancelledError:
            self.cancel(sid)
            raise

    def send(self, method: bytes, authority: bytes, scheme: bytes, path: bytes,
             headers: Headers, read_timeout: float | None, done: Done,
             head_only: int | None = None) -> int:
        """Start one request without a body (`Unprocessed` at once if the connection takes
        no new ones); `done` is called once, on the loop, with the answer or the
        exception it failed with (`ReadTimeout` after `read_timeout` s), unless the
        request is `cancel`led first. `head_only`: that many bytes of the body are enough
        (the stream is reset if more come). Returns the request's stream id."""
        if not self.usable:
            raise Unprocessed("the connection takes no new requests")
        pseudo, regular = self._header_block(method, authority, scheme, headers)
        block = pseudo + _literal(4, path) + regular  # :path among the pseudo-headers
        if len(block) > self._max_frame:
            raise httpx.LocalProtocolError(f"a header block of {len(block)} bytes, over the "
                                           f"server's frame size ({self._max_frame})")
        sid = self._next_sid
        self._next_sid += 2
        if self._next_sid > _LAST_STREAM_ID:
            self._usable = False
        self._out += _frame(_HEADERS, _END_STREAM | _END_HEADERS, sid, block)
        deadline = math.inf if read_timeout is None else self._loop.time() + read_timeout
        exchange = self._exchanges[sid] = _Exchange(done, head_only, deadline)
        if deadline < self._latest:
            # Sooner than one sent before it: `_sweep`, which looks at the oldest first,
            # would not see it in time.
            exchange.timer = self._loop.call_at(deadline, self._expired, sid)
        elif deadline != math.inf:
            self._latest = deadline
            if self._sweeping is None:
                self._sweeping = self._loop.call_later(SWEEP, self._sweep)
        self._flush_later()
        return sid

    def cancel(self, sid: int) -> None:
        """Give up on a request: its stream is reset and its callback never called."""
        exchange = self._exchanges.pop(sid, None)
        if exchange is not None:
            if exchange.timer is not None:
                exchange.timer.cancel()
            self._reset(sid, exchange)
            self._close_if_drained()

    def close(self) -> None:
        self._closing, self._usable = True, False
        if self.transport is not None:
            if self._started and not self.transport.is_closing():
                self._out += _frame(_GOAWAY, 0, 0, struct.pack(">II", 0, 0))
                self._flush()
            self.transport.close()
        self._fail_all(httpx.ReadError("the connection was closed"))

    # -- asyncio.Protocol ------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self._heard = True
        buf = self._in
        buf += data
        pos, size = 0, len(buf)
        try:
            while size - pos >= 9:
                hi, lo, kind, flags, sid = _FRAME_HEAD.unpack_from(buf, pos)
                length, sid = (hi << 16) | lo, sid & 0x7FFFFFFF
                if not self._framed:
                    if kind != _SETTINGS or flags & _ACK or sid:
                        raise NotHttp2("the answer to the preface is not SETTINGS")
                    self._framed = True
                if length > _MAX_FRAME:
                    raise _ProtocolError(f"a frame of {length} bytes (FRAME_SIZE_ERROR)")
                if size - pos - 9 < length:
                    break
                payload = bytes(buf[pos + 9:pos + 9 + length])
                pos += 9 + length
                self._on_frame(kind, flags, sid, payload)
        except NotHttp2 as exc:
            self._broken(httpx.RemoteProtocolError(str(exc)), not_h2=exc)
            return
        except (_ProtocolError, hpack.HPACKError, struct.error, ValueError) as exc:
            self._broken(httpx.RemoteProtocolError(f"{type(exc).__name__}: {exc}"))
            return
        del buf[:pos]
        self._flush()

    def eof_received(self) -> bool | None:
        self._broken(httpx.ReadError("the server closed the connection"))
        return None

    def connection_lost(self, exc: Exception | None) -> None:
        self._broken(httpx.ReadError(f"{type(exc).__name__}: {exc}" if exc
                                     else "the connection was closed"))

    # -- frames in ---------------------------------------------------------------------------

    def _on_frame(self, kind: int, flags: int, sid: int, payload: bytes) -> None:
        if self._block is not None and kind != _CONTINUATION:
            raise _ProtocolError("a header block left unfinished")
        if kind in (_DATA, _HEADERS, _RST_STREAM) and (
                not sid & 1 or sid >= self._next_sid):  # stream 0, a pushed one, or idle
            raise _ProtocolError(f"a frame of type {kind} on stream {sid}, which this "
                                 f"client did not open")
        if kind in (_SETTINGS, _PING, _GOAWAY) and sid:
            raise _ProtocolError(f"a frame of type {kind} on stream {sid}, not the "
                                 f"connection's (stream 0)")
        if kind == _DATA:
            self._on_data(flags, sid, payload)
        elif kind == _HEADERS:
            self._on_headers(flags, sid, payload)
        elif kind == _CONTINUATION:
            self._on_continuation(flags, sid, payload)
        elif kind == _RST_STREAM:
            (code,) = struct.unpack(">I", payload)  # not 4 bytes: struct.error
            self._draining.pop(sid, None)
            kind_of = Unprocessed if code == ErrorCodes.REFUSED_STREAM else \
                httpx.RemoteProtocolError
            self._settle(sid, kind_of(f"the server reset the stream ({_reason(code)!r})"))
        elif kind == _SETTINGS:
            self._on_settings(flags, payload)
        elif kind == _PING:
            if len(payload) != 8:
                raise _ProtocolError(f"a PING of {len(payload)} bytes, not 8 "
                                     f"(FRAME_SIZE_ERROR)")
            if not flags & _ACK:
                self._answer(_frame(_PING, _ACK, 0, payload))
        elif kind == _GOAWAY:
            self._on_goaway(payload)
        elif kind == _PUSH_PROMISE:
            raise _ProtocolError("a PUSH_PROMISE, with push disabled")
        # PRIORITY, WINDOW_UPDATE (this client sends no DATA) and unknown kinds: ignored

    def _on_settings(self, flags: int, payload: bytes) -> None:
        if flags & _ACK:
            if payload:
                raise _ProtocolError("a SETTINGS acknowledgement with a payload "
                                     "(FRAME_SIZE_ERROR)")
            return
        if len(payload) % 6:
            raise _ProtocolError("a SETTINGS frame of a length not a multiple of 6")
        for code, value in struct.iter_unpack(">HI", payload):
            _check_setting(code, value)
            if code == _MAX_CONCURRENT_STREAMS:
                self._room = max(1, int(value * HEADROOM))
            elif code == _MAX_FRAME_SIZE:
                self._max_frame = value
        self._answer(_frame(_SETTINGS, _ACK, 0))
        if not self.ready.done():
            self.ready.set_result(None)
            self._usable = not self._closing

    def _answer(self, frame: bytes) -> None:
        """Queue the answer to a frame of the server's (see `MAX_UNSENT`)."""
        transport = self.transport
        unsent = len(self._out) + (0 if transport is None else transport.get_write_buffer_size())
        if unsent > MAX_UNSENT:
            raise _ProtocolError(f"the server asks for answers it does not read (over "
                                 f"MAX_UNSENT, {MAX_UNSENT} bytes, unsent)")
        self._out += frame

    def _on_goaway(self, payload: bytes) -> None:
        """No new requests; the answers to the streams it processed may still come."""
        if len(payload) < 8:
            raise _ProtocolError(f"a GOAWAY of {len(payload)} bytes, under 8 "
                                 f"(FRAME_SIZE_ERROR)")
        (last,) = struct.unpack_from(">I", payload)
        self._closing, self._usable = True, False
        for sid in [s for s in self._exchanges if s > last & 0x7FFFFFFF]:
            self._settle(sid, Unprocessed("the server went away (GOAWAY)"))
        self._close_if_drained()

    def _on_headers(self, flags: int, sid: int, payload: bytes) -> None:
        payload = self._unpadded(flags, payload, 5 if flags & _PRIORITY_FLAG else 0)
        if flags & _END_HEADERS:
            self._on_block(sid, flags, payload)
        else:
            self._block = (sid, flags, bytearray(payload))

    def _on_continuation(self, flags: int, sid: int, payload: bytes) -> None:
        block = self._block
        if block is None or block[0] != sid:
            raise _ProtocolError("a CONTINUATION out of place")
        if len(block[2]) + len(payload) > MAX_HEADER_BLOCK:
            raise _ProtocolError(f"a header block over MAX_HEADER_BLOCK "
                                 f"({MAX_HEADER_BLOCK} bytes)")
        block[2].extend(payload)
        if flags & _END_HEADERS:
            self._block = None
            self._on_block(sid, block[1], bytes(block[2]))

    def _on_block(self, sid: int, flags: int, block: bytes) -> None:
        """A whole header block: decoded whatever stream it is for (the dynamic table
        must follow every block), then the answer's head, an informational answer
        (skipped) or trailers (dropped)."""
        fields = self._indexed.get(block)
        if fields is None:
            fields = [(bytes(k), bytes(v)) for k, v in self._decoder.decode(block, raw=True)]
            if all(b > 0x80 and b != 0xFF for b in block):  # one-byte indexed fields only
                if len(self._indexed) < 64:
                    self._indexed[block] = fields
            elif self._indexed:
                self._indexed.clear()  # the table may have changed
        exchange = self._exchanges.get(sid)
        if exchange is None:
            return
        expected = _content_length(fields)
        if exchange.status:
            if not flags & _END_STREAM or any(n[:1] == b":" for n, _ in fields):
                raise _ProtocolError(f"trailers without END_STREAM, or with a pseudo-header "
                                     f"field, on stream {sid}")
        else:
            status = _status(fields)
            if 100 <= status < 200:
                if flags & _END_STREAM:
                    raise _ProtocolError(f"an informational answer ({status}) that ends "
                                         f"stream {sid}")
                return  # the answer follows
            exchange.status, exchange.expected = status, expected
            exchange.headers = fields[1:]
        if flags & _END_STREAM:
            self._settle(sid, None)

    def _on_data(self, flags: int, sid: int, payload: bytes) -> None:
        used = len(payload)
        self._unacked += used
        if self._unacked > CONNECTION_WINDOW:
            raise _ProtocolError("DATA past the connection's window (FLOW_CONTROL_ERROR)")
        if self._unacked >= CONNECTION_WINDOW // 2:
            self._out += _frame(_WINDOW_UPDATE, 0, 0, struct.pack(">I", self._unacked))
            self._unacked = 0
        exchange = self._exchanges.get(sid)
        if exchange is None:
            self._on_draining(flags, sid, used)
            return
        if not exchange.status:
            raise _ProtocolError(f"DATA before the answer's head on stream {sid}")
        data = self._unpadded(flags, payload)
        body = exchange.body
        if not body:
            exchange.body = data
        elif isinstance(body, bytearray):
            body += data
        else:
            exchange.body = bytearray(body) + data
        exchange.received += used
        if exchange.received > STREAM_WINDOW:
            raise _ProtocolError(f"DATA past stream {sid}'s window (FLOW_CONTROL_ERROR)")
        expected, got = exchange.expected, len(exchange.body)
        if expected is not None and (got > expected or (flags & _END_STREAM and got < expected)):
            raise _ProtocolError(f"{got} bytes of body on stream {sid}"
                                 f"{'' if got > expected else ' at its end'}, its "
                                 f"content-length {expected}")
        if exchange.head_only is not None and len(exchange.body) > exchange.head_only:
            self._settle(sid, None, cut=True)  # enough: the rest is reset
            return
        if len(exchange.body) > MAX_BODY_BYTES:
            self._settle(sid, BodyTooLargeError(MAX_BODY_BYTES, status=exchange.status),
                         cut=True)
            return
        if flags & _END_STREAM:
            self._settle(sid, None)
        elif exchange.received >= STREAM_WINDOW // 2:
            self._out += _frame(_WINDOW_UPDATE, 0, sid, struct.pack(">I", exchange.received))
            exchange.received = 0

    def _on_draining(self, flags: int, sid: int, used: int) -> None:
        """DATA on a stream no request waits on: taken (and dropped) within the window
        of a stream this client reset; an error on one that ended."""
        left = self._draining.get(sid)
        if left is None:
            if sid > self._forgotten:
                raise _ProtocolError(f"DATA on stream {sid}, which ended (STREAM_CLOSED)")
            return
        left -= used
        if left < 0:
            raise _ProtocolError(f"DATA past stream {sid}'s window (FLOW_CONTROL_ERROR)")
        if flags & _END_STREAM:
            del self._draining[sid]
        else:
            self._draining[sid] = left

    @staticmethod
    def _unpadded(flags: int, payload: bytes, fixed: int = 0) -> bytes:
        """The frame's fragment: without its padding and its `fixed` leading fields
        (HEADERS' priority)."""
        if flags & _PADDED:
            if not payload or payload[0] > len(payload) - 1 - fixed:
                raise _ProtocolError("padding longer than the frame")
            payload = payload[1:len(payload) - payload[0]]
        if len(payload) < fixed:
            raise _ProtocolError(f"a frame shorter than its {fixed} bytes of fixed fields")
        return payload[fixed:]

    # -- inside --------------------------------------------------------------------------------

    def _header_block(self, method: bytes, authority: bytes, scheme: bytes,
                      headers: Headers) -> tuple[bytes, bytes]:
        """A request's header block but its :path, made once per set of headers: the
        pseudo-headers before it and the regular fields after it."""
        key = (method, authority, scheme, tuple(headers))
        block = self._blocks.get(key)
        if block is None:
            pseudo = [b"\x82" if method == b"GET" else _literal(2, method),
                      b"\x86" if scheme == b"http" else b"\x87" if scheme == b"https"
                      else _literal(6, scheme),
                      _literal(1, authority)]
            regular = []
            for name, value in headers:
                name = name.lower()
                if name not in _HOP_BY_HOP:
                    regular.append(_literal(name, value, never=name in _SENSITIVE))
            block = self._blocks[key] = (b"".join(pseudo), b"".join(regular))
            if len(self._blocks) > 64:
                self._blocks.pop(next(iter(self._blocks)))
        return block

    def _sweep(self) -> None:
        """Fail the requests past their deadline. Deadlines come in the order requests
        were sent (the others have a timer), so only the oldest are looked at: a timer
        per request, thousands of long-polls a connection, cost more memory than the
        rest of each (and a tenth of the watch's CPU)."""
        now = self._loop.time()
        expired = []
        for sid, exchange in self._exchanges.items():
            if exchange.deadline > now:
                if exchange.timer is None:
                    break
                continue
            expired.append(sid)
        for sid in expired:
            self._expired(sid)
        self._sweeping = self._loop.call_later(SWEEP, self._sweep) if self._exchanges else None

    def _expired(self, sid: int) -> None:
        exchange = self._exchanges.get(sid)
        if exchange is not None:
            exchange.timer = None
            self._settle(sid, httpx.ReadTimeout("no answer in time"), cut=True)

    def _settle(self, sid: int, exc: Exception | None, *, cut: bool = False) -> None:
        """The request's end: its callback gets the answer (or `exc`); `cut`: the stream
        is still open (the rest of the answer is not wanted), so it is reset."""
        exchange = self._exchanges.pop(sid, None)
        if exchange is None:
            return
        if exchange.timer is not None:
            exchange.timer.cancel()
        if cut:
            self._reset(sid, exchange)
        self._close_if_drained()
        if exc is not None:
            exchange.done(exc)
            return
        try:
            response = Response(exchange.status, list(exchange.headers),
                                content=bytes(exchange.body),
                                prefix=exchange.head_only is not None)
        except Exception as err:  # a body that does not decode
            exchange.done(err)
            return
        exchange.done(response)

    def _reset(self, sid: int, exchange: _Exchange) -> None:
        """Reset the stream; DATA may still come within its window (`DRAINING`)."""
        if self.transport is None or self.transport.is_closing():
            return
        self._draining[sid] = STREAM_WINDOW - exchange.received
        if len(self._draining) > DRAINING:
            oldest = next(iter(self._draining))
            del self._draining[oldest]
            self._forgotten = max(self._forgotten, oldest)
        self._out += _frame(_RST_STREAM, 0, sid, struct.pack(">I", ErrorCodes.CANCEL))
        self._flush_later()

    def _close_if_drained(self) -> None:
        if self._closing and not self._exchanges and self.transport is not None:
            self._flush()
            self.transport.close()

    def _broken(self, exc: Exception, not_h2: NotHttp2 | None = None) -> None:
        self._closing, self._usable = True, False
        if not self.ready.done():
            # Bytes, then closed: an HTTP/1.1 server's refusal of the preface.
            self.ready.set_exception(not_h2 or (NotHttp2("closed") if self._heard else exc))
        self._fail_all(exc)
        if self.transport is not None:
            self.transport.close()

    def _fail_all(self, exc: Exception) -> None:
        for sid in list(self._exchanges):
            self._settle(sid, exc)
        if self._sweeping is not None:
            self._sweeping.cancel()
            self._sweeping = None
        if not self.ready.done():
            self.ready.set_exception(exc)

    def _flush_later(self) -> None:
        """Write once the loop is done with what it is doing: the requests sent in one
        pass of the loop (a watch sending many polls again) go out in one write."""
        if not self._flush_soon:
            self._flush_soon = True
            self._loop.call_soon(self._flush)

    def _flush(self) -> None:
        self._flush_soon = False
        if not self._started or self.transport is None or self.transport.is_closing():
            return
        if self._out:
            data = bytes(self._out)
            self._out.clear()
            self.transport.write(data)
