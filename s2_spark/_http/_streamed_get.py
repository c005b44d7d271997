"""A streamed GET read straight off a socket of its own: what S2S read sessions run on.

A catch-up read streams its body as fast as the server sends it. Through httpcore and
h11 every socket read cost a new 1 MiB bytes object (mapped anew by malloc: a page fault
per 4 KiB), a copy into h11's receive buffer, one out of it per chunk and httpcore's copy
of each chunk: in a Spark worker about half of the read's CPU. Here a connection reads
with `recv_into` into a few buffers it keeps and hands the body out as memoryviews into
them (de-chunked by `_h1.BodyReader`); a buffer is read into again only once no view of
it is alive, so a view stays valid for as long as it is held.

Direct routes only (through a proxy, requests keep to httpcore). What the rest of the seam
keeps holds here too: TLS with the client's context (private CAs, client certificates),
connect and read timeouts, httpx's exception types (TLS failures chained, so
`transport_error` tells them apart), `Exchange` notes, and idle connections kept for the
next request to the origin (a kept one found dead before any answer is replaced once:
a GET can be sent again).
"""

from __future__ import annotations

import contextlib
import socket
import ssl
import threading
from collections.abc import Callable, Generator, Iterator
from typing import Any, NoReturn, cast

import httpx

from ._exchange import Exchange
from ._h1 import BodyReader, ResponseReader, body_framing, request_head
from ._response import Response

__all__ = ["StreamedGets"]

Headers = list[tuple[bytes, bytes]]
#: Bytes per socket read; buffers kept per connection.
READ_SIZE = 1 << 20
KEEP_BUFFERS = 4
#: Idle connections kept per origin.
KEEP_IDLE = 4


class _Connection:
    """A socket and the buffers it reads into."""

    __slots__ = ("_buffers", "sock")

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self._buffers: list[bytearray] = []

    def buffer(self) -> bytearray:
        """A kept buffer no view is held on (a new one when all are)."""
        for buf in self._buffers:
            try:
                buf.append(0)  # resizing fails while a view of it is alive
            except BufferError:
                continue
            del buf[-1]
            return buf
        buf = bytearray(READ_SIZE)
        if len(self._buffers) < KEEP_BUFFERS:
            self._buffers.append(buf)
        return buf

    def close(self) -> None:
        self.sock.close()


class StreamedGets:
    """Streamed GETs to direct origins, their idle connections kept per origin."""

    def __init__(self, ssl_context: Callable[[], ssl.SSLContext]) -> None:
        self._ssl_context = ssl_context
        self._idle: dict[tuple[str, str, int], list[_Connection]] = {}
        self._lock = threading.Lock()

    def get(self, scheme: str, host: str, port: int, target: bytes, headers: Headers, *,
            timeout: dict[str, float | None], trace: Exchange | None) -> Response:
        """Send GET `target` (its Host header among `headers`) and return the response,
        its body streamed (chunks are memoryviews)."""
        key = (scheme, host, port)
        head = request_head(b"GET", target, headers)
        url = f"{scheme}://{host}:{port}{target.decode('latin-1')}"
        conn = self._take(key)
        if conn is not None:
            try:
                return self._exchange(key, conn, head, url, timeout, trace, new=False)
            except (httpx.ReadError, httpx.WriteError, httpx.RemoteProtocolError) as exc:
                if getattr(exc, "answered", True):
                    raise
                # A kept connection the server had closed: once more on a new one.
        conn = self._connect(scheme, host, port, url, timeout)
        return self._exchange(key, conn, head, url, timeout, trace, new=True)

    def close(self) -> None:
        with self._lock:
            conns = [c for kept in self._idle.values() for c in kept]
            self._idle.clear()
        for conn in conns:
            conn.close()

    def _take(self, key: tuple[str, str, int]) -> _Connection | None:
        with self._lock:
            kept = self._idle.get(key)
            return kept.pop() if kept else None

    def _keep(self, key: tuple[str, str, int], conn: _Connection) -> None:
        with self._lock:
            kept = self._idle.setdefault(key, [])
            if len(kept) < KEEP_IDLE:
                kept.append(conn)
                return
        conn.close()

    def _connect(self, scheme: str, host: str, port: int, url: str,
                 timeout: dict[str, float | None]) -> _Connection:
        with _mapped(httpx.ConnectTimeout, httpx.ConnectError, url):
            sock = socket.create_connection((host, port), timeout=timeout.get("connect"))
        with _mapped(httpx.ConnectTimeout, httpx.ConnectError, url, sock.close):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if scheme == "https":  # ssl.SSLError is an OSError
                sock = self._ssl_context().wrap_socket(sock, server_hostname=host)
        return _Connection(sock)

    def _exchange(self, key: tuple[str, str, int], conn: _Connection, head: bytes, url: str,
                  timeout: dict[str, float | None], trace: Exchange | None, *,
                  new: bool) -> Response:
        """Send the request on `conn`, read the answer's head; the body streams on."""
        if trace is not None:
            trace.used, trace.new_connection = True, new
        with _mapped(httpx.WriteTimeout, httpx.WriteError, url, conn.close, answered=False):
            conn.sock.settimeout(timeout.get("write"))
            conn.sock.sendall(head)
        if trace is not None:
            trace.headers_sent = trace.sent = True
        conn.sock.settimeout(timeout.get("read"))
        reader = ResponseReader(head_request=True)  # the head only: the body streams
        while not reader.done:
            data = _recv(conn, url, answered=False)
            try:
                reader.feed(data)
            except httpx.RemoteProtocolError as exc:
                conn.close()
                exc.answered = True  # type: ignore[attr-defined]
                raise
        if trace is not None:
            trace.response_started = True
        no_body = reader.status in (204, 304)
        kind, length = ("none", 0) if no_body else body_framing(reader.headers)
        body = BodyReader(kind, length)
        keep = reader.keep_alive and kind != "eof"
        released = False

        def release() -> None:
            """Keep the connection if the whole answer was read off it, else close it."""
            nonlocal released
            if not released:
                released = True
                if keep and body.done and not body.leftover:
                    self._keep(key, conn)
                else:
                    conn.close()

        chunks = _body(conn, body, memoryview(reader.leftover), url, release)

        def close() -> None:
            chunks.close()
            release()

        # Views stand in for bytes: the callers that ask for them take either.
        return Response(reader.status, reader.headers, chunks=cast(Iterator[bytes], chunks),
                        close=close)


def _body(conn: _Connection, body: BodyReader, first: memoryview, url: str,
          release: Callable[[], None]) -> Generator[memoryview, None, None]:
    """The body's bytes, then `release` (also when the reader stops early: a session
    stopped at its count has often read the body's end already)."""
    try:
        yield from body.feed(first)
        while not body.done:
            buf = conn.buffer()
            n = _recv_into(conn, buf, url)
            if not n:
                body.closed()
                break
            yield from body.feed(memoryview(buf)[:n])
    finally:
        release()


def _recv(conn: _Connection, url: str, *, answered: bool) -> bytes:
    with _mapped(httpx.ReadTimeout, httpx.ReadError, url, conn.close, answered=answered):
        data = conn.sock.recv(65536)
    if not data:
        conn.close()
        err = httpx.RemoteProtocolError("the server closed the connection without an answer",
                                        request=httpx.Request("GET", url))
        err.answered = answered  # type: ignore[attr-defined]
        raise err
    return data


def _recv_into(conn: _Connection, buf: bytearray, url: str) -> int:
    with _mapped(httpx.ReadTimeout, httpx.ReadError, url):
        n = conn.sock.recv_into(buf)
    return n


@contextlib.contextmanager
def _mapped(timed_out: type[httpx.TransportError], failed: type[httpx.TransportError],
            url: str, close: Callable[[], None] | None = None, *,
            answered: bool = True) -> Iterator[None]:
    """Socket failures as httpx's `timed_out` or `failed` (`_raise`), after `close`."""
    try:
        yield
    except OSError as exc:  # TimeoutError and ssl.SSLError included
        if close is not None:
            close()
        if isinstance(exc, TimeoutError):
            _raise(timed_out, exc, url)
        _raise(failed, exc, url, answered=answered)


def _raise(kind: type[httpx.TransportError], exc: BaseException, url: str, *,
           answered: bool = True) -> NoReturn:
    """Raise `exc` as httpx's `kind` (chained, as httpcore's are: TLS problems show
    through); `answered` False: it failed before any byte of an answer arrived."""
    err: Any = kind(str(exc) or type(exc).__name__, request=httpx.Request("GET", url))
    err.answered = answered
    raise err from exc
