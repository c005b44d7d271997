"""What the PySpark under test offers, for tests of features that need a newer one.

Tests of such features skip on an older Spark, where `test_spark_versions.py` checks that
the option needing them fails cleanly instead; `limit(...)` adds a per-trigger limit only
where it is honoured, for tests in which it merely makes micro-batches smaller.
"""

from __future__ import annotations

import ast
import json
from typing import Any

import pytest

from s2_spark.spark._compat import HAS_ADMISSION_CONTROL, SPARK_VERSION

needs_admission_control = pytest.mark.skipif(
    not HAS_ADMISSION_CONTROL,
    reason=f"maxRecordsPerTrigger needs PySpark 4.2+; this is {SPARK_VERSION}",
)


def limit(records: int) -> dict[str, str]:
    """`maxRecordsPerTrigger=records` where this Spark honours it, else no option."""
    return {"maxRecordsPerTrigger": str(records)} if HAS_ADMISSION_CONTROL else {}


def progress_offsets(value: Any) -> Any:
    """A source offset from a query's progress: JSON text, except on PySpark 4.0, which
    shows a Python source's offsets as the repr of a dict (the checkpoint has JSON)."""
    if not isinstance(value, str):
        return value
    try:
        return json.loads(value)
    except json.JSONDecodeError:
        return ast.literal_eval(value)


def plan_all_available(reader: Any, start: dict[str, Any]) -> dict[str, Any]:
    """A stream reader's next end from `start` with no limit, as this Spark asks for it
    (before 4.2 `latestOffset()` takes no arguments: the reader plans from its own state)."""
    if HAS_ADMISSION_CONTROL:
        from pyspark.sql.streaming.datasource import ReadAllAvailable

        return reader.latestOffset(start, ReadAllAvailable())  # type: ignore[no-any-return]
    return reader.latestOffset()  # type: ignore[no-any-return]
