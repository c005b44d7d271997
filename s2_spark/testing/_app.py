"""The local S2 server's ASGI application: routing, formats and sessions.

One `/v1` endpoint serves account and basin operations; the basin comes from the
`S2-Basin` header, as in s2-lite. Unary calls speak JSON or protobuf; reads also speak
SSE and S2S; appends also run as S2S sessions (full duplex on HTTP/2).

Not S2: the app counts the requests it receives per kind (`RequestCounter`; kinds are the
handler names, e.g. `check_tail`, `read`, `read_session`, `append_session`,
`list_streams`), and answers them as JSON at `GET /_local/stats`, a testing-only path
outside `/v1` that no S2 client calls (it needs the access token when one is set and is
not counted itself). Tests and benchmarks use it to see how many requests a client made.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import hmac
import json
import math
import threading
import time
import zlib
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any
from urllib.parse import parse_qsl, unquote_to_bytes

import zstandard
from google.protobuf.message import DecodeError

from s2_spark._proto import s2_pb2
from s2_spark.testing._errors import ApiError
from s2_spark.testing._read import Batch, ReadSpec, read_session, resolve_start
from s2_spark.testing._records import decode_entry, encode_position, parse_append_input
from s2_spark.testing._store import (
    AppendRecord,
    Store,
    Stream,
    validate_basin_name,
    validate_fencing_token,
    validate_records,
    validate_stream_name,
)
from s2_spark.wire.frames import (
    MAX_PAYLOAD_BYTES,
    Compression,
    FrameDecoder,
    Message,
    Terminal,
    encode_message,
    encode_terminal,
)

__all__ = ["STATS_PATH", "RequestCounter", "S2App"]

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]

MAX_UNARY_BODY = 16 * 1024 * 1024
MAX_UNARY_WAIT = 60.0
LIST_LIMIT = 1000
FLUSH_BYTES = 4 * 1024 * 1024
_JSON = [(b"content-type", b"application/json")]
#: The testing-only path answering the request counts (not part of S2's API).
STATS_PATH = "/_local/stats"
#: The kind of requests answered before reaching a handler: failed authorization, unknown
#: routes, 501s, a bad basin name in the path, a path that is not UTF-8.
UNROUTED = "unrouted"
_PROTO = [(b"content-type", b"application/protobuf")]


def _json_bytes(obj: Any) -> bytes:
    return json.dumps(obj, separators=(",", ":")).encode()


def _pos(p: tuple[int, int]) -> dict[str, int]:
    return {"seq_num": p[0], "timestamp": p[1]}


class Request:
    """The parts of an ASGI HTTP scope the handlers use."""

    __slots__ = ("counted", "headers", "method", "query", "receive", "scope", "segments")

    def __init__(self, scope: Scope, receive: Receive) -> None:
        self.counted = False  # set once the request counter has seen it
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

    async def body(self, limit: int = MAX_UNARY_BODY) -> bytes:
        chunks: list[bytes] = []
        size = 0
        while True:
            msg = await self.receive()
            if msg["type"] == "http.disconnect":
                raise ConnectionError("client disconnected")
            chunk = msg.get("body", b"")
            if chunk:
                size += len(chunk)
                if size > limit:
                    raise ApiError.standard(413, "invalid", "request body is too large")
                chunks.append(chunk)
            if not msg.get("more_body", False):
                return self._decoded(b"".join(chunks), limit)

    def _decoded(self, data: bytes, limit: int) -> bytes:
        """Undo a `Content-Encoding`: s2-sdk with compression on compresses unary bodies."""
        encoding = (self.headers.get("content-encoding") or "identity").strip().lower()
        if encoding == "identity" or not data:
            return data
        if encoding not in ("zstd", "gzip"):
            raise ApiError.bad(
                "bad_header", f"unsupported Content-Encoding {encoding!r}: use zstd or gzip"
            )
        parts: list[bytes] = []
        size = 0
        try:
            if encoding == "zstd":
                reader = zstandard.ZstdDecompressor().stream_reader(data)
                while chunk := reader.read(1 << 16):
                    size += len(chunk)
                    if size > limit:
                        break
                    parts.append(chunk)
            else:
                out = zlib.decompressobj(wbits=31).decompress(data, limit + 1)
                size = len(out)
                parts.append(out)
        except (zstandard.ZstdError, zlib.error) as e:
            raise ApiError.bad("bad_request", f"corrupt {encoding} request body: {e}") from e
        if size > limit:
            raise ApiError.standard(413, "invalid", "request body is too large")
        return b"".join(parts)

    async def json(self) -> Any:
        data = await self.body()
        if not data.strip():
            return None
        try:
            return json.loads(data)
        except ValueError as e:
            raise ApiError.bad("bad_json", f"request body is not valid JSON: {e}") from e

    def basin_name(self) -> str:
        name = self.headers.get("s2-basin")
        if name is None:
            raise ApiError.bad("bad_header", "missing S2-Basin header")
        try:
            validate_basin_name(name)
        except ApiError as e:
            raise ApiError.bad("bad_header", f"invalid S2-Basin header: {e.body['message']}") from e
        return name


async def _respond(
    send: Send,
    status: int,
    body: bytes = b"",
    headers: list[tuple[bytes, bytes]] | None = None,
) -> None:
    hdrs = list(headers or [])
    hdrs.append((b"content-length", str(len(body)).encode()))
    await send({"type": "http.response.start", "status": status, "headers": hdrs})
    await send({"type": "http.response.body", "body": body})


async def _respond_json(
    send: Send, status: int, obj: Any, extra: list[tuple[bytes, bytes]] | None = None
) -> None:
    await _respond(send, status, _json_bytes(obj), _JSON + (extra or []))


def _query_int(req: Request, name: str) -> int | None:
    raw = req.query.get(name)
    if raw is None:
        return None
    try:
        value = int(raw)
    except ValueError:
        value = -1
    if value < 0 or not raw.isdigit():
        raise ApiError.bad(
            "bad_query", f"Failed to deserialize query string: {name}: invalid digit"
        )
    return value


def _query_bool(req: Request, name: str) -> bool | None:
    raw = req.query.get(name)
    if raw is None:
        return None
    if raw in ("true", "false"):
        return raw == "true"
    raise ApiError.bad(
        "bad_query", f"Failed to deserialize query string: {name}: expected true or false"
    )


def _format(req: Request) -> str:
    value = (req.header("s2-format") or "raw").strip().lower()
    if value in ("raw", "json"):
        return "raw"
    if value in ("base64", "json-binsafe"):
        return "base64"
    raise ApiError.bad("bad_header", f"invalid S2-Format header {value!r}: expected raw or base64")


async def _until_disconnect(req: Request, session: Awaitable[None]) -> None:
    """Run a streaming response until it ends or the client goes away.

    Without this an abandoned read session would keep following the tail (and sending
    heartbeats into a closed connection) until its `wait` ran out, possibly forever.
    """
    task = asyncio.ensure_future(session)

    async def watch() -> None:
        while True:
            msg = await req.receive()
            if msg["type"] == "http.disconnect":
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


def _checked(validate: Callable[[str], None], name: str, code: str, what: str) -> str:
    """Validate a name; a bad one is a 400 with `code` (bad_json, bad_path), as in s2-lite."""
    try:
        validate(name)
    except ApiError as e:
        raise ApiError.bad(code, f"invalid {what} name: {e.body['message']}") from e
    return name


def _is_proto(mime: str) -> bool:
    return mime in ("application/protobuf", "application/x-protobuf")


def _records_kind(req: Request, base: str) -> str:
    """`read` / `append` refined by format: S2S sessions and SSE are kinds of their own,
    and so is a unary read that long-polls (`wait` > 0), the way a tail watch asks."""
    s2s = req.mime("content-type") == "s2s/proto" or (
        base == "read" and req.mime("accept") == "s2s/proto"
    )
    if s2s:
        return f"{base}_session"
    if base == "read" and req.mime("accept") == "text/event-stream":
        return "read_sse"
    if base == "read" and req.query.get("wait", "0") not in ("", "0"):
        return "read_wait"
    return base


class RequestCounter:
    """Requests received per kind, counted on arrival (a long-poll or session counts when
    it starts). Thread-safe: the app runs on its event loop, readers may be elsewhere."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts: dict[str, int] = {}

    def add(self, kind: str) -> None:
        with self._lock:
            self._counts[kind] = self._counts.get(kind, 0) + 1

    def snapshot(self) -> dict[str, int]:
        """Kind -> requests so far, sorted by kind."""
        with self._lock:
            return dict(sorted(self._counts.items()))


class S2App:
    """ASGI app over a `Store`. Token comparison is constant-time; tokens are never logged."""

    def __init__(
        self, store: Store, *, token: str | None = None, heartbeat_interval: float = 5.0
    ) -> None:
        self.store = store
        self._token = token
        self.heartbeat_interval = heartbeat_interval
        self.requests = RequestCounter()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            while True:
                msg = await receive()
                if msg["type"] == "lifespan.startup":
                    await send({"type": "lifespan.startup.complete"})
                elif msg["type"] == "lifespan.shutdown":
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        if scope["type"] != "http":
            return
        started = False

        async def tracking_send(message: MutableMapping[str, Any]) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        req: Request | None = None

        def count_unrouted() -> None:
            # Before answering, so a client that has its answer sees the count.
            if req is None or not req.counted:
                self.requests.add(UNROUTED)

        try:
            req = Request(scope, receive)
            self._authorize(req)
            await self._route(req, tracking_send)
        except ApiError as e:
            count_unrouted()
            if not started:
                await _respond_json(send, e.status, e.body)
        except UnicodeDecodeError:
            count_unrouted()
            if not started:
                await _respond_json(
                    send, 400, {"code": "bad_path", "message": "path is not valid UTF-8"}
                )
        except (ConnectionError, asyncio.CancelledError):
            count_unrouted()
            raise
        except Exception as e:  # pragma: no cover - a bug; answer 500 rather than hang
            count_unrouted()
            if not started:
                await _respond_json(
                    send, 500, {"code": "other", "message": f"{type(e).__name__}: {e}"}
                )
            raise

    def _authorize(self, req: Request) -> None:
        if self._token is None:
            return
        auth = req.header("authorization")
        if auth is None:
            raise ApiError.standard(401, "authn", "missing access token")
        scheme, _, value = auth.partition(" ")
        if scheme.lower() != "bearer" or not value.strip():
            raise ApiError.standard(401, "authn", "malformed Authorization header")
        if not hmac.compare_digest(value.strip().encode(), self._token.encode()):
            raise ApiError.standard(403, "permission_denied", "invalid access token")

    async def _dispatch(
        self, handler: Callable[..., Awaitable[None]], req: Request, send: Send, *args: str
    ) -> None:
        """Count the request under its handler's name (refined by format), then run it."""
        kind = handler.__name__
        if kind in ("read", "append"):
            kind = _records_kind(req, kind)
        self.requests.add(kind)
        req.counted = True
        await handler(req, send, *args)

    async def _stats(self, req: Request, send: Send) -> None:
        """`GET /_local/stats`: {"requests": {kind: count}}. Testing only, not S2."""
        req.counted = True  # not counted: reading the counts leaves them as they were
        await _respond_json(send, 200, {"requests": self.requests.snapshot()})

    async def _route(self, req: Request, send: Send) -> None:
        seg = req.segments
        m = req.method
        if seg == ["_local", "stats"] and m == "GET":
            return await self._stats(req, send)
        if len(seg) < 2 or seg[0] != "v1":
            raise ApiError.standard(404, "not_found", f"no route for {m} {req.scope['path']}")
        kind, rest = seg[1], seg[2:]
        if kind in ("access-tokens", "metrics", "locations"):
            # s2-lite answers these with 501 too.
            raise ApiError.standard(501, "not_implemented", "Not implemented")
        if kind == "basins":
            if not rest:
                if m == "GET":
                    return await self._dispatch(self.list_basins, req, send)
                if m == "POST":
                    return await self._dispatch(self.create_basin, req, send)
            elif len(rest) == 1:
                name = _checked(validate_basin_name, rest[0], "bad_path", "basin")
                handler = {
                    "GET": self.get_basin,
                    "PUT": self.ensure_basin,
                    "DELETE": self.delete_basin,
                    "PATCH": self.reconfigure_basin,
                }.get(m)
                if handler is not None:
                    return await self._dispatch(handler, req, send, name)
        elif kind == "streams":
            if not rest:
                if m == "GET":
                    return await self._dispatch(self.list_streams, req, send)
                if m == "POST":
                    return await self._dispatch(self.create_stream, req, send)
            else:
                name = rest[0]
                if len(rest) == 1:
                    handler = {
                        "GET": self.get_stream,
                        "PUT": self.ensure_stream,
                        "DELETE": self.delete_stream,
                        "PATCH": self.reconfigure_stream,
                    }.get(m)
                    if handler is not None:
                        return await self._dispatch(handler, req, send, name)
                elif rest[1:] == ["records"]:
                    if m == "GET":
                        return await self._dispatch(self.read, req, send, name)
                    if m == "POST":
                        return await self._dispatch(self.append, req, send, name)
                elif rest[1:] == ["records", "tail"] and m == "GET":
                    return await self._dispatch(self.check_tail, req, send, name)
        raise ApiError.standard(404, "not_found", f"no route for {m} {req.scope['path']}")

    # ------------------------------------------------------------ listing

    def _list_params(self, req: Request) -> tuple[str, str, int]:
        limit = _query_int(req, "limit")
        limit = LIST_LIMIT if limit is None or limit == 0 else min(limit, LIST_LIMIT)
        prefix = req.query.get("prefix", "")
        start_after = req.query.get("start_after", "")
        if start_after and prefix and start_after < prefix:
            raise ApiError.invalid("`start_after` must be greater than or equal to `prefix`")
        return prefix, start_after, limit

    @staticmethod
    def _page(
        names: list[str], prefix: str, start_after: str, limit: int
    ) -> tuple[list[str], bool]:
        selected = [n for n in sorted(names) if n.startswith(prefix) and n > start_after]
        return selected[:limit], len(selected) > limit

    async def list_basins(self, req: Request, send: Send) -> None:
        prefix, start_after, limit = self._list_params(req)
        names, more = self._page(list(self.store.basins), prefix, start_after, limit)
        await _respond_json(
            send,
            200,
            {"basins": [self.store.basins[n].info() for n in names], "has_more": more},
        )

    async def list_streams(self, req: Request, send: Send) -> None:
        basin = self.store.basin(req.basin_name())
        prefix, start_after, limit = self._list_params(req)
        names, more = self._page(list(basin.streams), prefix, start_after, limit)
        await _respond_json(
            send,
            200,
            {"streams": [basin.streams[n].info() for n in names], "has_more": more},
        )

    # ------------------------------------------------------------ basins

    async def create_basin(self, req: Request, send: Send) -> None:
        body = await req.json()
        if not isinstance(body, dict) or not isinstance(body.get("basin"), str):
            raise ApiError.bad("bad_json", "request body must be an object with a `basin` name")
        _checked(validate_basin_name, body["basin"], "bad_json", "basin")
        basin, created = self.store.create_basin(
            body["basin"], body.get("config"), request_token=req.header("s2-request-token")
        )
        # s2-lite answers 201 for an idempotent retry too; the header tells them apart.
        result = b"created" if created else b"noop"
        await _respond_json(send, 201, basin.info(), [(b"s2-provision-result", result)])

    async def get_basin(self, req: Request, send: Send, name: str) -> None:
        await _respond_json(send, 200, self.store.basin(name).config)

    async def ensure_basin(self, req: Request, send: Send, name: str) -> None:
        body = await req.json()
        if body is not None and not isinstance(body, dict):
            raise ApiError.bad("bad_json", "request body must be a JSON object")
        basin, result = self.store.ensure_basin(name, (body or {}).get("config"))
        await _respond_json(
            send,
            201 if result == "created" else 200,
            basin.info(),
            [(b"s2-provision-result", result.encode())],
        )

    async def reconfigure_basin(self, req: Request, send: Send, name: str) -> None:
        body = await req.json()
        await _respond_json(send, 200, self.store.reconfigure_basin(name, body).config)

    async def delete_basin(self, req: Request, send: Send, name: str) -> None:
        self.store.delete_basin(name)
        await _respond(send, 202)

    # ------------------------------------------------------------ streams

    def _stream_name(self, name: str) -> str:
        return _checked(validate_stream_name, name, "bad_path", "stream")

    async def create_stream(self, req: Request, send: Send) -> None:
        basin = req.basin_name()
        body = await req.json()
        if not isinstance(body, dict) or not isinstance(body.get("stream"), str):
            raise ApiError.bad("bad_json", "request body must be an object with a `stream` name")
        _checked(validate_stream_name, body["stream"], "bad_json", "stream")
        stream, created = self.store.create_stream(
            basin, body["stream"], body.get("config"), request_token=req.header("s2-request-token")
        )
        result = b"created" if created else b"noop"
        await _respond_json(send, 201, stream.info(), [(b"s2-provision-result", result)])

    async def get_stream(self, req: Request, send: Send, name: str) -> None:
        stream = self.store.stream(req.basin_name(), self._stream_name(name))
        await _respond_json(send, 200, stream.config)

    async def ensure_stream(self, req: Request, send: Send, name: str) -> None:
        basin = req.basin_name()
        name = self._stream_name(name)
        body = await req.json()
        if body is not None and not isinstance(body, dict):
            raise ApiError.bad("bad_json", "request body must be a JSON object")
        # The PUT body is the StreamConfig itself (spec: `oneOf [null, StreamConfig]`).
        stream, result = self.store.ensure_stream(basin, name, body)
        await _respond_json(
            send,
            201 if result == "created" else 200,
            stream.info(),
            [(b"s2-provision-result", result.encode())],
        )

    async def reconfigure_stream(self, req: Request, send: Send, name: str) -> None:
        basin = req.basin_name()
        name = self._stream_name(name)
        body = await req.json()
        stream = self.store.reconfigure_stream(basin, name, body)
        await _respond_json(send, 200, stream.config)

    async def delete_stream(self, req: Request, send: Send, name: str) -> None:
        self.store.delete_stream(req.basin_name(), self._stream_name(name))
        await _respond(send, 202)

    # ------------------------------------------------------------ records

    async def check_tail(self, req: Request, send: Send, name: str) -> None:
        stream = self.store.stream(
            req.basin_name(), self._stream_name(name), auto_create="create_stream_on_read"
        )
        await _respond_json(send, 200, {"tail": _pos(stream.tail)})

    def _ack_json(self, ack: tuple[tuple[int, int], ...]) -> dict[str, Any]:
        return {"start": _pos(ack[0]), "end": _pos(ack[1]), "tail": _pos(ack[2])}

    @staticmethod
    def _ack_proto(ack: tuple[tuple[int, int], ...]) -> bytes:
        return (
            encode_position(1, *ack[0]) + encode_position(2, *ack[1]) + encode_position(3, *ack[2])
        )

    async def append(self, req: Request, send: Send, name: str) -> None:
        basin = req.basin_name()
        name = self._stream_name(name)
        ctype = req.mime("content-type")
        if ctype == "s2s/proto":
            stream = self.store.stream(basin, name, auto_create="create_stream_on_append")
            return await self._append_session(req, send, stream)
        if _is_proto(ctype):
            data = await req.body()
            records, match, fence = _parse_proto_input(data)
        else:
            fmt = _format(req)
            records, match, fence = _parse_json_input(await req.json(), fmt)
        stream = self.store.stream(basin, name, auto_create="create_stream_on_append")
        ack = self.store.append(stream, records, match, fence)
        if _is_proto(req.mime("accept")):
            await _respond(send, 200, self._ack_proto(ack), _PROTO)
        else:
            await _respond_json(send, 200, self._ack_json(ack))

    async def _append_session(self, req: Request, send: Send, stream: Stream) -> None:
        """S2S append: a reader task appends each input as it arrives and queues the ack;
        this task writes acks. Reading never waits on writing, so a client may send all
        inputs before reading any ack (HTTP/1.1) or interleave them (HTTP/2)."""
        compression = Compression.negotiate(req.header("accept-encoding"))
        out: asyncio.Queue[bytes | None] = asyncio.Queue()

        async def reader() -> None:
            decoder = FrameDecoder()
            try:
                while True:
                    msg = await req.receive()
                    if msg["type"] == "http.disconnect":
                        break
                    chunk = msg.get("body", b"")
                    for frame in decoder.feed(chunk) if chunk else []:
                        if isinstance(frame, Terminal):
                            raise ApiError.bad("bad_frame", "unexpected terminal frame as input")
                        assert isinstance(frame, Message)
                        records, match, fence = _parse_proto_input(frame.body)
                        ack = self.store.append(stream, records, match, fence)
                        out.put_nowait(encode_message(self._ack_proto(ack), compression))
                    if not msg.get("more_body", False):
                        decoder.finish()
                        break
            except ApiError as e:
                out.put_nowait(encode_terminal(e.status, e.body))
            except Exception as e:
                out.put_nowait(encode_terminal(400, {"code": "bad_frame", "message": str(e)}))
            out.put_nowait(None)

        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [(b"content-type", b"s2s/proto"), (b"cache-control", b"no-cache")],
            }
        )
        task = asyncio.create_task(reader())
        try:
            while True:
                item = await out.get()
                chunks = [item] if item is not None else []
                done = item is None
                while not done and not out.empty():
                    nxt = out.get_nowait()
                    if nxt is None:
                        done = True
                    else:
                        chunks.append(nxt)
                if chunks:
                    await send(
                        {"type": "http.response.body", "body": b"".join(chunks), "more_body": True}
                    )
                if done:
                    break
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        finally:
            if not task.done():
                task.cancel()

    # ------------------------------------------------------------ reads

    def _read_spec(self, req: Request) -> ReadSpec:
        spec = ReadSpec(
            seq_num=_query_int(req, "seq_num"),
            timestamp=_query_int(req, "timestamp"),
            tail_offset=_query_int(req, "tail_offset"),
            clamp=bool(_query_bool(req, "clamp")),
            count=_query_int(req, "count"),
            bytes=_query_int(req, "bytes"),
            until=_query_int(req, "until"),
        )
        wait = _query_int(req, "wait")
        spec.wait = None if wait is None else float(wait)
        starts = [x for x in (spec.seq_num, spec.timestamp, spec.tail_offset) if x is not None]
        if len(starts) > 1:
            raise ApiError.invalid("only one of seq_num, timestamp, or tail_offset can be provided")
        return spec

    @staticmethod
    def _check_until(spec: ReadSpec) -> None:
        if spec.timestamp is not None and spec.until is not None and spec.until <= spec.timestamp:
            raise ApiError.invalid("start `timestamp` exceeds or equal to `until`")

    async def read(self, req: Request, send: Send, name: str) -> None:
        basin = req.basin_name()
        name = self._stream_name(name)
        spec = self._read_spec(req)
        if req.mime("content-type") == "s2s/proto" or req.mime("accept") == "s2s/proto":
            self._check_until(spec)
            stream = self.store.stream(basin, name, auto_create="create_stream_on_read")
            start = resolve_start(self.store, stream, spec)
            return await _until_disconnect(req, self._read_s2s(req, send, stream, start, spec))
        fmt = _format(req)
        if req.mime("accept") == "text/event-stream":
            self._apply_last_event_id(req, spec)
            self._check_until(spec)
            stream = self.store.stream(basin, name, auto_create="create_stream_on_read")
            start = resolve_start(self.store, stream, spec)
            return await _until_disconnect(req, self._read_sse(send, stream, start, spec, fmt))
        # Unary: always bounded by 1000 records / 1 MiB, wait at most 60 s.
        spec.count = 1000 if spec.count is None else min(spec.count, 1000)
        spec.bytes = 1024 * 1024 if spec.bytes is None else min(spec.bytes, 1024 * 1024)
        if spec.wait is not None:
            spec.wait = min(spec.wait, MAX_UNARY_WAIT)
        self._check_until(spec)
        stream = self.store.stream(basin, name, auto_create="create_stream_on_read")
        start = resolve_start(self.store, stream, spec)
        entries: list[bytes] = []
        tail: tuple[int, int] | None = None
        wait_mode = False
        # Heartbeats tell a unary read only that it caught up (the first): no more.
        async for out in read_session(self.store, stream, start, spec, math.inf):
            if isinstance(out, Batch):
                entries.extend(out.entries)
                tail = out.tail
                if wait_mode:
                    break
            else:
                if entries:
                    break
                wait_mode = True
        if _is_proto(req.mime("accept")):
            body = b"".join(entries)
            if tail is not None:
                body += encode_position(2, *tail)
            await _respond(send, 200, body, _PROTO)
        else:
            await _respond_json(send, 200, _batch_json(entries, tail, fmt))

    @staticmethod
    def _apply_last_event_id(req: Request, spec: ReadSpec) -> None:
        raw = req.header("last-event-id")
        if raw is None:
            return
        parts = raw.replace(":", ",").split(",")
        try:
            seq, count, nbytes = (int(p) for p in parts)
            if min(seq, count, nbytes) < 0:
                raise ValueError
        except ValueError as e:
            raise ApiError.bad(
                "bad_header",
                f"invalid Last-Event-ID {raw!r}: expected seq_num,count,bytes",
            ) from e
        spec.seq_num, spec.timestamp, spec.tail_offset = seq + 1, None, None
        if spec.count is not None:
            spec.count = max(spec.count - count, 0)
        if spec.bytes is not None:
            spec.bytes = max(spec.bytes - nbytes, 0)

    async def _read_s2s(
        self, req: Request, send: Send, stream: Stream, start: int, spec: ReadSpec
    ) -> None:
        compression = Compression.negotiate(req.header("accept-encoding"))
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [
                    (b"content-type", b"s2s/proto"),
                    (b"cache-control", b"no-cache, no-transform"),
                    (b"x-accel-buffering", b"no"),
                ],
            }
        )
        pending: list[bytes] = []
        size = 0
        try:
            async for out in read_session(self.store, stream, start, spec, self.heartbeat_interval):
                if isinstance(out, Batch):
                    body = b"".join(out.entries)
                    if out.tail is not None:
                        body += encode_position(2, *out.tail)
                    if compression is Compression.NONE and len(body) < MAX_PAYLOAD_BYTES:
                        # Frame header and payload go out side by side: no extra copy.
                        pending.append((len(body) + 1).to_bytes(3, "big") + b"\x00")
                        pending.append(body)
                    else:
                        pending.append(encode_message(body, compression))
                    size += len(body)
                    if out.tail is None and size < FLUSH_BYTES:
                        continue
                else:
                    pending.append(encode_message(encode_position(2, *out.tail), compression))
                await send(
                    {"type": "http.response.body", "body": b"".join(pending), "more_body": True}
                )
                pending, size = [], 0
        except ApiError as e:
            pending.append(encode_terminal(e.status, e.body))
        await send({"type": "http.response.body", "body": b"".join(pending), "more_body": False})

    async def _read_sse(
        self, send: Send, stream: Stream, start: int, spec: ReadSpec, fmt: str
    ) -> None:
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [
                    (b"content-type", b"text/event-stream"),
                    (b"cache-control", b"no-cache, no-transform"),
                    (b"x-accel-buffering", b"no"),
                ],
            }
        )
        count = nbytes = 0
        try:
            async for out in read_session(self.store, stream, start, spec, self.heartbeat_interval):
                if isinstance(out, Batch):
                    count += len(out.entries)
                    nbytes += out.metered
                    data = _json_bytes(_batch_json(out.entries, out.tail, fmt))
                    event = (
                        b"event: batch\ndata: "
                        + data
                        + f"\nid: {out.last_seq},{count},{nbytes}\n\n".encode()
                    )
                else:
                    ping = {"timestamp": time.time_ns() // 1_000_000, "tail": _pos(out.tail)}
                    event = b"event: ping\ndata: " + _json_bytes(ping) + b"\n\n"
                await send({"type": "http.response.body", "body": event, "more_body": True})
            final = b"event: done\ndata: [DONE]\n\n"
        except ApiError as e:
            final = b"event: error\ndata: " + _json_bytes(e.body) + b"\n\n"
        await send({"type": "http.response.body", "body": final, "more_body": False})


# ---------------------------------------------------------------- body codecs


def _batch_json(entries: list[bytes], tail: tuple[int, int] | None, fmt: str) -> dict[str, Any]:
    records = []
    for entry in entries:
        rec = decode_entry(entry)
        records.append(
            {
                "seq_num": rec.seq_num,
                "timestamp": rec.timestamp,
                "headers": [[_enc(n, fmt), _enc(v, fmt)] for n, v in rec.headers],
                "body": _enc(rec.body, fmt),
            }
        )
    out: dict[str, Any] = {"records": records}
    if tail is not None:
        out["tail"] = _pos(tail)
    return out


def _enc(data: bytes, fmt: str) -> str:
    if fmt == "base64":
        return base64.b64encode(data).decode()
    return data.decode("utf-8", errors="replace")


def _dec(value: Any, fmt: str, what: str) -> bytes:
    if not isinstance(value, str):
        raise ApiError.bad("bad_json", f"{what} must be a string")
    if fmt == "base64":
        try:
            return base64.b64decode(value, validate=True)
        except (binascii.Error, ValueError) as e:
            raise ApiError.bad("bad_json", f"{what} is not valid base64: {e}") from e
    return value.encode()


def _opt_u64(value: Any, what: str) -> int | None:
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value < 2**64:
        raise ApiError.bad("bad_json", f"{what} must be an unsigned 64-bit integer")
    return value


def _parse_json_input(body: Any, fmt: str) -> tuple[list[AppendRecord], int | None, str | None]:
    if not isinstance(body, dict) or not isinstance(body.get("records"), list):
        raise ApiError.bad("bad_json", "request body must be an object with a `records` array")
    records: list[AppendRecord] = []
    for i, rec in enumerate(body["records"]):
        if not isinstance(rec, dict):
            raise ApiError.bad("bad_json", f"records[{i}] must be an object")
        headers: list[tuple[bytes, bytes]] = []
        for h in rec.get("headers") or []:
            if not isinstance(h, list) or len(h) != 2:
                raise ApiError.bad(
                    "bad_json", f"records[{i}].headers entries must be [name, value]"
                )
            headers.append((_dec(h[0], fmt, "header name"), _dec(h[1], fmt, "header value")))
        raw_body = rec.get("body")
        data = b"" if raw_body is None else _dec(raw_body, fmt, f"records[{i}].body")
        records.append((_opt_u64(rec.get("timestamp"), "timestamp"), headers, data))
    match = _opt_u64(body.get("match_seq_num"), "match_seq_num")
    fence = body.get("fencing_token")
    if fence is not None and not isinstance(fence, str):
        raise ApiError.bad("bad_json", "fencing_token must be a string")
    validate_fencing_token(fence)
    validate_records(records)
    return records, match, fence


def _parse_proto_input(data: bytes) -> tuple[list[AppendRecord], int | None, str | None]:
    try:
        records, match, fence = parse_append_input(data)
    except (ValueError, IndexError, UnicodeDecodeError):
        records, match, fence = _parse_proto_input_slow(data)
    validate_fencing_token(fence)
    validate_records(records)
    return records, match, fence


def _parse_proto_input_slow(data: bytes) -> tuple[list[AppendRecord], int | None, str | None]:
    """The protobuf runtime's parse: for inputs the fast parser does not handle."""
    msg = s2_pb2.AppendInput()
    try:
        msg.ParseFromString(data)
    except DecodeError as e:
        raise ApiError.bad("bad_proto", f"invalid AppendInput protobuf: {e}") from e
    records: list[AppendRecord] = []
    for r in msg.records:
        headers = [(h.name, h.value) for h in r.headers]
        records.append((r.timestamp if r.HasField("timestamp") else None, headers, r.body))
    match = msg.match_seq_num if msg.HasField("match_seq_num") else None
    fence = msg.fencing_token if msg.HasField("fencing_token") else None
    return records, match, fence
