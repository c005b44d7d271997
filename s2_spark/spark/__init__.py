"""Spark layer: the `s2` and `durable-streams` data sources (pyspark's Python Data Source
API).

Installing s2-spark registers both automatically through the top-level modules
``pyspark_s2`` and ``pyspark_durable_streams``; in a source checkout without an install,
``spark.dataSource.register(S2DataSource)`` (or ``DurableStreamsDataSource``).

The names below are imported on first use (`s2_spark._lazy`): an interpreter that
unpickles one format's objects imports that format's side only.
"""

from typing import TYPE_CHECKING

from s2_spark._lazy import lazy_exports
from s2_spark.errors import OptionError

if TYPE_CHECKING:
    from s2_spark.spark.durable.source import DurableStreamsDataSource as DurableStreamsDataSource
    from s2_spark.spark.s2.source import S2DataSource as S2DataSource
    from s2_spark.spark.s2.source import read_schema as read_schema

__all__ = ["DurableStreamsDataSource", "OptionError", "S2DataSource", "read_schema"]

__getattr__, __dir__ = lazy_exports(__name__, {
    "DurableStreamsDataSource": "s2_spark.spark.durable.source",
    "S2DataSource": "s2_spark.spark.s2.source",
    "read_schema": "s2_spark.spark.s2.source",
})
