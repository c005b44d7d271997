"""The local server against s2-lite itself, request by request.

Each group below is a list of named steps (one HTTP request each). A group runs against
a fresh `LocalS2Server()` and a fresh `S2Lite()` (the pinned build), and each answer is
normalised to a comparable dict: the HTTP status, the headers that matter
(content-type, content-encoding, cache-control, x-accel-buffering, every `s2-*`), and the
body, decoded by its content type (JSON; protobuf as its message; SSE as its events,
pings left out; S2S as its frames, heartbeats left out). What depends on the wall clock
is normalised deliberately: creation and deletion times (`*_at`) become `<time>`, and a
record or tail timestamp of 10^12 ms or more (arrival time) becomes `<wall-clock>`;
every other timestamp is the client's own, so equal on both.

A difference that is expected and documented is listed in `EXPECTED`, keyed by step name,
naming its row of the "What still differs from s2-lite" table of docs/local-server.md
(the test checks the row is there) and the fields it concerns; everything else in that
answer is still compared, and an entry whose difference went away fails the test too.
"""

from __future__ import annotations

import base64
import gzip
import json
import re
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
import zstandard
from google.protobuf.json_format import MessageToDict

from s2_spark._proto import s2_pb2
from s2_spark.testing import LocalS2Server
from s2_spark.testing.external import S2Lite
from s2_spark.wire.frames import Compression, FrameDecoder, Message, Terminal, encode_message

pytestmark = pytest.mark.s2_lite

DOC = Path(__file__).resolve().parents[1] / "docs" / "local-server.md"
#: Record and tail timestamps at or above this are arrival times (ms since 1970).
WALL_CLOCK_MS = 10**12
#: The headers compared besides every `s2-*` one.
HEADERS = ("content-type", "content-encoding", "cache-control", "x-accel-buffering")
KEY = base64.b64encode(bytes([0x42] * 32)).decode()
WRONG_KEY = base64.b64encode(bytes([0x24] * 32)).decode()

_UNSET: Any = object()


# ------------------------------------------------------------------ steps


@dataclass(frozen=True)
class Step:
    """One request, below `/v1`. `json` is a JSON body, `content` a raw one; `settle`
    repeats the request (up to 5 s) until its answer passes that check, for outcomes of
    background work whose timing differs (a deleted stream's removal, a trim's)."""

    name: str
    method: str
    path: str
    basin: str | None = None
    params: dict[str, Any] = field(default_factory=dict)
    headers: dict[str, str] = field(default_factory=dict)
    json: Any = _UNSET
    content: bytes | None = None
    proto: str | None = None  # the protobuf message an answer holds: "ack" or "batch"
    settle: Callable[[httpx.Response], bool] | None = None


def _status(code: int) -> Callable[[httpx.Response], bool]:
    return lambda r: r.status_code == code


def _no_records(r: httpx.Response) -> bool:
    return r.status_code == 200 and not r.json().get("records")


@dataclass(frozen=True)
class Expected:
    """A documented difference: its row of the table (the Area column, verbatim), the
    dotted fields of the normalised answer it concerns, and why."""

    row: str
    fields: tuple[str, ...]
    reason: str


def _rec(body: str, ts: int, headers: list[list[str]] | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {"body": body, "timestamp": ts}
    if headers is not None:
        out["headers"] = headers
    return out


def _append(name: str, basin: str, stream: str, records: list[dict[str, Any]],
            **extra: Any) -> Step:
    headers = extra.pop("headers", {})
    return Step(name, "POST", f"/streams/{stream}/records", basin,
                json={"records": records, **extra}, headers=headers)


def _read(name: str, basin: str, stream: str, **params: Any) -> Step:
    headers = params.pop("headers", {})
    proto = params.pop("proto", None)
    settle = params.pop("settle", None)
    return Step(name, "GET", f"/streams/{stream}/records", basin, params=params,
                headers=headers, proto=proto, settle=settle)


def _proto_input(records: list[tuple[int, list[tuple[bytes, bytes]], bytes]],
                 **extra: Any) -> bytes:
    msg = s2_pb2.AppendInput(**extra)
    for ts, headers, body in records:
        msg.records.add(timestamp=ts, body=body,
                        headers=[s2_pb2.Header(name=n, value=v) for n, v in headers])
    return bytes(msg.SerializeToString())


def _command(op: str, body: str, ts: int) -> dict[str, Any]:
    return _rec(body, ts, [["", op]])


def _trim(seq_num: int, ts: int) -> dict[str, Any]:
    """A trim command record, for `S2-Format: base64` (its body is 8 bytes)."""
    return _rec(base64.b64encode(seq_num.to_bytes(8, "big")).decode(), ts,
                [["", base64.b64encode(b"trim").decode()]])


# ------------------------------------------------------------------ groups

B = "diff-basin-a"


def _control() -> list[Step]:
    h = {"content-type": "application/json"}
    return [
        Step("create_basin", "POST", "/basins", json={"basin": B}),
        Step("create_basin_again", "POST", "/basins", json={"basin": B}),
        Step("create_basin_token", "POST", "/basins", json={"basin": "diff-basin-b"},
             headers={"s2-request-token": "tok-1"}),
        Step("create_basin_token_retry", "POST", "/basins", json={"basin": "diff-basin-b"},
             headers={"s2-request-token": "tok-1"}),
        Step("create_basin_token_other", "POST", "/basins", json={"basin": "diff-basin-b"},
             headers={"s2-request-token": "tok-2"}),
        Step("create_basin_token_too_long", "POST", "/basins", json={"basin": "diff-basin-x"},
             headers={"s2-request-token": "t" * 37}),
        Step("create_basin_config", "POST", "/basins", json={
            "basin": "diff-basin-c",
            "config": {"default_stream_config": {"storage_class": "standard",
                                                 "retention_policy": {"age": 86400},
                                                 "timestamping": {"mode": "client-require"}},
                       "create_stream_on_append": True, "create_stream_on_read": False}}),
        Step("create_basin_bad_chars", "POST", "/basins", json={"basin": "Diff_Basin"}),
        Step("create_basin_short", "POST", "/basins", json={"basin": "short"}),
        Step("create_basin_hyphen_end", "POST", "/basins", json={"basin": "diff-basin-"}),
        Step("create_basin_no_name", "POST", "/basins", json={}),
        Step("create_basin_unknown_field", "POST", "/basins",
             json={"basin": "diff-basin-u", "colour": "red"}),
        Step("create_basin_bad_config", "POST", "/basins",
             json={"basin": "diff-basin-v", "config": {"default_stream_config": {
                 "storage_class": "premium"}}}),
        Step("list_basins", "GET", "/basins"),
        Step("list_basins_any_token", "GET", "/basins", params={"limit": 1},
             headers={"authorization": "Bearer not-a-token"}),
        Step("list_basins_prefix_limit", "GET", "/basins",
             params={"prefix": "diff-basin", "limit": 2}),
        Step("list_basins_start_after", "GET", "/basins",
             params={"prefix": "diff-basin", "start_after": "diff-basin-a"}),
        Step("list_basins_limit_0", "GET", "/basins", params={"limit": 0}),
        Step("list_basins_limit_big", "GET", "/basins", params={"limit": 5000}),
        Step("list_basins_bad_prefix", "GET", "/basins", params={"prefix": "-x"}),
        Step("list_basins_bad_limit", "GET", "/basins", params={"limit": "many"}),
        Step("get_basin_config", "GET", f"/basins/{B}"),
        Step("get_basin_config_c", "GET", "/basins/diff-basin-c"),
        Step("get_basin_missing", "GET", "/basins/diff-basin-zz"),
        Step("get_basin_bad_name", "GET", "/basins/BAD"),
        Step("ensure_basin_new", "PUT", "/basins/diff-basin-d", json={}),
        Step("ensure_basin_noop", "PUT", "/basins/diff-basin-d", json={}),
        Step("ensure_basin_update", "PUT", "/basins/diff-basin-d",
             json={"config": {"create_stream_on_read": True}}),
        Step("ensure_basin_no_body", "PUT", "/basins/diff-basin-e"),
        Step("reconfigure_basin", "PATCH", f"/basins/{B}",
             json={"default_stream_config": {"retention_policy": {"age": 3600}},
                   "create_stream_on_append": True}),
        Step("reconfigure_basin_missing", "PATCH", "/basins/diff-basin-zz", json={}),
        Step("get_basin_after_reconfigure", "GET", f"/basins/{B}"),
        Step("create_stream", "POST", "/streams", B, json={"stream": "s1"}),
        Step("create_stream_again", "POST", "/streams", B, json={"stream": "s1"}),
        Step("create_stream_config", "POST", "/streams", B, json={
            "stream": "s2", "config": {"storage_class": "express",
                                       "retention_policy": {"infinite": {}},
                                       "timestamping": {"mode": "arrival", "uncapped": True},
                                       "delete_on_empty": {"min_age_secs": 60}}}),
        Step("create_stream_bad_config", "POST", "/streams", B, json={
            "stream": "s3", "config": {"retention_policy": {"age": 0}}}),
        Step("create_stream_bad_name", "POST", "/streams", B, json={"stream": ".."}),
        Step("create_stream_empty_name", "POST", "/streams", B, json={"stream": ""}),
        Step("create_stream_no_basin", "POST", "/streams", json={"stream": "s1"}),
        Step("create_stream_bad_basin_header", "POST", "/streams", "NOT A BASIN",
             json={"stream": "s1"}),
        Step("create_stream_missing_basin", "POST", "/streams", "diff-basin-zz",
             json={"stream": "s1"}),
        Step("list_streams", "GET", "/streams", B),
        Step("list_streams_prefix_limit", "GET", "/streams", B,
             params={"prefix": "s", "limit": 1}),
        Step("list_streams_start_after", "GET", "/streams", B, params={"start_after": "s1"}),
        Step("list_streams_missing_basin", "GET", "/streams", "diff-basin-zz"),
        Step("get_stream_config", "GET", "/streams/s1", B),
        Step("get_stream_config_2", "GET", "/streams/s2", B),
        Step("get_stream_missing", "GET", "/streams/nope", B),
        Step("get_stream_dotdot", "GET", "/streams/..", B),
        Step("reconfigure_stream", "PATCH", "/streams/s1", B,
             json={"retention_policy": {"age": 60}, "timestamping": {"mode": "client-prefer"}}),
        Step("reconfigure_stream_null", "PATCH", "/streams/s1", B,
             json={"retention_policy": None}),
        Step("reconfigure_stream_bad", "PATCH", "/streams/s1", B,
             json={"storage_class": "gold"}),
        Step("reconfigure_stream_unknown_field", "PATCH", "/streams/s1", B,
             json={"colour": "red"}),
        Step("reconfigure_stream_missing", "PATCH", "/streams/nope", B, json={}),
        Step("get_stream_after_reconfigure", "GET", "/streams/s1", B),
        Step("ensure_stream_new", "PUT", "/streams/s4", B,
             json={"retention_policy": {"age": 120}}),
        Step("ensure_stream_noop", "PUT", "/streams/s4", B,
             json={"retention_policy": {"age": 120}}),
        Step("ensure_stream_update", "PUT", "/streams/s4", B,
             json={"storage_class": "standard"}),
        Step("get_stream_after_ensure", "GET", "/streams/s4", B),
        Step("ensure_stream_no_body", "PUT", "/streams/s5", B),
        Step("ensure_stream_json_no_body", "PUT", "/streams/s6", B, headers=h),
        Step("delete_stream", "DELETE", "/streams/s1", B),
        Step("delete_stream_gone", "GET", "/streams/s1", B, settle=_status(404)),
        Step("delete_stream_missing", "DELETE", "/streams/nope", B),
        Step("list_streams_after_delete", "GET", "/streams", B),
        Step("delete_basin", "DELETE", "/basins/diff-basin-d"),
        Step("delete_basin_missing", "DELETE", "/basins/diff-basin-zz"),
        Step("unknown_route", "GET", "/nothing-here"),
        Step("wrong_method", "POST", f"/basins/{B}", json={}),
        Step("access_tokens", "GET", "/access-tokens"),
        Step("usage_metrics_no_set", "GET", "/metrics"),
        Step("usage_metrics_basin", "GET", f"/metrics/{B}", params={"set": "storage"}),
    ]


S = "s"


def _appends() -> list[Step]:
    big = "x" * (1024 * 1024)
    return [
        Step("setup_basin", "POST", "/basins", json={"basin": B}),
        Step("setup_stream", "POST", "/streams", B, json={"stream": S}),
        Step("setup_require", "POST", "/streams", B, json={
            "stream": "require", "config": {"timestamping": {"mode": "client-require"}}}),
        _append("json", B, S, [_rec("a", 1000, [["h1", "v1"], ["h2", ""]]),
                               _rec("b", 1001)]),
        _append("json_match_ok", B, S, [_rec("c", 1002)], match_seq_num=2),
        _append("json_match_wrong", B, S, [_rec("d", 1003)], match_seq_num=0),
        _append("json_ts_backwards", B, S, [_rec("e", 500)]),
        _append("json_ts_future", B, S, [_rec("f", 2**62)]),
        _append("json_no_ts", B, S, [{"body": "g"}]),
        _append("fence", B, S, [_command("fence", "tok-a", 2000)]),
        _append("fence_wrong_token", B, S, [_rec("h", 2001)], fencing_token="tok-b"),
        _append("fence_right_token", B, S, [_rec("i", 2002)], fencing_token="tok-a"),
        _append("fence_no_token", B, S, [_rec("j", 2003)]),
        _append("fence_token_too_long", B, S, [_rec("k", 2004)], fencing_token="t" * 37),
        _append("fence_clear", B, S, [_command("fence", "", 2005)], fencing_token="tok-a"),
        _append("fence_after_clear", B, S, [_rec("l", 2006)], fencing_token="tok-a"),
        _append("fence_too_long_body", B, S, [_command("fence", "t" * 37, 2007)]),
        _append("command_bad_op", B, S, [_command("nope", "", 2008)]),
        _append("command_two_headers", B, S, [_rec("x", 2009, [["", "fence"], ["a", "b"]])]),
        _append("trim_bad_body", B, S, [_command("trim", "abc", 2010)]),
        _append("base64", B, S, [{"body": base64.b64encode(b"\x00\xff").decode(),
                                  "headers": [["aGk=", "dGhlcmU="]], "timestamp": 3000}],
                headers={"s2-format": "base64"}),
        _append("base64_bad", B, S, [{"body": "@@@", "timestamp": 3001}],
                headers={"s2-format": "base64"}),
        _append("format_bad", B, S, [_rec("m", 3002)], headers={"s2-format": "yaml"}),
        Step("proto", "POST", f"/streams/{S}/records", B,
             content=_proto_input([(4000, [(b"p", b"q")], b"\x01\x02")]),
             headers={"content-type": "application/protobuf",
                      "accept": "application/protobuf"}, proto="ack"),
        Step("proto_json_ack", "POST", f"/streams/{S}/records", B,
             content=_proto_input([(4001, [], b"r")], match_seq_num=999),
             headers={"content-type": "application/protobuf"}),
        Step("proto_garbage", "POST", f"/streams/{S}/records", B, content=b"\xff\xff\xff",
             headers={"content-type": "application/protobuf"}),
        _append("oversize", B, S, [_rec(big, 5000)]),
        _append("oversize_batch", B, S, [_rec(big[: 600 * 1024], 5000),
                                         _rec(big[: 600 * 1024], 5001)]),
        _append("just_under_limit", B, S, [_rec(big[: 1024 * 1024 - 8], 5002)]),
        _append("empty_batch", B, S, []),
        _append("too_many_records", B, S, [_rec("", 6000)] * 1001),
        _append("max_records", B, S, [_rec("", 6001)] * 1000),
        _append("require_missing_ts", B, "require", [{"body": "n"}]),
        _append("require_ts", B, "require", [_rec("o", 7000)]),
        _append("missing_stream", B, "nope", [_rec("p", 1)]),
        _append("missing_basin", "diff-basin-zz", S, [_rec("p", 1)]),
        Step("tail", "GET", f"/streams/{S}/records/tail", B),
    ]


R = "r"


def _reads() -> list[Step]:
    records = [_rec(f"body-{i}", 1000 + 10 * i, [["k", str(i)]]) for i in range(6)]
    sse = {"accept": "text/event-stream"}
    return [
        Step("setup_basin", "POST", "/basins", json={"basin": B}),
        Step("setup_stream", "POST", "/streams", B, json={"stream": R}),
        Step("setup_empty", "POST", "/streams", B, json={"stream": "empty"}),
        _append("setup_records", B, R, records),
        _read("seq_num_0", B, R, seq_num=0),
        _read("no_start", B, R),
        _read("seq_num_2_count_2", B, R, seq_num=2, count=2),
        _read("timestamp", B, R, timestamp=1025),
        _read("timestamp_exact", B, R, timestamp=1030, count=1),
        _read("timestamp_past", B, R, timestamp=5000),
        _read("timestamp_past_count", B, R, timestamp=5000, count=1),
        _read("tail_offset_2", B, R, tail_offset=2),
        _read("tail_offset_big", B, R, tail_offset=100),
        _read("bytes_limit", B, R, seq_num=0, bytes=40),
        _read("bytes_limit_tiny", B, R, seq_num=0, bytes=1),
        _read("count_0", B, R, seq_num=0, count=0),
        _read("until", B, R, seq_num=0, until=1030),
        _read("until_le_timestamp", B, R, timestamp=1030, until=1030),
        _read("past_tail", B, R, seq_num=10),
        _read("at_tail_count", B, R, seq_num=6, count=1),
        _read("at_tail_unbounded", B, R, seq_num=6),
        _read("past_tail_clamp", B, R, seq_num=10, clamp="true"),
        _read("past_tail_clamp_count", B, R, seq_num=10, clamp="true", count=1),
        _read("two_starts", B, R, seq_num=0, timestamp=0),
        _read("empty_stream", B, "empty", seq_num=0),
        _read("empty_stream_count", B, "empty", seq_num=0, count=1),
        _read("base64", B, R, seq_num=4, headers={"s2-format": "base64"}),
        _read("proto", B, R, seq_num=1, count=3, headers={"accept": "application/protobuf"},
              proto="batch"),
        _read("proto_past_tail", B, R, seq_num=10, headers={"accept": "application/protobuf"}),
        _read("sse_count", B, R, seq_num=1, count=3, headers=sse),
        _read("sse_bytes", B, R, seq_num=0, bytes=50, headers=sse),
        _read("sse_past_tail", B, R, seq_num=10, headers=sse),
        _read("sse_last_event_id", B, R, seq_num=0, count=4,
              headers={**sse, "last-event-id": "1,2,40"}),
        _read("sse_bad_last_event_id", B, R, seq_num=0, count=4,
              headers={**sse, "last-event-id": "zzz"}),
        _read("s2s_count", B, R, seq_num=2, count=3, headers={"content-type": "s2s/proto"}),
        _read("s2s_past_tail", B, R, seq_num=10, headers={"content-type": "s2s/proto"}),
        _read("accept_s2s_only", B, R, seq_num=0, count=1, headers={"accept": "s2s/proto"}),
        _read("missing_stream", B, "nope", seq_num=0),
        Step("tail", "GET", f"/streams/{R}/records/tail", B),
        Step("tail_empty", "GET", "/streams/empty/records/tail", B),
        Step("tail_missing", "GET", "/streams/nope/records/tail", B),
    ]


C = "c"


def _commands() -> list[Step]:
    return [
        Step("setup_basin", "POST", "/basins", json={"basin": B}),
        Step("setup_stream", "POST", "/streams", B, json={"stream": C}),
        _append("records", B, C, [_rec(f"r{i}", 100 + i) for i in range(5)]),
        _append("fence", B, C, [_command("fence", "owner-1", 200)]),
        _append("fenced_append", B, C, [_rec("r5", 201)], fencing_token="owner-1"),
        _append("trim", B, C, [_trim(3, 300)],
                headers={"s2-format": "base64"}),
        Step("tail", "GET", f"/streams/{C}/records/tail", B),
        _read("commands_read_back", B, C, seq_num=5),
        _read("commands_read_back_base64", B, C, seq_num=5, headers={"s2-format": "base64"}),
        _read("after_trim", B, C, seq_num=3),
        _append("trim_past_tail", B, C, [_trim(1000, 400)],
                headers={"s2-format": "base64"}, fencing_token="owner-1"),
        Step("tail_after_trim_past_tail", "GET", f"/streams/{C}/records/tail", B),
        # s2-lite deletes trimmed records in the background, the trim record too.
        _read("read_after_trim_past_tail", B, C, seq_num=8, settle=_no_records),
        _append("fence_again", B, C, [_command("fence", "owner-2", 500)],
                fencing_token="owner-1"),
        _append("old_owner", B, C, [_rec("z", 501)], fencing_token="owner-1"),
        _read("tail_of_commands", B, C, seq_num=8),
    ]


A = "diff-basin-auto"


def _auto_create() -> list[Step]:
    def cfg(value: str) -> dict[str, str]:
        return {"s2-stream-config": value}

    wanted = '{"retention_policy":{"age":3600},"timestamping":{"mode":"client-require"}}'
    return [
        Step("setup_basin", "POST", "/basins", json={"basin": A, "config": {
            "create_stream_on_append": True, "create_stream_on_read": True,
            "default_stream_config": {"storage_class": "standard"}}}),
        Step("setup_plain_basin", "POST", "/basins", json={"basin": B}),
        _append("append_creates", A, "a1", [_rec("x", 1)]),
        Step("config_a1", "GET", "/streams/a1", A),
        _append("append_creates_with_config", A, "a2", [_rec("x", 1)], headers=cfg(wanted)),
        Step("config_a2", "GET", "/streams/a2", A),
        _append("append_existing_with_config", A, "a1", [_rec("y", 2)],
                headers=cfg('{"storage_class":"express"}')),
        Step("config_a1_unchanged", "GET", "/streams/a1", A),
        _read("read_creates_with_config", A, "r1", seq_num=0, count=1,
              headers=cfg('{"delete_on_empty":{"min_age_secs":60}}')),
        Step("config_r1", "GET", "/streams/r1", A),
        _read("read_creates_sse", A, "r2", seq_num=0, count=1,
              headers={"accept": "text/event-stream", **cfg('{"storage_class":"express"}')}),
        Step("tail_creates", "GET", "/streams/r3/records/tail", A),
        Step("list_streams", "GET", "/streams", A),
        _append("append_bad_json_config", A, "a3", [_rec("x", 1)], headers=cfg("{")),
        _append("append_zero_age_config", A, "a3", [_rec("x", 1)],
                headers=cfg('{"retention_policy":{"age":0}}')),
        _append("append_null_config", A, "a3", [_rec("x", 1)], headers=cfg("null")),
        _append("append_bad_class_config", A, "a3", [_rec("x", 1)],
                headers=cfg('{"storage_class":"gold"}')),
        _append("append_unknown_field_config", A, "a3", [_rec("x", 1)],
                headers=cfg('{"colour":"red"}')),
        _read("read_bad_config", A, "a1", seq_num=0, headers=cfg("[]")),
        _append("plain_basin_no_create", B, "a1", [_rec("x", 1)], headers=cfg("{}")),
        _append("plain_basin_bad_config", B, "a1", [_rec("x", 1)], headers=cfg("{")),
        Step("config_a3", "GET", "/streams/a3", A),
    ]


E = "diff-basin-enc"


def _encryption() -> list[Step]:
    def k(key: str | None) -> dict[str, str]:
        return {} if key is None else {"s2-encryption-key": key}

    return [
        Step("setup_basin", "POST", "/basins",
             json={"basin": E, "config": {"stream_cipher": "aegis-256"}}),
        Step("setup_plain_basin", "POST", "/basins", json={"basin": B}),
        Step("get_basin_config", "GET", f"/basins/{E}"),
        Step("setup_stream", "POST", "/streams", E, json={"stream": "e"}),
        Step("get_stream_config", "GET", "/streams/e", E),
        Step("setup_plain_stream", "POST", "/streams", B, json={"stream": "p"}),
        _append("append_key", E, "e", [_rec("secret", 10, [["h", "v"]])], headers=k(KEY)),
        _append("append_missing_key", E, "e", [_rec("x", 11)]),
        _append("append_malformed_key", E, "e", [_rec("x", 12)], headers=k("not base64!")),
        _append("append_short_key", E, "e", [_rec("x", 13)],
                headers=k(base64.b64encode(b"1" * 16).decode())),
        _append("append_fence_command", E, "e", [_command("fence", "t", 14)], headers=k(KEY)),
        _read("read_key", E, "e", seq_num=0, headers=k(KEY)),
        _read("read_wrong_key", E, "e", seq_num=0, headers=k(WRONG_KEY)),
        _read("read_missing_key", E, "e", seq_num=0),
        _read("read_malformed_key", E, "e", seq_num=0, headers=k("%%%")),
        _read("read_past_tail_no_key", E, "e", seq_num=10),
        _read("read_wrong_key_sse", E, "e", seq_num=0, count=1,
              headers={**k(WRONG_KEY), "accept": "text/event-stream"}),
        _read("read_wrong_key_s2s", E, "e", seq_num=0, count=1,
              headers={**k(WRONG_KEY), "content-type": "s2s/proto"}),
        _read("read_key_proto", E, "e", seq_num=0,
              headers={**k(KEY), "accept": "application/protobuf"}, proto="batch"),
        _append("append_wrong_key", E, "e", [_rec("other", 15)], headers=k(WRONG_KEY)),
        _read("read_mixed_keys", E, "e", seq_num=0, headers=k(KEY)),
        _read("read_from_wrong_key_record", E, "e", seq_num=2, headers=k(WRONG_KEY)),
        Step("tail_no_key", "GET", "/streams/e/records/tail", E),
        _append("plain_with_key", B, "p", [_rec("x", 20)], headers=k(KEY)),
        _append("plain_malformed_key", B, "p", [_rec("x", 21)], headers=k("nope")),
        _read("plain_read_with_key", B, "p", seq_num=0, headers=k(WRONG_KEY)),
        Step("bad_cipher", "POST", "/basins",
             json={"basin": "diff-basin-bad", "config": {"stream_cipher": "rot13"}}),
    ]


def _compression() -> list[Step]:
    big = [_rec("z" * 300, 1000 + i) for i in range(8)]
    body = json.dumps({"records": [_rec("gz", 2000)]}).encode()
    jh = {"content-type": "application/json"}
    return [
        Step("setup_basin", "POST", "/basins", json={"basin": B}),
        Step("setup_stream", "POST", "/streams", B, json={"stream": S}),
        _append("setup_records", B, S, big),
        _read("read_zstd", B, S, seq_num=0, headers={"accept-encoding": "zstd"}),
        _read("read_gzip", B, S, seq_num=0, headers={"accept-encoding": "gzip"}),
        _read("read_both", B, S, seq_num=0, headers={"accept-encoding": "gzip, zstd"}),
        _read("read_gzip_preferred", B, S, seq_num=0,
              headers={"accept-encoding": "gzip;q=1, zstd;q=0.5"}),
        _read("read_br_only", B, S, seq_num=0, headers={"accept-encoding": "br"}),
        _read("read_identity_refused", B, S, seq_num=0,
              headers={"accept-encoding": "identity;q=0"}),
        _read("read_star", B, S, seq_num=0, headers={"accept-encoding": "*"}),
        _read("read_small_zstd", B, S, seq_num=0, count=1, headers={"accept-encoding": "zstd"}),
        _read("read_proto_zstd", B, S, seq_num=0, proto="batch",
              headers={"accept-encoding": "zstd", "accept": "application/protobuf"}),
        _read("read_sse_zstd", B, S, seq_num=0, count=8,
              headers={"accept-encoding": "zstd", "accept": "text/event-stream"}),
        _read("read_s2s_zstd", B, S, seq_num=0, count=8,
              headers={"accept-encoding": "zstd", "content-type": "s2s/proto"}),
        _read("read_error_zstd", B, S, seq_num=100, headers={"accept-encoding": "zstd"}),
        Step("append_gzip", "POST", f"/streams/{S}/records", B, content=gzip.compress(body),
             headers={**jh, "content-encoding": "gzip"}),
        Step("append_zstd", "POST", f"/streams/{S}/records", B,
             content=zstandard.ZstdCompressor().compress(body),
             headers={**jh, "content-encoding": "zstd"}),
        Step("append_br", "POST", f"/streams/{S}/records", B, content=body,
             headers={**jh, "content-encoding": "br"}),
        Step("append_bad_gzip", "POST", f"/streams/{S}/records", B, content=b"not gzip",
             headers={**jh, "content-encoding": "gzip"}),
        Step("append_bad_gzip_proto", "POST", f"/streams/{S}/records", B, content=b"not gzip",
             headers={"content-type": "application/protobuf", "content-encoding": "gzip"}),
        Step("create_stream_gzip", "POST", "/streams", B,
             content=gzip.compress(b'{"stream": "gz"}'),
             headers={**jh, "content-encoding": "gzip"}),
        _read("read_after_compressed_appends", B, S, seq_num=8),
    ]


def _errors() -> list[Step]:
    jh = {"content-type": "application/json"}
    return [
        Step("setup_basin", "POST", "/basins", json={"basin": B}),
        Step("setup_stream", "POST", "/streams", B, json={"stream": S}),
        _append("setup_record", B, S, [_rec("a", 1)]),  # so no read below waits
        _read("seq_num_not_int", B, S, seq_num="abc"),
        _read("seq_num_negative", B, S, seq_num=-1),
        _read("count_not_int", B, S, seq_num=0, count="x"),
        _read("wait_too_long", B, S, seq_num=0, wait=61),
        _read("clamp_not_bool", B, S, seq_num=0, clamp="maybe"),
        _read("unknown_param", B, S, seq_num=0, colour="red"),
        Step("append_malformed_json", "POST", f"/streams/{S}/records", B,
             content=b'{"records": [', headers=jh),
        Step("append_not_object", "POST", f"/streams/{S}/records", B, json=[1, 2]),
        Step("append_unknown_field", "POST", f"/streams/{S}/records", B,
             json={"records": [_rec("a", 1)], "colour": "red"}),
        Step("append_record_unknown_field", "POST", f"/streams/{S}/records", B,
             json={"records": [{"body": "a", "colour": "red"}]}),
        Step("append_body_not_string", "POST", f"/streams/{S}/records", B,
             json={"records": [{"body": 5}]}),
        Step("append_header_not_pair", "POST", f"/streams/{S}/records", B,
             json={"records": [{"body": "a", "headers": [["x"]]}]}),
        Step("append_text_plain", "POST", f"/streams/{S}/records", B,
             content=b'{"records": []}', headers={"content-type": "text/plain"}),
        Step("append_no_content_type", "POST", f"/streams/{S}/records", B,
             content=b'{"records": [{"body": "a", "timestamp": 1}]}'),
        Step("append_ts_negative", "POST", f"/streams/{S}/records", B,
             json={"records": [{"body": "a", "timestamp": -1}]}),
        Step("append_match_string", "POST", f"/streams/{S}/records", B,
             json={"records": [_rec("a", 1)], "match_seq_num": "0"}),
        Step("create_basin_malformed", "POST", "/basins", content=b"{", headers=jh),
        Step("create_basin_text_plain", "POST", "/basins", content=b'{"basin": "diff-basin-t"}',
             headers={"content-type": "text/plain"}),
        Step("create_basin_no_content_type", "POST", "/basins",
             content=b'{"basin": "diff-basin-t"}'),
        Step("create_stream_not_object", "POST", "/streams", B, json="s"),
        Step("reconfigure_stream_malformed", "PATCH", f"/streams/{S}", B, content=b"[",
             headers=jh),
        Step("ensure_stream_malformed", "PUT", "/streams/s9", B, content=b"{", headers=jh),
        Step("ensure_stream_null", "PUT", "/streams/s9", B, content=b"null", headers=jh),
        Step("ensure_basin_null", "PUT", "/basins/diff-basin-n", content=b"null", headers=jh),
        Step("stream_name_too_long", "GET", "/streams/" + "n" * 513, B),
        Step("list_streams_no_basin", "GET", "/streams"),
        Step("tail_no_basin", "GET", f"/streams/{S}/records/tail"),
        Step("read_bad_stream_config_header", "GET", f"/streams/{S}/records", B,
             params={"seq_num": 0}, headers={"s2-stream-config": "{"}),
    ]


W = "w"


def _sessions() -> list[Step]:
    """S2S append sessions (each input framed, acks framed back, the session ended by the
    body's end or by a terminal frame) and long-polls (`wait`)."""
    s2s = {"content-type": "s2s/proto"}
    big = bytes(range(256)) * 8  # 2 KiB: its frame is compressed

    def session(name: str, *inputs: bytes, compression: Compression = Compression.NONE
                ) -> Step:
        body = b"".join(encode_message(i, compression) for i in inputs)
        return Step(name, "POST", f"/streams/{W}/records", B, content=body,
                    headers={**s2s, **({"s2-compression": "zstd"} if compression else {})},
                    proto="ack")

    return [
        Step("setup_basin", "POST", "/basins", json={"basin": B}),
        Step("setup_stream", "POST", "/streams", B, json={"stream": W}),
        session("s2s_append", _proto_input([(5, [], b"one")]),
                _proto_input([(6, [(b"k", b"v")], b"two"), (7, [], b"three")])),
        session("s2s_append_match", _proto_input([(8, [], b"four")], match_seq_num=3)),
        session("s2s_append_match_fails", _proto_input([(9, [], b"x")], match_seq_num=0),
                _proto_input([(10, [], b"never")])),
        session("s2s_append_zstd", _proto_input([(11, [], big)]),
                compression=Compression.ZSTD),
        session("s2s_append_empty"),
        session("s2s_append_fenced", _proto_input([(12, [(b"", b"fence")], b"me")]),
                _proto_input([(13, [], b"not-me")], fencing_token="other"),
                _proto_input([(14, [], b"never")])),
        session("s2s_append_unfenced", _proto_input([(15, [(b"", b"fence")], b"")],
                                                    fencing_token="me")),
        session("s2s_append_not_proto", b"\xff\xff\xff"),
        Step("s2s_append_cut_frame", "POST", f"/streams/{W}/records", B,
             content=encode_message(_proto_input([(16, [], b"cut")]))[:-2], headers=s2s,
             proto="ack"),
        _read("read_back", B, W, seq_num=0, headers={"s2-format": "base64"}),
        _read("wait_at_tail", B, W, seq_num=5, wait=1),
        _read("wait_with_records", B, W, seq_num=0, count=1, wait=5),
        _read("wait_past_tail", B, W, seq_num=9, wait=1),
        _read("wait_sse_at_tail", B, W, seq_num=5, wait=1,
              headers={"accept": "text/event-stream"}),
        _read("wait_s2s_count", B, W, seq_num=3, count=2, wait=1, headers=s2s),
    ]


GROUPS: dict[str, Callable[[], list[Step]]] = {
    "control": _control,
    "appends": _appends,
    "reads": _reads,
    "commands": _commands,
    "auto_create": _auto_create,
    "encryption": _encryption,
    "compression": _compression,
    "errors": _errors,
    "sessions": _sessions,
}

_SERDE = ("serde's wording for a JSON body it could not take, with its line and column; "
          "the local server says what is wrong in its own words")
_WORDING: dict[str, str] = {
    **dict.fromkeys(
        ["control/create_basin_bad_chars", "control/create_basin_short",
         "control/create_basin_hyphen_end", "control/create_basin_no_name",
         "control/create_stream_bad_name", "control/create_stream_empty_name",
         "appends/fence_token_too_long", "encryption/bad_cipher",
         "errors/append_malformed_json", "errors/append_not_object",
         "errors/append_body_not_string", "errors/append_header_not_pair",
         "errors/append_ts_negative", "errors/append_match_string",
         "errors/create_basin_malformed", "errors/create_stream_not_object",
         "errors/reconfigure_stream_malformed", "errors/ensure_stream_malformed",
         "errors/ensure_stream_null", "errors/ensure_basin_null"], _SERDE),
    **dict.fromkeys(
        ["auto_create/append_bad_json_config", "auto_create/append_null_config",
         "auto_create/read_bad_config", "auto_create/plain_basin_bad_config",
         "errors/read_bad_stream_config_header"],
        "serde's wording for an `s2-stream-config` header that is not a StreamConfig"),
    "appends/proto_garbage": "prost's wording for a protobuf body it could not decode",
    **dict.fromkeys(["compression/append_bad_gzip", "compression/append_bad_gzip_proto"],
                    "flate2's wording for a body that does not decompress"),
}

#: Documented differences: "group/step" -> the row of docs/local-server.md that covers it.
EXPECTED: dict[str, Expected] = {
    **{step: Expected("Error messages", ("body.message",), why)
       for step, why in _WORDING.items()},
    # A session's error is its terminal frame's: the first frame of the answer.
    "sessions/s2s_append_not_proto": Expected(
        "Error messages", ("body.0.error.message",),
        "prost's wording for a protobuf message it could not decode"),
    "sessions/s2s_append_cut_frame": Expected(
        "Error messages", ("body.0.error.message",),
        "tokio-util's wording for input that ends inside a frame; the local server says "
        "how much of it arrived"),
    "control/usage_metrics_no_set": Expected(
        "Usage metrics (`/v1/metrics...`)", ("status", "body"),
        "s2-lite takes the query string apart before it answers 501"),
}


# ------------------------------------------------------------------ normalising


def _clock(value: Any, key: str = "") -> Any:
    """Wall-clock values made comparable: `*_at` times and arrival timestamps."""
    if isinstance(value, dict):
        return {k: _clock(v, k) for k, v in value.items()}
    if isinstance(value, list):
        return [_clock(v, key) for v in value]
    if key.endswith("_at") and value is not None:
        return "<time>"
    if key == "timestamp" and isinstance(value, (int, str)) and int(value) >= WALL_CLOCK_MS:
        return "<wall-clock>"
    return value


def _proto_dict(data: bytes, kind: str | None) -> Any:
    message = {"ack": s2_pb2.AppendAck, "batch": s2_pb2.ReadBatch}.get(kind or "")
    if message is None:
        return {"bytes": base64.b64encode(data).decode()}
    parsed = message()
    parsed.ParseFromString(data)
    return MessageToDict(parsed, preserving_proto_field_name=True)


def _sse(text: str) -> list[dict[str, Any]]:
    """SSE events as {event, data, id}, pings left out (they carry the time)."""
    events = []
    for block in re.split(r"\r?\n\r?\n", text):
        event: dict[str, Any] = {}
        for line in block.splitlines():
            name, _, value = line.partition(":")
            value = value[1:] if value.startswith(" ") else value
            if name == "data":
                event["data"] = event["data"] + "\n" + value if "data" in event else value
            elif name in ("event", "id"):
                event[name] = value
        if not event or event.get("event") == "ping":
            continue
        if "data" in event and event["data"] != "[DONE]":
            event["data"] = json.loads(event["data"])
        events.append(event)
    return events


def _s2s(data: bytes, kind: str | None) -> list[dict[str, Any]]:
    """S2S frames: each message (AppendAck for `kind` "ack", else a ReadBatch with
    records: heartbeats, without, are left out), and the terminal frame."""
    decoder = FrameDecoder()
    out: list[dict[str, Any]] = []
    for frame in decoder.feed(data):
        if isinstance(frame, Terminal):
            out.append({"terminal": frame.status, "error": frame.error()})
            continue
        assert isinstance(frame, Message)
        message = _proto_dict(bytes(frame.body), kind or "batch")
        if kind == "ack" or message.get("records"):
            out.append(message)
    decoder.finish()
    return out


def _body(r: httpx.Response, step: Step) -> Any:
    ctype = r.headers.get("content-type", "").split(";")[0].strip()
    if not r.content:
        return None
    if ctype == "application/json":
        return r.json()
    if ctype == "application/protobuf":
        return _proto_dict(r.content, step.proto)
    if ctype == "text/event-stream":
        return _sse(r.text)
    if ctype == "s2s/proto":
        return _s2s(r.content, step.proto)
    return r.text


def normalise(r: httpx.Response, step: Step) -> dict[str, Any]:
    headers = {k: v for k, v in r.headers.items() if k in HEADERS or k.startswith("s2-")}
    return {"status": r.status_code, "headers": headers, "body": _clock(_body(r, step))}


# ------------------------------------------------------------------ running


def send(http: httpx.Client, step: Step) -> httpx.Response:
    headers = dict(step.headers)
    if step.basin is not None:
        headers["s2-basin"] = step.basin
    kwargs: dict[str, Any] = {"params": step.params, "headers": headers}
    if step.json is not _UNSET:
        kwargs["json"] = step.json
    elif step.content is not None:
        kwargs["content"] = step.content
    deadline = time.monotonic() + 5.0
    while True:
        r = http.request(step.method, step.path, **kwargs)
        if step.settle is None or step.settle(r) or time.monotonic() > deadline:
            return r
        time.sleep(0.05)


def run(url: str, steps: list[Step]) -> dict[str, dict[str, Any]]:
    # httpx asks for compressed answers by default; only the steps that say so do here.
    # A connection per request: a server may close one after refusing a body, and reusing
    # it would race that close (RemoteProtocolError) instead of comparing answers.
    with httpx.Client(base_url=f"{url}/v1", timeout=20,
                      limits=httpx.Limits(max_keepalive_connections=0),
                      headers={"accept-encoding": "identity"}) as http:
        return {step.name: normalise(send(http, step), step) for step in steps}


def _drop(answer: dict[str, Any], dotted: str) -> None:
    *path, last = dotted.split(".")
    node: Any = answer
    for part in path:  # a number is a list's index
        if isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            node = node.get(part) if isinstance(node, dict) else None
    if isinstance(node, dict):
        node.pop(last, None)


def _diff(local: Any, lite: Any, where: str = "") -> list[str]:
    if isinstance(local, dict) and isinstance(lite, dict):
        out = []
        for k in sorted(set(local) | set(lite), key=str):
            here = f"{where}.{k}" if where else str(k)
            if k not in local:
                out.append(f"  {here}: only s2-lite: {lite[k]!r}")
            elif k not in lite:
                out.append(f"  {here}: only local: {local[k]!r}")
            else:
                out += _diff(local[k], lite[k], here)
        return out
    if isinstance(local, list) and isinstance(lite, list) and len(local) == len(lite):
        return [d for i, (a, b) in enumerate(zip(local, lite, strict=True))
                for d in _diff(a, b, f"{where}[{i}]")]
    if local != lite:
        return [f"  {where}: local {_short(local)} != s2-lite {_short(lite)}"]
    return []


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) < 400 else text[:400] + "..."


def _table_rows() -> set[str]:
    """The Area column of the differences table."""
    text = DOC.read_text()
    table = text.split("## What still differs from s2-lite", 1)[1]
    return {line.split("|")[1].strip() for line in table.splitlines()
            if line.startswith("| ") and not line.startswith("| Area")}


@pytest.fixture
def both() -> Iterator[tuple[str, str]]:
    with LocalS2Server() as local, S2Lite() as lite:
        yield local.url, lite.url


@pytest.mark.parametrize("group", list(GROUPS))
def test_same_answers(group: str, both: tuple[str, str]) -> None:
    steps = GROUPS[group]()
    assert len({s.name for s in steps}) == len(steps), "step names must be unique"
    local, lite = run(both[0], steps), run(both[1], steps)
    rows = _table_rows()
    problems: list[str] = []
    for step in steps:
        a, b = local[step.name], lite[step.name]
        expected = EXPECTED.get(f"{group}/{step.name}")
        if expected is not None:
            assert expected.row in rows, f"{group}/{step.name}: no row {expected.row!r}"
            if not _diff(a, b):
                problems.append(f"{step.name}: listed as differing ({expected.row}) "
                                f"but answers the same: drop it from EXPECTED")
            for dotted in expected.fields:
                _drop(a, dotted)
                _drop(b, dotted)
            print(f"{step.name}: {', '.join(expected.fields)} differ as documented "
                  f"({expected.row}: {expected.reason})")
        lines = _diff(a, b)
        if lines:
            problems.append(f"{step.name} ({step.method} {step.path} {step.params or ''}):\n"
                            + "\n".join(lines))
    assert not problems, f"{len(problems)} step(s) differ:\n" + "\n".join(problems)
