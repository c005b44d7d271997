"""One HTTP/2 connection on asyncio: many requests at once, each on its own HTTP/2 stream,
framed by the `h2` package's state machine (what httpx uses for HTTP/2 too).

A tail watch keeps one long-poll waiting per watched stream: over HTTP/1.1 that is a
connection, so a file descriptor, each, and a process may open only so many. Over HTTP/2
one connection carries as many requests as the server's SETTINGS_MAX_CONCURRENT_STREAMS
allows (`Http2Origin` opens more connections beyond that). What goes wrong is typed as
`AsyncConnection` types it (httpx's exceptions); `Unprocessed` marks a request the server
says it never looked at (a GOAWAY past it, or REFUSED_STREAM): safe to send again.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import h2.config
import h2.connection
import h2.errors
import h2.events
import h2.exceptions
import h2.settings
import httpx

from ._response import Response

__all__ = ["H2Connection", "NotHttp2", "Unprocessed"]

Headers = list[tuple[bytes, bytes]]

#: Flow-control window per stream and for the connection: a long-poll answer is small,
#: but a slow reader must never stall the others sharing the connection.
STREAM_WINDOW = 1 << 20
CONNECTION_WINDOW = 1 << 26
#: The part of the server's SETTINGS_MAX_CONCURRENT_STREAMS used (see `max_streams`).
HEADROOM = 0.9
#: Headers HTTP/2 forbids (RFC 9113, 8.2.2) or carries as pseudo-headers (`host`).
_HOP_BY_HOP = frozenset({b"connection", b"host", b"keep-alive", b"proxy-connection",
                         b"transfer-encoding", b"upgrade", b"te"})
_CONFIG = h2.config.H2Configuration(client_side=True, header_encoding=None)
#: New requests between two of h2's own counts of its open streams (see `_Counted`).
SWEEP = 1024


class _Counted(h2.connection.H2Connection):
    """h2's connection, told how many requests are open by its owner: h2 counts them, on
    every new request, by looking at every stream it holds, which at hundreds of
    long-polls a connection cost more CPU than all the rest of a poll. h2's own count
    (which also forgets closed streams) runs once every `SWEEP` requests."""

    def __init__(self, open_requests: Callable[[], int]) -> None:
        super().__init__(config=_CONFIG)
        self._open_requests = open_requests
        self._unswept = 0

    @property
    def open_outbound_streams(self) -> int:
        self._unswept += 1
        if self._unswept < SWEEP:
            return self._open_requests()
        self._unswept = 0
        return int(super().open_outbound_streams)

    def _receive_goaway_frame(self, frame: Any) -> Any:
        """A GOAWAY as RFC 9113 (6.8) has it: no new requests (`H2Connection` sends none),
        but the answers to the streams the server processed still come. h2 closes its
        state machine on one (python-hyper/h2#1181) and would refuse those answers as a
        protocol error, failing every request the server did process."""
        state = self.state_machine.state
        result = super()._receive_goaway_frame(frame)
        self.state_machine.state = state
        return result


class NotHttp2(Exception):
    """The server answered the HTTP/2 preface with something else (an HTTP/1.1-only
    server), or chose another protocol by ALPN."""


class Unprocessed(httpx.RemoteProtocolError):
    """The server did not process the request (GOAWAY past its stream, REFUSED_STREAM)."""


@dataclass(slots=True)
class _Exchange:
    """One request's answer as it arrives."""

    done: asyncio.Future[None]
    head_only: int | None
    status: int = 0
    headers: Headers = field(default_factory=list)
    body: bytearray = field(default_factory=bytearray)


class H2Connection(asyncio.Protocol):
    """The protocol of one HTTP/2 connection. `start` once the transport is there (after
    TLS, and ALPN said h2); `ready` resolves with the server's first SETTINGS. Loop
    thread only."""

    def __init__(self) -> None:
        self._h2 = _Counted(lambda: len(self._exchanges))
        self._h2.initiate_connection()
        self._h2.update_settings({h2.settings.SettingCodes.ENABLE_PUSH: 0,
                                  h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: STREAM_WINDOW})
        self._h2.increment_flow_control_window(CONNECTION_WINDOW - 65535)
        self.transport: asyncio.Transport | None = None
        self.ready: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._exchanges: dict[int, _Exchange] = {}
        self._started = False
        self._heard = False  # any bytes from the server
        self._closing = False  # GOAWAY received, or the connection failed: no new requests
        self.serial = 0  # set by the owner: the order connections were opened in

    # -- what `Http2Origin` asks -------------------------------------------------------------

    @property
    def usable(self) -> bool:
        return not self._closing and self.ready.done() and self.ready.exception() is None

    @property
    def in_flight(self) -> int:
        return len(self._exchanges)

    @property
    def max_streams(self) -> int:
        """Requests this connection takes at once: `HEADROOM` of the server's limit. At
        exactly the limit, hypercorn 0.18 (the local server) left answers undelivered
        until the client's read timeout (seen at 1,000 of 1,000; never at 999)."""
        return max(1, int(self._h2.remote_settings.max_concurrent_streams * HEADROOM))

    def start(self, transport: asyncio.Transport) -> None:
        """Send the preface (and what came in before, answered)."""
        self.transport = transport
        self._started = True
        self._flush()

    async def request(self, method: bytes, authority: bytes, scheme: bytes, path: bytes,
                      headers: Headers, read_timeout: float | None,
                      head_only: int | None = None) -> Response:
        """One request without a body; `head_only`: that many bytes of the body are
        enough (the stream is reset if more come)."""
        if not self.usable:
            raise Unprocessed("the connection takes no new requests")
        sid = self._send_head(method, authority, scheme, path, headers)
        exchange = _Exchange(asyncio.get_running_loop().create_future(), head_only)
        self._exchanges[sid] = exchange
        self._flush()
        try:
            async with asyncio.timeout(read_timeout):
                await exchange.done
        except TimeoutError as exc:
            raise httpx.ReadTimeout("no answer in time") from exc
        finally:
            if self._exchanges.pop(sid, None) is not None:
                self._reset(sid)  # given up on (timeout, cancelled) or cut short
            self._close_if_drained()
        return Response(exchange.status, exchange.headers, content=bytes(exchange.body),
                        prefix=head_only is not None)

    def _send_head(self, method: bytes, authority: bytes, scheme: bytes, path: bytes,
                   headers: Headers) -> int:
        """Open a stream with these headers (and no body); its id. Apart from `request`:
        the header list is garbage once sent, not kept for as long as the answer takes
        (a long-poll's, per watched stream)."""
        sid: int = self._h2.get_next_available_stream_id()
        head = [(b":method", method), (b":scheme", scheme), (b":authority", authority),
                (b":path", path)]
        head += [(k.lower(), v) for k, v in headers if k.lower() not in _HOP_BY_HOP]
        try:
            self._h2.send_headers(sid, head, end_stream=True)  # counts `_exchanges`: first
        except h2.exceptions.ProtocolError as exc:
            raise httpx.LocalProtocolError(f"{type(exc).__name__}: {exc}") from exc
        return sid

    def close(self) -> None:
        self._closing = True
        if self.transport is not None:
            if self._started and not self.transport.is_closing():
                self._h2.close_connection()
                self._flush()
            self.transport.close()
        self._fail_all(httpx.ReadError("the connection was closed"))

    # -- asyncio.Protocol ------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        heard, self._heard = self._heard, True
        try:
            events = self._h2.receive_data(data)
        except h2.exceptions.ProtocolError as exc:
            if not self.ready.done() and not heard:
                self.ready.set_exception(NotHttp2(type(exc).__name__))
            self._broken(httpx.RemoteProtocolError(f"{type(exc).__name__}: {exc}"))
            return
        for event in events:
            self._on(event)
        self._flush()

    def eof_received(self) -> bool | None:
        self._broken(httpx.ReadError("the server closed the connection"))
        return None

    def connection_lost(self, exc: Exception | None) -> None:
        self._broken(httpx.ReadError(f"{type(exc).__name__}: {exc}" if exc
                                     else "the connection was closed"))

    # -- inside --------------------------------------------------------------------------------

    def _on(self, event: h2.events.Event) -> None:
        if isinstance(event, h2.events.RemoteSettingsChanged):
            if not self.ready.done():
                self.ready.set_result(None)
        elif isinstance(event, h2.events.ResponseReceived):
            exchange = self._exchanges.get(event.stream_id)
            if exchange is not None:
                self._take_head(exchange, event.headers)
        elif isinstance(event, h2.events.DataReceived):
            self._take_data(event)
        elif isinstance(event, h2.events.StreamEnded):
            self._settle(event.stream_id, None)
        elif isinstance(event, h2.events.StreamReset):
            unprocessed = event.error_code == h2.errors.ErrorCodes.REFUSED_STREAM
            kind = Unprocessed if unprocessed else httpx.RemoteProtocolError
            self._settle(event.stream_id, kind(f"the server reset the stream "
                                               f"({event.error_code!r})"))
        elif isinstance(event, h2.events.ConnectionTerminated):
            self._closing = True  # answers to the streams it processed may still come
            last = event.last_stream_id or 0
            for sid in [s for s in self._exchanges if s > last]:
                self._settle(sid, Unprocessed("the server went away (GOAWAY)"))
            self._close_if_drained()

    def _take_head(self, exchange: _Exchange, headers: Headers) -> None:
        for name, value in headers:
            if name == b":status":
                exchange.status = int(value)
            elif not name.startswith(b":"):
                exchange.headers.append((name, value))

    def _take_data(self, event: h2.events.DataReceived) -> None:
        sid = event.stream_id
        if event.flow_controlled_length:
            self._h2.acknowledge_received_data(event.flow_controlled_length, sid)
        exchange = self._exchanges.get(sid)
        if exchange is None or event.data is None:
            return
        exchange.body += event.data
        if exchange.head_only is not None and len(exchange.body) > exchange.head_only:
            self._settle(sid, None)  # enough: `request` resets the rest

    def _settle(self, sid: int, exc: Exception | None) -> None:
        exchange = self._exchanges.get(sid)
        if exchange is None or exchange.done.done():
            return
        if exc is None:
            if exchange.head_only is None or len(exchange.body) <= exchange.head_only:
                self._exchanges.pop(sid)  # whole: nothing to reset
            exchange.done.set_result(None)
        else:
            self._exchanges.pop(sid)
            exchange.done.set_exception(exc)

    def _reset(self, sid: int) -> None:
        if self.transport is None or self.transport.is_closing():
            return
        try:
            self._h2.reset_stream(sid, h2.errors.ErrorCodes.CANCEL)
        except h2.exceptions.ProtocolError:
            return  # closed already
        self._flush()

    def _close_if_drained(self) -> None:
        if self._closing and not self._exchanges and self.transport is not None:
            self.transport.close()

    def _broken(self, exc: Exception) -> None:
        self._closing = True
        if not self.ready.done():
            # Bytes, then closed: an HTTP/1.1 server's refusal of the preface.
            self.ready.set_exception(NotHttp2("closed") if self._heard else exc)
        self._fail_all(exc)
        if self.transport is not None:
            self.transport.close()

    def _fail_all(self, exc: Exception) -> None:
        for sid in list(self._exchanges):
            self._settle(sid, exc)
        if not self.ready.done():
            self.ready.set_exception(exc)

    def _flush(self) -> None:
        if not self._started or self.transport is None or self.transport.is_closing():
            return
        data = self._h2.data_to_send()
        if data:
            self.transport.write(data)
