"""Automatic registration: Spark imports top-level `pyspark_*` modules that define
`DefaultSource` and registers it under its name, so `format("s2")` works with no
`spark.dataSource.register` call once s2-spark is installed."""

from s2_spark.spark import S2DataSource as DefaultSource

__all__ = ["DefaultSource"]
