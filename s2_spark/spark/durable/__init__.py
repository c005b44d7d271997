"""Format `durable-streams`: the data source (`source`), its writer and the writer's
options.

`DurableStreamsDataSource` is imported on first use (`s2_spark._lazy`)."""

from typing import TYPE_CHECKING

from s2_spark._lazy import lazy_exports

if TYPE_CHECKING:
    from s2_spark.spark.durable.source import DurableStreamsDataSource as DurableStreamsDataSource

__all__ = ["DurableStreamsDataSource"]

__getattr__, __dir__ = lazy_exports(__name__, {
    "DurableStreamsDataSource": "s2_spark.spark.durable.source",
})
