"""The local server's JSON responses validate against S2's OpenAPI spec.

Drives every endpoint the server implements with httpx (plain JSON, as a curl user would)
and checks each response, success and error alike, against the schema the spec declares
for that operation and status. Object schemas are made strict (no undeclared fields), so a
misspelt or invented field fails too. The spec is a copy of S2's public one:
tests/data/s2-openapi.json.
"""

from __future__ import annotations

import base64
import copy
import json
import time
from collections.abc import Callable, Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
from _s2_target import token
from jsonschema import Draft202012Validator, FormatChecker

SPEC: dict[str, Any] = json.loads(
    (Path(__file__).parent / "data" / "s2-openapi.json").read_text(encoding="utf-8")
)
TOKEN = "openapi-token"
# Client timestamps: an hour ago plus an offset, so they are kept exactly as given.
BASE_MS = (time.time_ns() // 1_000_000 - 3_600_000) // 1000 * 1000
Unique = Callable[[str], str]


def _strict(node: Any) -> Any:
    """Forbid undeclared properties in every object schema that lists its properties."""
    if isinstance(node, dict):
        out = {key: _strict(value) for key, value in node.items()}
        if "properties" in out and "additionalProperties" not in out:
            out["additionalProperties"] = False
        return out
    if isinstance(node, list):
        return [_strict(item) for item in node]
    return node


STRICT_COMPONENTS = _strict(SPEC["components"])
# Fields s2-lite sends that this spec version does not list (s2 `api/src/v1/basin.rs`):
# `location` (newer than the spec's `scope`) and the deprecated, schema-hidden `state`.
STRICT_COMPONENTS["schemas"]["BasinInfo"]["properties"].update(
    {
        "location": {"type": ["string", "null"]},
        "state": {"type": "string", "enum": ["active", "deleting"]},
    }
)
# s2-lite's ping events also carry the tail (s2 `api/src/v1/stream/sse.rs`).
STRICT_COMPONENTS["schemas"]["PingEventData"]["properties"]["tail"] = {
    "$ref": "#/components/schemas/StreamPosition"
}
FORMATS = FormatChecker()


@FORMATS.checks("date-time", raises=ValueError)
def _is_rfc3339(value: object) -> bool:
    if not isinstance(value, str):
        return True
    # RFC 3339 needs a 'T' separator and an explicit offset.
    return "T" in value and datetime.fromisoformat(value).tzinfo is not None


def validate(instance: Any, schema: dict[str, Any]) -> None:
    root = {**copy.deepcopy(schema), "components": STRICT_COMPONENTS}
    Draft202012Validator(root, format_checker=FORMATS).validate(instance)


def check(response: httpx.Response, method: str, template: str, status: int) -> Any:
    """Assert the status, then validate the body against the spec for that operation."""
    assert response.status_code == status, (response.status_code, response.text)
    operation = SPEC["paths"][template][method.lower()]
    declared = operation["responses"].get(str(status))
    assert declared is not None, f"{method} {template} does not declare status {status}"
    content = declared.get("content")
    if not content:
        assert response.content.strip() in (b"", b"{}", b"null"), response.content
        return None
    media = response.headers.get("content-type", "").split(";")[0].strip()
    assert media in content, f"content-type {media!r} not among {sorted(content)}"
    body = response.json()
    validate(body, content[media]["schema"])
    return body


def check_error(
    response: httpx.Response, method: str, template: str, status: int, code: str
) -> dict[str, Any]:
    """An error response: per the spec where it declares the status, else (s2-lite's 401
    `authn` and 422 `invalid`, which this spec version does not list) as ErrorInfo."""
    declared = SPEC["paths"][template][method.lower()]["responses"]
    if str(status) in declared:
        body = check(response, method, template, status)
    else:
        assert response.status_code == status, (response.status_code, response.text)
        assert response.headers["content-type"].split(";")[0] == "application/json"
        body = response.json()
        validate(body, schema_ref("ErrorInfo"))
    assert body["code"] == code, body
    return dict(body)


def schema_ref(name: str) -> dict[str, Any]:
    return {"$ref": f"#/components/schemas/{name}"}


@pytest.fixture
def http(s2_server: Any) -> Iterator[httpx.Client]:
    with httpx.Client(
        base_url=f"{s2_server.url}/v1",
        headers={"authorization": f"Bearer {token(TOKEN)}"},
        timeout=15,
        # A connection per request: s2-lite closes one after refusing a request's body, and
        # reusing it would race that close (RemoteProtocolError) instead of checking answers.
        limits=httpx.Limits(max_keepalive_connections=0),
    ) as client:
        yield client


@pytest.fixture
def basin(http: httpx.Client, unique: Unique) -> str:
    name = unique("oa")
    check(http.post("/basins", json={"basin": name}), "POST", "/basins", 201)
    return name


def test_spec_is_loaded_and_strict() -> None:
    with pytest.raises(Exception, match="Additional properties"):
        validate({"seq_num": 1, "timestamp": 2, "extra": 3}, schema_ref("StreamPosition"))
    validate({"seq_num": 1, "timestamp": 2}, schema_ref("StreamPosition"))
    with pytest.raises(Exception, match="date-time"):
        validate({"name": "abcdefgh", "created_at": "yesterday"}, schema_ref("BasinInfo"))


def test_basin_endpoints(http: httpx.Client, unique: Unique) -> None:
    prefix = unique("oab")
    first, second = f"{prefix}-1", f"{prefix}-2"

    created = check(http.post("/basins", json={"basin": first}), "POST", "/basins", 201)
    assert created["name"] == first
    conflict = check(http.post("/basins", json={"basin": first}), "POST", "/basins", 409)
    assert conflict["code"] == "resource_already_exists"
    bad = check(http.post("/basins", json={"basin": "Not_A_Basin"}), "POST", "/basins", 400)
    assert bad["code"]

    ensured = http.put(f"/basins/{second}")
    assert check(ensured, "PUT", "/basins/{basin}", 201)["name"] == second
    assert ensured.headers["s2-provision-result"] == "created"
    again = http.put(f"/basins/{second}")
    assert check(again, "PUT", "/basins/{basin}", 200)["name"] == second
    assert again.headers["s2-provision-result"] == "noop"

    listed = check(http.get("/basins", params={"prefix": prefix}), "GET", "/basins", 200)
    assert ([b["name"] for b in listed["basins"]], listed["has_more"]) == ([first, second], False)
    page = check(http.get("/basins", params={"prefix": prefix, "limit": 1}), "GET", "/basins", 200)
    assert ([b["name"] for b in page["basins"]], page["has_more"]) == ([first], True)
    after = check(
        http.get("/basins", params={"prefix": prefix, "start_after": first}), "GET", "/basins", 200
    )
    assert [b["name"] for b in after["basins"]] == [second]

    config = check(http.get(f"/basins/{first}"), "GET", "/basins/{basin}", 200)
    assert isinstance(config, dict)
    missing = unique("oamissing")
    not_found = check(http.get(f"/basins/{missing}"), "GET", "/basins/{basin}", 404)
    assert not_found["code"] == "basin_not_found"

    check(http.delete(f"/basins/{second}"), "DELETE", "/basins/{basin}", 202)
    gone = check(http.delete(f"/basins/{missing}"), "DELETE", "/basins/{basin}", 404)
    assert gone["code"] == "basin_not_found"


def test_basin_reconfigure(http: httpx.Client, basin: str) -> None:
    patched = check(
        http.patch(
            f"/basins/{basin}",
            json={"default_stream_config": {"retention_policy": {"age": 600}}},
        ),
        "PATCH",
        "/basins/{basin}",
        200,
    )
    assert patched["default_stream_config"]["retention_policy"] == {"age": 600}
    fetched = check(http.get(f"/basins/{basin}"), "GET", "/basins/{basin}", 200)
    assert fetched["default_stream_config"]["retention_policy"] == {"age": 600}
    missing = f"{basin}-gone"
    check_error(
        http.patch(f"/basins/{missing}", json={}),
        "PATCH",
        "/basins/{basin}",
        404,
        "basin_not_found",
    )
    check_error(
        http.get("/streams", headers={"s2-basin": missing}),
        "GET",
        "/streams",
        404,
        "basin_not_found",
    )


def test_stream_endpoints(http: httpx.Client, basin: str, unique: Unique) -> None:
    h = {"s2-basin": basin}
    config = {"retention_policy": {"age": 3600}, "timestamping": {"mode": "arrival"}}
    created = check(
        http.post("/streams", headers=h, json={"stream": "a/1", "config": config}),
        "POST",
        "/streams",
        201,
    )
    assert created["name"] == "a/1"
    conflict = check(
        http.post("/streams", headers=h, json={"stream": "a/1"}), "POST", "/streams", 409
    )
    assert conflict["code"] == "resource_already_exists"
    no_basin = check(
        http.post("/streams", headers={"s2-basin": unique("oanob")}, json={"stream": "x"}),
        "POST",
        "/streams",
        404,
    )
    assert no_basin["code"] == "basin_not_found"

    ensured = http.put("/streams/a%2F2", headers=h, json={"retention_policy": {"infinite": {}}})
    assert check(ensured, "PUT", "/streams/{stream}", 201)["name"] == "a/2"
    assert ensured.headers["s2-provision-result"] == "created"
    same = http.put("/streams/a%2F2", headers=h, json={"retention_policy": {"infinite": {}}})
    check(same, "PUT", "/streams/{stream}", 200)
    assert same.headers["s2-provision-result"] == "noop"

    got = check(http.get("/streams/a%2F1", headers=h), "GET", "/streams/{stream}", 200)
    assert got["retention_policy"] == {"age": 3600}
    assert got["timestamping"]["mode"] == "arrival"
    infinite = check(http.get("/streams/a%2F2", headers=h), "GET", "/streams/{stream}", 200)
    assert infinite["retention_policy"] == {"infinite": {}}
    missing = check(http.get("/streams/nope", headers=h), "GET", "/streams/{stream}", 404)
    assert missing["code"] == "stream_not_found"

    patched = check(
        http.patch("/streams/a%2F1", headers=h, json={"retention_policy": {"age": 60}}),
        "PATCH",
        "/streams/{stream}",
        200,
    )
    assert patched["retention_policy"] == {"age": 60}
    assert patched["timestamping"]["mode"] == "arrival"

    listed = check(http.get("/streams", headers=h), "GET", "/streams", 200)
    assert ([s["name"] for s in listed["streams"]], listed["has_more"]) == (["a/1", "a/2"], False)
    page = check(
        http.get("/streams", headers=h, params={"prefix": "a/", "limit": 1}), "GET", "/streams", 200
    )
    assert ([s["name"] for s in page["streams"]], page["has_more"]) == (["a/1"], True)
    after = check(
        http.get("/streams", headers=h, params={"start_after": "a/1"}), "GET", "/streams", 200
    )
    assert [s["name"] for s in after["streams"]] == ["a/2"]

    check_error(
        http.patch("/streams/nope", headers=h, json={"retention_policy": {"age": 60}}),
        "PATCH",
        "/streams/{stream}",
        404,
        "stream_not_found",
    )
    check_error(
        http.put("/streams/x", headers={"s2-basin": unique("oanob")}),
        "PUT",
        "/streams/{stream}",
        404,
        "basin_not_found",
    )
    check(http.delete("/streams/a%2F2", headers=h), "DELETE", "/streams/{stream}", 202)
    gone = check(http.delete("/streams/nope", headers=h), "DELETE", "/streams/{stream}", 404)
    assert gone["code"] == "stream_not_found"


def test_record_endpoints(http: httpx.Client, basin: str) -> None:
    h = {"s2-basin": basin}
    check(http.post("/streams", headers=h, json={"stream": "s"}), "POST", "/streams", 201)
    records = "/streams/{stream}/records"

    empty_tail = check(
        http.get("/streams/s/records/tail", headers=h), "GET", "/streams/{stream}/records/tail", 200
    )
    assert empty_tail == {"tail": {"seq_num": 0, "timestamp": 0}}

    ack = check(
        http.post(
            "/streams/s/records",
            headers=h,
            json={
                "records": [
                    {"body": "hello", "headers": [["k", "v"]], "timestamp": BASE_MS + 1000},
                    {"body": "world", "timestamp": BASE_MS + 2000},
                ],
                "match_seq_num": 0,
            },
        ),
        "POST",
        records,
        200,
    )
    assert ack == {
        "start": {"seq_num": 0, "timestamp": BASE_MS + 1000},
        "end": {"seq_num": 2, "timestamp": BASE_MS + 2000},
        "tail": {"seq_num": 2, "timestamp": BASE_MS + 2000},
    }

    seq_mismatch = check(
        http.post(
            "/streams/s/records", headers=h, json={"records": [{"body": "x"}], "match_seq_num": 7}
        ),
        "POST",
        records,
        412,
    )
    assert seq_mismatch == {"seq_num_mismatch": 2}
    fence_mismatch = check(
        http.post(
            "/streams/s/records",
            headers=h,
            json={"records": [{"body": "x"}], "fencing_token": "not-the-token"},
        ),
        "POST",
        records,
        412,
    )
    assert fence_mismatch == {"fencing_token_mismatch": ""}

    batch = check(
        http.get("/streams/s/records", headers=h, params={"seq_num": 0}), "GET", records, 200
    )
    assert [
        (r["seq_num"], r["timestamp"], r.get("headers", []), r["body"]) for r in batch["records"]
    ] == [(0, BASE_MS + 1000, [["k", "v"]], "hello"), (1, BASE_MS + 2000, [], "world")]
    counted = check(
        http.get("/streams/s/records", headers=h, params={"tail_offset": 1, "count": 5}),
        "GET",
        records,
        200,
    )
    assert [r["seq_num"] for r in counted["records"]] == [1]
    by_time = check(
        http.get("/streams/s/records", headers=h, params={"timestamp": BASE_MS + 1500}),
        "GET",
        records,
        200,
    )
    assert [r["seq_num"] for r in by_time["records"]] == [1]

    past = check(
        http.get("/streams/s/records", headers=h, params={"seq_num": 2}), "GET", records, 416
    )
    assert past == {"tail": {"seq_num": 2, "timestamp": BASE_MS + 2000}}

    bad_query = check(
        http.get("/streams/s/records", headers=h, params={"seq_num": "abc"}), "GET", records, 400
    )
    assert bad_query["code"]
    for path in ("/streams/nope/records", "/streams/nope/records/tail"):
        template = records if path.endswith("records") else records + "/tail"
        nf = check(http.get(path, headers=h, params={"seq_num": 0}), "GET", template, 404)
        assert nf["code"] == "stream_not_found"
    nf_append = check(
        http.post("/streams/nope/records", headers=h, json={"records": [{"body": "x"}]}),
        "POST",
        records,
        404,
    )
    assert nf_append["code"] == "stream_not_found"

    tail = check(
        http.get("/streams/s/records/tail", headers=h), "GET", "/streams/{stream}/records/tail", 200
    )
    assert tail == {"tail": {"seq_num": 2, "timestamp": BASE_MS + 2000}}


def test_base64_format_round_trip(http: httpx.Client, basin: str) -> None:
    h = {"s2-basin": basin, "s2-format": "base64"}
    check(http.post("/streams", headers=h, json={"stream": "bin"}), "POST", "/streams", 201)
    raw_body = b"\x00\xff\x10binary"

    def b64(data: bytes) -> str:
        return base64.b64encode(data).decode()

    check(
        http.post(
            "/streams/bin/records",
            headers=h,
            json={"records": [{"body": b64(raw_body), "headers": [[b64(b"h\x00"), b64(b"\xfe")]]}]},
        ),
        "POST",
        "/streams/{stream}/records",
        200,
    )
    batch = check(
        http.get("/streams/bin/records", headers=h, params={"seq_num": 0}),
        "GET",
        "/streams/{stream}/records",
        200,
    )
    (record,) = batch["records"]
    assert base64.b64decode(record["body"]) == raw_body
    assert [[base64.b64decode(x) for x in pair] for pair in record["headers"]] == [
        [b"h\x00", b"\xfe"]
    ]


def test_sse_read_events(http: httpx.Client, basin: str) -> None:
    h = {"s2-basin": basin}
    check(http.post("/streams", headers=h, json={"stream": "sse"}), "POST", "/streams", 201)
    check(
        http.post(
            "/streams/sse/records",
            headers=h,
            json={
                "records": [
                    {"body": "a", "timestamp": BASE_MS},
                    {"body": "b", "timestamp": BASE_MS + 1},
                ]
            },
        ),
        "POST",
        "/streams/{stream}/records",
        200,
    )
    with http.stream(
        "GET",
        "/streams/sse/records",
        headers={**h, "accept": "text/event-stream"},
        params={"seq_num": 0, "count": 2},
    ) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].split(";")[0] == "text/event-stream"
        events = parse_sse(response.iter_lines())
    schema = SPEC["paths"]["/streams/{stream}/records"]["get"]["responses"]["200"]["content"][
        "text/event-stream"
    ]["schema"]
    seen: list[int] = []
    for event in events:
        if event.get("event", "done") == "done":
            # End of stream; this spec version does not list it. S2's docs name it
            # `event: done`, s2-lite sends a bare `data: [DONE]`.
            assert event.get("data") == "[DONE]", event
            continue
        parsed: dict[str, Any] = dict(event)
        if event["event"] != "error":
            parsed["data"] = json.loads(event["data"])
        validate(parsed, schema)
        if parsed["event"] == "batch":
            seen.extend(r["seq_num"] for r in parsed["data"]["records"])
            last = parsed["data"]["records"][-1]["seq_num"]
            assert parsed["id"].split(",")[0] == str(last)
    assert seen == [0, 1]


def test_sse_follow_pings_then_delivers_new_records(
    http: httpx.Client, basin: str, s2_server: Any
) -> None:
    h = {"s2-basin": basin}
    check(http.post("/streams", headers=h, json={"stream": "live"}), "POST", "/streams", 201)
    schema = SPEC["paths"]["/streams/{stream}/records"]["get"]["responses"]["200"]["content"][
        "text/event-stream"
    ]["schema"]
    append = {"records": [{"body": "first"}]}
    check(
        http.post("/streams/live/records", headers=h, json=append),
        "POST",
        "/streams/{stream}/records",
        200,
    )
    kinds: list[str] = []
    appended = False
    with http.stream(
        "GET",
        "/streams/live/records",
        headers={**h, "accept": "text/event-stream"},
        params={"seq_num": 0},
    ) as response:
        assert response.status_code == 200
        for raw in iter_sse(response.iter_lines()):
            event: dict[str, Any] = {**raw, "data": json.loads(raw["data"])}
            validate(event, schema)
            kinds.append(event["event"])
            if event["event"] == "ping" and not appended:
                assert event["data"]["tail"]["seq_num"] == 1
                with httpx.Client(base_url=f"{s2_server.url}/v1", timeout=15,
                                  headers=http.headers) as other:
                    check(
                        other.post(
                            "/streams/live/records",
                            headers=h,
                            json={"records": [{"body": "second"}]},
                        ),
                        "POST",
                        "/streams/{stream}/records",
                        200,
                    )
                appended = True
                kinds.append("appended")
            if event["event"] == "batch" and event["data"]["records"][-1]["body"] == "second":
                assert [r["seq_num"] for r in event["data"]["records"]] == [1]
                assert event["id"].startswith("1,")
                break
    assert kinds[:3] == ["batch", "ping", "appended"]
    assert kinds[-1] == "batch"


def iter_sse(lines: Iterator[str]) -> Iterator[dict[str, str]]:
    """Yield events as they complete, so a test can act while the stream stays open."""
    current: dict[str, str] = {}
    for line in lines:
        if not line:
            if current:
                yield current
                current = {}
            continue
        if line.startswith(":"):
            continue
        field, _, value = line.partition(":")
        value = value.removeprefix(" ")
        if field == "data" and "data" in current:
            current["data"] += "\n" + value
        elif field in ("event", "data", "id"):
            current[field] = value
    if current:
        yield current


def parse_sse(lines: Iterator[str]) -> list[dict[str, str]]:
    """Group `field: value` lines into events (blank line ends one); data lines concatenate."""
    return list(iter_sse(lines))


def test_validation_errors(http: httpx.Client, basin: str) -> None:
    h = {"s2-basin": basin}
    check(http.post("/streams", headers=h, json={"stream": "v"}), "POST", "/streams", 201)
    records = "/streams/{stream}/records"

    def append(payload: dict[str, Any]) -> httpx.Response:
        return http.post("/streams/v/records", headers=h, json=payload)

    check_error(append({"records": []}), "POST", records, 422, "invalid")
    check_error(append({"records": [{"body": "a"}] * 1001}), "POST", records, 422, "invalid")
    huge = {"records": [{"body": "a" * (1024 * 1024)}]}
    check_error(append(huge), "POST", records, 422, "invalid")
    long_token = {"records": [{"body": "a"}], "fencing_token": "x" * 37}
    # Checked as the JSON is deserialized: 400 `bad_json`, as s2-lite 0.43.4 answers
    # (tests/test_s2_differential.py).
    check_error(append(long_token), "POST", records, 400, "bad_json")
    bad_fence = {"records": [{"body": "x" * 37, "headers": [["", "fence"]]}]}
    check_error(append(bad_fence), "POST", records, 422, "invalid")
    unknown_command = {"records": [{"body": "x", "headers": [["", "bogus"]]}]}
    check_error(append(unknown_command), "POST", records, 422, "invalid")
    check_error(
        http.post("/streams/v/records", headers=h, content=b"{not json"),
        "POST",
        records,
        400,
        "bad_json",
    )
    two_starts = http.get("/streams/v/records", headers=h, params={"seq_num": 0, "timestamp": 1})
    check_error(two_starts, "GET", records, 422, "invalid")
    # Nothing was appended by any of the rejected requests.
    tail = check(http.get("/streams/v/records/tail", headers=h), "GET", records + "/tail", 200)
    assert tail["tail"]["seq_num"] == 0


@pytest.mark.local_server
def test_auth_errors() -> None:
    from s2_spark.testing import LocalS2Server

    with LocalS2Server(token="right-token") as server:
        url = f"{server.url}/v1/basins"
        missing = httpx.get(url, timeout=15)
        check_error(missing, "GET", "/basins", 401, "authn")
        wrong = httpx.get(url, headers={"authorization": "Bearer wrong-token"}, timeout=15)
        body = check_error(wrong, "GET", "/basins", 403, "permission_denied")
        assert "wrong-token" not in body["message"] and "right-token" not in body["message"]
        right = httpx.get(url, headers={"authorization": "Bearer right-token"}, timeout=15)
        check(right, "GET", "/basins", 200)


def test_create_is_idempotent_per_request_token(http: httpx.Client, unique: Unique) -> None:
    """s2-lite: a create retried with the same `s2-request-token` (and body) is a 201 no-op."""
    name = unique("oaidem")

    def create_basin(token: str) -> httpx.Response:
        return http.post("/basins", json={"basin": name}, headers={"s2-request-token": token})

    first = create_basin("tok-a")
    created = check(first, "POST", "/basins", 201)
    assert first.headers["s2-provision-result"] == "created"
    retried = create_basin("tok-a")
    assert check(retried, "POST", "/basins", 201) == created
    assert retried.headers["s2-provision-result"] == "noop"
    check_error(create_basin("tok-b"), "POST", "/basins", 409, "resource_already_exists")

    h = {"s2-basin": name}

    def create_stream(token: str, config: dict[str, Any] | None = None) -> httpx.Response:
        body: dict[str, Any] = {"stream": "s"}
        if config is not None:
            body["config"] = config
        return http.post("/streams", json=body, headers={**h, "s2-request-token": token})

    first = create_stream("tok-s")
    info = check(first, "POST", "/streams", 201)
    assert first.headers["s2-provision-result"] == "created"
    retried = create_stream("tok-s")
    assert check(retried, "POST", "/streams", 201) == info
    assert retried.headers["s2-provision-result"] == "noop"
    # Same token, different request: a conflict, not a silent no-op.
    changed = create_stream("tok-s", {"retention_policy": {"age": 5}})
    check_error(changed, "POST", "/streams", 409, "resource_already_exists")
