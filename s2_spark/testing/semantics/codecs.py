"""Bodies of the local server's records endpoints: S2's JSON and protobuf shapes.

Appends arrive as JSON (`AppendInput` with records as text or base64, by `S2-Format`) or
protobuf; reads and acks leave as JSON, protobuf (stored entries joined as they are), or
inside SSE events and S2S frames, which the read and append handlers build from these.
"""

from __future__ import annotations

import base64
import binascii
from typing import Any

from google.protobuf.message import DecodeError

from s2_spark._proto import s2_pb2
from s2_spark.testing.semantics.append_rules import (
    AppendRecord,
    validate_fencing_token,
    validate_records,
)
from s2_spark.testing.semantics.errors import ApiError
from s2_spark.testing.semantics.records import decode_entry, encode_position, parse_append_input
from s2_spark.testing.serving.asgi import Request

__all__ = [
    "Ack",
    "ack_json",
    "ack_proto",
    "batch_json",
    "is_proto",
    "parse_json_input",
    "parse_proto_input",
    "pos_json",
    "record_format",
]

#: An append's (start, end, tail) positions, each (seq_num, timestamp).
Ack = tuple[tuple[int, int], ...]
#: A parsed append: its records, match_seq_num and fencing token.
AppendInput = tuple[list[AppendRecord], int | None, str | None]


def pos_json(p: tuple[int, int]) -> dict[str, int]:
    return {"seq_num": p[0], "timestamp": p[1]}


def is_proto(mime: str) -> bool:
    return mime in ("application/protobuf", "application/x-protobuf")


def record_format(req: Request) -> str:
    """How JSON carries record bytes, from `S2-Format`: "raw" (text) or "base64"."""
    raw = req.header("s2-format")
    value = "raw" if raw is None else raw.strip()  # case matters, as in s2 `api/src/data.rs`
    if value in ("raw", "json"):
        return "raw"
    if value in ("base64", "json-binsafe"):
        return "base64"
    raise ApiError.bad("bad_header", f"Invalid header `s2-format`: {raw}")


def ack_json(ack: Ack) -> dict[str, Any]:
    return {"start": pos_json(ack[0]), "end": pos_json(ack[1]), "tail": pos_json(ack[2])}


def ack_proto(ack: Ack) -> bytes:
    return encode_position(1, *ack[0]) + encode_position(2, *ack[1]) + encode_position(3, *ack[2])


def batch_json(entries: list[bytes], tail: tuple[int, int] | None, fmt: str) -> dict[str, Any]:
    records = []
    for entry in entries:
        rec = decode_entry(entry)
        # s2 `api/src/v1/stream/json.rs` (`RecordJson`) leaves out empty headers and body.
        record: dict[str, Any] = {"seq_num": rec.seq_num, "timestamp": rec.timestamp}
        if rec.headers:
            record["headers"] = [[_enc(n, fmt), _enc(v, fmt)] for n, v in rec.headers]
        if rec.body:
            record["body"] = _enc(rec.body, fmt)
        records.append(record)
    out: dict[str, Any] = {"records": records}
    if tail is not None:
        out["tail"] = pos_json(tail)
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
            # Decoded after parsing, as a validation (s2 `api/src/data.rs`, `Format::decode`).
            raise ApiError.invalid("invalid Base64 encoding") from e
    return value.encode()


def _opt_u64(value: Any, what: str) -> int | None:
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value < 2**64:
        raise ApiError.bad("bad_json", f"{what} must be an unsigned 64-bit integer")
    return value


def parse_json_input(body: Any, fmt: str) -> AppendInput:
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
    try:
        validate_fencing_token(fence)
    except ApiError as e:
        # In JSON the token is checked as it is deserialized: a 400, not a 422.
        raise ApiError.bad("bad_json", e.body["message"]) from e
    validate_records(records)
    return records, match, fence


def parse_proto_input(data: bytes) -> AppendInput:
    try:
        records, match, fence = parse_append_input(data)
    except (ValueError, IndexError, UnicodeDecodeError):
        records, match, fence = _parse_proto_input_slow(data)
    validate_fencing_token(fence)
    validate_records(records)
    return records, match, fence


def _parse_proto_input_slow(data: bytes) -> AppendInput:
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
