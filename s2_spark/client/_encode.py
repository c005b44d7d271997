"""AppendRecords -> AppendBatches through Arrow columns and the C encoder.

Building three Arrow columns from Python objects and encoding them in C is several times
faster than encoding record by record in Python (`encode_records`), which stays the
fallback for values Arrow's int64 cannot hold (timestamps of 2**63 ms and above).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import pyarrow as pa

from ._types import AppendRecord

if TYPE_CHECKING:
    from s2_spark.wire.appends import AppendBatch

__all__ = ["encode_append_records"]

_HEADER = pa.list_(pa.struct([("name", pa.binary()), ("value", pa.binary())]))
_INT64_MAX = (1 << 63) - 1


def encode_append_records(records: Sequence[AppendRecord]) -> list[AppendBatch]:
    """Encode records, in order, into batches of <= 1000 records and <= 1 MiB metered."""
    from s2_spark.wire.appends import encode_append_batches, encode_records

    if not records:
        return []
    try:
        bodies = pa.array([r.body for r in records], pa.binary())
    except AttributeError:
        bad = next(r for r in records if not isinstance(r, AppendRecord))
        raise TypeError(
            f"expected AppendRecord items, got {type(bad).__name__}; build records with "
            "AppendRecord(body, headers, timestamp)"
        ) from None
    headers = None
    if any(r.headers for r in records):
        headers = pa.array(
            [[{"name": n, "value": v} for n, v in r.headers] for r in records], _HEADER
        )
    timestamps = None
    stamps = [r.timestamp for r in records]
    if stamps.count(None) != len(stamps):
        if any(t is not None and t > _INT64_MAX for t in stamps):
            return encode_records(records)
        timestamps = pa.array(stamps, pa.int64())
    return encode_append_batches(bodies, headers, timestamps)
