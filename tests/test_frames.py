"""S2S frame codec: exact bytes, limits, compression, and fuzzing for one typed error."""

from __future__ import annotations

import contextlib
import gzip
import itertools
import zlib

import pytest
import zstandard
from hypothesis import given, settings
from hypothesis import strategies as st

from s2_spark.errors import FrameError
from s2_spark.wire.frames import (
    COMPRESSION_THRESHOLD,
    MAX_FRAME_LENGTH,
    MAX_PAYLOAD_BYTES,
    Compression,
    FrameDecoder,
    Message,
    Terminal,
    encode_message,
    encode_terminal,
    message_parts,
)


def decode_all(data: bytes) -> list[Message | Terminal]:
    decoder = FrameDecoder()
    frames = decoder.feed(data)
    decoder.finish()
    return frames


def test_regular_frame_bytes() -> None:
    assert encode_message(b"abc") == b"\x00\x00\x04\x00abc"


def test_terminal_frame_bytes() -> None:
    frame = encode_terminal(416, {"tail": {"seq_num": 7, "timestamp": 9}})
    body = b'{"tail":{"seq_num":7,"timestamp":9}}'
    assert frame == (len(body) + 3).to_bytes(3, "big") + b"\x80\x01\xa0" + body
    [terminal] = decode_all(frame)
    assert terminal == Terminal(416, body.decode())
    assert isinstance(terminal, Terminal)
    assert terminal.error() == {"tail": {"seq_num": 7, "timestamp": 9}}


def test_terminal_error_that_is_not_a_json_object() -> None:
    assert Terminal(500, "boom").error() == {"message": "boom"}
    assert Terminal(500, "[1]").error() == {"message": [1]}
    assert Terminal(500, "").error() == {}


@pytest.mark.parametrize("compression", [Compression.ZSTD, Compression.GZIP])
def test_small_payloads_are_never_compressed(compression: Compression) -> None:
    body = b"x" * (COMPRESSION_THRESHOLD - 1)
    frame = encode_message(body, compression)
    assert frame[3] == 0x00
    assert frame[4:] == body


@pytest.mark.parametrize(
    ("compression", "flag"), [(Compression.ZSTD, 0x20), (Compression.GZIP, 0x40)]
)
def test_payloads_from_threshold_are_compressed(compression: Compression, flag: int) -> None:
    body = b"y" * COMPRESSION_THRESHOLD
    frame = encode_message(body, compression)
    assert frame[3] == flag
    assert len(frame) < len(body)
    assert decode_all(frame) == [Message(body)]


def test_decodes_payloads_compressed_by_other_encoders() -> None:
    body = bytes(range(256)) * 40
    no_size = zstandard.ZstdCompressor(write_content_size=False).compress(body)
    frames = [
        (len(no_size) + 1).to_bytes(3, "big") + b"\x20" + no_size,
        (len(g := gzip.compress(body)) + 1).to_bytes(3, "big") + b"\x40" + g,
    ]
    assert decode_all(b"".join(frames)) == [Message(body), Message(body)]


def test_reconnect_advised_bit_round_trips_and_reserved_bits_are_ignored() -> None:
    frame = encode_message(b"hi", reconnect_advised=True)
    assert frame[3] == 0x10
    assert decode_all(frame) == [Message(b"hi", reconnect_advised=True)]
    reserved = b"\x00\x00\x03\x0fhi"
    assert decode_all(reserved) == [Message(b"hi")]


def test_incremental_decoding_one_byte_at_a_time() -> None:
    bodies = [b"", b"a", b"b" * 5000, b"c" * 70000]
    data = b"".join(encode_message(b, Compression.ZSTD) for b in bodies)
    data += encode_terminal(200, "{}")
    decoder = FrameDecoder()
    frames: list[Message | Terminal] = []
    for i in range(len(data)):
        frames.extend(decoder.feed(data[i : i + 1]))
    decoder.finish()
    assert frames == [*(Message(b) for b in bodies), Terminal(200, "{}")]
    assert decoder.buffered == 0


def test_frame_length_limit() -> None:
    at_limit = MAX_FRAME_LENGTH.to_bytes(3, "big") + b"\x00"
    assert FrameDecoder().feed(at_limit) == []  # waits for the rest: legal
    over = (MAX_FRAME_LENGTH + 1).to_bytes(3, "big") + b"\x00"
    with pytest.raises(FrameError, match="exceeds the 2097152-byte limit"):
        FrameDecoder().feed(over)


def test_largest_payload_round_trips_and_one_more_byte_is_refused() -> None:
    body = b"z" * MAX_PAYLOAD_BYTES
    assert decode_all(encode_message(body)) == [Message(body)]
    with pytest.raises(FrameError, match="exceeds the 2097151-byte limit"):
        encode_message(body + b"z")


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"\x00\x00\x00", "length 0"),
        (b"\x00\x00\x02\x60x", "compression code 3"),
        (b"\x00\x00\x02\x80\x01", "missing its 2-byte status"),
        (b"\x00\x00\x04\x80\x01\x90\xff", "not valid UTF-8"),
        (b"\x00\x00\x04\x20abc", "zstd payload is corrupt"),
        (b"\x00\x00\x04\x40abc", "gzip payload is corrupt"),
        (encode_terminal(500, "{}") + b"\x00", "after the terminal frame"),
    ],
)
def test_malformed_frames(data: bytes, message: str) -> None:
    with pytest.raises(FrameError, match=message):
        decode_all(data)


def test_truncated_input_is_reported_at_finish() -> None:
    decoder = FrameDecoder()
    assert decoder.feed(encode_message(b"hello")[:-1]) == []
    with pytest.raises(FrameError, match="ended inside a frame"):
        decoder.finish()


def test_truncated_gzip_payload() -> None:
    payload = gzip.compress(b"q" * 4000)[:-4]
    with pytest.raises(FrameError, match="gzip payload is truncated"):
        decode_all((len(payload) + 1).to_bytes(3, "big") + b"\x40" + payload)


@pytest.mark.parametrize("compression", [Compression.ZSTD, Compression.GZIP])
def test_decompression_bombs_are_refused(compression: Compression) -> None:
    huge = b"\x00" * (MAX_PAYLOAD_BYTES + 1)
    if compression is Compression.ZSTD:
        payload = zstandard.ZstdCompressor(write_content_size=False).compress(huge)
    else:
        payload = zlib.compress(huge, wbits=31)
    frame = (len(payload) + 1).to_bytes(3, "big") + bytes((compression << 5,)) + payload
    with pytest.raises(FrameError):
        decode_all(frame)


def test_negotiation_prefers_zstd_then_gzip() -> None:
    assert Compression.negotiate("gzip, zstd") is Compression.ZSTD
    assert Compression.negotiate("gzip;q=0.5, br") is Compression.GZIP
    # As s2-lite (api/src/v1/stream/s2s.rs, from_accept_encoding): q-values are ignored.
    assert Compression.negotiate("zstd;q=0, gzip") is Compression.ZSTD
    assert Compression.negotiate("GZIP;q=0") is Compression.GZIP
    assert Compression.negotiate("br") is Compression.NONE
    assert Compression.negotiate(None) is Compression.NONE
    assert Compression.ZSTD.token == "zstd"
    assert Compression.NONE.token is None


@settings(max_examples=300, deadline=None)
@given(
    bodies=st.lists(st.binary(max_size=3000), max_size=6),
    compression=st.sampled_from(list(Compression)),
    cuts=st.lists(st.integers(min_value=0, max_value=20000), max_size=8),
)
def test_round_trip_with_arbitrary_chunking(
    bodies: list[bytes], compression: Compression, cuts: list[int]
) -> None:
    data = b"".join(encode_message(b, compression) for b in bodies)
    points = sorted({0, len(data), *(c for c in cuts if c < len(data))})
    decoder = FrameDecoder()
    frames: list[Message | Terminal] = []
    for a, b in itertools.pairwise(points):
        frames.extend(decoder.feed(data[a:b]))
    decoder.finish()
    assert frames == [Message(b) for b in bodies]


@settings(max_examples=2000, deadline=None)
@given(data=st.binary(max_size=600))
def test_fuzz_arbitrary_bytes_raise_only_frame_error(data: bytes) -> None:
    with contextlib.suppress(FrameError):
        decode_all(data)


@settings(max_examples=1000, deadline=None)
@given(
    flag=st.integers(min_value=0, max_value=255),
    payload=st.binary(max_size=400),
    prefix=st.sampled_from([b"", zstandard.ZstdCompressor().compress(b"p" * 2000)[:8]]),
)
def test_fuzz_any_flag_and_payload_raise_only_frame_error(
    flag: int, payload: bytes, prefix: bytes
) -> None:
    body = prefix + payload
    with contextlib.suppress(FrameError):
        decode_all((len(body) + 1).to_bytes(3, "big") + bytes((flag,)) + body)


@settings(max_examples=200, deadline=None)
@given(parts=st.lists(st.binary(max_size=700), max_size=4),
       compression=st.sampled_from(list(Compression)))
def test_message_parts_join_to_the_message_encode_message_frames(
        parts: list[bytes], compression: Compression) -> None:
    """A session's frames built from parts (uncompressed: the frame's head, then the parts
    themselves, uncopied) are byte for byte the frames of the joined payload."""
    views: list[bytes | memoryview] = [memoryview(p) for p in parts]
    framed = message_parts(views, compression)
    assert b"".join(framed) == encode_message(b"".join(parts), compression)
    if compression is Compression.NONE or sum(map(len, parts)) < COMPRESSION_THRESHOLD:
        assert all(a is b for a, b in zip(framed[1:], views, strict=True))


def test_message_parts_refuse_a_payload_over_the_frame_limit() -> None:
    with pytest.raises(FrameError, match="exceeds the"):
        message_parts([b"x" * MAX_PAYLOAD_BYTES, b"y"])
