"""Handlers for reads: check tail, and reads as unary JSON or protobuf, SSE or S2S.

Every read resolves its start (`_read.resolve_start`) and runs one `_read.read_session`;
the formats differ only in how batches and heartbeats are framed. A unary read is
bounded by 1000 records / 1 MiB and waits at most 60 s; SSE and S2S sessions follow
the tail, sending heartbeats, until a bound or `wait` ends them or the client leaves.
Reads of an encrypted stream need its key (`encryption`); tail checks do not.
"""

from __future__ import annotations

import math
import time
from typing import Any

from s2_spark.testing.semantics.codecs import batch_json, is_proto, pos_json, record_format
from s2_spark.testing.semantics.config import config_from_header
from s2_spark.testing.semantics.encryption import Sealer, key_from_header, resolve
from s2_spark.testing.semantics.errors import ApiError
from s2_spark.testing.semantics.names import stream_in_path
from s2_spark.testing.semantics.read import (
    Batch,
    HeartbeatInterval,
    ReadSpec,
    read_session,
    resolve_start,
)
from s2_spark.testing.semantics.records import encode_position
from s2_spark.testing.semantics.store import Store
from s2_spark.testing.semantics.stream import Stream
from s2_spark.testing.serving.asgi import (
    PROTO_HEADERS,
    Request,
    Send,
    json_bytes,
    query_bool,
    query_int,
    respond,
    respond_json,
    rust_uint,
    start_session,
    until_disconnect,
)
from s2_spark.wire.frames import (
    MAX_PAYLOAD_BYTES,
    Compression,
    encode_message,
    encode_terminal,
)

__all__ = ["FLUSH_BYTES", "MAX_UNARY_WAIT", "ReadHandlers"]

MAX_UNARY_WAIT = 60.0
#: An S2S read session sends what it has gathered once it holds this much (or catches up).
FLUSH_BYTES = 4 * 1024 * 1024


def _read_spec(req: Request) -> ReadSpec:
    spec = ReadSpec(
        seq_num=query_int(req, "seq_num"),
        timestamp=query_int(req, "timestamp"),
        tail_offset=query_int(req, "tail_offset"),
        clamp=bool(query_bool(req, "clamp")),
        count=query_int(req, "count"),
        bytes=query_int(req, "bytes"),
        until=query_int(req, "until"),
    )
    wait = query_int(req, "wait")
    spec.wait = None if wait is None else float(wait)
    starts = [x for x in (spec.seq_num, spec.timestamp, spec.tail_offset) if x is not None]
    if len(starts) > 1:
        raise ApiError.invalid("only one of seq_num, timestamp, or tail_offset can be provided")
    return spec


def _check_until(spec: ReadSpec) -> None:
    if spec.timestamp is not None and spec.until is not None and spec.until <= spec.timestamp:
        raise ApiError.invalid("start `timestamp` exceeds or equal to `until`")


def _apply_last_event_id(req: Request, spec: ReadSpec) -> tuple[int, int]:
    """Resume an SSE read after the event a reconnecting client names (seq,count,bytes);
    returns the count and bytes it says were delivered, from which the new events' ids go
    on counting (s2 `lite/src/handlers/v1/records.rs`, `apply_last_event_id`)."""
    raw = req.header("last-event-id")
    if raw is None:
        return 0, 0
    parts = raw.split(",", 2)  # Rust's `splitn(3, ",")`: the last part keeps any commas
    values: list[int] = []
    padded: list[str | None] = [*parts, None, None, None]
    for field, part in zip(("seq_num", "count", "bytes"), padded, strict=False):
        if part is None:
            why = f"missing {field} in Last-Event-Id"
        else:
            try:
                values.append(rust_uint(part))
                continue
            except ValueError as e:
                why = f"invalid {field} in Last-Event-ID: {e}"
        raise ApiError.bad("bad_header", f"Invalid header `last-event-id`: {why}")
    seq, count, nbytes = values
    spec.seq_num, spec.timestamp, spec.tail_offset = seq + 1, None, None
    if spec.count is not None:
        spec.count = max(spec.count - count, 0)
    if spec.bytes is not None:
        spec.bytes = max(spec.bytes - nbytes, 0)
    return count, nbytes


def _bound_unary(spec: ReadSpec) -> None:
    """Unary: always bounded by 1000 records / 1 MiB, wait at most 60 s."""
    spec.count = 1000 if spec.count is None else min(spec.count, 1000)
    spec.bytes = 1024 * 1024 if spec.bytes is None else min(spec.bytes, 1024 * 1024)
    if spec.wait is not None:
        spec.wait = min(spec.wait, MAX_UNARY_WAIT)


class ReadHandlers:
    """Reads of the streams of a `Store`; sessions send a heartbeat after a random delay
    within `heartbeat_interval` (seconds, low and high)."""

    def __init__(self, store: Store, heartbeat_interval: HeartbeatInterval) -> None:
        self.store = store
        self.heartbeat_interval = heartbeat_interval

    async def check_tail(self, req: Request, send: Send, name: str) -> None:
        stream = self.store.stream(
            req.basin_name(), stream_in_path(name), auto_create="create_stream_on_read"
        )
        await respond_json(send, 200, {"tail": pos_json(stream.tail)})

    def _start(
        self, basin: str, name: str, spec: ReadSpec, key: str | None, config: Any
    ) -> tuple[Stream, int, Sealer | None]:
        """The stream (created with `config` where the basin creates streams on read), the
        key resolved against its cipher, then the start (s2-lite's order: a missing key is
        answered before a start beyond the tail)."""
        _check_until(spec)
        stream = self.store.stream(basin, name, auto_create="create_stream_on_read",
                                   config=config)
        sealer = resolve(stream.cipher, key, basin, name)
        return stream, resolve_start(self.store, stream, spec), sealer

    async def read(self, req: Request, send: Send, name: str) -> None:
        basin = req.basin_name()
        name = stream_in_path(name)
        spec = _read_spec(req)
        key = key_from_header(req.headers)
        config = config_from_header(req.headers)
        # An S2S session is asked for by its Content-Type alone (s2 `api/src/v1/stream/
        # extract.rs`, `ReadRequest`); `Accept: s2s/proto` alone is a unary JSON read.
        if req.mime("content-type") == "s2s/proto":
            stream, start, sealer = self._start(basin, name, spec, key, config)
            return await until_disconnect(
                req, self._read_s2s(req, send, stream, start, spec, sealer)
            )
        fmt = record_format(req)
        if req.mime("accept") == "text/event-stream":
            delivered = _apply_last_event_id(req, spec)
            stream, start, sealer = self._start(basin, name, spec, key, config)
            return await until_disconnect(
                req, self._read_sse(send, stream, start, spec, fmt, sealer, delivered)
            )
        _bound_unary(spec)
        stream, start, sealer = self._start(basin, name, spec, key, config)
        await self._read_unary(req, send, stream, start, spec, fmt, sealer)

    async def _read_unary(
        self, req: Request, send: Send, stream: Stream, start: int, spec: ReadSpec, fmt: str,
        sealer: Sealer | None,
    ) -> None:
        entries: list[bytes] = []
        tail: tuple[int, int] | None = None
        wait_mode = False
        # Heartbeats tell a unary read only that it caught up (the first): no more.
        async for out in read_session(self.store, stream, start, spec, (math.inf, math.inf),
                                      sealer):
            if isinstance(out, Batch):
                entries.extend(out.entries)
                tail = out.tail
                if wait_mode:
                    break
            else:
                if entries:
                    break
                wait_mode = True
        if is_proto(req.mime("accept")):
            body = b"".join(entries)
            if tail is not None:
                body += encode_position(2, *tail)
            await respond(send, 200, body, PROTO_HEADERS)
        else:
            await respond_json(send, 200, batch_json(entries, tail, fmt))

    async def _read_s2s(
        self, req: Request, send: Send, stream: Stream, start: int, spec: ReadSpec,
        sealer: Sealer | None,
    ) -> None:
        compression = Compression.negotiate(req.header("accept-encoding"))
        await start_session(send, b"s2s/proto")
        pending: list[bytes] = []
        size = 0
        beat = self.heartbeat_interval
        try:
            async for out in read_session(self.store, stream, start, spec, beat, sealer):
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
        self, send: Send, stream: Stream, start: int, spec: ReadSpec, fmt: str,
        sealer: Sealer | None, delivered: tuple[int, int],
    ) -> None:
        await start_session(send, b"text/event-stream")
        count, nbytes = delivered
        beat = self.heartbeat_interval
        try:
            async for out in read_session(self.store, stream, start, spec, beat, sealer):
                if isinstance(out, Batch):
                    count += len(out.entries)
                    nbytes += out.metered
                    data = json_bytes(batch_json(out.entries, out.tail, fmt))
                    event = (
                        b"event: batch\ndata: "
                        + data
                        + f"\nid: {out.last_seq},{count},{nbytes}\n\n".encode()
                    )
                else:
                    ping = {"timestamp": time.time_ns() // 1_000_000, "tail": pos_json(out.tail)}
                    event = b"event: ping\ndata: " + json_bytes(ping) + b"\n\n"
                await send({"type": "http.response.body", "body": event, "more_body": True})
            # s2-lite ends with an unnamed event (s2 `api/src/v1/stream/sse.rs`, `done_event`).
            final = b"data: [DONE]\n\n"
        except ApiError as e:
            final = b"event: error\ndata: " + json_bytes(e.body) + b"\n\n"
        await send({"type": "http.response.body", "body": final, "more_body": False})
