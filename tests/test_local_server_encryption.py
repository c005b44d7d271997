"""Encrypted streams on the local server, case by case as s2-lite answers them.

Each test names the s2-lite source it follows (repository s2-streamstore/s2): the key's
header and its checks (`common/src/encryption.rs`, `api/src/v1/stream/extract.rs`), where
the key is resolved (`lite/src/backend/append.rs`, `read.rs`, `core.rs`), what is sealed
(`storage/src/record/encryption.rs`), the status and body of each failure
(`lite/src/handlers/v1/error.rs`, `api/src/v1/error.rs`) and the handler tests of
`lite/src/handlers/v1/records.rs`. The last tests drive the server with S2's own client,
`s2-sdk`, which sends the key the same way.
"""

from __future__ import annotations

import asyncio
import base64
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from s2_sdk import (
    S2,
    AppendInput,
    BasinConfig,
    Encryption,
    Endpoints,
    Record,
    Retry,
    S2ServerError,
    SeqNum,
)

from s2_spark._proto import s2_pb2
from s2_spark.testing import LocalS2Server
from s2_spark.wire.frames import FrameDecoder, Message, Terminal, encode_message

#: The local server is what these tests test (s2-lite's answers are the reference they
#: follow; tests/test_s2_differential.py compares the two): each meets it.
pytestmark = pytest.mark.local_server

KEY = base64.b64encode(bytes([0x42] * 32)).decode()  # records.rs `aegis_key(0x42)`
WRONG = base64.b64encode(bytes([0x24] * 32)).decode()  # records.rs `aegis_key(0x24)`
CIPHERS = ("aegis-256", "aes-256-gcm")
RECORDS = "/streams/s/records"

Unique = Callable[[str], str]


class Basin:
    """Raw HTTP on one basin of the local server."""

    def __init__(self, url: str, name: str) -> None:
        self.http = httpx.Client(base_url=url + "/v1", timeout=30)
        self.name = name

    def h(self, key: str | None = None, **extra: str) -> dict[str, str]:
        out = {"s2-basin": self.name, **extra}
        if key is not None:
            out["s2-encryption-key"] = key
        return out

    def append(self, body: str, key: str | None = None, path: str = RECORDS,
               headers: list[list[str]] | None = None) -> httpx.Response:
        record: dict[str, Any] = {"body": body}
        if headers:
            record["headers"] = headers
        return self.http.post(path, headers=self.h(key), json={"records": [record]})

    def read(self, key: str | None = None, path: str = RECORDS, *, as_: str | None = None,
             **params: Any) -> httpx.Response:
        """A read, unary JSON unless `as_` names an SSE or S2S session."""
        kind = {None: {}, "sse": {"accept": "text/event-stream"},
                "s2s": {"content-type": "s2s/proto"}}[as_]
        return self.http.get(path, headers=self.h(key, **kind), params={"seq_num": 0, **params})


def make_basin(url: str, unique: Unique, cipher: str | None) -> Basin:
    name = unique("enc")
    config = {} if cipher is None else {"config": {"stream_cipher": cipher}}
    r = httpx.post(url + "/v1/basins", json={"basin": name, **config})
    assert r.status_code == 201, r.text
    return Basin(url, name)


@pytest.fixture(params=CIPHERS)
def enc(request: Any, s2_server: Any, unique: Unique) -> Iterator[Basin]:
    """A basin whose `stream_cipher` is each of S2's ciphers, with stream `s`."""
    b = make_basin(s2_server.url, unique, request.param)
    assert b.http.post("/streams", headers=b.h(), json={"stream": "s"}).status_code == 201
    yield b
    b.http.close()


def err(r: httpx.Response) -> tuple[int, str, str]:
    body = r.json()
    return r.status_code, body["code"], body["message"]


def missing(cipher: str) -> tuple[int, str, str]:
    """encryption.rs `EncryptionSpecResolutionError::MissingKey`, as error.rs answers it."""
    return 400, "bad_header", f"missing encryption key for stream cipher '{cipher}'"


def cipher_of(b: Basin) -> str:
    return str(b.http.get(f"/basins/{b.name}").json()["stream_cipher"])


# ---------------------------------------------------------------- basin and stream config


def test_stream_cipher_is_basin_config_and_fixed_per_stream(s2_server: Any, unique: Unique
                                                             ) -> None:
    """api/src/v1/config.rs `BasinConfig.stream_cipher` (null by default; an unknown name
    is refused by JSON extraction); lite/src/backend/streams.rs `provision_stream`: a new
    stream takes the basin's cipher, an existing one keeps its own (docs/adr/csek.md:
    immutable for the stream's life); api/src/v1/stream/mod.rs `StreamInfo.cipher`."""
    b = make_basin(s2_server.url, unique, None)
    assert b.http.get(f"/basins/{b.name}").json()["stream_cipher"] is None
    assert b.http.post("/streams", headers=b.h(), json={"stream": "plain"}).json()["cipher"] is None

    r = b.http.patch(f"/basins/{b.name}", json={"stream_cipher": "des"})
    assert (r.status_code, r.json()["code"]) == (400, "bad_json")
    r = b.http.patch(f"/basins/{b.name}", json={"stream_cipher": "aegis-256"})
    assert (r.status_code, r.json()["stream_cipher"]) == (200, "aegis-256")
    assert b.http.post("/streams", headers=b.h(), json={"stream": "a"}).json()["cipher"] == (
        "aegis-256")
    # Auto-created streams take it too (core.rs `stream_handle_with_auto_create`).
    b.http.patch(f"/basins/{b.name}", json={"create_stream_on_append": True,
                                            "stream_cipher": "aes-256-gcm"})
    assert b.append("x", KEY, "/streams/auto/records").status_code == 200

    # Another cipher on the basin, then none: the streams keep theirs, also when ensured.
    b.http.patch(f"/basins/{b.name}", json={"stream_cipher": None})
    assert b.http.put("/streams/a", headers=b.h(), json={}).json()["cipher"] == "aegis-256"
    listed = b.http.get("/streams", headers=b.h()).json()["streams"]
    assert {s["name"]: s["cipher"] for s in listed} == {
        "a": "aegis-256", "auto": "aes-256-gcm", "plain": None}
    assert err(b.append("x", None, "/streams/a/records")) == missing("aegis-256")
    assert b.append("x", None, "/streams/plain/records").status_code == 200


# ---------------------------------------------------------------- the key: missing, malformed


def test_appends_and_reads_need_the_key_tail_checks_do_not(enc: Basin) -> None:
    """core.rs `stream_handle_with_auto_create` resolves the key for appends and reads
    (append.rs `open_for_append`, read.rs `open_for_read`) but not for tail checks
    (`open_for_check_tail`: always Plain); records.rs
    `sse_read_without_key_header_is_rejected_before_stream_starts`,
    `s2s_read_without_key_header_is_rejected_before_stream_starts`: an HTTP 400, not an
    event or a terminal frame."""
    cipher = cipher_of(enc)
    assert err(enc.append("x")) == missing(cipher)
    proto = s2_pb2.AppendInput(records=[s2_pb2.AppendRecord(body=b"x")]).SerializeToString()
    r = enc.http.post(RECORDS, headers=enc.h(**{"content-type": "application/protobuf"}),
                      content=proto)
    assert err(r) == missing(cipher)
    r = enc.http.post(RECORDS, headers=enc.h(**{"content-type": "s2s/proto"}),
                      content=encode_message(proto))
    assert err(r) == missing(cipher)
    assert err(enc.read()) == missing(cipher)
    assert err(enc.read(as_="sse")) == missing(cipher)
    assert err(enc.read(as_="s2s")) == missing(cipher)
    # Nothing was appended; the tail needs no key.
    assert enc.http.get(RECORDS + "/tail", headers=enc.h()).json()["tail"]["seq_num"] == 0


def test_malformed_keys(enc: Basin, s2_server: Any, unique: Unique) -> None:
    """encryption.rs `FromStr for EncryptionKey` (1..=44 characters, checked by
    request extraction: extract.rs `parse_header_opt`, whatever the stream) and
    `resolve_key` (standard padded base64 of exactly 32 bytes, checked only against a
    stream with a cipher: `resolve_plain_ignores_supplied_key`)."""
    cipher = cipher_of(enc)
    too_long = (400, "bad_header", "Invalid header `s2-encryption-key`: invalid encryption key: "
                "key material length 45 is out of range")
    assert err(enc.append("x", "A" * 45)) == too_long
    assert err(enc.read("A" * 45)) == too_long
    assert err(enc.append("x", "!!!!")) == (
        400, "bad_header", f"invalid encryption key for stream cipher '{cipher}': invalid base64")
    assert err(enc.read(KEY.rstrip("="))) == (
        400, "bad_header", f"invalid encryption key for stream cipher '{cipher}': invalid base64")
    short = base64.b64encode(b"k" * 16).decode()
    assert err(enc.read(short)) == (
        400, "bad_header", f"invalid encryption key length for stream cipher '{cipher}': 16")
    long = base64.b64encode(b"k" * 33).decode()
    assert err(enc.append("x", long)) == (
        400, "bad_header", f"invalid encryption key length for stream cipher '{cipher}': 33")
    # A stream without a cipher ignores a bad key but not an over-long header; the tail
    # check reads no key at all.
    plain = make_basin(s2_server.url, unique, None)
    plain.http.post("/streams", headers=plain.h(), json={"stream": "s"})
    assert plain.append("x", "!!!!").status_code == 200
    assert plain.read(short).status_code == 200
    assert err(plain.read("A" * 45)) == too_long
    r = enc.http.get(RECORDS + "/tail", headers=enc.h("A" * 45))
    assert r.status_code == 200


def test_the_key_is_resolved_after_the_stream_and_before_the_start(enc: Basin) -> None:
    """core.rs `stream_handle_with_auto_create`: a missing stream is 404 before the key
    is looked at; read.rs: the key is resolved by `open_for_read`, before `read` finds a
    start beyond the tail (416)."""
    assert err(enc.read(path="/streams/nope/records"))[:2] == (404, "stream_not_found")
    assert err(enc.read(seq_num=5)) == missing(cipher_of(enc))
    r = enc.read(KEY, seq_num=5)
    assert (r.status_code, r.json()) == (416, {"tail": {"seq_num": 0, "timestamp": 0}})


# ---------------------------------------------------------------- the right key, the wrong key


def test_records_round_trip_with_the_key(enc: Basin) -> None:
    """records.rs `unary_append_with_encryption_header_persists_encrypted_record` and
    `s2s_read_with_correct_encryption_returns_batch_frame`: a read with the key returns
    the records as appended (headers, body, positions)."""
    r = enc.append("secret", KEY, headers=[["h", "v"]])
    assert r.json()["end"]["seq_num"] == 1
    ts = r.json()["start"]["timestamp"]
    assert enc.read(KEY).json()["records"] == [
        {"seq_num": 0, "timestamp": ts, "headers": [["h", "v"]], "body": "secret"}]
    r = enc.read(KEY, as_="s2s", count=1)
    frames = FrameDecoder().feed(r.content)
    assert isinstance(frames[0], Message)
    batch = s2_pb2.ReadBatch.FromString(bytes(frames[0].body))
    assert [(x.seq_num, x.body, [(h.name, h.value) for h in x.headers]) for x in batch.records] \
        == [(0, b"secret", [(b"h", b"v")])]


def test_wrong_key_appends_then_fails_the_read_at_the_sealed_record(enc: Basin) -> None:
    """docs/adr/csek.md: appends succeed with another key than before; the read that meets
    the records fails (storage/src/record/encryption.rs `wrong_key_fails`: an
    AuthenticationFailed; error.rs: 400 `decryption_failed`; records.rs
    `unary_read_with_wrong_key_returns_decryption_failed_error`). Command records are not
    sealed (`decrypt_stored_record_preserves_plaintext_command_records`), so a read of
    them alone succeeds with any key; a read that meets no record (at the tail) too."""
    assert enc.append("first", KEY).status_code == 200
    fence = enc.append("tok", WRONG, headers=[["", "fence"]])
    assert fence.status_code == 200
    assert enc.append("second", WRONG).status_code == 200
    failed = (400, "decryption_failed", "record decryption failed")
    assert err(enc.read(WRONG)) == failed
    assert err(enc.read(KEY)) == failed  # reaches the record appended with WRONG
    assert [x["body"] for x in enc.read(KEY, count=2).json()["records"]] == ["first", "tok"]
    assert [x["body"] for x in enc.read(WRONG, seq_num=1, count=1).json()["records"]] == ["tok"]
    assert enc.read(WRONG, seq_num=3, wait=1).json()["records"] == []
    # A fence appended with the wrong key still fences: command records are in the clear.
    r = enc.http.post(RECORDS, headers=enc.h(KEY),
                      json={"records": [{"body": "x"}], "fencing_token": "tok"})
    assert r.status_code == 200


def test_wrong_key_in_sessions(enc: Basin) -> None:
    """records.rs `read`: an SSE session that fails after its start sends an `error` event
    with the error's body; an S2S session a terminal frame with its status and body
    (`From<ServiceError> for TerminalMessage`). Both started: the key was well formed."""
    enc.append("secret", KEY)
    r = enc.read(WRONG, as_="sse")
    assert r.status_code == 200
    assert "event: error\ndata: " in r.text
    body = r.text.split("event: error\ndata: ", 1)[1].split("\n", 1)[0]
    assert httpx.Response(200, content=body).json() == {
        "code": "decryption_failed", "message": "record decryption failed"}
    r = enc.read(WRONG, as_="s2s")
    assert r.status_code == 200
    (frame,) = FrameDecoder().feed(r.content)
    assert isinstance(frame, Terminal)
    assert (frame.status, frame.error()) == (
        400, {"code": "decryption_failed", "message": "record decryption failed"})


def test_sealed_at_rest_and_after_restart(tmp_path: Path) -> None:
    """storage/src/record/encryption.rs: envelope records are stored sealed, command
    records in the clear, the key nowhere; lite keeps a stream's cipher in its metadata
    (kv/stream_meta.rs), so records stay readable with the key after a restart."""
    data = tmp_path / "data"
    key_bytes = os.urandom(32)
    key = base64.b64encode(key_bytes).decode()
    body = "plaintext-" + os.urandom(8).hex()
    with LocalS2Server(data_dir=data) as server:
        b = make_basin(server.url, lambda p: "enc-at-rest", "aes-256-gcm")
        b.http.post("/streams", headers=b.h(), json={"stream": "s"})
        assert b.append(body, key).status_code == 200
        assert b.append("fence-token", key, headers=[["", "fence"]]).status_code == 200
        b.http.close()
    journal = b"".join(p.read_bytes() for p in data.rglob("*") if p.is_file())
    assert body.encode() not in journal
    assert b"fence-token" in journal
    for secret in (key.encode(), key_bytes, key_bytes.hex().encode()):
        assert secret not in journal
    with LocalS2Server(data_dir=data) as server:
        b = Basin(server.url, "enc-at-rest")
        assert [x["body"] for x in b.read(key).json()["records"]] == [body, "fence-token"]
        assert err(b.read(WRONG))[1] == "decryption_failed"
        assert b.http.get("/streams", headers=b.h()).json()["streams"][0]["cipher"] == (
            "aes-256-gcm")
        b.http.close()


# ---------------------------------------------------------------- S2's own client


def sdk(url: str) -> S2:
    return S2("token", endpoints=Endpoints(url, url), retry=Retry(max_attempts=1))


@pytest.mark.parametrize("cipher", [Encryption.AEGIS_256, Encryption.AES_256_GCM])
def test_s2_sdk_reads_and_writes_encrypted_streams(s2_server: Any, unique: Unique,
                                                   cipher: Encryption) -> None:
    """s2-sdk (its `S2Basin.stream(name, encryption_key=...)`, as sdk/src/api.rs
    `set_encryption_header`) on every data path: unary and session appends and reads
    with the key; a wrong key fails the read with `decryption_failed`, no key the append
    with `bad_header` (error.rs)."""
    from s2_spark.s2 import AppendRecord, S2Client, S2Config

    async def body() -> None:
        async with sdk(s2_server.url) as s2:
            name = unique("sdkenc")
            await s2.create_basin(name, config=BasinConfig(stream_cipher=cipher))
            basin = s2.basin(name)
            info = await basin.create_stream("s")
            assert info.cipher == cipher
            stream = basin.stream("s", encryption_key=bytes([0x42] * 32))
            await stream.append(AppendInput(records=[Record(body=b"one", headers=[(b"h", b"v")])]))
            async with stream.append_session() as session:
                await (await session.submit(AppendInput(records=[Record(body=b"two")])))
            # Our client, with the same key, on the same stream.
            with S2Client(S2Config(endpoint=s2_server.url, encryption_key=KEY)) as ours:
                ours.basin(name).stream("s").append([AppendRecord(b"three")])
                got = ours.basin(name).stream("s").read(seq_num=0, count=10)
                assert [r["body"] for r in got.batch.to_pylist()] == [b"one", b"two", b"three"]
            batch = await stream.read(start=SeqNum(0))
            assert [(r.body, r.headers) for r in batch.records] == [
                (b"one", [(b"h", b"v")]), (b"two", []), (b"three", [])]
            bodies = []
            async for b in stream.read_session(start=SeqNum(0)):
                bodies += [r.body for r in b.records]
                if len(bodies) >= 3:
                    break
            assert bodies == [b"one", b"two", b"three"]

            with pytest.raises(S2ServerError) as wrong:
                await basin.stream("s", encryption_key=WRONG).read(start=SeqNum(0))
            assert (wrong.value.status_code, wrong.value.code) == (400, "decryption_failed")
            with pytest.raises(S2ServerError) as none:
                await basin.stream("s").append(AppendInput(records=[Record(body=b"x")]))
            assert (none.value.status_code, none.value.code) == (400, "bad_header")
            assert KEY not in str(wrong.value) and KEY not in str(none.value)

    asyncio.run(asyncio.wait_for(body(), 60))
