"""Automatic registration of `format("durable-streams")`: Spark imports top-level
`pyspark_*` modules that define `DefaultSource` and registers it under its name."""

from s2_spark.spark.durable.source import DurableStreamsDataSource as DefaultSource

__all__ = ["DefaultSource"]
