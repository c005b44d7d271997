"""A micro-batch's input partitions: stream ranges split and packed into them, and each
stream's share of a read limit. Pure functions over per-stream positions.

An offset is a JSON object mapping each stream to the backend's position for it (for S2,
the next seq_num to read). Everything here is deterministic in its inputs, so a batch
re-planned from the checkpoint's offset log reads the same ranges.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pyspark.sql.datasource import InputPartition

if TYPE_CHECKING:
    from s2_spark.backends.base import StreamBackend

__all__ = [
    "DEFAULT_MAX_STREAMS_PER_PARTITION",
    "DEFAULT_PACK_RECORDS",
    "RANGE_COST",
    "UNSIZED_SPREAD",
    "PackedPartition",
    "RangePartition",
    "fair_share",
    "pack_ranges",
    "split_ranges",
]

#: Records a packed partition holds at most when maxRecordsPerPartition is not set.
DEFAULT_PACK_RECORDS = 100_000
#: What one range costs beyond its records, in records: a request to the service and a
#: fixed amount of decoding set-up, whatever the range's size.
RANGE_COST = 100
#: Ranges (streams) one packed partition holds at most, by default.
DEFAULT_MAX_STREAMS_PER_PARTITION = 1000
#: Partitions that ranges of unknown size are spread over (see `pack_ranges`).
UNSIZED_SPREAD = 64


@dataclass(frozen=True)
class RangePartition(InputPartition):
    """Read positions [start, end) of one stream. Holds no credentials.

    `from_origin` marks a stream discovered after the previous batch: it is read from the
    backend's origin, and records trimmed before it was discovered are not data loss (a
    gap at the start of such a partition is skipped silently).
    """

    stream: str
    start: Any
    end: Any
    from_origin: bool = False

    def __repr__(self) -> str:
        return f"RangePartition({self.stream!r}, [{self.start}, {self.end}))"


@dataclass(frozen=True)
class PackedPartition(InputPartition):
    """Several small ranges read by one task, in this order (sorted by stream)."""

    ranges: tuple[RangePartition, ...]

    def __repr__(self) -> str:
        first, last = self.ranges[0], self.ranges[-1]
        return (f"PackedPartition({len(self.ranges)} ranges, {first.stream!r} .. "
                f"{last.stream!r})")


def fair_share(pending: Mapping[str, int], budget: int) -> dict[str, int]:
    """Split `budget` records across streams: equal shares, unused shares passed on.

    Streams with fewer pending records than their share take what they have and the rest
    goes to the others (water-filling). A remainder smaller than the number of streams
    goes one record each, streams in name order.
    """
    grant = {s: 0 for s in pending}
    active = sorted(s for s, n in pending.items() if n > 0)
    left = budget
    while left > 0 and active:
        share = left // len(active)
        if share == 0:
            for s in active[:left]:
                grant[s] += 1
            break
        still = []
        for s in active:
            take = min(share, pending[s] - grant[s])
            grant[s] += take
            left -= take
            if grant[s] < pending[s]:
                still.append(s)
        active = still
    return grant


def split_ranges(
    backend: StreamBackend[Any],
    ranges: Mapping[str, tuple[Any, Any, bool]],
    *,
    min_partitions: int | None,
    max_records_per_partition: int | None,
) -> list[RangePartition]:
    """Cut each stream's [start, end) into partitions.

    Each stream gets at least one partition; `maxRecordsPerPartition` caps a partition's
    size, and `minPartitions` spreads extra partitions across streams in proportion to
    their sizes (like Kafka's minPartitions).
    """
    distance = backend.distance
    sizes = {s: distance(a, b) for s, (a, b, _) in ranges.items()}
    total = sum(n for n in sizes.values() if n) if min_partitions else 0
    cap = max_records_per_partition or math.inf
    out: list[RangePartition] = []
    for stream in sorted(sizes):
        start, end, from_origin = ranges[stream]
        size = sizes[stream]
        if size is None:  # unsized (read to know): one partition, unless it is empty
            if backend.is_after(end, start):
                out.append(RangePartition(stream, start, end, from_origin))
            continue
        if size == 0:
            continue
        if size <= cap and not total:  # most streams, and every one without the options
            out.append(RangePartition(stream, start, end, from_origin))
            continue
        parts = 1
        if max_records_per_partition:
            parts = max(parts, math.ceil(size / max_records_per_partition))
        if min_partitions and total:
            parts = max(parts, math.ceil(min_partitions * size / total))
        parts = min(parts, size)
        pos = start
        for i in range(parts):
            # Spread the remainder over the first partitions: sizes differ by at most one.
            n = size // parts + (1 if i < size % parts else 0)
            nxt = end if i == parts - 1 else backend.advance(pos, n)
            out.append(RangePartition(stream, pos, nxt, from_origin))
            pos = nxt
    return out


def pack_ranges(
    backend: StreamBackend[Any],
    parts: list[RangePartition],
    *,
    min_partitions: int | None,
    max_records_per_partition: int | None,
    max_streams_per_partition: int,
) -> list[RangePartition | PackedPartition]:
    """Pack consecutive small ranges into shared partitions, in the order given.

    A range weighs its records plus `RANGE_COST`. A partition takes ranges while their
    weight stays within `DEFAULT_PACK_RECORDS` (`minPartitions` lowers it and the number of
    ranges per partition so there are at least that many partitions where there are that
    many ranges, and spreads the weight evenly), their records within
    `maxRecordsPerPartition`, and their number within `max_streams_per_partition`; a range
    that alone exceeds a bound stays alone. Only the ranges' sizes and the options decide,
    so a replayed micro-batch packs the same way on any cluster. A pack of one range is
    that range.

    A range whose size the service cannot tell without reading it (Durable Streams)
    weighs as if the unsized ranges were spread over `UNSIZED_SPREAD` partitions: each its
    own task while there are few, packed evenly when there are many.
    """
    known = [backend.distance(p.start, p.end) for p in parts]
    unsized = sum(1 for n in known if n is None)
    share = max(0, DEFAULT_PACK_RECORDS // max(1, math.ceil(unsized / UNSIZED_SPREAD))
                - RANGE_COST)
    sizes = [share if n is None else n for n in known]
    budget = DEFAULT_PACK_RECORDS
    if min_partitions:
        budget = min(budget, max(1, (sum(sizes) + RANGE_COST * len(sizes)) // min_partitions))
        max_streams_per_partition = min(max_streams_per_partition,
                                        max(1, len(parts) // min_partitions))
    record_cap = max_records_per_partition or budget
    out: list[RangePartition | PackedPartition] = []
    group: list[RangePartition] = []
    weight = records = 0
    for part, size in zip(parts, sizes, strict=True):
        if group and (weight + size + RANGE_COST > budget or records + size > record_cap
                      or len(group) >= max_streams_per_partition):
            out.append(group[0] if len(group) == 1 else PackedPartition(tuple(group)))
            group, weight, records = [], 0, 0
        group.append(part)
        weight += size + RANGE_COST
        records += size
    if group:
        out.append(group[0] if len(group) == 1 else PackedPartition(tuple(group)))
    return out
