"""The C decoders, where this install has them, and which path the wire codecs take.

`_fastwire` (S2 ReadBatch decoding, AppendInput encoding) and `_fastjson` (Durable Streams
JSON-mode bodies) are in every wheel; an install from source without a compiler has
neither, and the codecs then take their pure-Python paths (numpy for JSON bodies): the
same results, many times slower (figures in docs/getting-started.md). Which path runs is
logged once, at debug level, on the `s2_spark.wire` logger, and kept in `ACCELERATED`.
"""

from __future__ import annotations

import importlib
import logging
from types import ModuleType

__all__ = ["ACCELERATED", "fastjson", "fastwire"]

log = logging.getLogger("s2_spark.wire")


def _load(name: str, missing: list[str]) -> ModuleType | None:
    try:
        return importlib.import_module(f"s2_spark.wire.{name}")
    except ImportError as exc:
        missing.append(f"{name}: {exc}")
        return None


_missing: list[str] = []
fastwire = _load("_fastwire", _missing)
fastjson = _load("_fastjson", _missing)

ACCELERATED: bool = not _missing
"""Whether the C decoders are in use (both of them); False: the pure-Python paths."""

if ACCELERATED:
    log.debug("wire codecs: the C decoders are in use (_fastwire, _fastjson)")
else:
    log.debug(
        "wire codecs: the C decoders are not in use (%s); the pure-Python paths decode "
        "the same data many times slower (install a wheel, or build from source with a "
        "C compiler)", "; ".join(_missing))
