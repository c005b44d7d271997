"""Offsets over many streams stay small: `s2_spark._offset_codec` round trips, the
threshold's edges, determinism, and damaged offsets refused. (A real query restarted from a
compact checkpoint: test_spark_many_streams.)"""

from __future__ import annotations

import json
import random

import pytest

from s2_spark._offset_codec import (
    COMPACT_ABOVE,
    OffsetCodec,
    decode_offset,
    encode_offset,
    is_compact,
)


def _s2(n: int, seed: int = 1) -> dict[str, int]:
    rng = random.Random(seed)
    return {f"u/{i:06d}": rng.randrange(10_000) for i in range(n)}


def _stored(offset: dict[str, object]) -> dict[str, object]:
    """The offset as Spark writes and reads it back: JSON text."""
    return json.loads(json.dumps(offset))


@pytest.mark.parametrize("n", [0, 1, COMPACT_ABOVE])
def test_up_to_the_threshold_an_offset_stays_plain(n: int) -> None:
    positions = _s2(n)
    offset = encode_offset(positions)
    assert offset == positions and list(offset) == list(positions)
    assert not is_compact(offset)
    assert decode_offset(_stored(offset)) == positions


@pytest.mark.parametrize("n", [COMPACT_ABOVE + 1, 5000])
def test_above_the_threshold_an_offset_is_compact_and_exact(n: int) -> None:
    positions = _s2(n)
    offset = encode_offset(positions)
    assert set(offset) == {"v", "streams", "zstd"}
    assert (offset["v"], offset["streams"]) == (2, n)
    assert is_compact(_stored(offset))
    assert decode_offset(_stored(offset)) == positions
    assert len(json.dumps(offset)) < len(json.dumps(positions)) / 3


def test_the_same_positions_give_the_same_string_in_any_order() -> None:
    """Spark compares offsets as strings: insertion order must not matter."""
    positions = _s2(3000)
    shuffled = list(positions.items())
    random.Random(7).shuffle(shuffled)
    a = json.dumps(encode_offset(positions))
    b = json.dumps(OffsetCodec().encode(dict(shuffled)))
    assert a == b
    codec = OffsetCodec()  # names encoded once, then from memory: the same string
    assert [json.dumps(codec.encode(dict(shuffled))) for _ in range(2)] == [a, a]


def test_durable_positions_and_awkward_names_round_trip() -> None:
    """Durable Streams positions (objects) and names that share prefixes, are prefixes of
    each other, end in zero bytes, or are not ASCII."""
    names = ["a", "a\x00", "a\x00\x00", "ab", "é", "é/日本", "/x/" + "y" * 600, ""]
    names += [f"/streams/s{i}" for i in range(COMPACT_ABOVE)]
    rng = random.Random(3)
    positions = {n: {"offset": f"{rng.randrange(10**6):016d}_{rng.randrange(99):016d}",
                     "skip": rng.randrange(3), **({"closed": True} if i % 7 == 0 else {})}
                 for i, n in enumerate(names)}
    positions["-1"] = {"offset": "-1", "skip": 0}
    offset = encode_offset(positions)
    assert is_compact(offset)
    assert decode_offset(_stored(offset)) == positions


def test_big_seq_nums_and_mixed_values_round_trip() -> None:
    positions: dict[str, object] = {f"s{i}": 2**64 - 1 - i for i in range(COMPACT_ABOVE + 1)}
    assert decode_offset(_stored(encode_offset(positions))) == positions
    positions["s0"] = 2**64  # beyond u64: kept exactly all the same
    assert decode_offset(_stored(encode_offset(positions))) == positions


def test_a_plain_offset_of_streams_named_like_the_keys_is_not_compact() -> None:
    plain = {"v": 2, "streams": 3, "zstd": 5}
    assert not is_compact(plain)
    assert decode_offset(plain) == plain


def test_a_damaged_compact_offset_is_refused() -> None:
    offset = _stored(encode_offset(_s2(COMPACT_ABOVE + 10)))
    with pytest.raises(ValueError, match="compact offset of 1010 streams is damaged"):
        decode_offset({**offset, "zstd": offset["zstd"][:-40]})
    with pytest.raises(ValueError, match="says 1011 streams but holds 1010"):
        decode_offset({**offset, "streams": 1011})


def test_one_hundred_thousand_streams_fit_in_256_kib() -> None:
    """The issue's target, for names like u/000123 and seq_nums up to 10,000 (a plain
    offset is about 1.8 MB)."""
    offset = json.dumps(encode_offset(_s2(100_000)))
    assert len(offset) <= 256 * 1024
