"""Spark layer: the `s2` and `durable-streams` data sources (pyspark's Python Data Source
API).

Installing s2-spark registers both automatically through the top-level modules
``pyspark_s2`` and ``pyspark_durable_streams``; in a source checkout without an install,
``spark.dataSource.register(S2DataSource)`` (or ``DurableStreamsDataSource``).
"""

from s2_spark.spark.durable.source import DurableStreamsDataSource
from s2_spark.spark.options import OptionError
from s2_spark.spark.s2.source import S2DataSource, read_schema

__all__ = ["DurableStreamsDataSource", "OptionError", "S2DataSource", "read_schema"]
