"""S2 as s2-lite answers, not as we remember it.

Convention: every case follows s2-lite's source (repository s2-streamstore/s2, folders
`lite/`, `api/`, `common/`) and its docstring names the file (and function) it follows,
so a reader can check the expectation against the reference rather than against our
local server. Cases for other parts of S2's behaviour (compression, deletion, error
classes, encryption) live in their own modules under the same convention.

The cases talk HTTP to `s2_server`, so with `S2_TEST_ENDPOINT` set (see `_s2_target`)
they run against s2-lite itself; those that need the local server's own features (its
request counts, a server of their own) are marked `local_server`.
"""

from __future__ import annotations

import gzip
import json
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest
from _s2_target import s2_config, token

from s2_spark.errors import AlreadyExistsError, NotFoundError
from s2_spark.s2 import AppendRecord, S2Client, S2Config, StreamClient, StreamConfig
from s2_spark.s2._client import _basin_info
from s2_spark.testing.semantics.errors import CODE_STATUS
from s2_spark.testing.semantics.read import HEARTBEAT_INTERVAL
from s2_spark.wire.frames import FrameDecoder, Message

Unique = Callable[[str], str]


@pytest.fixture
def http(s2_server: Any) -> Iterator[httpx.Client]:
    auth = token()
    headers = {} if auth is None else {"authorization": f"Bearer {auth}"}
    # A connection per request: s2-lite (hyper) closes a connection after refusing a body
    # it did not read, and a request sent on it meanwhile fails (seen in 1 of 30 runs).
    with httpx.Client(base_url=f"{s2_server.url}/v1", headers=headers, timeout=30,
                      limits=httpx.Limits(max_keepalive_connections=0)) as c:
        yield c


@pytest.fixture
def basin(http: httpx.Client, unique: Unique) -> str:
    name = unique("lite")
    r = http.post("/basins", json={"basin": name})
    assert r.status_code == 201, r.text
    return name


def _stream(http: httpx.Client, basin: str, name: str, config: Any = None) -> None:
    body: dict[str, Any] = {"stream": name}
    if config is not None:
        body["config"] = config
    r = http.post("/streams", headers={"s2-basin": basin}, json=body)
    assert r.status_code == 201, r.text


def _error(r: httpx.Response) -> tuple[int, str]:
    """(status, code) of an S2 error answer, checking the pair is S2's."""
    body = r.json()
    assert CODE_STATUS[body["code"]] == r.status_code, (r.status_code, body)
    assert isinstance(body["message"], str)
    return r.status_code, body["code"]


# ------------------------------------------------------------------ heartbeats


def test_heartbeat_interval_default_and_idle_timeout() -> None:
    """`lite/src/backend/read.rs` (`new_heartbeat_sleep`): a following session gets a
    heartbeat after a random 5-15 s; the client's default idle timeout outlasts the
    longest of them."""
    assert HEARTBEAT_INTERVAL == (5.0, 15.0)
    assert S2Config().session_idle_timeout > HEARTBEAT_INTERVAL[1]


@pytest.mark.local_server
def test_session_idle_past_the_shortest_heartbeat_interval_survives() -> None:
    """`lite/src/backend/read.rs` (`read_session`, `new_heartbeat_sleep`): at s2-lite's
    own 5-15 s heartbeats, a session left idle at the tail until a heartbeat came (so at
    least 5 s) stays open with the default idle timeout: no reconnect, and the record
    appended then arrives on it."""
    from s2_spark.testing import LocalS2Server

    with LocalS2Server() as server, S2Client(S2Config(endpoint=server.url)) as client:
        client.create_basin("heartbeat-basin")
        client.basin("heartbeat-basin").create_stream("s")
        stream = client.basin("heartbeat-basin").stream("s")
        with stream.read_session(seq_num=0, count=1, wait=60, heartbeats=True) as session:
            caught_up = next(session)  # sent at once when the session reaches the tail
            assert caught_up.count == 0 and caught_up.tail is not None
            idle = next(session)  # the next one, 5-15 s later
            assert idle.count == 0
            stream.append([AppendRecord(b"after-idle")])
            got = [b for b in session if b.count]
        assert [r["body"] for b in got for r in b.batch.to_pylist()] == [b"after-idle"]
        assert server.request_counts()["read_session"] == 1


@pytest.mark.local_server
def test_tests_may_shorten_heartbeats() -> None:
    """`lite/src/backend/read.rs` (`new_heartbeat_sleep`, under `cfg(test)` 5-15 ms):
    s2-lite's own tests shorten the interval; ours may too, without changing the default."""
    from s2_spark.testing import LocalS2Server

    with LocalS2Server(heartbeat_interval=(0.05, 0.15)) as server, S2Client(
        S2Config(endpoint=server.url)
    ) as client:
        client.create_basin("short-beats")
        client.basin("short-beats").create_stream("s")
        stream = client.basin("short-beats").stream("s")
        with stream.read_session(seq_num=0, heartbeats=True) as session:
            beats = [next(session) for _ in range(4)]
        assert all(b.count == 0 and b.tail is not None for b in beats)


# ------------------------------------------------------------------ SSE


def test_sse_ends_with_an_unnamed_done_event(http: httpx.Client, basin: str) -> None:
    """`api/src/v1/stream/sse.rs` (`done_event`, `read_batch_event`, `ping_event`) and
    `lite/src/handlers/v1/records.rs` (`read`): batches are `event: batch` with an id
    `seq_num,count,bytes`; the end is an event without a name whose data is `[DONE]`."""
    h = {"s2-basin": basin}
    _stream(http, basin, "s")
    http.post("/streams/s/records", headers=h, json={"records": [{"body": "a"}]})
    with http.stream(
        "GET", "/streams/s/records", headers={**h, "accept": "text/event-stream"},
        params={"seq_num": 0, "count": 1},
    ) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        text = r.read().decode()
    blocks = [b for b in text.replace("\r\n", "\n").split("\n\n") if b.strip()]
    fields = [dict(line.split(": ", 1) for line in b.split("\n")) for b in blocks]
    assert fields[0]["event"] == "batch" and fields[0]["id"] == "0,1,9"
    assert json.loads(fields[0]["data"])["records"][0]["body"] == "a"
    assert fields[-1] == {"data": "[DONE]"}


# ------------------------------------------------------------------ basins, listing


def test_basin_info_has_location_not_scope(http: httpx.Client, unique: Unique) -> None:
    """`api/src/v1/basin.rs` (`BasinInfo`) and `lite/src/backend/basins.rs`
    (`provision_basin`): a basin has `location` (null on s2-lite), no `scope`; the
    deprecated `state` is still sent."""
    name = unique("loc")
    info = http.post("/basins", json={"basin": name}).json()
    assert "scope" not in info
    assert info["location"] is None and info["state"] == "active"
    assert info["deleted_at"] is None
    listed = http.get("/basins", params={"prefix": name}).json()["basins"]
    assert [(b["name"], b["location"]) for b in listed] == [(name, None)]


def test_client_reads_location_or_the_older_scope() -> None:
    """`api/src/v1/basin.rs` (`BasinInfo.location`): our client reads it, and `scope`
    from servers older than it."""
    assert _basin_info({"name": "b", "location": "aws:us-east-1"}).location == "aws:us-east-1"
    assert _basin_info({"name": "b", "scope": "aws:us-east-1"}).location == "aws:us-east-1"
    assert _basin_info({"name": "b", "location": None}).location is None


def test_list_cursor_before_the_prefix_lists_from_the_prefix(
    http: httpx.Client, basin: str
) -> None:
    """`lite/src/backend/kv/stream_meta.rs` (`ser_key_range`) and `lite/src/backend/
    streams.rs` (`list_streams`): a `start_after` before the prefix is no error, the
    listing starts at the prefix; `limit` 0 or above 1000 means 1000 (`common/src/
    resources.rs`, `ListLimit`); `has_more` tells a cut page."""
    h = {"s2-basin": basin}
    for name in ("a/1", "a/2", "a/3", "b/1"):
        _stream(http, basin, name)
    names = lambda r: [s["name"] for s in r.json()["streams"]]  # noqa: E731
    r = http.get("/streams", headers=h, params={"prefix": "a/", "start_after": "0"})
    assert (r.status_code, names(r), r.json()["has_more"]) == (200, ["a/1", "a/2", "a/3"], False)
    r = http.get("/streams", headers=h, params={"prefix": "a/", "start_after": "z"})
    assert (names(r), r.json()["has_more"]) == ([], False)
    r = http.get("/streams", headers=h, params={"prefix": "a/", "limit": 2})
    assert (names(r), r.json()["has_more"]) == (["a/1", "a/2"], True)
    for limit in (0, 5000):
        r = http.get("/streams", headers=h, params={"limit": limit})
        assert names(r) == ["a/1", "a/2", "a/3", "b/1"]


def test_list_prefixes_no_name_could_have_are_bad_query(http: httpx.Client, basin: str) -> None:
    """`common/src/basin.rs` and `common/src/stream.rs` (`validate_str` with `IS_PREFIX`):
    a basin prefix or cursor must be a start of a basin name (else 400 `bad_query`); a
    stream prefix at most 512 bytes, "." allowed."""
    for bad in ("-x", "Ab", "a_b", "x" * 49):
        assert _error(http.get("/basins", params={"prefix": bad})) == (400, "bad_query")
    assert _error(http.get("/basins", params={"start_after": "A"})) == (400, "bad_query")
    h = {"s2-basin": basin}
    r = http.get("/streams", headers=h, params={"prefix": "x" * 513})
    assert _error(r) == (400, "bad_query")
    assert http.get("/streams", headers=h, params={"prefix": "."}).status_code == 200


# ------------------------------------------------------------------ names


def test_dot_stream_names_are_rejected(http: httpx.Client, basin: str) -> None:
    """`common/src/stream.rs` (`StreamNameStr::validate_str`): "." and ".." are no stream
    names: 400 `bad_path` in a path, 400 `bad_json` in a create's body."""
    h = {"s2-basin": basin}
    for name in (".", ".."):
        r = http.post("/streams", headers=h, json={"stream": name})
        assert _error(r) == (400, "bad_json")
        r = http.get("/streams/%2E/records/tail" if name == "." else "/streams/%2E%2E", headers=h)
        assert _error(r) == (400, "bad_path")
    _stream(http, basin, "...")  # three dots is a name
    _stream(http, basin, "./x")


# ------------------------------------------------------------------ content types


def test_s2s_read_needs_the_content_type(http: httpx.Client, basin: str) -> None:
    """`api/src/v1/stream/extract.rs` (`ReadRequest::from_request_parts`): a read is an
    S2S session only for `Content-Type: s2s/proto`; `Accept: s2s/proto` alone is a
    unary read answered in JSON."""
    h = {"s2-basin": basin}
    _stream(http, basin, "s")
    http.post("/streams/s/records", headers=h, json={"records": [{"body": "x"}]})
    r = http.get("/streams/s/records", headers={**h, "accept": "s2s/proto"},
                 params={"seq_num": 0})
    assert r.status_code == 200 and r.headers["content-type"].startswith("application/json")
    assert [x["body"] for x in r.json()["records"]] == ["x"]
    with http.stream("GET", "/streams/s/records",
                     headers={**h, "content-type": "s2s/proto", "accept-encoding": "identity"},
                     params={"seq_num": 0, "count": 1}) as r:
        assert r.headers["content-type"] == "s2s/proto"
        frames = FrameDecoder().feed(r.read())
    assert isinstance(frames[0], Message)


def test_our_client_reads_sessions_with_the_content_type(stream_client: StreamClient) -> None:
    """`api/src/v1/stream/extract.rs` (`ReadRequest`): our read sessions send
    `Content-Type: s2s/proto`, so s2-lite answers them as S2S sessions."""
    stream_client.append([AppendRecord(b"a"), AppendRecord(b"b")])
    got = [r["body"] for b in stream_client.read_session(seq_num=0, count=2)
           for r in b.batch.to_pylist()]
    assert got == [b"a", b"b"]


def test_json_bodies_need_their_content_type(http: httpx.Client, basin: str) -> None:
    """`api/src/data.rs` (`Json::from_request`, `JsonOpt`): a JSON body without
    `Content-Type: application/json` is a 400 `bad_json`, except for PUT, where a
    request without a Content-Type has no body at all."""
    h = {"s2-basin": basin}
    r = http.post("/streams", headers=h, content=b'{"stream": "s"}')
    assert _error(r) == (400, "bad_json")
    r = http.post("/streams", headers={**h, "content-type": "text/plain"},
                  content=b'{"stream": "s"}')
    assert _error(r) == (400, "bad_json")
    r = http.post("/streams/s/records", headers=h, content=b'{"records": [{"body": "x"}]}')
    assert _error(r) == (400, "bad_json")
    # PUT without a Content-Type: the body is not read; the stream gets the defaults.
    r = http.put("/streams/p", headers=h, content=b'{"storage_class": "standard"}')
    assert r.status_code == 201 and r.headers["s2-provision-result"] == "created"
    assert http.get("/streams/p", headers=h).json()["storage_class"] == "express"


def test_gzip_request_bodies_are_undone(http: httpx.Client, basin: str) -> None:
    """`lite/src/handlers/v1/mod.rs` (`router`: `RequestDecompressionLayer`, gzip and
    zstd): a compressed request body is read as what it compresses."""
    h = {"s2-basin": basin, "content-type": "application/json", "content-encoding": "gzip"}
    r = http.post("/streams", headers=h, content=gzip.compress(b'{"stream": "g"}'))
    assert r.status_code == 201, r.text


# ------------------------------------------------------------------ ensure (PUT)


def test_ensure_stream_replaces_the_whole_config(http: httpx.Client, basin: str) -> None:
    """`lite/src/backend/streams.rs` (`provision_stream`, `ProvisionMode::Ensure`) and
    `common/src/config.rs` (`OptionalStreamConfig::merge`): PUT sets an existing stream's
    config to what it was given merged over the basin's defaults; fields left out are
    reset, not kept. A PUT of the same config again is a `noop`."""
    h = {"s2-basin": basin}
    custom = {"storage_class": "standard", "retention_policy": {"age": 3600},
              "timestamping": {"mode": "arrival", "uncapped": True}}
    _stream(http, basin, "s", custom)
    got = http.get("/streams/s", headers=h).json()
    assert got["retention_policy"] == {"age": 3600} and got["timestamping"]["mode"] == "arrival"
    r = http.put("/streams/s", headers=h, json={"storage_class": "standard"})
    assert (r.status_code, r.headers["s2-provision-result"]) == (200, "updated")
    assert http.get("/streams/s", headers=h).json() == {
        "storage_class": "standard",
        "retention_policy": {"age": 7 * 24 * 3600},
        "timestamping": {"mode": "client-prefer", "uncapped": False},
        "delete_on_empty": {"min_age_secs": 0},
    }
    r = http.put("/streams/s", headers=h, json={"storage_class": "standard"})
    assert (r.status_code, r.headers["s2-provision-result"]) == (200, "noop")
    r = http.put("/streams/s", headers=h, json={})
    assert r.headers["s2-provision-result"] == "updated"
    assert http.get("/streams/s", headers=h).json()["storage_class"] == "express"


def test_ensure_basin_replaces_the_whole_config(http: httpx.Client, unique: Unique) -> None:
    """`lite/src/backend/basins.rs` (`provision_basin`, `ProvisionMode::Ensure`) and
    `api/src/v1/config.rs` (`BasinConfig`, `StreamConfig::to_opt`): PUT without a config
    resets an existing basin's to the defaults; a basin's default stream config is a
    layer whose unset fields are null (all unset: null)."""
    name = unique("ens")
    r = http.put(f"/basins/{name}", json={"config": {
        "create_stream_on_append": True,
        "default_stream_config": {"retention_policy": {"age": 60}}}})
    assert (r.status_code, r.headers["s2-provision-result"]) == (201, "created")
    assert http.get(f"/basins/{name}").json() == {
        "default_stream_config": {"storage_class": None, "retention_policy": {"age": 60},
                                  "timestamping": None, "delete_on_empty": None},
        "stream_cipher": None,
        "create_stream_on_append": True,
        "create_stream_on_read": False,
    }
    r = http.put(f"/basins/{name}", json={})
    assert (r.status_code, r.headers["s2-provision-result"]) == (200, "updated")
    assert http.get(f"/basins/{name}").json() == {
        "default_stream_config": None,
        "stream_cipher": None,
        "create_stream_on_append": False,
        "create_stream_on_read": False,
    }


def test_reconfigure_null_resets_to_the_basins_default(http: httpx.Client, unique: Unique) -> None:
    """`lite/src/backend/streams.rs` (`reconfigure_stream`) and `common/src/config.rs`
    (`OptionalStreamConfig::reconfigure`, `merge`): a PATCH field set to null falls back
    to the basin's default for it, then S2's; fields left out are kept."""
    name = unique("rcf")
    http.post("/basins", json={"basin": name, "config": {
        "default_stream_config": {"retention_policy": {"age": 60}}}})
    h = {"s2-basin": name}
    _stream(http, name, "s", {"retention_policy": {"age": 3600}, "storage_class": "standard"})
    r = http.patch("/streams/s", headers=h, json={"retention_policy": None})
    assert r.status_code == 200
    assert r.json()["retention_policy"] == {"age": 60} and r.json()["storage_class"] == "standard"


def test_client_ensure_stream_replaces_and_create_streams_keeps(
    s2_server: Any, unique: Unique, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`lite/src/backend/streams.rs` (`provision_stream`): PUT replaces an existing
    stream's config, as `BasinClient.ensure_stream` now says; so the writer's
    `createStreams` creates with POST and keeps a stream someone else made meanwhile
    (here: made after the writer's tail lookup found none) as it is."""
    from s2_spark.backends.s2.options import S2Settings
    from s2_spark.backends.s2.plan import check_target
    from s2_spark.backends.s2.settings import SinkSettings

    basin_name = unique("cst")
    with S2Client(s2_config(s2_server.url)) as client:
        client.create_basin(basin_name)
        basin = client.basin(basin_name)
        basin.create_stream("kept", StreamConfig(retention_age=3600))
        basin.create_stream("reset", StreamConfig(retention_age=3600))
        basin.ensure_stream("reset")
        assert basin.get_stream_config("reset").retention_age == 7 * 24 * 3600

        def missing(self: StreamClient) -> None:
            raise NotFoundError("stream not found (as the writer first saw it)")

        monkeypatch.setattr(StreamClient, "check_tail", missing)
        settings = S2Settings(basin=basin_name, endpoint=s2_server.url, access_token=token())
        check_target(settings, "kept", SinkSettings(create_streams=True))
        assert basin.get_stream_config("kept").retention_age == 3600
        with pytest.raises(AlreadyExistsError):
            basin.create_stream("kept")


# ------------------------------------------------------------------ errors


def test_errors_carry_s2s_code_and_status(http: httpx.Client, basin: str) -> None:
    """`api/src/v1/error.rs` (`ErrorCode::status`) and `lite/src/handlers/v1/error.rs`
    (`ServiceError::to_response`): each error the server answers is one of S2's codes
    with S2's status for it."""
    h = {"s2-basin": basin}
    _stream(http, basin, "s")
    cases = {
        "bad_path": http.get("/basins/Not_A_Basin"),
        "bad_header": http.get("/streams", headers={"s2-basin": "X"}),
        "bad_query": http.get("/streams", headers=h, params={"limit": "x"}),
        "bad_json": http.post("/streams", headers={**h, "content-type": "application/json"},
                              content=b"{"),
        "bad_proto": http.post("/streams/s/records",
                               headers={**h, "content-type": "application/protobuf"},
                               content=b"\xff\xff\xff"),
        "basin_not_found": http.get("/streams", headers={"s2-basin": "no-such-basin-x"}),
        "stream_not_found": http.get("/streams/nope/records/tail", headers=h),
        "resource_already_exists": http.post("/streams", headers=h, json={"stream": "s"}),
        "invalid": http.post("/streams/s/records", headers=h, json={"records": []}),
        "not_implemented": http.get("/access-tokens"),
    }
    for code, r in cases.items():
        assert _error(r)[1] == code, (code, r.text)
    assert CODE_STATUS["stream_deletion_pending"] == 409
    assert CODE_STATUS["unavailable"] == 503 and CODE_STATUS["client_hangup"] == 499


def test_json_body_over_axums_limit_is_bad_json(http: httpx.Client, basin: str) -> None:
    """`api/src/data.rs` (`Json::from_request`: the body buffered under axum's default
    2 MiB limit) and `lite/src/handlers/v1/error.rs` (a JSON rejection is 400
    `bad_json`): a JSON append of more than 2 MiB is refused before it is read."""
    h = {"s2-basin": basin}
    _stream(http, basin, "s")
    big = {"records": [{"body": "x" * 1000}] * 2200}
    assert _error(http.post("/streams/s/records", headers=h, json=big)) == (400, "bad_json")


def test_unknown_routes_and_methods_have_no_body(http: httpx.Client, s2_server: Any) -> None:
    """`lite/src/handlers/mod.rs` (`router`, no fallback): an unknown path is axum's 404
    and a known path with another method its 405, both with an empty body; `/health`
    answers "OK"."""
    r = http.get("/nothing-here")
    assert (r.status_code, r.content) == (404, b"")
    r = http.post("/streams/s/records/tail")
    assert (r.status_code, r.content) == (405, b"")
    r = httpx.get(s2_server.url + "/health", headers=http.headers)
    assert (r.status_code, r.text) == (200, "OK")


def test_stream_info_has_a_cipher_field(http: httpx.Client, basin: str) -> None:
    """`api/src/v1/stream/mod.rs` (`StreamInfo`): streams are listed with `cipher` (null
    for a basin without a stream cipher) and `deleted_at`."""
    _stream(http, basin, "s")
    listed = http.get("/streams", headers={"s2-basin": basin}).json()["streams"]
    assert [(s["name"], s["cipher"], s["deleted_at"]) for s in listed] == [("s", None, None)]


@pytest.fixture
def stream_client(s2_server: Any, basin: str) -> Iterator[StreamClient]:
    with S2Client(s2_config(s2_server.url)) as client:
        client.basin(basin).create_stream("c")
        yield client.basin(basin).stream("c")
