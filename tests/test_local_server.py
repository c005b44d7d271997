"""Direct HTTP tests of the local S2 server, for what s2-sdk cannot exercise.

JSON and SSE formats, Last-Event-ID resume, 416 cases, clamp, until, auth, retention,
limits, names and command records, with exact statuses and bodies.
"""

from __future__ import annotations

import base64
import json
import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest
from _waiting import wait_for as until

from s2_spark._proto import s2_pb2
from s2_spark.testing import LocalS2Server, ServerProcess
from s2_spark.wire.frames import FrameDecoder, Message, Terminal

#: The local server is what these tests test (s2-lite's answers are the reference they
#: follow; tests/test_s2_differential.py compares the two): each meets it.
pytestmark = pytest.mark.local_server

MIB = 1024 * 1024


class Api:
    """A stream on the shared server, reached over HTTP/1.1 with httpx."""

    def __init__(self, url: str, basin: str, stream: str) -> None:
        self.client = httpx.Client(base_url=url + "/v1", timeout=30)
        self.basin = basin
        self.stream = stream
        self.h = {"s2-basin": basin}

    def path(self, suffix: str = "/records") -> str:
        return f"/streams/{self.stream}{suffix}"

    def append(self, records: list[dict[str, Any]], **extra: Any) -> httpx.Response:
        return self.client.post(self.path(), headers=self.h, json={"records": records, **extra})

    def read(self, headers: dict[str, str] | None = None, **params: Any) -> httpx.Response:
        return self.client.get(self.path(), headers={**self.h, **(headers or {})}, params=params)

    def sse(self, headers: dict[str, str] | None = None, **params: Any) -> list[dict[str, str]]:
        hdrs = {**self.h, "accept": "text/event-stream", **(headers or {})}
        with self.client.stream("GET", self.path(), headers=hdrs, params=params) as r:
            assert r.status_code == 200, r.read()
            assert r.headers["content-type"] == "text/event-stream"
            text = r.read().decode()
        events = []
        for block in text.split("\n\n"):
            if not block.strip():
                continue
            event: dict[str, str] = {}
            for line in block.split("\n"):
                key, _, value = line.partition(": ")
                event[key] = value
            # An event without a name is a "message" (the SSE spec); s2-lite's end is one.
            event.setdefault("event", "message")
            events.append(event)
        return events

    def s2s(self, **params: Any) -> list[Message | Terminal]:
        hdrs = {**self.h, "content-type": "s2s/proto", "accept-encoding": "identity"}
        decoder = FrameDecoder()
        frames: list[Message | Terminal] = []
        with self.client.stream("GET", self.path(), headers=hdrs, params=params) as r:
            assert r.status_code == 200, r.read()
            for chunk in r.iter_bytes():
                frames.extend(decoder.feed(chunk))
        decoder.finish()
        return frames


@pytest.fixture
def api(s2_server: Any, unique: Callable[[str], str]) -> Iterator[Api]:
    basin = unique("lsb")
    a = Api(s2_server.url, basin, "events")
    assert a.client.post("/basins", json={"basin": basin}).status_code == 201
    r = a.client.post("/streams", headers=a.h, json={"stream": "events"})
    assert r.status_code == 201
    yield a
    a.client.close()


def _bodies(resp: httpx.Response) -> list[str]:
    return [rec["body"] for rec in resp.json()["records"]]


def _batch(frame: Message | Terminal) -> Any:
    assert isinstance(frame, Message)
    return s2_pb2.ReadBatch.FromString(frame.body)


# ------------------------------------------------------------------ formats


def test_json_raw_and_base64_round_trip(api: Api) -> None:
    r = api.append([{"body": "héllo", "headers": [["k", "v"]], "timestamp": 5}])
    assert r.status_code == 200
    ack = r.json()
    assert ack["start"]["seq_num"] == 0 and ack["end"]["seq_num"] == 1
    assert ack["tail"] == ack["end"]

    binary = bytes(range(256))
    r = api.client.post(
        api.path(),
        headers={**api.h, "s2-format": "base64"},
        json={"records": [{"body": base64.b64encode(binary).decode(), "headers": []}]},
    )
    assert r.status_code == 200 and r.json()["start"]["seq_num"] == 1

    raw = api.read(seq_num=0).json()["records"]
    assert raw[0]["body"] == "héllo" and raw[0]["headers"] == [["k", "v"]]
    assert raw[0]["seq_num"] == 0 and raw[1]["seq_num"] == 1

    for fmt in ("base64", "json-binsafe"):
        recs = api.read({"s2-format": fmt}, seq_num=0).json()["records"]
        assert base64.b64decode(recs[0]["body"]) == "héllo".encode()
        assert recs[0]["headers"] == [[base64.b64encode(b"k").decode(), "dg=="]]
        assert base64.b64decode(recs[1]["body"]) == binary
    assert _bodies(api.read({"s2-format": "json"}, seq_num=0))[0] == "héllo"


def test_bad_format_and_bad_base64(api: Api) -> None:
    r = api.read({"s2-format": "hex"}, seq_num=0)
    assert r.status_code == 400 and r.json()["code"] == "bad_header"
    r = api.client.post(
        api.path(), headers={**api.h, "s2-format": "base64"}, json={"records": [{"body": "!!"}]}
    )
    # Base64 is decoded after the JSON is taken, as a validation: 422 `invalid` (s2-lite
    # 0.43.4 answers so, `tests/test_s2_differential.py`; s2 `api/src/data.rs`,
    # `Format::decode`).
    assert r.status_code == 422 and r.json()["code"] == "invalid"


def test_protobuf_append_and_read(api: Api) -> None:
    inp = s2_pb2.AppendInput(
        records=[s2_pb2.AppendRecord(body=b"p%d" % i, timestamp=100 + i) for i in range(3)]
    )
    hdrs = {**api.h, "content-type": "application/protobuf", "accept": "application/protobuf"}
    r = api.client.post(api.path(), headers=hdrs, content=inp.SerializeToString())
    assert r.status_code == 200
    ack = s2_pb2.AppendAck.FromString(r.content)
    assert (ack.start.seq_num, ack.end.seq_num, ack.end.timestamp) == (0, 3, 102)
    r = api.read({"accept": "application/protobuf"}, seq_num=1)
    batch = s2_pb2.ReadBatch.FromString(r.content)
    assert [(x.seq_num, x.timestamp, x.body) for x in batch.records] == [
        (1, 101, b"p1"),
        (2, 102, b"p2"),
    ]


# ------------------------------------------------------------------ SSE


def test_sse_events_ids_and_last_event_id_resume(api: Api) -> None:
    api.append([{"body": f"r{i}"} for i in range(5)])
    events = api.sse(seq_num=0, count=3)
    assert [e.get("event") for e in events] == ["batch", "message"]
    data = json.loads(events[0]["data"])
    assert [x["body"] for x in data["records"]] == ["r0", "r1", "r2"]
    metered = 3 * (8 + 2)
    assert events[0]["id"] == f"2,3,{metered}"
    assert events[1]["data"] == "[DONE]"

    # Resume after the first event: the remaining count is 5 - 3 = 2 records.
    resumed = api.sse({"last-event-id": events[0]["id"]}, seq_num=0, count=5)
    data = json.loads(resumed[0]["data"])
    assert [x["body"] for x in data["records"]] == ["r3", "r4"]
    # Ids go on counting from what Last-Event-ID says was delivered (s2-lite 0.43.4 answers
    # so, `tests/test_s2_differential.py`: `lite/src/handlers/v1/records.rs`,
    # `apply_last_event_id` starts its count at the delivered count and bytes).
    assert resumed[0]["id"] == f"4,5,{5 * 10}"
    assert resumed[-1] == {"event": "message", "data": "[DONE]"}

    b64 = api.sse({"s2-format": "base64"}, seq_num=4, count=1)
    assert json.loads(b64[0]["data"])["records"][0]["body"] == base64.b64encode(b"r4").decode()


def test_sse_ping_when_caught_up_then_done_after_wait(api: Api) -> None:
    api.append([{"body": "a"}])
    events = api.sse(seq_num=0, wait=1)
    kinds = [e["event"] for e in events]
    assert kinds[0] == "batch" and kinds[1] == "ping"
    assert events[-1] == {"event": "message", "data": "[DONE]"}
    ping = json.loads(events[1]["data"])
    assert ping["tail"]["seq_num"] == 1 and isinstance(ping["timestamp"], int)


def test_sse_bad_last_event_id(api: Api) -> None:
    r = api.read({"accept": "text/event-stream", "last-event-id": "x"}, seq_num=0)
    assert r.status_code == 400 and r.json()["code"] == "bad_header"


# ------------------------------------------------------------------ 416, clamp, until


def test_read_past_tail_is_416_with_tail(api: Api) -> None:
    api.append([{"body": "a", "timestamp": 10}, {"body": "b", "timestamp": 20}])
    tail = {"tail": {"seq_num": 2, "timestamp": 20}}
    r = api.read(seq_num=3)
    assert (r.status_code, r.json()) == (416, tail)
    # Exactly at the tail with nothing that may follow: 416 too (unary reads are bounded).
    r = api.read(seq_num=2)
    assert (r.status_code, r.json()) == (416, tail)
    r = api.read(tail_offset=0)
    assert (r.status_code, r.json()) == (416, tail)
    r = api.read(timestamp=21)
    assert (r.status_code, r.json()) == (416, tail)
    r = api.client.get(
        api.path(),
        headers={**api.h, "accept": "text/event-stream"},
        params={"seq_num": 2, "count": 1},
    )
    assert (r.status_code, r.json()) == (416, tail)
    # A clamped start lands on the tail, where a bounded read is still 416.
    r = api.read(seq_num=99, clamp="true")
    assert (r.status_code, r.json()) == (416, tail)


def test_read_at_tail_of_empty_stream_is_416(api: Api) -> None:
    r = api.read(seq_num=0)
    assert (r.status_code, r.json()) == (416, {"tail": {"seq_num": 0, "timestamp": 0}})


def test_clamp_streaming_read_follows_from_tail(api: Api) -> None:
    api.append([{"body": "a"}, {"body": "b"}])
    events = api.sse(seq_num=50, clamp="true", wait=1)
    kinds = [e["event"] for e in events]
    assert events[-1] == {"event": "message", "data": "[DONE]"}
    assert set(kinds[:-1]) == {"ping"}
    assert json.loads(events[0]["data"])["tail"]["seq_num"] == 2


def test_timestamp_start_and_until(api: Api) -> None:
    api.append([{"body": f"t{t}", "timestamp": t} for t in (10, 20, 30, 40)])
    assert _bodies(api.read(timestamp=15)) == ["t20", "t30", "t40"]
    assert _bodies(api.read(timestamp=20, until=40)) == ["t20", "t30"]
    assert _bodies(api.read(seq_num=0, until=25)) == ["t10", "t20"]
    # until before the first record: nothing may be read, an empty batch (not 416).
    r = api.read(seq_num=0, until=5)
    assert (r.status_code, r.json()) == (200, {"records": []})
    r = api.read(timestamp=30, until=30)
    assert r.status_code == 422 and r.json() == {
        "code": "invalid",
        "message": "start `timestamp` exceeds or equal to `until`",
    }
    # A timestamp between the last record's and the tail's resolves to the tail.
    assert api.read(timestamp=40).json()["records"][0]["body"] == "t40"


def test_count_and_bytes_limits(api: Api) -> None:
    api.append([{"body": "x" * 10} for _ in range(10)])  # 18 metered bytes each
    assert len(api.read(seq_num=0, count=4).json()["records"]) == 4
    assert len(api.read(seq_num=0, bytes=40).json()["records"]) == 2
    assert len(api.read(seq_num=0, count=5, bytes=1000).json()["records"]) == 5
    frames = api.s2s(seq_num=0, count=7)
    assert [r.seq_num for f in frames for r in _batch(f).records] == list(range(7))


def test_more_than_one_start_is_422(api: Api) -> None:
    r = api.read(seq_num=0, timestamp=0)
    assert r.status_code == 422 and r.json()["code"] == "invalid"
    r = api.read(seq_num="x")
    assert r.status_code == 400 and r.json()["code"] == "bad_query"


def test_unary_read_caps_at_1000_records(api: Api) -> None:
    for _ in range(2):
        assert api.append([{"body": "r"} for _ in range(1000)]).status_code == 200
    r = api.read(seq_num=0, count=5000)
    assert len(r.json()["records"]) == 1000
    r = api.read(seq_num=0)
    assert len(r.json()["records"]) == 1000


def test_unary_read_caps_at_1_mib(api: Api) -> None:
    body = "x" * (256 * 1024)
    for _ in range(5):
        assert api.append([{"body": body}]).status_code == 200
    r = api.read(seq_num=0)
    assert len(r.json()["records"]) == 3  # 4 x (256 KiB + 8) > 1 MiB


# ------------------------------------------------------------------ S2S read


def test_s2s_read_heartbeat_when_caught_up(api: Api) -> None:
    api.append([{"body": "a"}, {"body": "b"}])
    frames = api.s2s(seq_num=0, wait=1)
    first = _batch(frames[0])
    assert [r.body for r in first.records] == [b"a", b"b"] and not first.HasField("tail")
    beat = _batch(frames[1])
    assert len(beat.records) == 0 and beat.tail.seq_num == 2
    assert all(len(_batch(f).records) == 0 for f in frames[1:])


def test_s2s_read_416_and_compression(api: Api) -> None:
    r = api.client.get(
        api.path(), headers={**api.h, "content-type": "s2s/proto"}, params={"seq_num": 1}
    )
    assert (r.status_code, r.json()) == (416, {"tail": {"seq_num": 0, "timestamp": 0}})
    api.append([{"body": "z" * 5000}])
    for encoding in ("zstd", "gzip"):
        hdrs = {**api.h, "content-type": "s2s/proto", "accept-encoding": encoding}
        with api.client.stream(
            "GET", api.path(), headers=hdrs, params={"seq_num": 0, "count": 1}
        ) as resp:
            raw = resp.read()
        expected_cc = {"zstd": 0x20, "gzip": 0x40}[encoding]
        assert raw[3] & 0x60 == expected_cc
        (frame,) = FrameDecoder().feed(raw)
        assert _batch(frame).records[0].body == b"z" * 5000


# ------------------------------------------------------------------ S2S append


def _frame(inp: Any) -> bytes:
    body = inp.SerializeToString()
    return (len(body) + 1).to_bytes(3, "big") + b"\x00" + body


def test_s2s_append_session_all_inputs_before_acks(api: Api) -> None:
    """HTTP/1.1 half duplex: every input is sent before any ack is read."""
    n = 300
    payload = b"".join(
        _frame(s2_pb2.AppendInput(records=[s2_pb2.AppendRecord(body=b"%d" % i)])) for i in range(n)
    )

    def gen() -> Iterator[bytes]:
        for i in range(0, len(payload), 1000):
            yield payload[i : i + 1000]

    hdrs = {**api.h, "content-type": "s2s/proto"}
    r = api.client.post(api.path(), headers=hdrs, content=gen())
    assert r.status_code == 200
    frames = FrameDecoder().feed(r.content)
    acks = [s2_pb2.AppendAck.FromString(f.body) for f in frames if isinstance(f, Message)]
    assert [a.start.seq_num for a in acks] == list(range(n))
    assert acks[-1].end.seq_num == n


def test_s2s_append_session_error_is_terminal_frame(api: Api) -> None:
    payload = _frame(s2_pb2.AppendInput(records=[s2_pb2.AppendRecord(body=b"a")])) + _frame(
        s2_pb2.AppendInput(records=[s2_pb2.AppendRecord(body=b"b")], match_seq_num=7)
    )
    r = api.client.post(api.path(), headers={**api.h, "content-type": "s2s/proto"}, content=payload)
    frames = FrameDecoder().feed(r.content)
    assert isinstance(frames[0], Message)
    assert isinstance(frames[1], Terminal)
    assert (frames[1].status, frames[1].error()) == (412, {"seq_num_mismatch": 1})


# ------------------------------------------------------------------ append rules


def test_batch_limits(api: Api) -> None:
    r = api.append([{"body": ""} for _ in range(1001)])
    assert (r.status_code, r.json()) == (
        422,
        {"code": "invalid", "message": "record batch must not exceed 1000 records"},
    )
    r = api.append([{"body": "x" * (600 * 1024)}, {"body": "x" * (600 * 1024)}])
    assert (r.status_code, r.json()) == (
        422,
        {"code": "invalid", "message": "record batch must not exceed a metered size of 1 MiB"},
    )
    r = api.append([{"body": "x" * MIB}])
    assert (r.status_code, r.json()) == (
        422,
        {"code": "invalid", "message": "record must have metered size less than 1 MiB"},
    )
    r = api.append([])
    assert (r.status_code, r.json()) == (
        422,
        {"code": "invalid", "message": "record batch must not be empty"},
    )
    # Exactly 1 MiB metered is allowed: 8 bytes of overhead + body.
    assert api.append([{"body": "x" * (MIB - 8)}]).status_code == 200
    assert api.client.get(api.path("/records/tail"), headers=api.h).json()["tail"]["seq_num"] == 1


def test_match_seq_num_and_fencing(api: Api) -> None:
    assert api.append([{"body": "a"}], match_seq_num=0).status_code == 200
    r = api.append([{"body": "b"}], match_seq_num=0)
    assert (r.status_code, r.json()) == (412, {"seq_num_mismatch": 1})
    fence = {"headers": [["", "fence"]], "body": "tok-1"}
    assert api.append([fence]).json()["start"]["seq_num"] == 1
    r = api.append([{"body": "c"}], fencing_token="other")
    assert (r.status_code, r.json()) == (412, {"fencing_token_mismatch": "tok-1"})
    assert api.append([{"body": "c"}], fencing_token="tok-1").status_code == 200
    # Unfenced appends still go through; an empty fence body clears the token.
    assert api.append([{"body": "d"}]).status_code == 200
    assert (
        api.append([{"headers": [["", "fence"]], "body": ""}], fencing_token="tok-1").status_code
        == 200
    )
    assert api.append([{"body": "e"}], fencing_token="").status_code == 200
    r = api.append([{"headers": [["", "fence"]], "body": "x" * 37}])
    assert r.status_code == 422 and r.json()["code"] == "invalid"
    # A JSON body's fencing token is checked as it is deserialized: 400 `bad_json` (s2-lite
    # 0.43.4 answers so, `tests/test_s2_differential.py`; a FencingToken's serde impl).
    r = api.append([{"body": "e"}], fencing_token="x" * 37)
    assert r.status_code == 400 and r.json()["code"] == "bad_json"


def test_trim_command(api: Api) -> None:
    api.append([{"body": f"r{i}"} for i in range(5)])
    trim = {
        "headers": [["", "dHJpbQ=="]],
        "body": base64.b64encode((3).to_bytes(8, "big")).decode(),
    }
    r = api.client.post(
        api.path(), headers={**api.h, "s2-format": "base64"}, json={"records": [trim]}
    )
    assert r.json()["start"]["seq_num"] == 5
    # s2-lite deletes trimmed records in the background: wait (with a deadline) for it.
    until(lambda: api.read(seq_num=0).json()["records"][0]["seq_num"] == 3,
          "the records below the trim point to go")
    recs = api.read(seq_num=0).json()["records"]
    assert [x["seq_num"] for x in recs] == [3, 4, 5]
    assert recs[2]["headers"] == [["", "trim"]]
    r = api.append([{"headers": [["", "trim"]], "body": "abc"}])
    assert r.status_code == 422
    r = api.append([{"headers": [["", "nope"]], "body": ""}])
    assert (r.status_code, r.json()) == (422, {"code": "invalid", "message": "unknown command"})


def test_client_timestamps_by_mode(api: Api, unique: Callable[[str], str]) -> None:
    # client-prefer (default): client timestamps kept, raised to stay monotonic.
    ack = api.append([{"body": "a", "timestamp": 50}, {"body": "b", "timestamp": 40}]).json()
    assert [x["timestamp"] for x in api.read(seq_num=0).json()["records"]] == [50, 50]
    assert ack["end"]["timestamp"] == 50
    # Future timestamps are capped at arrival time.
    future = int(time.time() * 1000) + 3_600_000
    ack = api.append([{"body": "c", "timestamp": future}]).json()
    assert ack["end"]["timestamp"] < future

    for mode in ("client-require", "arrival"):
        name = unique(mode)
        cfg = {"timestamping": {"mode": mode}}
        r = api.client.post("/streams", headers=api.h, json={"stream": name, "config": cfg})
        assert r.status_code == 201
        other = Api(api.client.base_url.__str__().removesuffix("/v1/"), api.basin, name)
        other.client = api.client
        if mode == "client-require":
            r = other.append([{"body": "x"}])
            assert r.status_code == 422 and r.json()["code"] == "invalid"
            assert other.append([{"body": "x", "timestamp": 7}]).json()["end"]["timestamp"] == 7
        else:
            before = int(time.time() * 1000)
            ts = other.append([{"body": "x", "timestamp": 7}]).json()["end"]["timestamp"]
            assert ts >= before


# ------------------------------------------------------------------ retention


def test_retention_counts_from_arrival_not_client_timestamp(
    api: Api, unique: Callable[[str], str]
) -> None:
    """As in s2-lite (a storage TTL), an old client timestamp does not expire a record."""
    name = unique("ret")
    cfg = {"retention_policy": {"age": 3600}}
    r = api.client.post("/streams", headers=api.h, json={"stream": name, "config": cfg})
    assert r.status_code == 201
    r = api.client.get(f"/streams/{name}", headers=api.h)
    assert r.json()["retention_policy"] == {"age": 3600}
    old = int(time.time() * 1000) - 2 * 3600 * 1000
    records = [{"body": "old", "timestamp": old}]
    api.client.post(f"/streams/{name}/records", headers=api.h, json={"records": records})
    r = api.client.get(f"/streams/{name}/records", headers=api.h, params={"seq_num": 0})
    assert [(x["seq_num"], x["body"], x["timestamp"]) for x in r.json()["records"]] == [
        (0, "old", old)
    ]


@pytest.mark.local_server  # s2-lite drops expired records only when SlateDB compacts
def test_retention_expires_records_with_time(s2_server: Any, unique: Callable[[str], str]) -> None:
    api = Api(s2_server.url, unique("lsb"), "s")
    api.client.post("/basins", json={"basin": api.basin})
    cfg = {"retention_policy": {"age": 1}}
    api.client.post("/streams", headers=api.h, json={"stream": "s", "config": cfg})
    api.append([{"body": "a"}])
    assert len(api.read(seq_num=0).json()["records"]) == 1
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        r = api.read(seq_num=0)
        if r.status_code == 200 and r.json()["records"] == []:
            break
        time.sleep(0.1)
    # Everything expired: a bounded read from a trimmed position is an empty batch.
    assert (r.status_code, r.json()) == (200, {"records": []})
    # Newer records are kept, and a read from a trimmed seq_num starts at the first of them.
    api.append([{"body": "b"}, {"body": "c"}])
    assert [x["seq_num"] for x in api.read(seq_num=0).json()["records"]] == [1, 2]
    # The tail is unaffected by trimming.
    assert api.client.get(api.path("/records/tail"), headers=api.h).json()["tail"]["seq_num"] == 3


# ------------------------------------------------------------------ names, control plane


def test_names(s2_server: Any) -> None:
    c = httpx.Client(base_url=s2_server.url + "/v1")
    for bad in ("short", "x" * 49, "-leading-hyphen", "trailing-hyphen-", "Upper-case-name"):
        r = c.post("/basins", json={"basin": bad})
        assert r.status_code == 400 and r.json()["code"] == "bad_json", bad
        r = c.get(f"/basins/{bad}")
        assert r.status_code == 400 and r.json()["code"] == "bad_path", bad
        r = c.get("/streams", headers={"s2-basin": bad})
        assert r.status_code == 400 and r.json()["code"] == "bad_header", bad
    ok = "names-" + "a" * 42
    assert c.post("/basins", json={"basin": ok}).status_code == 201
    h = {"s2-basin": ok}
    r = c.post("/streams", headers=h, json={"stream": "s" * 513})
    assert r.status_code == 400 and r.json()["code"] == "bad_json"
    r = c.post("/streams", headers=h, json={"stream": ""})
    assert r.status_code == 400
    long_name = "é" * 256  # 512 bytes
    assert c.post("/streams", headers=h, json={"stream": long_name}).status_code == 201
    r = c.get(f"/streams/{'s' * 513}/records/tail", headers=h)
    assert r.status_code == 400 and r.json()["code"] == "bad_path"
    r = c.get("/streams/missing/records/tail", headers=h)
    assert r.status_code == 404 and r.json()["code"] == "stream_not_found"
    r = c.get("/streams", headers={"s2-basin": "missing-basin"})
    assert r.status_code == 404 and r.json()["code"] == "basin_not_found"
    c.delete(f"/basins/{ok}")


def test_control_plane_lists_and_ensure(s2_server: Any, unique: Callable[[str], str]) -> None:
    c = httpx.Client(base_url=s2_server.url + "/v1")
    basin = unique("ctl")
    r = c.put(f"/basins/{basin}", json={})
    assert r.status_code == 201 and r.headers["s2-provision-result"] == "created"
    r = c.put(f"/basins/{basin}", json={})
    assert r.status_code == 200 and r.headers["s2-provision-result"] == "noop"
    r = c.post("/basins", json={"basin": basin})
    assert r.status_code == 409 and r.json()["code"] == "resource_already_exists"
    h = {"s2-basin": basin}
    for i in range(5):
        assert c.post("/streams", headers=h, json={"stream": f"a/{i}"}).status_code == 201
    c.post("/streams", headers=h, json={"stream": "b"})
    page = c.get("/streams", headers=h, params={"prefix": "a/", "limit": 2}).json()
    assert [s["name"] for s in page["streams"]] == ["a/0", "a/1"] and page["has_more"] is True
    page = c.get(
        "/streams", headers=h, params={"prefix": "a/", "start_after": "a/2", "limit": 2}
    ).json()
    assert [s["name"] for s in page["streams"]] == ["a/3", "a/4"] and page["has_more"] is False
    r = c.put("/streams/b", headers=h, json={"retention_policy": {"infinite": {}}})
    assert r.status_code == 200 and r.headers["s2-provision-result"] == "updated"
    r = c.patch("/streams/b", headers=h, json={"timestamping": {"mode": "arrival"}})
    assert r.json()["timestamping"]["mode"] == "arrival"
    assert r.json()["retention_policy"] == {"infinite": {}}
    assert c.delete("/streams/b", headers=h).status_code == 202
    # s2-lite answers 409 `stream_deletion_pending` until its deletion task has run (half a
    # second, seen on 0.43.4), then 404; the local server deletes at once.
    gone = c.get("/streams/b", headers=h)
    deadline = time.monotonic() + 30
    while gone.status_code == 409 and gone.json()["code"] == "stream_deletion_pending":
        assert time.monotonic() < deadline, "the stream's deletion never ended"
        time.sleep(0.05)
        gone = c.get("/streams/b", headers=h)
    assert gone.status_code == 404 and gone.json()["code"] == "stream_not_found"
    names = [b["name"] for b in c.get("/basins", params={"prefix": basin}).json()["basins"]]
    assert names == [basin]
    assert c.delete(f"/basins/{basin}").status_code == 202
    r = c.get(f"/basins/{basin}")
    if r.status_code == 200:  # s2-lite: pending until its basin-deletion task's next tick
        listed = c.get("/basins", params={"prefix": basin}).json()["basins"]
        assert [(b["name"], b["state"]) for b in listed] == [(basin, "deleting")]
    else:
        assert r.status_code == 404


def test_create_stream_on_append(s2_server: Any, unique: Callable[[str], str]) -> None:
    c = httpx.Client(base_url=s2_server.url + "/v1")
    basin = unique("auto")
    c.post("/basins", json={"basin": basin, "config": {"create_stream_on_append": True}})
    h = {"s2-basin": basin}
    r = c.post("/streams/new/records", headers=h, json={"records": [{"body": "a"}]})
    assert r.status_code == 200
    assert c.get("/streams/new/records/tail", headers=h).json()["tail"]["seq_num"] == 1


# ------------------------------------------------------------------ auth


def test_token_auth() -> None:
    secret = "s3cret-token"
    with LocalS2Server(token=secret) as server:
        c = httpx.Client(base_url=server.url + "/v1")
        r = c.get("/basins")
        assert (r.status_code, r.json()["code"]) == (401, "authn")
        r = c.get("/basins", headers={"authorization": "Bearer wrong"})
        assert (r.status_code, r.json()["code"]) == (403, "permission_denied")
        assert secret not in r.text
        r = c.get("/basins", headers={"authorization": f"Bearer {secret}"})
        assert r.status_code == 200 and r.json() == {"basins": [], "has_more": False}
        assert secret not in repr(server)


# ------------------------------------------------------------------ durability


def test_restart_after_kill_keeps_acknowledged_appends(tmp_path: Any) -> None:
    with ServerProcess(data_dir=tmp_path, heartbeat_interval=0.5) as server:
        api = Api(server.url, "durable-basin", "s")
        api.client.post("/basins", json={"basin": api.basin})
        api.client.post("/streams", headers=api.h, json={"stream": "s"})
        api.append([{"body": f"r{i}", "timestamp": 100 + i} for i in range(3)])
        api.append([{"headers": [["", "fence"]], "body": "f"}])
        url = server.url
        server.kill()
        server.start()
        assert server.url == url
        api.client.close()
        api = Api(server.url, "durable-basin", "s")
        recs = api.read(seq_num=0).json()["records"]
        assert [(x["seq_num"], x["body"]) for x in recs] == [
            (0, "r0"),
            (1, "r1"),
            (2, "r2"),
            (3, "f"),
        ]
        r = api.append([{"body": "x"}], fencing_token="nope")
        assert (r.status_code, r.json()) == (412, {"fencing_token_mismatch": "f"})
        assert api.append([{"body": "x"}], fencing_token="f").json()["start"]["seq_num"] == 4


def test_request_token_makes_create_idempotent(
    s2_server: Any, unique: Callable[[str], str]
) -> None:
    c = httpx.Client(base_url=s2_server.url + "/v1")
    basin = unique("idem")
    tok = {"s2-request-token": "req-1"}
    r = c.post("/basins", headers=tok, json={"basin": basin})
    assert (r.status_code, r.headers["s2-provision-result"]) == (201, "created")
    r = c.post("/basins", headers=tok, json={"basin": basin})
    assert (r.status_code, r.headers["s2-provision-result"]) == (201, "noop")
    r = c.post("/basins", headers={"s2-request-token": "req-2"}, json={"basin": basin})
    assert r.status_code == 409
    h = {"s2-basin": basin, **tok}
    r = c.post("/streams", headers=h, json={"stream": "s"})
    assert (r.status_code, r.headers["s2-provision-result"]) == (201, "created")
    r = c.post("/streams", headers=h, json={"stream": "s"})
    assert (r.status_code, r.headers["s2-provision-result"]) == (201, "noop")
    # Same token, different config: a different request, so the stream already exists.
    cfg = {"retention_policy": {"age": 60}}
    r = c.post("/streams", headers=h, json={"stream": "s", "config": cfg})
    assert r.status_code == 409


def test_ensure_replaces_config(s2_server: Any, unique: Callable[[str], str]) -> None:
    """PUT sets the whole desired config (s2-lite); PATCH changes single fields."""
    c = httpx.Client(base_url=s2_server.url + "/v1")
    basin = unique("ens")
    c.post("/basins", json={"basin": basin})
    h = {"s2-basin": basin}
    r = c.put("/streams/s", headers=h, json={"retention_policy": {"age": 60}})
    assert (r.status_code, r.headers["s2-provision-result"]) == (201, "created")
    r = c.put("/streams/s", headers=h, json={"retention_policy": {"age": 60}})
    assert (r.status_code, r.headers["s2-provision-result"]) == (200, "noop")
    r = c.put("/streams/s", headers=h, json={"timestamping": {"mode": "arrival"}})
    assert (r.status_code, r.headers["s2-provision-result"]) == (200, "updated")
    cfg = c.get("/streams/s", headers=h).json()
    assert cfg["timestamping"]["mode"] == "arrival"
    assert cfg["retention_policy"] == {"age": 7 * 24 * 3600}
    r = c.patch("/streams/s", headers=h, json={"retention_policy": {"age": 5}})
    assert r.json()["retention_policy"] == {"age": 5}
    assert r.json()["timestamping"]["mode"] == "arrival"


def test_unary_long_poll_returns_when_records_arrive(api: Api) -> None:
    import threading

    api.append([{"body": "a"}])
    result: dict[str, httpx.Response] = {}

    def poll() -> None:
        with httpx.Client(base_url=str(api.client.base_url), timeout=30) as c:
            result["r"] = c.get(api.path(), headers=api.h, params={"seq_num": 1, "wait": 20})

    thread = threading.Thread(target=poll)
    thread.start()
    deadline = time.monotonic() + 10
    while thread.is_alive() and time.monotonic() < deadline:
        # Append until the poll has seen a record (it may not have started waiting yet).
        api.append([{"body": "b"}])
        thread.join(0.2)
    thread.join(10)
    r = result["r"]
    assert r.status_code == 200
    recs = r.json()["records"]
    assert recs[0]["seq_num"] == 1 and recs[0]["body"] == "b"
    # Records that arrived while it followed carry the tail, as in s2-lite.
    assert r.json().get("tail", {"seq_num": 2})["seq_num"] >= 2


def test_empty_wait_long_poll_times_out_with_empty_batch(api: Api) -> None:
    api.append([{"body": "a"}])
    r = api.read(seq_num=1, wait=1)
    assert (r.status_code, r.json()) == (200, {"records": []})


def test_stream_names_with_slashes_and_unicode(
    s2_server: Any, unique: Callable[[str], str]
) -> None:
    from urllib.parse import quote

    c = httpx.Client(base_url=s2_server.url + "/v1")
    basin = unique("esc")
    c.post("/basins", json={"basin": basin})
    h = {"s2-basin": basin}
    name = "dir/sub é ?#%"
    assert c.post("/streams", headers=h, json={"stream": name}).status_code == 201
    path = f"/streams/{quote(name, safe='')}/records"
    assert c.post(path, headers=h, json={"records": [{"body": "x"}]}).status_code == 200
    r = c.get(path + "/tail", headers=h)
    assert r.json() == {"tail": {"seq_num": 1, "timestamp": r.json()["tail"]["timestamp"]}}
    assert [s["name"] for s in c.get("/streams", headers=h).json()["streams"]] == [name]


def test_server_process_token_and_cli_url() -> None:
    with ServerProcess(token="proc-secret") as server:
        assert server.url.startswith("http://127.0.0.1:") and not server.url.endswith(":0")
        r = httpx.get(server.url + "/v1/basins")
        assert (r.status_code, r.json()["code"]) == (401, "authn")
        r = httpx.get(server.url + "/v1/basins", headers={"authorization": "Bearer proc-secret"})
        assert r.status_code == 200
        assert "proc-secret" not in repr(server)


def test_unimplemented_and_unknown_routes(s2_server: Any) -> None:
    r = httpx.get(s2_server.url + "/v1/access-tokens")
    assert (r.status_code, r.json()) == (
        501,
        {"code": "not_implemented", "message": "Not implemented"},
    )
    r = httpx.get(s2_server.url + "/v1/nothing-here")
    assert r.status_code == 404


# ------------------------------------------------------------------ request counter (not S2)


@pytest.mark.parametrize("server_type", [LocalS2Server, ServerProcess])
def test_request_counts_per_kind(server_type: Any) -> None:
    from s2_spark.errors import FencingTokenMismatchError
    from s2_spark.s2 import AppendRecord, S2Client, S2Config

    with server_type() as server, S2Client(S2Config(endpoint=server.url)) as client:
        assert server.request_counts() == {}
        client.create_basin("counted-basin")
        basin = client.basin("counted-basin")
        basin.create_stream("a")
        basin.create_stream("b")
        stream = basin.stream("a")
        stream.append([AppendRecord(b"x")])
        stream.append_many([AppendRecord(b"y")] * 1500)  # two batches: one S2S session
        for _ in range(3):
            stream.check_tail()
        assert [s.name for s in basin.list_streams()] == ["a", "b"]
        assert stream.read(seq_num=0, count=1).batch.num_rows == 1
        assert stream.read(seq_num=0, count=1, wait=1).batch.num_rows == 1
        assert sum(b.batch.num_rows for b in stream.read_session(seq_num=0, count=10)) == 10
        assert httpx.get(server.url + "/v1/nothing-here").status_code == 404
        expected = {
            "append": 1,
            "append_session": 1,
            "check_tail": 3,
            "create_basin": 1,
            "create_stream": 2,
            "list_streams": 1,
            "read": 1,
            "read_session": 1,
            "read_wait": 1,
            "unrouted": 1,
        }
        assert server.request_counts() == expected
        # Appends by outcome: the unary one and the session's two inputs landed; one
        # conditioned on a token the stream does not have was refused.
        with pytest.raises(FencingTokenMismatchError):
            stream.append([AppendRecord(b"z")], fencing_token="not-set")
        expected["append"] = 2
        assert server.append_counts() == {"landed": 3, "refused": 1}
        # Asking for the counts is not counted, and the path answers plain JSON.
        r = httpx.get(server.url + "/_local/stats")
        assert (r.status_code, r.json()) == (
            200, {"requests": expected, "appends": {"landed": 3, "refused": 1}})
