"""s2-lite's HTTP compression, as an ASGI middleware around the local server's app.

s2-lite layers tower-http's `CompressionLayer` and `RequestDecompressionLayer` (0.7, zstd
and gzip built in) over its `/v1` routes (`lite/src/handlers/v1/mod.rs`). This does what
those layers do, so a client meets compressed answers here exactly where it would there:

* Answers are compressed by the request's Accept-Encoding (`preferred_coding`): the
  acceptable coding of highest q-value, zstd before gzip before identity at equal q,
  `*` standing for what is not named; nothing acceptable and identity refused (`q=0`)
  answers 406 (the handler has run: only the status changes). Compressed are answers of
  1024 bytes or more (by Content-Length; a streamed one of unknown length always), unless
  `text/event-stream` or `s2s/proto` (SSE and S2S sessions), or with a Content-Encoding or
  Content-Range of their own. A compressed answer names its Content-Encoding, gets `Vary:
  accept-encoding`, and loses Content-Length (so HTTP/1.1 sends it chunked) and
  Accept-Ranges. zstd at level 3 and gzip at level 6 (the libraries' defaults, which
  tower-http uses), streamed: a zstd frame without a content size, as s2-lite sends it.
* Request bodies in Content-Encoding `gzip` or `zstd` reach the app decompressed (and
  without that header); `identity` passes; any other coding is answered 415 with
  `Accept-Encoding: zstd,gzip` and no body. A corrupt one is a 400, and so is one past
  `MAX_UNARY_BODY` before or after decompression (s2-lite's body limit, and its words):
  `bad_proto` for a protobuf body, else `bad_json`. A body refused before its end (415,
  or too large as it came) is left unread and its HTTP/1.1 connection closed.

Only paths under `/v1` (s2-lite's `route_layer`); everything else passes untouched, and so
does a request that asks for no compression and sends none: one look at its headers.
Unlike s2-lite, a compressed request body is read whole before the app sees it (a unary
body: S2's SDKs never compress a session's).
"""

from __future__ import annotations

import zlib
from collections.abc import MutableMapping
from typing import Any

import zstandard

from s2_spark.testing.serving.asgi import (
    BODY_TOO_LARGE,
    MAX_UNARY_BODY,
    Receive,
    Scope,
    Send,
    closing,
    respond_json,
)
from s2_spark.testing.serving.counter import KindCounter

__all__ = ["MIN_COMPRESSED_SIZE", "HttpCompression", "preferred_coding"]

Headers = list[tuple[bytes, bytes]]
#: Answers smaller than this are never compressed (s2-lite's `SizeAbove::new(1024)`).
MIN_COMPRESSED_SIZE = 1024
#: Content types never compressed (s2-lite's `NotForContentType`, a prefix match).
_NOT_FOR = (b"text/event-stream", b"s2s/proto")
#: tower-http's order of preference at equal q-value, least preferred first.
_RANK = {"identity": 0, "gzip": 1, "zstd": 2}
_CODINGS = {"gzip": "gzip", "x-gzip": "gzip", "zstd": "zstd", "identity": "identity"}
#: What a 415 names as taken (tower-http's `AcceptEncoding::to_header_value`).
_TAKEN = b"zstd,gzip"
_ZSTD_LEVEL = 3
_GZIP_LEVEL = 6


def _qvalue(param: str) -> int | None:
    """A `q=...` parameter in thousandths (0 to 1, three decimals at most), None when it
    is not one: tower-http then drops the whole entry."""
    if len(param) < 3 or param[0] not in "qQ" or param[1] != "=" or param[2] not in "01":
        return None
    value, rest = (1000 if param[2] == "1" else 0), param[3:]
    if not rest:
        return value
    frac = rest[1:]
    if rest[0] != "." or len(frac) > 3 or any(c not in "0123456789" for c in frac):
        return None
    value += int(frac.ljust(3, "0")) if frac else 0
    return value if value <= 1000 else None


def _entries(values: list[str]) -> tuple[list[tuple[str, int]], int | None]:
    """The codings this server knows, as named with their q-values, and the first
    wildcard's q-value (None: no wildcard)."""
    named: list[tuple[str, int]] = []
    wildcard: int | None = None
    for value in values:
        for entry in value.split(","):
            coding, semi, param = entry.partition(";")
            coding = coding.strip()
            q = 1000 if not semi else _qvalue(param.strip())
            if q is None:
                continue
            if coding == "*":
                wildcard = q if wildcard is None else wildcard
            elif coding.lower() in _CODINGS:
                named.append((_CODINGS[coding.lower()], q))
    return named, wildcard


def _best(candidates: list[tuple[str, int]]) -> str | None:
    """The acceptable coding of highest q-value, the most preferred of equals."""
    best = max(((q, _RANK[c], c) for c, q in candidates if q > 0), default=None)
    return None if best is None else best[2]


def preferred_coding(values: list[str]) -> str | None:
    """The coding an answer goes out in for these Accept-Encoding values (`zstd`, `gzip`
    or `identity`), or None when none is acceptable (406), as tower-http 0.7 picks it."""
    named, wildcard = _entries(values)
    if wildcard is not None:
        return _best([(c, next((q for n, q in named if n == c), wildcard)) for c in _RANK])
    best = _best(named)
    if best is not None:
        return best
    return None if ("identity", 0) in named else "identity"


def _should_compress(headers: Headers) -> bool:
    """s2-lite's predicate, and tower-http's own rules, on an answer's headers."""
    size: int | None = None
    for name, value in headers:
        name = name.lower()
        if name in (b"content-encoding", b"content-range"):
            return False
        if name == b"content-type" and value.lower().startswith(_NOT_FOR):
            return False
        if name == b"content-length" and value.strip().isdigit():
            size = int(value)
    return size is None or size >= MIN_COMPRESSED_SIZE


def _compressed_headers(headers: Headers, coding: str) -> Headers:
    out = [(k, v) for k, v in headers
           if k.lower() not in (b"content-length", b"accept-ranges")]
    if not any(k.lower() == b"vary" and b"accept-encoding" in v.lower() for k, v in out):
        out.append((b"vary", b"accept-encoding"))
    out.append((b"content-encoding", coding.encode()))
    return out


class _Compressor:
    """One answer's body compressed as it is sent: each piece flushed as it goes out (a
    streamed answer is never held back), the stream ended with the last."""

    def __init__(self, coding: str) -> None:
        self._zstd = coding == "zstd"
        self._obj: Any = (
            zstandard.ZstdCompressor(level=_ZSTD_LEVEL, write_content_size=False).compressobj()
            if self._zstd else zlib.compressobj(_GZIP_LEVEL, zlib.DEFLATED, zlib.MAX_WBITS | 16))

    def piece(self, data: bytes, *, last: bool) -> bytes:
        out: bytes = self._obj.compress(data) if data else b""
        if last:
            end: bytes = self._obj.flush() if self._zstd else self._obj.flush(zlib.Z_FINISH)
            return out + end
        if not data:
            return out
        flushed: bytes = self._obj.flush(
            zstandard.COMPRESSOBJ_FLUSH_BLOCK if self._zstd else zlib.Z_SYNC_FLUSH)
        return out + flushed


class _CompressingSend:
    """The app's `send`, its answer compressed in `coding` where the predicate says so;
    `refused`: no coding was acceptable, the answer goes out as it is, with status 406."""

    def __init__(self, send: Send, coding: str | None, counter: KindCounter) -> None:
        self._send = send
        self._coding = coding
        self._counter = counter
        self._compressor: _Compressor | None = None

    async def __call__(self, message: MutableMapping[str, Any]) -> None:
        kind = message["type"]
        if kind == "http.response.start":
            headers = list(message.get("headers", ()))
            if self._coding is None:
                message = {**message, "status": 406, "headers": _with_vary(headers)}
            elif self._coding != "identity" and _should_compress(headers):
                self._compressor = _Compressor(self._coding)
                self._counter.add(self._coding)
                message = {**message, "headers": _compressed_headers(headers, self._coding)}
        elif kind == "http.response.body" and self._compressor is not None:
            more = bool(message.get("more_body", False))
            body = self._compressor.piece(bytes(message.get("body", b"")), last=not more)
            # Always as a stream of unknown length, as tower-http's compressed body is (an
            # HTTP/1.1 answer goes out chunked): a stack that sees the whole body in one
            # message would send a Content-Length instead.
            await self._send({"type": kind, "body": body, "more_body": True})
            if not more:
                await self._send({"type": kind, "body": b"", "more_body": False})
            return
        await self._send(message)


def _with_vary(headers: Headers) -> Headers:
    if any(k.lower() == b"vary" and b"accept-encoding" in v.lower() for k, v in headers):
        return headers
    return [*headers, (b"vary", b"accept-encoding")]


class HttpCompression:
    """The ASGI app `app` behind s2-lite's compression layers (see the module).

    Not s2-lite: `compressed` counts the answers sent compressed and `decompressed` the
    request bodies that came compressed, by coding, so tests can tell that a client
    asked for compression and got it, or sent its bodies compressed."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.compressed = KindCounter()
        self.decompressed = KindCounter()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not _under_v1(scope.get("path", "")):
            await self.app(scope, receive, send)
            return
        accept: list[str] = []
        encoding: bytes | None = None
        for name, value in scope["headers"]:
            if len(name) == 15 and name.lower() == b"accept-encoding":
                accept.append(value.decode("latin-1"))
            elif len(name) == 16 and name.lower() == b"content-encoding" and encoding is None:
                encoding = value
        coding = preferred_coding(accept) if accept else "identity"
        if coding == "identity" and encoding in (None, b"identity"):
            await self.app(scope, receive, send)  # nothing to do: the common case
            return
        if encoding not in (None, b"identity"):
            if encoding not in (b"gzip", b"zstd"):
                await send({"type": "http.response.start", "status": 415,
                            "headers": [(b"accept-encoding", _TAKEN),
                                        (b"content-length", b"0"), *closing(scope)]})
                await send({"type": "http.response.body", "body": b""})
                return
            try:
                body = await _decompressed(receive, encoding.decode())
                self.decompressed.add(encoding.decode())
            except _Unreadable as e:
                await _refuse_unreadable(send, scope, e)
                return
            scope = {**scope, "headers": [(k, v) for k, v in scope["headers"]
                                          if k.lower() not in (b"content-encoding",
                                                               b"content-length")]}
            receive = _replay(body, receive)
        await self.app(scope, receive, send if coding == "identity"
                       else _CompressingSend(send, coding, self.compressed))


def _under_v1(path: str) -> bool:
    return path == "/v1" or path.startswith("/v1/")


async def _decompressed(receive: Receive, coding: str) -> bytes:
    """The request's whole body, decompressed; `_Unreadable` for a corrupt one or one past
    `MAX_UNARY_BODY` (compressed: refused as it comes, its rest left unread)."""
    chunks: list[bytes] = []
    size = 0
    while True:
        msg = await receive()
        if msg["type"] == "http.disconnect":
            raise ConnectionError("client disconnected")
        chunk = msg.get("body", b"")
        more = msg.get("more_body", False)
        size += len(chunk)
        if size > MAX_UNARY_BODY:
            raise _Unreadable(BODY_TOO_LARGE, unread=bool(more))
        chunks.append(chunk)
        if not more:
            break
    data = b"".join(chunks)
    return _decode_request(data, coding, MAX_UNARY_BODY) if data else data


def _decode_request(data: bytes, coding: str, limit: int) -> bytes:
    """`data` decompressed (every gzip member, every zstd frame), at most `limit` bytes of
    it (more: s2-lite's length limit); corrupt, cut short or followed by anything else:
    `_Unreadable` too."""
    try:
        out = _unzstd(data, limit) if coding == "zstd" else _gunzip(data, limit)
    except (zstandard.ZstdError, zlib.error) as e:
        raise _Unreadable(f"Failed to buffer the request body: corrupt {coding} data: {e}") from e
    if len(out) > limit:
        raise _Unreadable(BODY_TOO_LARGE)
    return out


class _Unreadable(Exception):
    """A request body that does not decompress by its Content-Encoding, or is too large;
    `unread`: its rest was not read, so its connection is closed after the answer."""

    def __init__(self, why: str, *, unread: bool = False) -> None:
        super().__init__(why)
        self.unread = unread


async def _refuse_unreadable(send: Send, scope: Scope, err: _Unreadable) -> None:
    """What s2-lite's handler answers when its body extractor cannot read the body: a
    protobuf body's 400 `bad_proto` (`api/src/data.rs`, `ProtoRejection`), any other's
    400 `bad_json` (`JsonExtractionRejection`), both mapped in
    `lite/src/handlers/v1/error.rs` (checked against s2-lite 0.43.4)."""
    ctype = next((v for k, v in scope["headers"] if k.lower() == b"content-type"), b"")
    mime = ctype.split(b",")[0].split(b";")[0].strip().lower()
    proto = mime in (b"application/protobuf", b"application/x-protobuf")
    body = {"code": "bad_proto" if proto else "bad_json", "message": str(err)}
    await respond_json(send, 400, body, closing(scope) if err.unread else None)


def _gunzip(data: bytes, limit: int) -> bytes:
    parts: list[bytes] = []
    size = 0
    while data and size <= limit:
        z = zlib.decompressobj(zlib.MAX_WBITS | 16)
        parts.append(z.decompress(data, limit + 1 - size))
        size += len(parts[-1])
        if size <= limit and not z.eof:
            raise zlib.error("the gzip data ends before its end")
        data = z.unused_data
    return b"".join(parts)


def _unzstd(data: bytes, limit: int) -> bytes:
    # Read in bounded pieces first (a small body may decompress to a huge one)...
    reader = zstandard.ZstdDecompressor().stream_reader(data, read_across_frames=True)
    parts: list[bytes] = []
    size = 0
    while size <= limit and (chunk := reader.read(1 << 16)):
        size += len(chunk)
        parts.append(chunk)
    if size > limit:
        return b"".join(parts)
    # ... then see that every frame ends (the reader stops quietly where data does).
    rest = data
    while rest:
        frame = zstandard.ZstdDecompressor().decompressobj()
        frame.decompress(rest)
        if not frame.eof:
            raise zstandard.ZstdError("the zstd data ends before its end")
        rest = frame.unused_data
    return b"".join(parts)


def _replay(body: bytes, receive: Receive) -> Receive:
    """A `receive` that gives `body` once, then what the client's gives (a disconnect)."""
    given = False

    async def replayed() -> MutableMapping[str, Any]:
        nonlocal given
        if not given:
            given = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replayed
