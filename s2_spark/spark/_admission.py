"""Admission control and AvailableNow pacing for PySpark 4.2+.

Kept apart from `reader` because `pyspark.sql.streaming.datasource` does not exist before
4.2: importing it unconditionally would make the whole format fail to load there.
"""

from __future__ import annotations

from typing import Any

from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)

from s2_spark.spark.reader import RangeStreamReader

__all__ = ["AdmittedStreamReader"]


class AdmittedStreamReader(RangeStreamReader, SupportsTriggerAvailableNow):
    """`maxRecordsPerTrigger` through Spark's read limits; `trigger(availableNow=True)`
    stops at the tails seen when the query started, in paced micro-batches."""

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, Any]:  # type: ignore[override]
        max_records = limit.max_rows if isinstance(limit, ReadMaxRows) else None
        return self._plan(start, max_records=max_records)

    def getDefaultReadLimit(self) -> ReadLimit:
        n = self._options.max_records_per_trigger
        return ReadMaxRows(n) if n else ReadAllAvailable()
