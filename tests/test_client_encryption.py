"""The S2 client on encrypted streams: the key checked up front and never shown, sent on
every append and read path, and the errors S2 answers about it, against the local server
(whose encryption follows s2-lite: tests/test_local_server_encryption.py)."""

from __future__ import annotations

import base64
import logging
import os
import pickle
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from _waiting import wait_for

from s2_spark.errors import EncryptionKeyError
from s2_spark.s2 import (
    AppendRecord,
    BasinClient,
    S2Client,
    S2Config,
    SingleAppend,
    SmallRead,
)
from s2_spark.s2._encode import encode_append_records
from s2_spark.s2._verify import landed_batches

KEY_BYTES = os.urandom(32)
KEY = base64.b64encode(KEY_BYTES).decode()
WRONG = base64.b64encode(os.urandom(32)).decode()
#: Every form the key could leak in.
LEAKS = (KEY, KEY_BYTES.hex(), KEY.rstrip("="))


def no_key_in(text: str) -> None:
    for leak in LEAKS:
        assert leak not in text


@pytest.fixture(params=["aegis-256", "aes-256-gcm"])
def encrypted(request: Any, s2_server: Any) -> Iterator[tuple[BasinClient, str]]:
    """A basin with a stream cipher, on a client that has the key; the stream `s`."""
    with S2Client(S2Config(endpoint=s2_server.url, encryption_key=KEY)) as client:
        name = f"enc-{uuid.uuid4().hex[:10]}"
        client.create_basin(name, {"stream_cipher": request.param})
        basin = client.basin(name)
        basin.create_stream("s")
        yield basin, request.param


# ---------------------------------------------------------------- the key in the config


@pytest.mark.parametrize(
    ("value", "said"),
    [
        ("", "an empty string"),
        ("not base64!", "a string of 11 characters that is not padded standard base64"),
        (KEY.rstrip("="), "a string of 43 characters that is not padded standard base64"),
        (KEY.replace("+", "-").replace("/", "_") if ("+" in KEY or "/" in KEY) else "-" * 44,
         "a string of 44 characters that is not padded standard base64"),
        (base64.b64encode(b"k" * 16).decode(), "the base64 of 16 bytes"),
        (KEY_BYTES, "a value of type bytes"),
    ],
    ids=["empty", "not-base64", "unpadded", "urlsafe", "16-bytes", "bytes"],  # keys are random
)
def test_a_malformed_key_fails_at_once_without_echo(value: Any, said: str) -> None:
    with pytest.raises(ValueError) as info:
        S2Config(endpoint="http://127.0.0.1:1", encryption_key=value)
    text = str(info.value)
    assert text.startswith("S2Config.encryption_key must be the base64 of exactly 32 bytes")
    assert text.endswith(f"got {said}")
    no_key_in(text)
    if isinstance(value, str) and len(value) > 4:
        assert value not in text


def test_the_key_is_hidden_and_travels_with_the_config(monkeypatch: pytest.MonkeyPatch
                                                       ) -> None:
    cfg = S2Config(endpoint="http://127.0.0.1:1", encryption_key=f" {KEY}\n")
    assert cfg.encryption_key == KEY  # surrounding whitespace dropped
    assert "encryption_key='***'" in repr(cfg)
    no_key_in(repr(cfg))
    with S2Client(cfg) as client:
        no_key_in(repr(client) + repr(client.basin("basin-abcdefgh").stream("s")))
    assert pickle.loads(pickle.dumps(cfg)).encryption_key == KEY  # executors get it
    assert "encryption_key=None" in repr(S2Config())
    monkeypatch.setenv("S2_ENCRYPTION_KEY", KEY)
    assert S2Config.from_env(endpoint="http://127.0.0.1:1").encryption_key == KEY
    assert S2Config.from_env(encryption_key=WRONG).encryption_key == WRONG


# ---------------------------------------------------------------- every path carries it


def test_every_append_and_read_path_sends_the_key(
    encrypted: tuple[BasinClient, str], caplog: pytest.LogCaptureFixture
) -> None:
    """Each path appends or reads records that only the key opens: a path that left the
    key out would fail with EncryptionKeyError (missing key)."""
    basin, _ = encrypted
    caplog.set_level(logging.DEBUG)
    s = basin.stream("s")
    s.append([AppendRecord(b"unary", headers=[(b"h", b"v")])])  # unary append
    s.append_many([AppendRecord(b"m%d" % i) for i in range(1500)])  # session of 2 batches
    chain = encode_append_records([AppendRecord(b"c0"), AppendRecord(b"c1")])
    res = s.append_chain([chain[0], chain[0]], fencing_tokens=[None, None])
    assert res.error is None and len(res.acks) == 2
    acks = basin.append_each([SingleAppend("s", chain[0])], in_flight=1)  # fan-out append
    assert not isinstance(acks[0], Exception)
    tail = 1 + 1500 + 2 * 2 + 2
    assert s.check_tail().seq_num == tail
    assert basin.check_tails(["s"])["s"].seq_num == tail  # type: ignore[union-attr]

    first = s.read(seq_num=0, count=2).batch.to_pylist()  # unary read
    assert [(r["body"], r["headers"]) for r in first] == [
        (b"unary", [{"name": b"h", "value": b"v"}]), (b"m0", [])]
    with s.read_session(seq_num=0, count=tail) as session:  # S2S read session
        bodies = [b for d in session for b in d.batch.column("body").to_pylist()]
    assert bodies[:2] == [b"unary", b"m0"] and bodies[-2:] == [b"c0", b"c1"]
    assert len(bodies) == tail
    (many,) = basin.read_many([SmallRead("s", 1501, 4)])  # fan-out read
    assert not isinstance(many, Exception)
    assert many.batch.column("body").to_pylist() == [b"c0", b"c1", b"c0", b"c1"]
    # The read-back that settles an ambiguous append (`landed_batches`).
    assert landed_batches(basin._transport, basin.name, "s", chain, tail - 2, tail) is not None

    # Long-polls: reads of one record. One without the key is refused at once (400), which
    # makes the stream not quiet with nothing appended; one with it waits.
    watch = basin.watch_tails(wait=5)
    try:
        watch.watch({"s": tail})
        wait_for(lambda: watch.quiet({"s": tail}) == {"s"}, "the watch to arm", timeout=20)
        watch.wait({"s"}, timeout=1)
        assert watch.quiet({"s": tail}) == {"s"}, "the watch's read was refused"
        s.append([AppendRecord(b"news")])
        # What the watch promises: news (not quiet), with the exact tail if it tells one
        # (it does not when the record reached S2 before the poll waited there).
        wait_for(lambda: not watch.quiet({"s": tail}), "news of the append", timeout=20)
        assert watch.news_tails(["s"]) in ({}, {"s": tail + 1})
    finally:
        watch.close()
    for record in caplog.records:
        no_key_in(record.getMessage())


# ---------------------------------------------------------------- what S2 says about the key


def test_a_wrong_key_fails_the_read_naming_the_stream(
    encrypted: tuple[BasinClient, str], s2_server: Any
) -> None:
    basin, _ = encrypted
    basin.stream("s").append([AppendRecord(b"secret")])
    with S2Client(S2Config(endpoint=s2_server.url, encryption_key=WRONG)) as other:
        s = other.basin(basin.name).stream("s")
        s.append([AppendRecord(b"appended with another key")])  # S2 takes it
        errors: list[BaseException] = []
        for read in (lambda: s.read(seq_num=0),
                     lambda: list(s.read_session(seq_num=0, count=2))):
            with pytest.raises(EncryptionKeyError) as info:
                read()
            errors.append(info.value)
        (failed,) = other.basin(basin.name).read_many([SmallRead("s", 0, 2)])
        assert isinstance(failed, EncryptionKeyError)
        errors.append(failed)
    for e in errors:
        assert isinstance(e, EncryptionKeyError)
        assert (e.status, e.code, e.retryable) == (400, "decryption_failed", False)
        text = str(e)
        assert f"records of stream 's' in basin '{basin.name}' could not be decrypted" in text
        assert "the key is wrong" in text
        no_key_in(text + repr(e))
        assert WRONG not in text
    # The right key reads the first record, and fails on the other one.
    assert basin.stream("s").read(seq_num=0, count=1).batch.column("body").to_pylist() == [
        b"secret"]
    with pytest.raises(EncryptionKeyError):
        basin.stream("s").read(seq_num=1, count=1)


def test_no_key_for_an_encrypted_stream(encrypted: tuple[BasinClient, str],
                                        s2_server: Any) -> None:
    basin, cipher = encrypted
    with S2Client(S2Config(endpoint=s2_server.url)) as keyless:
        s = keyless.basin(basin.name).stream("s")
        assert s.check_tail().seq_num == 0  # tails need no key
        for op in (lambda: s.append([AppendRecord(b"x")]), lambda: s.read(seq_num=0, wait=0)):
            with pytest.raises(EncryptionKeyError) as info:
                op()
            assert (info.value.status, info.value.code) == (400, "bad_header")
            assert str(info.value).startswith(
                f"stream 's' in basin '{basin.name}' is encrypted and S2 refused the request "
                f"for its key (bad_header): missing encryption key for stream cipher "
                f"'{cipher}'")
        assert [i.cipher for i in keyless.basin(basin.name).list_streams()] == [cipher]
