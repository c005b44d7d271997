"""HTTP/1.1 for a client that sends one request at a time on a connection: the request's
head as bytes, and an incremental reader of the response (no I/O).

What `AsyncConnection` speaks for the tail watch's long-polls and the fan-out's small
requests, thousands a second: h11 does the same with events, state machines and header
validation on both directions, about half of such a request's client CPU. This reads what
a client needs of RFC 9112: a status line, header fields, and a body framed by
`Transfer-Encoding: chunked`, by `Content-Length` or by the connection's close; informational
(1xx) answers skipped; no body for HEAD, 204 and 304. Anything else is refused with
`httpx.RemoteProtocolError`, the error h11 raises through httpx (a body over its limit with
`BodyTooLargeError`, which is never retried), and the connection is then dropped: a
malformed answer never leaves a connection in doubt. `BodyReader` reads a body
too long to hold (a read session's, `_streamed_get`) as views into what arrived.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import httpx

from s2_spark.wire._accelerator import fastwire

from ._response import MAX_BODY_BYTES, BodyTooLargeError

__all__ = ["MAX_HEAD_BYTES", "BodyReader", "ResponseReader", "body_framing", "request_head"]

#: The most a response's head (status line and header fields) may take; also the most its
#: informational heads before it, and its trailer section, may take together.
MAX_HEAD_BYTES = 64 * 1024
_MAX_CHUNK_LINE = 4096
#: A control character in a head, or a CR or LF not in a CRLF: h11 takes a bare LF as a
#: line's end, where a reader that did not would see one line where h11 sees two.
_BAD_HEAD_BYTE = re.compile(rb"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]|\r(?!\n)|(?<!\r)\n")
#: Every byte but the control characters: what is left of a sound head without them is
#: its CRLFs (a check that costs a tenth of the search above).
_NOT_CONTROL = bytes(b for b in range(256) if (b >= 0x20 and b != 0x7f) or b == 0x09)
_CRLF = b"\r\n"
_TOKEN = (b"!#$%&'*+-.^_`|~0123456789abcdefghijklmnopqrstuvwxyz"
          b"ABCDEFGHIJKLMNOPQRSTUVWXYZ")
#: `_fastwire.h1_response` (None without the C decoders): a whole plain answer (a final
#: status, a Content-Length body or none) read in one call, None for anything else, which
#: the Python steps below then read (so theirs are the only errors). Fuzzed against them.
FastAnswer = Callable[[bytearray, int, int, bool], "tuple[Any, ...] | None"]
fast_answer: FastAnswer | None = None if fastwire is None else fastwire.h1_response
#: Header fields as sent, by the fields: the same few sets go out thousands of times.
_FIELDS: dict[tuple[tuple[bytes, bytes], ...], bytes] = {}
_FIELDS_KEPT = 256


def request_head(method: bytes, target: bytes, headers: list[tuple[bytes, bytes]]) -> bytes:
    """The request line and header fields, ready to send before the body. Names and values
    come from the clients' own code (never from a response), so only line breaks are
    refused: they would end the head early."""
    key = tuple(headers)
    fields = _FIELDS.get(key)
    if fields is None:
        lines = []
        for name, value in headers:
            if b"\r" in value or b"\n" in value or b"\r" in name or b"\n" in name:
                raise ValueError(f"header {name!r} holds a line break")
            lines.append(name + b": " + value + b"\r\n")
        fields = b"".join(lines)
        if len(_FIELDS) >= _FIELDS_KEPT:
            _FIELDS.clear()
        _FIELDS[key] = fields
    return b"%s %s HTTP/1.1\r\n%s\r\n" % (method, target, fields)


def _error(what: str) -> httpx.RemoteProtocolError:
    return httpx.RemoteProtocolError(f"malformed HTTP/1.1 response: {what}")


class ResponseReader:
    """One response, fed as it arrives (`feed`); `done` once it is whole.

    `head_request`: the request was HEAD (no body follows). `head_only`: the body's first
    `head_only` bytes are enough (the connection is then not reused). A body past
    `max_body` (`MAX_BODY_BYTES`): `BodyTooLargeError`; informational heads or trailers
    past `MAX_HEAD_BYTES`: a protocol error; never a reader that grows or turns without
    end. After `done`: `status`, `headers` (as they came, names lower-case), `body`, and
    `keep_alive` (whether the connection may carry the next request), and `leftover`: bytes
    after the response, which a server may not send before the next request (the caller
    drops the connection when there are any).
    """

    __slots__ = ("_buf", "_chunked", "_head_only", "_head_request", "_left", "_max_body",
                 "_parts", "_size", "_state", "body", "done", "headers", "keep_alive",
                 "status")

    def __init__(self, *, head_request: bool = False, head_only: int | None = None,
                 max_body: int = MAX_BODY_BYTES) -> None:
        self._head_request = head_request
        self._head_only = head_only
        self._max_body = max_body
        self._buf = bytearray()
        self._state = "head"  # head, length, chunk-size, chunk-data, chunk-end, trailers, eof
        # Bytes of body (or of the chunk) still to come; in "head" and "trailers", the
        # bytes of head or trailers still allowed.
        self._left = MAX_HEAD_BYTES
        self._parts: list[bytes] = []
        self._size = 0
        self._chunked = False
        self.status = 0
        self.headers: list[tuple[bytes, bytes]] = []
        self.keep_alive = False
        self.body = b""
        self.done = False

    @property
    def leftover(self) -> bytes:
        """(Once `done`) the bytes that came after the response."""
        return bytes(self._buf) if self.done else b""

    def feed(self, data: bytes) -> None:
        """Take the next bytes of the connection (b"" when it closed)."""
        if self.done:
            self._buf += data
            return
        if not data:
            self._closed()
            return
        self._buf += data
        while not self.done and self._step():
            pass

    def rest(self) -> bytearray:
        """(Once `done`) the bytes after the response, handed over, not copied: the next
        response's on a connection that pipelines (`adopt`)."""
        buf, self._buf = self._buf, bytearray()
        return buf

    def adopt(self, buf: bytearray) -> None:
        """Take `buf` (another reader's `rest`) as the first bytes of this response,
        without copying them: answers that came together are read in one pass."""
        self._buf = buf
        while not self.done and buf and self._step():
            pass

    def _closed(self) -> None:
        if self._state == "eof":
            self._finish(keep_alive=False)
            return
        raise _error("the connection closed before the response ended")

    def _step(self) -> bool:
        """One step of the state machine; whether it made progress."""
        state = self._state
        if state == "head":
            return self._read_head()
        if state in ("length", "chunk-data", "eof"):
            return self._read_body()
        if state == "chunk-size":
            return self._read_chunk_size()
        if state == "chunk-end":
            return self._read_chunk_end()
        return self._read_trailers()

    def _line(self, limit: int) -> bytes | None:
        """The next CRLF-terminated line, without its CRLF (None: not all here yet)."""
        end = self._buf.find(b"\r\n", 0, limit + 2)
        if end < 0:
            if len(self._buf) > limit:
                raise _error("a line is too long")
            return None
        line = bytes(self._buf[:end])
        del self._buf[:end + 2]
        return line

    def _read_head(self) -> bool:
        fast = fast_answer
        if fast is not None and self._head_only is None:
            got = fast(self._buf, self._left, self._max_body, self._head_request)
            if got is not None:
                self.status, self.headers, self.keep_alive, self.body, end = got
                del self._buf[:end]
                self.done = True
                return False
        end = self._buf.find(b"\r\n\r\n")
        if end < 0:
            if len(self._buf) > self._left:
                raise _error(f"the head is over MAX_HEAD_BYTES ({MAX_HEAD_BYTES} bytes)")
            return False
        if end + 4 > self._left:
            raise _error(f"the head is over MAX_HEAD_BYTES ({MAX_HEAD_BYTES} bytes)")
        self._left -= end + 4
        head = bytes(self._buf[:end])
        del self._buf[:end + 4]
        lines = head.split(b"\r\n")
        if head.translate(None, _NOT_CONTROL) != _CRLF * (len(lines) - 1):
            bad = _BAD_HEAD_BYTE.search(head)  # which, for the message
            assert bad is not None
            raise _error(f"byte {bad.group()!r} in the head at {bad.start()}")
        version, status = _status_line(lines[0])
        headers = [_field(line) for line in lines[1:]]
        if 100 <= status < 200:
            if status == 101:
                raise _error("a protocol switch was not asked for")
            return True  # informational: the real response follows
        self.status, self.headers = status, headers
        self.keep_alive = version == b"1.1" and not _has_token(headers, b"connection", b"close")
        self._frame_body(headers)
        return True

    def _frame_body(self, headers: list[tuple[bytes, bytes]]) -> None:
        """How the body is delimited (`body_framing`)."""
        if self._head_request or self.status in (204, 304):
            self._finish(self.keep_alive)
            return
        kind, length = body_framing(headers)
        if kind == "chunked":
            self._chunked = True
            self._state = "chunk-size"
        elif kind == "length":
            if length > self._max_body and self._head_only is None:
                raise BodyTooLargeError(self._max_body, status=self.status, length=length)
            self._left = length
            self._state = "length"
            if self._left == 0:
                self._finish(self.keep_alive)
        else:
            self._state = "eof"
            self.keep_alive = False

    def _read_body(self) -> bool:
        if not self._buf:
            return False
        take = len(self._buf) if self._state == "eof" else min(self._left, len(self._buf))
        self._take(bytes(self._buf[:take]))
        del self._buf[:take]
        if self.done:
            return False
        if self._state == "eof":
            return False
        self._left -= take
        if self._left:
            return False
        if self._state == "length":
            self._finish(self.keep_alive)
            return False
        self._state = "chunk-end"
        return True

    def _take(self, part: bytes) -> None:
        if part:
            self._parts.append(part)
            self._size += len(part)
        if self._head_only is not None and self._size >= self._head_only:
            self._finish(keep_alive=False)
        elif self._size > self._max_body:
            self._parts.clear()  # not kept alive by the error's traceback
            raise BodyTooLargeError(self._max_body, status=self.status)

    def _read_chunk_size(self) -> bool:
        line = self._line(_MAX_CHUNK_LINE)
        if line is None:
            return False
        size = _chunk_size(line)
        self._state, self._left = ("chunk-data", size) if size else ("trailers", MAX_HEAD_BYTES)
        return True

    def _read_chunk_end(self) -> bool:
        if len(self._buf) < 2:
            return False
        if self._buf[:2] != b"\r\n":
            raise _error("a chunk does not end with CRLF")
        del self._buf[:2]
        self._state = "chunk-size"
        return True

    def _read_trailers(self) -> bool:
        line = self._line(MAX_HEAD_BYTES)
        if line is None:
            return False
        self._left -= len(line) + 2
        if self._left < 0:
            raise _error(f"trailers over MAX_HEAD_BYTES ({MAX_HEAD_BYTES} bytes)")
        if line:
            _field(line)  # a trailer field: checked, then ignored
            return True
        self._finish(self.keep_alive)
        return False

    def _finish(self, keep_alive: bool) -> None:
        self.keep_alive = keep_alive
        self.body = b"".join(self._parts) if len(self._parts) != 1 else self._parts[0]
        self.done = True  # what follows stays in `_buf` (`leftover`, `rest`)


def body_framing(headers: list[tuple[bytes, bytes]]) -> tuple[str, int]:
    """How a response body (one that has a body) is delimited (RFC 9112 section 6.3):
    ("chunked", 0), ("length", N), or ("eof", 0): it runs to the connection's close."""
    codings = [v for k, v in headers if k == b"transfer-encoding"]
    if codings:
        last = b",".join(codings).split(b",")[-1].strip().lower()
        return ("chunked", 0) if last == b"chunked" else ("eof", 0)
    lengths = {v.strip() for k, v in headers if k == b"content-length"}
    if not lengths:
        return "eof", 0
    if len(lengths) != 1:
        raise _error("Content-Length values differ")
    raw = lengths.pop()
    if not raw.isdigit() or len(raw) > 18:
        raise _error(f"Content-Length {raw[:20]!r} is not a length")
    return "length", int(raw)


def _chunk_size(line: bytes) -> int:
    """The size on a chunk-size line (extensions after `;` ignored)."""
    size = line.split(b";", 1)[0].strip()
    if not size or len(size) > 15 or any(c not in b"0123456789abcdefABCDEF" for c in size):
        raise _error(f"chunk size {size[:20]!r} is not hexadecimal")
    return int(size, 16)


def _status_line(line: bytes) -> tuple[bytes, int]:
    """(version, status) of `HTTP/1.x NNN reason`."""
    if not line.startswith(b"HTTP/1.") or len(line) < 12 or line[8:9] != b" ":
        raise _error(f"status line {line[:40]!r}")
    version, code = line[5:8], line[9:12]
    if version not in (b"1.0", b"1.1") or not code.isdigit() or line[12:13] not in (b"", b" "):
        raise _error(f"status line {line[:40]!r}")
    return version, int(code)


def _field(line: bytes) -> tuple[bytes, bytes]:
    """A header field line as (lower-case name, value without surrounding spaces)."""
    name, colon, value = line.partition(b":")
    if not colon or not name or name.translate(None, _TOKEN):
        raise _error(f"header field {line[:40]!r}")
    return name.lower(), value.strip(b" \t")


def _has_token(headers: list[tuple[bytes, bytes]], name: bytes, token: bytes) -> bool:
    return any(token in (t.strip().lower() for t in v.split(b","))
               for k, v in headers if k == name)


#: Bytes of a line `BodyReader` looks at per step (a chunk-size line is a few).
_LINE_STEP = 64


class BodyReader:
    """A response body as it arrives, for a body too long to hold (a read session's):
    `feed` takes the next received bytes as a memoryview and returns the body's bytes
    among them as views into it (nothing copied but chunk-size lines); `done` once the
    body ended, then `leftover`: how many fed bytes came after it. `closed()`: the
    connection ended, which ends an ("eof") body and is an error for any other.
    `kind`, `length`: as `body_framing` gives them (or "none" for no body).
    """

    __slots__ = ("_chunked", "_left", "_line", "_state", "done", "leftover")

    def __init__(self, kind: str, length: int = 0) -> None:
        self._chunked = kind == "chunked"
        self._line = bytearray()
        self._left = length if kind == "length" else -1  # -1: to the close
        self._state = {"chunked": "size", "none": "end"}.get(kind, "data")
        self.done = kind == "none" or (kind == "length" and length == 0)
        self.leftover = 0

    def feed(self, data: memoryview) -> list[memoryview]:
        out: list[memoryview] = []
        pos, n = 0, len(data)
        while pos < n and not self.done:
            if self._state == "data":
                take = n - pos if self._left < 0 else min(self._left, n - pos)
                out.append(data[pos:pos + take])
                pos += take
                if self._left > 0:
                    self._left -= take
                    if not self._left:
                        self._chunk_ended()
                continue
            line, pos = self._next_line(data, pos)
            if line is not None:
                self._on_line(line)
        self.leftover += n - pos
        return out

    def closed(self) -> None:
        if self._left < 0 and self._state == "data":
            self.done = True
            return
        if not self.done:
            raise _error("the connection closed before the response ended")

    def _chunk_ended(self) -> None:
        if self._chunked:
            self._state = "crlf"
        else:
            self.done = True

    def _next_line(self, data: memoryview, pos: int) -> tuple[bytes | None, int]:
        """The next CRLF-ended line (None: it goes on in the next input) and where the
        input after it starts; the line's bytes so far are held in `_line`."""
        n = len(data)
        while pos < n:
            start = len(self._line)
            self._line += data[pos:pos + _LINE_STEP]
            end = self._line.find(b"\r\n", max(start - 1, 0))
            if end >= 0:
                pos += end + 2 - start
                line = bytes(self._line[:end])
                self._line.clear()
                return line, pos
            if len(self._line) > (MAX_HEAD_BYTES if self._state == "trailers"
                                  else _MAX_CHUNK_LINE):
                raise _error("a line is too long")
            pos += min(_LINE_STEP, n - pos)
        return None, pos

    def _on_line(self, line: bytes) -> None:
        state = self._state
        if state == "crlf":
            if line:
                raise _error("a chunk does not end with CRLF")
            self._state = "size"
        elif state == "size":
            size = _chunk_size(line)
            self._state, self._left = ("data", size) if size else ("trailers", MAX_HEAD_BYTES)
        else:
            self._left -= len(line) + 2  # trailers: bounded as a head is
            if self._left < 0:
                raise _error(f"trailers over MAX_HEAD_BYTES ({MAX_HEAD_BYTES} bytes)")
            if line:
                _field(line)  # a field, checked, then ignored
            else:
                self.done = True
