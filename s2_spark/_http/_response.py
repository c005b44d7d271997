"""A response as the protocol clients read it: status, headers, a body read whole or in
pieces, decoded per its Content-Encoding.

Smaller than httpx's `Response` (which costs more to build than a small request's own
parsing): headers are decoded on first use, and nothing else is done per response.

Every path of the seam (the threads' `HttpClient`, a read session's `StreamedGets`, the
asyncio `AsyncConnection` of the tail watch and the fan-out, HTTP/2's `H2Connection`)
hands its bodies to `Response`, which decodes them here and nowhere else: a whole body
through `decoded_body`, a streamed one through `iter_bytes`, both with `BodyDecoder`.
S2 compresses answers of 1 KiB or more when asked to (zstd or gzip, by Accept-Encoding);
an answer without a Content-Encoding costs one look at each header's name. A body that
does not decode, or decodes to more than the most held at once (`MAX_BODY_BYTES` whole,
`MAX_DECODED_PIECE` a piece: a few KB of zstd decode to 256 MiB), raises
`BodyDecodingError`, never a parse error further on.
"""

from __future__ import annotations

import asyncio
import json
import zlib
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import httpx

__all__ = ["MAX_BODY_BYTES", "MAX_DECODED_PIECE", "BodyDecoder", "BodyDecodingError",
           "BodyTooLargeError", "Done", "Headers", "Response", "body_limit", "content_encoding",
           "decoded_body", "settle"]

Chunks = Iterator[bytes]

#: The largest body held whole, as it came and decoded (the HTTP/1.1 and HTTP/2 readers,
#: the unary path): twice S2's largest answer (a read of 1 MiB of records, as JSON with
#: base64 bodies); a body without end, or that decodes without end, fails here instead of
#: growing the process. Longer answers are read as they come (read sessions, Durable
#: Streams' catch-up reads in pieces).
MAX_BODY_BYTES = 4 << 20


def body_limit(max_body: int = MAX_BODY_BYTES) -> str:
    """A body limit as errors name it."""
    if max_body == MAX_BODY_BYTES:
        return f"{max_body} bytes (MAX_BODY_BYTES)"
    return f"{max_body} bytes (the most this request takes)"


#: The most one piece of a streamed body decodes to (a piece is what one read of the
#: socket gave: up to about 1 MiB, compressed 50 times at the most by real encoders).
MAX_DECODED_PIECE = 64 << 20
#: Input bytes zstd is given at a time: each block takes 4 bytes at least and decodes to
#: 128 KiB at most, so a slice decodes to a bounded amount (zlib bounds its output itself).
_ZSTD_SLICE = 128


class Headers(Mapping[str, str]):
    """Response headers by lower-case name (repeated ones joined by ", ", as httpx does)."""

    __slots__ = ("_map", "_raw")

    def __init__(self, raw: list[tuple[bytes, bytes]]) -> None:
        self._raw = raw
        self._map: dict[str, str] | None = None

    @property
    def raw(self) -> list[tuple[bytes, bytes]]:
        """The headers as they came, in order."""
        return self._raw

    def _decoded(self) -> dict[str, str]:
        if self._map is None:
            out: dict[str, str] = {}
            for k, v in self._raw:
                name, value = k.decode("latin-1").lower(), v.decode("latin-1")
                out[name] = f"{out[name]}, {value}" if name in out else value
            self._map = out
        return self._map

    def __getitem__(self, name: str) -> str:
        return self._decoded()[name.lower()]

    def get(self, name: str, default: Any = None) -> Any:
        return self._decoded().get(name.lower(), default)

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and name.lower() in self._decoded()

    def __iter__(self) -> Iterator[str]:
        return iter(self._decoded())

    def __len__(self) -> int:
        return len(self._decoded())

    def __repr__(self) -> str:
        return f"Headers({sorted(self._decoded())})"  # names only: values may be secrets


class BodyDecodingError(httpx.DecodingError):
    """A response body that does not decode by its Content-Encoding: corrupt, cut short,
    or in an encoding this client does not take. Never retried by the seam; the protocol
    clients raise it as their own typed error (asking again would most likely get the
    same body)."""

    def __init__(self, message: str, *, encoding: str, status: int) -> None:
        super().__init__(message)
        self.encoding = encoding
        self.status = status


class BodyTooLargeError(BodyDecodingError):
    """An answer's body over the most its request takes (`limit` bytes, as it came or
    decoded). The server's doing, not the network's: asking again gets the same body, so
    it is never retried; the protocol clients name the setting that raises the limit,
    where there is one."""

    def __init__(self, limit: int, *, status: int = 0, length: int | None = None) -> None:
        what = "a body" if length is None else f"a body of {length} bytes,"
        super().__init__(f"{what} over {body_limit(limit)}", encoding="", status=status)
        self.limit = limit


#: The codings a body may come in, each with how to make its decompressor.
_DECOMPRESSORS: dict[str, Callable[[], Any]] = {
    "gzip": lambda: zlib.decompressobj(zlib.MAX_WBITS | 16),
    "x-gzip": lambda: zlib.decompressobj(zlib.MAX_WBITS | 16),
    "deflate": zlib.decompressobj,
    "zstd": lambda: _zstd().decompressobj(),
}
_ZSTD: list[Any] = []
_ZLIB = type(zlib.decompressobj())


def _zstd() -> Any:
    """One zstd decompression context for the process (made on first use)."""
    if not _ZSTD:
        import zstandard

        _ZSTD.append(zstandard.ZstdDecompressor())
    return _ZSTD[0]


def content_encoding(headers: list[tuple[bytes, bytes]]) -> str:
    """A response's Content-Encoding as sent, lower-cased ("" when there is none): a look
    at each header's name length, so an answer without one costs next to nothing."""
    for name, value in headers:
        if len(name) == 16 and name.lower() == b"content-encoding":
            coding = value.decode("latin-1").strip().lower()
            return "" if coding == "identity" else coding
    return ""


class BodyDecoder:
    """Undoes a Content-Encoding (gzip, deflate, zstd; a list of them applied in turn),
    piece by piece: `decode` each piece as it arrives (to at most `limit` bytes), `finish`
    once the body ended (a body cut short fails there). A gzip body of several members, or
    a zstd one of several frames, decodes whole."""

    __slots__ = ("_encoding", "_fed", "_limit", "_makers", "_objs", "_status")

    def __init__(self, encoding: str, status: int = 0, limit: int = MAX_DECODED_PIECE) -> None:
        self._encoding = encoding
        self._status = status
        self._limit = limit
        codings = [c.strip() for c in encoding.split(",")]
        codings = [c for c in codings if c and c != "identity"]
        unknown = [c for c in codings if c not in _DECOMPRESSORS]
        if unknown:
            raise self._error(f"it is in Content-Encoding {unknown[0]!r}, which this client "
                              "does not take (it asks for zstd, gzip or deflate only)")
        # Applied last first: "gzip, zstd" was gzipped, then zstd-compressed.
        self._makers = [_DECOMPRESSORS[c] for c in reversed(codings)]
        self._objs = [make() for make in self._makers]
        self._fed = [False] * len(self._objs)

    def _error(self, what: str) -> BodyDecodingError:
        return BodyDecodingError(f"the response body (HTTP {self._status}) could not be "
                                 f"decoded: {what}", encoding=self._encoding,
                                 status=self._status)

    def decode(self, data: bytes | memoryview) -> bytes:
        out: bytes | memoryview = data
        for i in range(len(self._objs)):
            out = self._step(i, out)
        return bytes(out)

    def _step(self, i: int, data: bytes | memoryview) -> bytes:
        """Data through the i-th decompressor (a new one for each member or frame), to at
        most `limit` bytes."""
        parts = []
        size = 0
        rest = memoryview(data)
        while rest:
            obj = self._objs[i]
            if obj.eof:
                obj = self._objs[i] = self._makers[i]()
            self._fed[i] = True
            zstd = not isinstance(obj, _ZLIB)
            take, rest = (rest[:_ZSTD_SLICE], rest[_ZSTD_SLICE:]) if zstd else (rest, rest[:0])
            try:
                out = obj.decompress(take) if zstd else obj.decompress(take,
                                                                       self._limit - size + 1)
            except Exception as exc:  # zlib.error, zstandard.ZstdError
                raise self._error(f"corrupt {self._encoding} data ({exc})") from exc
            size += len(out)
            if size > self._limit:
                raise self._error(f"it decodes to more than {self._limit} bytes")
            parts.append(out)
            if obj.eof and obj.unused_data:
                rest = memoryview(obj.unused_data + rest)
        return b"".join(parts)

    def finish(self) -> None:
        """The body ended: fail if it ended inside a member or frame."""
        for obj, fed in zip(self._objs, self._fed, strict=True):
            if fed and not obj.eof:
                raise self._error(f"the {self._encoding} data ends before its end "
                                  "(the body was cut short)")


def decoded_body(status: int, headers: list[tuple[bytes, bytes]], body: bytes, *,
                 prefix: bool = False, limit: int = MAX_BODY_BYTES) -> bytes:
    """`body` decoded by the response's Content-Encoding, to at most `limit` bytes: the one
    place every whole body read by the seam goes through (`Response` calls it). `prefix`:
    the body is only its first bytes (a poll that needs no more), decoded as far as they
    go."""
    encoding = content_encoding(headers)
    if not encoding:
        return body
    decoder = BodyDecoder(encoding, status, limit)
    out = decoder.decode(body)
    if not prefix:
        decoder.finish()
    return out


class Response:
    """One response. A streamed one must be read or closed (`with` closes it).

    `content` is the body as it came; it is decoded here (`decoded_body`, to at most
    `limit` bytes), so `content` is always the decoded body. `prefix`: `content` is only
    the body's first bytes."""

    __slots__ = ("_chunks", "_close", "_content", "headers", "status_code")

    def __init__(self, status_code: int, headers: list[tuple[bytes, bytes]], *,
                 content: bytes | None = None, chunks: Chunks | None = None,
                 close: Callable[[], None] | None = None, prefix: bool = False,
                 limit: int = MAX_BODY_BYTES) -> None:
        self.status_code = status_code
        self.headers = Headers(headers)
        self._content = (content if content is None or not headers
                         else decoded_body(status_code, headers, content, prefix=prefix,
                                           limit=limit))
        self._chunks = chunks
        self._close = close

    def __repr__(self) -> str:
        return f"<Response [{self.status_code}]>"

    def __enter__(self) -> Response:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def is_success(self) -> bool:
        return 200 <= self.status_code < 300

    @property
    def content(self) -> bytes:
        """The decoded body (after `read()` for a streamed response)."""
        if self._content is None:
            raise httpx.ResponseNotRead()
        return self._content

    @property
    def text(self) -> str:
        return self.content.decode("utf-8")

    def json(self) -> Any:
        return json.loads(self.content)

    def read(self) -> bytes:
        """Read the rest of the body, decoded (an error's, mostly), to `MAX_BODY_BYTES`."""
        if self._content is None:
            parts, size = [], 0
            for piece in self.iter_bytes():
                parts.append(piece)
                size += len(piece)
                if size > MAX_BODY_BYTES:
                    parts.clear()  # not kept alive by the error's traceback
                    self.close()
                    raise BodyTooLargeError(MAX_BODY_BYTES, status=self.status_code)
            self._content = b"".join(parts)
        return self._content

    def iter_raw(self) -> Chunks:
        """The body as it arrives, still in its Content-Encoding (`iter_bytes` decodes)."""
        chunks, self._chunks = self._chunks, None
        if chunks is None:
            raise httpx.StreamConsumed()
        try:
            yield from chunks
        finally:
            self.close()

    def iter_bytes(self, chunk_size: int | None = None) -> Chunks:
        """The body decoded, in pieces of `chunk_size` bytes (the last may be shorter) or
        as it arrives (then, where nothing needs decoding, the pieces as they came: views
        stay views). S2S frames carry their own compression besides: a session's frames
        come out of here as the server framed them."""
        if self._content is not None:
            pieces: Chunks = iter([self._content])
        else:
            encoding = content_encoding(self.headers.raw)
            pieces = (self.iter_raw() if not encoding
                      else _decoding(self.iter_raw(), BodyDecoder(encoding, self.status_code)))
        if chunk_size is None:
            for data in pieces:
                if data:
                    yield data
            return
        pending = b""
        for data in pieces:
            pending += data
            at = 0
            while len(pending) - at >= chunk_size:
                yield pending[at:at + chunk_size]
                at += chunk_size
            pending = pending[at:]
        if pending:
            yield pending

    def close(self) -> None:
        close, self._close = self._close, None
        if close is not None:
            close()


def _decoding(raw: Chunks, decoder: BodyDecoder) -> Chunks:
    for data in raw:
        yield decoder.decode(data)
    decoder.finish()


#: How a request sent by callback answers: called once, on the event loop, with the
#: answer or the exception the request failed with.
Done = Callable[[Response | Exception], None]


def settle(answer: asyncio.Future[Response]) -> Done:
    """A `Done` that resolves `answer` (unless it was cancelled): a callback-driven
    `send`, awaited."""
    def done(result: Response | Exception) -> None:
        if not answer.done():
            if isinstance(result, Exception):
                answer.set_exception(result)
            else:
                answer.set_result(result)

    return done
