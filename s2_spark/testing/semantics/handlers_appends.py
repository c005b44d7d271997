"""Handlers for appends: unary (JSON or protobuf) and S2S append sessions.

A session appends each input as it arrives and answers each with an ack frame; reading
inputs never waits on writing acks, so a client may send all its inputs before reading
any ack (HTTP/1.1) or interleave them (HTTP/2). A failure ends the session with a
terminal frame carrying S2's error body. An encrypted stream's appends need a key (any
well-formed one: S2 cannot tell a wrong key at append), resolved before the session's
answer starts (`encryption`).
"""

from __future__ import annotations

import asyncio

from s2_spark.testing.semantics.append_rules import AppendRecord
from s2_spark.testing.semantics.codecs import (
    AppendInput,
    ack_json,
    ack_proto,
    is_proto,
    parse_json_input,
    parse_proto_input,
    record_format,
)
from s2_spark.testing.semantics.config import config_from_header
from s2_spark.testing.semantics.encryption import Sealer, key_from_header, resolve
from s2_spark.testing.semantics.errors import ApiError
from s2_spark.testing.semantics.names import stream_in_path
from s2_spark.testing.semantics.store import Store
from s2_spark.testing.semantics.stream import Stream
from s2_spark.testing.serving.asgi import (
    PROTO_HEADERS,
    Request,
    Send,
    respond,
    respond_json,
    start_session,
)
from s2_spark.testing.serving.counter import KindCounter
from s2_spark.wire.frames import (
    Compression,
    FrameDecoder,
    Message,
    Terminal,
    encode_message,
    encode_terminal,
)

__all__ = ["AppendHandlers"]

#: Frames to send, in order; None ends the session.
_Outbox = asyncio.Queue[bytes | None]


class AppendHandlers:
    """Appends to the streams of a `Store`. `outcomes` counts appends (a unary append or
    one input of a session) as `landed` or `refused` (412: a fencing token or
    `match_seq_num` that did not match); not S2, for tests and benchmarks."""

    def __init__(self, store: Store, outcomes: KindCounter) -> None:
        self.store = store
        self.outcomes = outcomes

    def _append(self, stream: Stream, records: list[AppendRecord], match: int | None,
                fence: str | None, sealer: Sealer | None
                ) -> tuple[tuple[int, int], tuple[int, int], tuple[int, int]]:
        try:
            ack = self.store.append(stream, records, match, fence, sealer)
        except ApiError as e:
            if e.status == 412:
                self.outcomes.add("refused")
            raise
        self.outcomes.add("landed")
        return ack

    async def append(self, req: Request, send: Send, name: str) -> None:
        basin = req.basin_name()
        name = stream_in_path(name)
        ctype = req.mime("content-type")
        key = key_from_header(req.headers)
        config = config_from_header(req.headers)
        if ctype == "s2s/proto":
            stream = self.store.stream(basin, name, auto_create="create_stream_on_append",
                                       config=config)
            sealer = resolve(stream.cipher, key, basin, name)
            return await self._append_session(req, send, stream, sealer)
        if is_proto(ctype):
            data = await req.body("bad_proto")
            records, match, fence = parse_proto_input(data)
        else:
            fmt = record_format(req)
            records, match, fence = parse_json_input(await req.json(), fmt)
        stream = self.store.stream(basin, name, auto_create="create_stream_on_append",
                                   config=config)
        sealer = resolve(stream.cipher, key, basin, name)
        ack = self._append(stream, records, match, fence, sealer)
        if is_proto(req.mime("accept")):
            await respond(send, 200, ack_proto(ack), PROTO_HEADERS)
        else:
            await respond_json(send, 200, ack_json(ack))

    async def _append_session(
        self, req: Request, send: Send, stream: Stream, sealer: Sealer | None
    ) -> None:
        """S2S append: a reader task appends each input as it arrives and queues the ack;
        this task writes acks."""
        compression = Compression.negotiate(req.header("accept-encoding"))
        out: _Outbox = asyncio.Queue()
        await start_session(send, b"s2s/proto")
        task = asyncio.create_task(self._append_inputs(req, stream, sealer, compression, out))
        try:
            await _send_frames(send, out)
        finally:
            if not task.done():
                task.cancel()

    async def _append_inputs(
        self, req: Request, stream: Stream, sealer: Sealer | None, compression: Compression,
        out: _Outbox,
    ) -> None:
        """Append each input frame as it arrives, queueing its ack (or the terminal frame
        that ends the session), then the end of the session."""
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
                    records, match, fence = _session_input(bytes(frame.body))
                    ack = self._append(stream, records, match, fence, sealer)
                    out.put_nowait(encode_message(ack_proto(ack), compression))
                if not msg.get("more_body", False):
                    decoder.finish()
                    break
        except ApiError as e:
            out.put_nowait(encode_terminal(e.status, e.body))
        except Exception as e:
            out.put_nowait(encode_terminal(400, {"code": "bad_frame", "message": str(e)}))
        out.put_nowait(None)


def _session_input(data: bytes) -> AppendInput:
    """A session's input: one that is not an AppendInput is a frame that does not decode,
    400 `bad_frame` (s2-lite decodes the message with the frame), not `bad_proto`."""
    try:
        return parse_proto_input(data)
    except ApiError as e:
        if e.body.get("code") != "bad_proto":
            raise
        raise ApiError.bad("bad_frame", e.body["message"]) from e


async def _send_frames(send: Send, out: _Outbox) -> None:
    """Send queued frames until the end, joining those already queued into one body."""
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
            await send({"type": "http.response.body", "body": b"".join(chunks), "more_body": True})
        if done:
            break
    await send({"type": "http.response.body", "body": b"", "more_body": False})
