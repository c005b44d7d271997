"""The `durable-streams` data source: reads with exact replay, exactly-once writes."""

from __future__ import annotations

from typing import Any

from pyspark.sql.datasource import DataSourceStreamWriter, DataSourceWriter
from pyspark.sql.types import StructType

from s2_spark.backends.base import StreamBackend
from s2_spark.spark.options import ReadOptions
from s2_spark.spark.source import RangeDataSource

__all__ = ["DurableStreamsDataSource"]


class DurableStreamsDataSource(RangeDataSource):
    """Read and write Durable Streams with Spark, exactly-once (format ``durable-streams``).

    (Reader documentation: filled in with the reader.)
    """

    @classmethod
    def name(cls) -> str:
        return "durable-streams"

    def _backend(self, options: ReadOptions) -> StreamBackend[Any]:
        raise NotImplementedError("the durable-streams reader is being built")

    def _read_schema(self, options: ReadOptions) -> StructType:
        raise NotImplementedError("the durable-streams reader is being built")

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        """`df.write.format("durable-streams")`: idempotent-producer appends."""
        from s2_spark.spark._durable_writer import batch_writer

        return batch_writer(self.options, schema, overwrite)

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        """`df.writeStream.format("durable-streams")`: exactly-once across retries and
        restarts (see s2_spark.spark._durable_writer)."""
        from s2_spark.spark._durable_writer import stream_writer

        return stream_writer(self.options, schema, overwrite)
