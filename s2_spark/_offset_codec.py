"""Streaming offsets over many streams, kept small: `{stream: position}` as compact JSON.

An offset names every stream a query reads. Up to `COMPACT_ABOVE` streams it is the plain
JSON object `{stream: position}`, readable in the Spark UI and in a checkpoint's
`offsets/N` file. Above that, Spark's per-batch cost and the offset log grow with every
key (a plain offset over 100,000 streams is 1.5-2 MB, and Spark keeps 100 of them), so
it is written as

    {"v": 2, "streams": <count>, "zstd": "<base64 of zstd of the canonical encoding>"}

The canonical encoding has the streams in name order (UTF-8 bytes), each name written as
the length of the prefix it shares with the one before and the rest; lengths and integer
positions (S2 seq_nums) as columns of little-endian byte planes (all low bytes, then the
next...), which zstd compresses far better than text; other positions (Durable Streams'
`{"offset", "skip"}`) as one JSON array. So the same positions always give the same
string (Spark compares offsets as strings), and decoding gives back exactly the
positions encoded.

Nothing here imports pyspark: `s2_spark.lag` decodes offsets from a progress too. A plain
offset cannot be mistaken for a compact one: no stream's position is a string.
"""

from __future__ import annotations

import base64
import json
import struct
from collections.abc import Mapping
from typing import Any

# numpy and zstandard are imported where a compact offset is made or read: a query over
# up to COMPACT_ABOVE streams (and every interpreter that unpickles its reader) never
# needs them.

__all__ = ["COMPACT_ABOVE", "COMPACT_VERSION", "OffsetCodec", "decode_offset",
           "encode_offset", "is_compact"]

#: Offsets over more streams than this are compact; up to it they stay plain JSON.
COMPACT_ABOVE = 1000
#: The `v` of a compact offset.
COMPACT_VERSION = 2
#: zstd level: the canonical encoding is mostly byte planes, where higher levels gain
#: little (a few %) for many times the time, and the encoding runs at every plan.
_LEVEL = 3
_INTS, _JSON = 0, 1
_KEYS = frozenset({"v", "streams", "zstd"})


def is_compact(offset: Mapping[str, Any]) -> bool:
    """Whether `offset` is a compact offset (a plain one maps streams to positions, none
    of which is a string)."""
    return (len(offset) == len(_KEYS) and offset.keys() == _KEYS
            and offset["v"] == COMPACT_VERSION and isinstance(offset["zstd"], str))


def encode_offset(positions: Mapping[str, Any]) -> dict[str, Any]:
    """`positions` as the offset Spark stores: plain up to `COMPACT_ABOVE` streams,
    compact above."""
    return OffsetCodec().encode(positions)


def decode_offset(offset: Mapping[str, Any]) -> dict[str, Any]:
    """`{stream: position}` from an offset in either form. ValueError when a compact
    offset is damaged."""
    return OffsetCodec().decode(offset)


class OffsetCodec:
    """`encode_offset` and `decode_offset` for a reader that plans again and again over
    mostly the same streams: the names of the last `_KEPT` sets of streams are encoded
    once, and the last `_KEPT` offsets encoded or decoded are decoded from memory (Spark
    hands back the end of one plan as the start of the next; a plan also reports the
    tails it saw)."""

    _KEPT = 2

    def __init__(self) -> None:
        self._names: list[tuple[set[str], list[str], bytes]] = []  # set, sorted, column
        self._offsets: list[tuple[str, dict[str, Any]]] = []  # (zstd text, positions)

    def encode(self, positions: Mapping[str, Any]) -> dict[str, Any]:
        if len(positions) <= COMPACT_ABOVE:
            return dict(positions)
        for text, kept in self._offsets:  # an idle plan's end is its start: no new text
            if kept == positions:
                return {"v": COMPACT_VERSION, "streams": len(kept), "zstd": text}
        names = next((n for n in self._names if positions.keys() == n[0]), None)
        if names is None:
            ordered = sorted(positions)
            names = (set(ordered), ordered, _name_column(ordered))
            self._names = [names, *self._names][:self._KEPT]
        values = list(map(positions.__getitem__, names[1]))
        import zstandard

        raw = zstandard.ZstdCompressor(level=_LEVEL).compress(names[2] + _value_column(values))
        text = base64.b64encode(raw).decode("ascii")
        self._keep(text, dict(positions))
        return {"v": COMPACT_VERSION, "streams": len(values), "zstd": text}

    def decode(self, offset: Mapping[str, Any]) -> dict[str, Any]:
        if not is_compact(offset):
            return dict(offset)
        text = offset["zstd"]
        kept = next((p for t, p in self._offsets if t == text), None)
        if kept is not None:
            return dict(kept)
        import zstandard

        try:
            positions = _parse(zstandard.ZstdDecompressor().decompress(base64.b64decode(text)))
        except (ValueError, struct.error, zstandard.ZstdError, UnicodeDecodeError) as exc:
            raise ValueError(f"a compact offset of {offset.get('streams')} streams is "
                             f"damaged: {exc}") from None
        if len(positions) != offset["streams"]:
            raise ValueError(f"a compact offset says {offset['streams']} streams but holds "
                             f"{len(positions)}")
        self._keep(text, positions)
        return dict(positions)

    def _keep(self, text: str, positions: dict[str, Any]) -> None:
        self._offsets = [(text, positions), *(o for o in self._offsets if o[0] != text)]
        del self._offsets[self._KEPT:]


def _name_column(ordered: list[str]) -> bytes:
    """The count, then each name (in code point order, which is UTF-8 byte order) as the
    length it shares with the one before and the rest of its bytes."""
    import numpy as np

    keys = [name.encode() for name in ordered]
    lengths = np.fromiter(map(len, keys), np.int64, len(keys))
    shared = np.zeros(len(keys), np.int64)
    if len(keys) > 1:
        width = int(lengths.max())
        # Zero-padded to one width; a name ending in zero bytes can then seem to share
        # more than its length, so each count is capped at the shorter name's length.
        grid = np.frombuffer(b"".join(k.ljust(width, b"\0") for k in keys), np.uint8)
        grid = grid.reshape(len(keys), width)
        same = grid[1:] == grid[:-1]
        first_diff = np.where(same.all(axis=1), width, same.argmin(axis=1))
        shared[1:] = np.minimum(first_diff, np.minimum(lengths[1:], lengths[:-1]))
    rests = b"".join(k[n:] for k, n in zip(keys, shared.tolist(), strict=True))
    return (struct.pack("<I", len(keys)) + _column(shared.tolist())
            + _column((lengths - shared).tolist()) + rests)


def _value_column(values: list[Any]) -> bytes:
    """Positions: a byte planes column when all are integers in [0, 2**64), else JSON."""
    if all(type(v) is int and 0 <= v < 2**64 for v in values):
        return bytes([_INTS]) + _column(values)
    return bytes([_JSON]) + json.dumps(values, separators=(",", ":"), sort_keys=True).encode()


def _column(values: list[int]) -> bytes:
    """Integers in [0, 2**64) as a width byte and that many byte planes."""
    import numpy as np

    width = max(1, (max(values, default=0).bit_length() + 7) // 8)
    planes = np.array(values, dtype="<u8").view(np.uint8).reshape(-1, 8)[:, :width]
    return bytes([width]) + planes.T.tobytes()


def _read_column(raw: bytes, at: int, count: int) -> tuple[list[int], int]:
    import numpy as np

    width = raw[at]
    end = at + 1 + width * count
    if not 1 <= width <= 8 or end > len(raw):
        raise ValueError("truncated")
    planes = np.frombuffer(raw, np.uint8, width * count, at + 1).reshape(width, count)
    full = np.zeros((count, 8), np.uint8)
    full[:, :width] = planes.T
    return full.view("<u8").reshape(count).tolist(), end


def _parse(raw: bytes) -> dict[str, Any]:
    (count,) = struct.unpack_from("<I", raw, 0)
    shared, at = _read_column(raw, 4, count)
    lengths, at = _read_column(raw, at, count)
    names: list[str] = []
    prev = b""
    for n, length in zip(shared, lengths, strict=True):
        key = prev[:n] + raw[at:at + length]
        at += length
        names.append(key.decode())
        prev = key
    kind = raw[at]
    if kind == _INTS:
        values: list[Any]
        values, at = _read_column(raw, at + 1, count)
        if at != len(raw):
            raise ValueError("trailing bytes")
    elif kind == _JSON:
        values = json.loads(raw[at + 1:])
        if not isinstance(values, list) or len(values) != count:
            raise ValueError("positions do not match the streams")
    else:
        raise ValueError(f"unknown positions kind {kind}")
    return dict(zip(names, values, strict=True))
