"""What the running PySpark offers: the Python Data Source API grew between 4.0 and 4.3.

Checked once, at import, by looking for the API itself rather than parsing version
numbers, so a backport in a vendor's Spark build is used where it exists. Everything the
connector needs from a newer Spark goes through here, and an option that needs what this
Spark lacks fails at `load()`, naming the option and the version it needs.
"""

from __future__ import annotations

from pyspark import __version__ as SPARK_VERSION

__all__ = [
    "HAS_ADMISSION_CONTROL",
    "HAS_FILTER_PUSHDOWN",
    "HAS_STREAM_ARROW_WRITER",
    "SPARK_VERSION",
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
