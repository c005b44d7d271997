"""Format `s2`: the data source (`source`), its writer and the writer's options."""

from s2_spark.spark.s2.source import S2DataSource, read_schema

__all__ = ["S2DataSource", "read_schema"]
