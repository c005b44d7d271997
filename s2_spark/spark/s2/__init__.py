"""Format `s2`: the data source (`source`), its writer and the writer's options.

`S2DataSource` and `read_schema` are imported on first use (`s2_spark._lazy`)."""

from typing import TYPE_CHECKING

from s2_spark._lazy import lazy_exports

if TYPE_CHECKING:
    from s2_spark.spark.s2.source import S2DataSource as S2DataSource
    from s2_spark.spark.s2.source import read_schema as read_schema

__all__ = ["S2DataSource", "read_schema"]

__getattr__, __dir__ = lazy_exports(__name__, {
    "S2DataSource": "s2_spark.spark.s2.source",
    "read_schema": "s2_spark.spark.s2.source",
})
