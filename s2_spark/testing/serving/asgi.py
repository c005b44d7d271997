"""The ASGI plumbing of the local server: a request's parts, bodies, answers, disconnects.

Nothing here knows S2's resources: `Request` reads an HTTP scope (path segments split
before unescaping, query, headers, a body: undone from its Content-Encoding before the
app sees it, by `compression.HttpCompression`),
`respond`/`respond_json` answer it, and `until_disconnect` ends a streaming answer
when its client goes away.

A body is read only as far as a valid request goes: one past `MAX_UNARY_BODY` is refused
as soon as that much arrived, and one the app does not use is dropped up to
`MAX_DRAINED_BODY`; the rest is left unread (`Request.unread`), and the answer closes its
HTTP/1.1 connection (`closing`), as s2-lite's does, so a body without end costs neither
memory nor a reader that never stops.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any
from urllib.parse import parse_qsl, unquote_to_bytes

from s2_spark.testing.semantics.errors import ApiError
from s2_spark.testing.semantics.names import validate_basin_name

__all__ = [
    "BODY_TOO_LARGE",
    "JSON_HEADERS",
    "MAX_DRAINED_BODY",
    "MAX_UNARY_BODY",
    "PROTO_HEADERS",
    "Receive",
    "Request",
    "Scope",
    "Send",
    "closing",
    "json_bytes",
    "query_bool",
    "query_int",
    "respond",
    "respond_json",
    "start_session",
    "until_disconnect",
]

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]

#: The largest unary request body, after its Content-Encoding is undone: axum's default
#: body limit (2 MiB), which s2-lite keeps; past it, s2-lite answers the body's parse
#: error (400 `bad_json` or `bad_proto`).
MAX_UNARY_BODY = 2 * 1024 * 1024
#: s2-lite's words for a body past `MAX_UNARY_BODY` (axum's `LengthLimitError`).
BODY_TOO_LARGE = "Failed to buffer the request body: length limit exceeded"
#: A body the app does not use is dropped up to this (so a short one keeps its connection
#: usable), the rest left unread: one without end would be read forever.
MAX_DRAINED_BODY = MAX_UNARY_BODY
_NO_JSON = "Expected request with `Content-Type: application/json`"
JSON_HEADERS = [(b"content-type", b"application/json")]
PROTO_HEADERS = [(b"content-type", b"application/protobuf")]


def json_bytes(obj: Any) -> bytes:
    return json.dumps(obj, separators=(",", ":")).encode()


class Request:
    """The parts of an ASGI HTTP scope the handlers use."""

    __slots__ = ("counted", "headers", "method", "query", "receive", "scope", "segments",
                 "unread")

    def __init__(self, scope: Scope, receive: Receive) -> None:
        self.counted = False  # set once the request counter has seen it
        self.unread = False  # set when the body's rest is left unread: close after answering
        self.scope = scope
        self.receive = receive
        self.method: str = scope["method"]
        self.headers: dict[str, str] = {}
        for k, v in scope["headers"]:
            self.headers[k.decode("latin-1").lower()] = v.decode("latin-1")
        raw = scope.get("raw_path") or scope["path"].encode()
        path = raw.split(b"?", 1)[0]
        # Split before unescaping, so an escaped "/" (%2F) stays inside a stream name.
        self.segments = [unquote_to_bytes(s).decode() for s in path.split(b"/")[1:]]
        self.query: dict[str, str] = {}
        for k, v in parse_qsl(scope.get("query_string", b"").decode("latin-1")):
            self.query[k] = v

    def header(self, name: str) -> str | None:
        return self.headers.get(name)

    def mime(self, name: str) -> str:
        """The first media type of a header, lowercased, without parameters."""
        value = self.headers.get(name, "")
        return value.split(",", 1)[0].split(";", 1)[0].strip().lower()

    async def body(self, code: str, limit: int = MAX_UNARY_BODY) -> bytes:
        """The whole body, its Content-Encoding undone; one that cannot be read (too
        large, corrupt) is a 400 with `code` (`bad_json`, `bad_proto`), as in s2-lite.
        A body past `limit` is refused once that much arrived, its rest left unread."""
        chunks: list[bytes] = []
        size = 0
        while True:
            msg = await self.receive()
            if msg["type"] == "http.disconnect":
                raise ConnectionError("client disconnected")
            chunk = msg.get("body", b"")
            more = msg.get("more_body", False)
            if chunk:
                size += len(chunk)
                if size > limit:
                    self.unread = bool(more)
                    raise ApiError.bad(code, BODY_TOO_LARGE)
                chunks.append(chunk)
            if not more:
                return b"".join(chunks)

    async def _drain(self) -> None:
        """Drop a body that is not used, so the connection stays usable for the next
        request; past `MAX_DRAINED_BODY`, leave the rest unread (the answer closes the
        connection): a body without end would keep this reading forever."""
        size = 0
        while True:
            msg = await self.receive()
            if msg["type"] == "http.disconnect" or not msg.get("more_body", False):
                return
            size += len(msg.get("body", b""))
            if size > MAX_DRAINED_BODY:
                self.unread = True
                return

    async def json(self, *, optional: bool = False) -> Any:
        """The JSON body; s2-lite's `Json` extractor wants `Content-Type: application/json`
        (else 400 `bad_json`). `optional` (its `JsonOpt`, for PUT): a request without a
        Content-Type, or with an empty body, has none (None), whatever it sent; a body of
        `null` is a 400 `bad_json`."""
        ctype = self.headers.get("content-type")
        if ctype is None and optional:
            await self._drain()
            return None
        if not _is_json(self.mime("content-type")):
            await self._drain()
            raise ApiError.bad("bad_json", _NO_JSON)
        data = await self.body("bad_json")
        if optional and not data:
            return None
        try:
            value = json.loads(data)
        except ValueError as e:
            raise ApiError.bad("bad_json", f"request body is not valid JSON: {e}") from e
        if optional and value is None:
            # A body that is there must be the object: `null` is not "none" (s2 `api/src/
            # data.rs`, `JsonOpt`; s2-lite 0.43.4 answers 400 `bad_json`).
            raise ApiError.bad("bad_json", "invalid type: null, expected a JSON object")
        return value

    def basin_name(self) -> str:
        name = self.headers.get("s2-basin")
        if name is None:
            raise ApiError.bad("bad_header", "Missing header `s2-basin`")
        try:
            validate_basin_name(name)
        except ApiError as e:
            raise ApiError.bad(
                "bad_header", f"Invalid header `s2-basin`: {e.body['message']}"
            ) from e
        return name


def _is_json(mime: str) -> bool:
    """`application/json` or `application/*+json`, as s2-lite's `mime::is_json`."""
    kind, _, subtype = mime.partition("/")
    return kind == "application" and (subtype == "json" or subtype.endswith("+json"))


def closing(scope: Scope) -> list[tuple[bytes, bytes]]:
    """The header that has an HTTP/1.x connection closed after its answer, for a request
    whose body is left unread; none on HTTP/2, where the stack resets the stream instead
    (the header is not HTTP/2's) and the connection serves on."""
    return [] if scope.get("http_version", "1.1") == "2" else [(b"connection", b"close")]


async def respond(
    send: Send,
    status: int,
    body: bytes = b"",
    headers: list[tuple[bytes, bytes]] | None = None,
) -> None:
    hdrs = list(headers or [])
    hdrs.append((b"content-length", str(len(body)).encode()))
    await send({"type": "http.response.start", "status": status, "headers": hdrs})
    await send({"type": "http.response.body", "body": body})


async def start_session(send: Send, content_type: bytes) -> None:
    """Start a streaming answer (a read or append session) that no proxy may buffer or
    transform, with s2-lite's headers for it."""
    await send({"type": "http.response.start", "status": 200, "headers": [
        (b"content-type", content_type),
        (b"cache-control", b"no-cache, no-transform"),
        (b"x-accel-buffering", b"no"),
    ]})


async def respond_json(
    send: Send, status: int, obj: Any, extra: list[tuple[bytes, bytes]] | None = None
) -> None:
    await respond(send, status, json_bytes(obj), JSON_HEADERS + (extra or []))


def rust_uint(raw: str, bits: int = 64) -> int:
    """An unsigned integer as Rust's `str::parse` reads one (a leading `+` allowed), or a
    ValueError with Rust's wording, which s2-lite passes on in its messages."""
    digits = raw[1:] if raw.startswith("+") else raw
    if not digits:
        raise ValueError("cannot parse integer from empty string")
    if not (digits.isascii() and digits.isdigit()):
        raise ValueError("invalid digit found in string")
    value = int(digits)
    if value >= 1 << bits:
        raise ValueError("number too large to fit in target type")
    return value


def query_int(req: Request, name: str) -> int | None:
    raw = req.query.get(name)
    if raw is None:
        return None
    try:
        return rust_uint(raw)
    except ValueError as e:
        raise ApiError.bad("bad_query", f"Failed to deserialize query string: {name}: {e}") from e


def query_bool(req: Request, name: str) -> bool | None:
    raw = req.query.get(name)
    if raw is None:
        return None
    if raw in ("true", "false"):
        return raw == "true"
    raise ApiError.bad(
        "bad_query",
        f"Failed to deserialize query string: {name}: provided string was not `true` or `false`",
    )


async def until_disconnect(req: Request, session: Awaitable[None]) -> None:
    """Run a streaming response until it ends or the client goes away.

    Without this an abandoned read session would keep following the tail (and sending
    heartbeats into a closed connection) until its `wait` ran out, possibly forever. A
    read has no use for a body: one past `MAX_DRAINED_BODY` ends the session as a
    disconnect does, rather than be read as long as it goes on.
    """
    task = asyncio.ensure_future(session)

    async def watch() -> None:
        size = 0
        while True:
            msg = await req.receive()
            size += len(msg.get("body", b""))
            if msg["type"] == "http.disconnect" or size > MAX_DRAINED_BODY:
                task.cancel()
                return

    watcher = asyncio.create_task(watch())
    try:
        await task
    except asyncio.CancelledError:
        if not watcher.done() or watcher.cancelled():
            raise  # cancelled from outside (server shutdown), not by a disconnect
    finally:
        watcher.cancel()
