"""Format `durable-streams`: the data source (`source`), its writer and the writer's
options."""

from s2_spark.spark.durable.source import DurableStreamsDataSource

__all__ = ["DurableStreamsDataSource"]
