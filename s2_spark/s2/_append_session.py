"""S2S append sessions over httpx, half-duplex: send every input, then read every ack.

httpx cannot read a response while it is still sending the request, so a session is one
POST whose body holds all AppendInput frames (sized up front) and whose response holds
one AppendAck frame per input, in order. The number of inputs per session is bounded so
unread acks never fill the socket buffers. Ordering is S2's: inputs of one session are
applied in the order sent, and the first one that fails ends the session, so the acks
name exactly the prefix that landed.

Each input may carry its own fencing token (`fencing_tokens`): a writer whose inputs each
end with a fence record conditions input k on the token input k-1 sets. If one input
fails its condition every later one fails too, so a whole chain can be sent without
waiting for acks and still never duplicates records.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING
from urllib.parse import quote

import httpx

from s2_spark._http import BodyDecodingError, Exchange
from s2_spark.errors import FrameError, S2Error, ServiceError
from s2_spark.wire.frames import Compression, FrameDecoder, Message, message_parts

from ._acks import PROTO_ACCEPT, PROTO_HEADERS, SESSION_HEADERS, ack_objects, ack_of, acks_of
from ._errors import (
    error_from_decoding,
    error_from_response,
    error_from_status,
    error_from_transport,
)
from ._limits import MAX_INPUTS_PER_SESSION
from ._transport import Transport
from ._types import AppendAck

if TYPE_CHECKING:
    from s2_spark.wire.appends import AppendBatch

__all__ = [
    "MAX_INPUTS_PER_SESSION",
    "PROTO_ACCEPT",
    "PROTO_HEADERS",
    "SESSION_HEADERS",
    "SessionResult",
    "ack_objects",
    "ack_of",
    "acks_of",
    "run_append_session",
]


@dataclass(slots=True)
class SessionResult:
    """What one session achieved: acks for a prefix of the inputs, and the error if any
    (its `unsent` is true when the failure provably had no effect: nothing was sent, or
    S2's answer, a status or a terminal frame, guarantees no side effect)."""

    acks: list[AppendAck]
    error: ServiceError | None = None


def _read_acks(chunks: Iterator[bytes], acks: list[AppendAck], expected: int,
               target: str) -> SessionResult | None:
    """Acks from the session's frames into `acks`: a result once all `expected` came or
    the server ended with an error; None when the body ended first."""
    decoder = FrameDecoder()
    for chunk in chunks:
        for frame in decoder.feed(chunk):
            if isinstance(frame, Message):
                acks.append(ack_of(frame.body))
                continue
            return SessionResult(acks, error_from_status(frame.status, frame.error(), target))
        if len(acks) == expected:
            _drain(chunks)
            return SessionResult(acks)
    decoder.finish()
    return None


def run_append_session(
    transport: Transport,
    basin: str,
    stream: str,
    batches: Sequence[AppendBatch],
    *,
    match_seq_num: int | None,
    fencing_token: str | None = None,
    fencing_tokens: Sequence[str | None] | None = None,
) -> SessionResult:
    """Append `batches` in one S2S session. Never raises S2 errors: returns them.

    `match_seq_num` conditions the first input; each later one is conditioned on the end
    of the one before (counted from the batches). `fencing_tokens`, when given, holds one
    token per input instead of the single `fencing_token` for all of them. A session of
    one input is sent as a unary append instead: the same conditions and outcomes, at
    about half the client's cost (no frames, a response read whole).
    """
    if len(batches) == 1:
        token = fencing_tokens[0] if fencing_tokens is not None else fencing_token
        return _unary_append(transport, basin, stream, batches[0], match_seq_num, token)
    target = f"stream {stream!r} in basin {basin!r}"
    compression = transport.route(basin).compression
    body = _session_body(batches, match_seq_num, fencing_token, fencing_tokens, compression)
    path = f"/streams/{quote(stream, safe='')}/records"
    acks: list[AppendAck] = []
    exchange = Exchange()
    try:
        with transport.send("POST", basin, path, SESSION_HEADERS, content=body, trace=exchange,
                            stream=True) as resp:
            if resp.status_code != 200:
                resp.read()
                return SessionResult(acks, error_from_response(resp, target))
            ended = _read_acks(resp.iter_bytes(), acks, len(batches), target)
            if ended is not None:
                return ended
    except httpx.TransportError as exc:
        failure = error_from_transport(exc, target, "append session", exchange, streamed=True)
        failure.__cause__ = exc
        failure.unsent = failure.unsent and not acks
        return SessionResult(acks, failure)
    except FrameError as exc:
        return SessionResult(
            acks, S2Error(f"append session of {target} got malformed S2S data: {exc}")
        )
    except BodyDecodingError as exc:
        return SessionResult(acks, error_from_decoding(exc, target))
    if len(acks) < len(batches):
        return SessionResult(
            acks,
            error_from_status(
                503,
                {"message": f"session ended after {len(acks)} of {len(batches)} acks"},
                target,
            ),
        )
    return SessionResult(acks)


def _unary_append(transport: Transport, basin: str, stream: str, batch: AppendBatch,
                  match_seq_num: int | None, fencing_token: str | None) -> SessionResult:
    """One protobuf append, its outcome as a session's. Only an unconditioned append needs
    to know whether it left (a repeat could duplicate it): others go untraced."""
    target = f"stream {stream!r} in basin {basin!r}"
    exchange = Exchange(traced=match_seq_num is None and fencing_token is None)
    body, encoded = transport.route(basin).body(batch.to_append_input(match_seq_num,
                                                                      fencing_token))
    try:
        resp = transport.send("POST", basin, f"/streams/{quote(stream, safe='')}/records",
                              PROTO_HEADERS + encoded, trace=exchange, content=body)
    except httpx.TransportError as exc:
        failure = error_from_transport(exc, target, "append", exchange)
        failure.__cause__ = exc
        return SessionResult([], failure)
    except BodyDecodingError as exc:
        return SessionResult([], error_from_decoding(exc, target))
    if resp.status_code != 200:
        return SessionResult([], error_from_response(resp, target))
    return SessionResult([ack_of(resp.content)])


def _session_body(
    batches: Sequence[AppendBatch],
    match_seq_num: int | None,
    fencing_token: str | None,
    fencing_tokens: Sequence[str | None] | None,
    compression: Compression,
) -> bytes:
    """The AppendInput frames of a session, conditions chained input to input."""
    if fencing_tokens is None:
        fencing_tokens = [fencing_token] * len(batches)
    elif fencing_token is not None or len(fencing_tokens) != len(batches):
        raise ValueError(
            f"an append session takes one fencing token per input ({len(batches)}) or one "
            f"for all; got {len(fencing_tokens)} tokens"
            + (" and fencing_token too" if fencing_token is not None else "")
        )
    parts: list[bytes | memoryview] = []
    match = match_seq_num
    for b, token in zip(batches, fencing_tokens, strict=True):
        parts += message_parts(b.append_input_parts(match, token), compression)
        if match is not None:
            match += b.count
    return b"".join(parts)  # the records' one copy on the way


def _drain(chunks: Iterator[bytes]) -> None:
    """Read a finished session's response to its end (the server ends it once the input
    has ended), so its connection goes back to the pool instead of being closed. Every
    ack is in already: a failure here only costs the connection."""
    try:
        for _ in chunks:
            pass
    except (httpx.TransportError, BodyDecodingError):
        pass
