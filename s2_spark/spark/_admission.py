"""Admission control and AvailableNow pacing for PySpark 4.2+.

Kept apart from `stream_reader` because `pyspark.sql.streaming.datasource` does not exist before
4.2: importing it unconditionally would make the whole format fail to load there.
"""

from __future__ import annotations

from typing import Any

from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    ReadMinRows,
    SupportsTriggerAvailableNow,
)

from s2_spark.spark.stream_reader import RangeStreamReader

__all__ = ["AdmittedStreamReader"]


class AdmittedStreamReader(RangeStreamReader, SupportsTriggerAvailableNow):
    """`maxRecordsPerTrigger` through Spark's read limits, `minRecordsPerTrigger` with
    `maxTriggerDelay` through `TriggerHold`; `trigger(availableNow=True)` stops at the
    tails seen when the query started, in micro-batches paced by the maximum only.

    Spark hands `latestOffset` back the limit `getDefaultReadLimit` gave (one of them: a
    Python source has no composite limit) or `ReadAllAvailable` where the trigger reads
    everything at once; the minimum and the delay come from the options."""

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, Any]:  # type: ignore[override]
        max_units = limit.max_rows if isinstance(limit, ReadMaxRows) else None
        everything = isinstance(limit, ReadAllAvailable) or self._available_now
        end = self._plan(self._codec.decode(start), max_units=max_units,
                         hold=None if everything else self._hold)
        return self._codec.encode(end)

    def getDefaultReadLimit(self) -> ReadLimit:
        options = self._options
        if options.max_units_per_trigger:
            return ReadMaxRows(options.max_units_per_trigger)
        if options.min_units_per_trigger:
            return ReadMinRows(options.min_units_per_trigger)
        return ReadAllAvailable()
