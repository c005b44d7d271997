"""The batch reader: one range per stream, [startingPosition, endingPosition), cut into
partitions; on PySpark 4.1+ pushed filters narrow the ranges."""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator, Sequence
from typing import TYPE_CHECKING

import pyarrow as pa
from pyspark.sql.datasource import DataSourceReader, InputPartition

from s2_spark.spark._compat import PushFiltersSlot
from s2_spark.spark._planner import Backend, Planner, Position, plan_partitions
from s2_spark.spark._read_task import read_partition
from s2_spark.spark._worker_heap import settled
from s2_spark.spark.options import BoundSpec, OptionError, ReadOptions
from s2_spark.spark.partitions import RangePartition

if TYPE_CHECKING:
    from pyspark.sql.datasource import Filter

    from s2_spark.spark._pushdown import Narrowing

__all__ = ["RangeBatchReader"]

log = logging.getLogger("s2_spark.spark")


class RangeBatchReader(DataSourceReader):
    """One range per stream, [startingPosition, endingPosition), cut into partitions.

    On PySpark 4.1+ with spark.sql.python.filterPushdown.enabled=true, filters on `stream`,
    `seq_num` and `timestamp` narrow the ranges (see s2_spark.spark._pushdown) when the
    backend supports it; other backends push nothing.
    """

    def __init__(self, backend: Backend, options: ReadOptions) -> None:
        self._backend = backend
        self._options = options
        self._narrowing: Narrowing | None = None

    def __repr__(self) -> str:
        pushed = "" if not self._narrowing else f", pushed={self._narrowing.describe()!r}"
        return f"RangeBatchReader({self._options!r}{pushed})"

    pushFilters = PushFiltersSlot()

    def _push_filters(self, filters: list[Filter]) -> Iterable[Filter]:
        """Keep what filters on stream, seq_num and timestamp allow; return the filters
        Spark must still evaluate (those not fully expressed by the narrowed ranges)."""
        if not self._backend.supports_filter_pushdown:
            return filters
        from s2_spark.spark._pushdown import translate

        narrowing, keep = translate(filters)
        self._narrowing = narrowing if narrowing else None
        if narrowing:
            log.info("Batch read narrowed by pushed filters: %s", narrowing.describe())
        return keep

    @settled
    def partitions(self) -> Sequence[InputPartition]:
        backend, options = self._backend, self._options
        planner = Planner(backend, options)
        ending = options.ending or BoundSpec("latest")
        narrowing = self._narrowing

        def bounds(stream: str) -> tuple[Position, Position, Position, Position, Position]:
            start = planner.resolve(options.starting, stream, default="earliest")
            tail = planner.tail(stream)
            end = planner.resolve(ending, stream, default="latest", tail=tail)
            lo, hi = start, end
            if narrowing is not None and not backend.is_after(start, end):
                lo, hi = planner.narrow(stream, start, end, narrowing)
            return tail, start, end, lo, hi

        streams = planner.discover()
        if narrowing is not None and narrowing.streams is not None:
            streams = [s for s in streams if s in narrowing.streams]
        ranges: dict[str, tuple[Position, Position, bool]] = {}
        for stream, (tail, start, end, lo, hi) in planner.each(bounds, streams).items():
            if backend.is_after(end, tail):
                raise OptionError(
                    f"option endingPosition puts {backend.describe(stream)} at {end}, past "
                    f"its tail {tail}: those records do not exist yet"
                )
            if backend.is_after(start, end):
                raise OptionError(
                    f"option startingPosition puts {backend.describe(stream)} at {start}, "
                    f"after its end {end} (endingPosition "
                    f"{ending.describe()}, exclusive)"
                )
            ranges[stream] = (lo, hi, False)
        parts = plan_partitions(backend, options, ranges)
        # Spark wants at least one partition; an empty range reads nothing.
        return parts or [RangePartition("", backend.origin(), backend.origin())]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return read_partition(self._backend, self._options, partition)
