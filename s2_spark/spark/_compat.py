"""What the running PySpark offers: the Python Data Source API grew between 4.0 and 4.3.

Checked once, at import, by looking for the API itself rather than parsing version
numbers, so a backport in a vendor's Spark build is used where it exists. Everything the
connector needs from a newer Spark goes through here, and an option that needs what this
Spark lacks fails at `load()`, naming the option and the version it needs.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from pyspark import __version__ as SPARK_VERSION

if TYPE_CHECKING:
    from pyspark.sql.datasource import Filter

__all__ = [
    "HAS_ADMISSION_CONTROL",
    "HAS_FILTER_PUSHDOWN",
    "HAS_STREAM_ARROW_WRITER",
    "SPARK_VERSION",
    "PushFiltersSlot",
]

try:  # 4.2+: latestOffset(start, limit), ReadLimit, SupportsTriggerAvailableNow
    import pyspark.sql.streaming.datasource  # noqa: F401

    HAS_ADMISSION_CONTROL = True
except ImportError:
    HAS_ADMISSION_CONTROL = False

try:  # 4.1+: writeStream hands Python writers Arrow batches
    from pyspark.sql.datasource import DataSourceStreamArrowWriter  # noqa: F401

    HAS_STREAM_ARROW_WRITER = True
except ImportError:
    HAS_STREAM_ARROW_WRITER = False

# 4.1+: DataSourceReader.pushFilters. Spark calls it only with the SQL conf
# spark.sql.python.filterPushdown.enabled=true (default false).
from pyspark.sql.datasource import DataSourceReader as _DataSourceReader

HAS_FILTER_PUSHDOWN = hasattr(_DataSourceReader, "pushFilters")


#: The base `pushFilters` (None before PySpark 4.1, where nothing calls it).
_BASE_PUSH_FILTERS: Any = getattr(_DataSourceReader, "pushFilters", None)


class _BoundPushFilters:
    """A reader's `pushFilters`, bound: calls the reader's `_push_filters`.

    PySpark 4.1+ fails every read of a reader whose `pushFilters.__func__` is not
    `DataSourceReader.pushFilters` while spark.sql.python.filterPushdown.enabled is false
    (its default), so that a source relying on pushdown does not silently lose it. Our
    pushdown only narrows the planned ranges, and without the conf Spark evaluates every
    filter itself, so reads must go on working as before: the bound method shows the base
    method as its `__func__`.
    """

    __func__ = staticmethod(_BASE_PUSH_FILTERS)

    def __init__(self, reader: Any) -> None:
        self.__self__ = reader

    def __call__(self, filters: list[Filter]) -> Iterable[Filter]:
        result: Iterable[Filter] = self.__self__._push_filters(filters)
        return result


class PushFiltersSlot:
    """`pushFilters = PushFiltersSlot()` on a reader class that defines `_push_filters`:
    pushdown where Spark asks for it, and reads as before where it does not."""

    def __get__(self, reader: Any, owner: Any = None) -> Any:
        return self if reader is None else _BoundPushFilters(reader)
