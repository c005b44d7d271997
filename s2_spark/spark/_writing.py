"""`WritingDataSource`: the writing half every format's data source shares, kept apart from
the writers (`spark.writer`) so that defining a data source imports no write path.

Spark's streaming source runner and read planners unpickle a data source to read: each is
a new interpreter that pays for every module the data source's module imports. So the
writers, the sink and the format's `WriteFormat` are imported when a write starts
(`writer()` / `streamWriter()`), and `write_format` is looked up where the format defines
it (`write_format_home`) on first use.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any, ClassVar

from pyspark.sql.datasource import DataSource, DataSourceStreamWriter, DataSourceWriter
from pyspark.sql.types import StructType

from s2_spark.spark._worker_heap import settled

if TYPE_CHECKING:
    from s2_spark.spark.writer import WriteFormat

__all__ = ["WritingDataSource"]


class _FormatAtHome:
    """`WritingDataSource.write_format`: the class's format, found at its
    `write_format_home` (module, attribute), which imports that module's write path."""

    def __get__(self, obj: object, owner: type[WritingDataSource]) -> WriteFormat[Any, Any]:
        module, attribute = owner.write_format_home
        found: WriteFormat[Any, Any] = getattr(importlib.import_module(module), attribute)
        return found


class WritingDataSource(DataSource):
    """The writing half every format shares (`RangeDataSource` is the reading half):
    the writer options checked against the format's declaration, then the writers of
    `spark.writer` over the format's `write_format`."""

    #: Where the format's `WriteFormat` is defined (module, attribute).
    write_format_home: ClassVar[tuple[str, str]]
    write_format: ClassVar[_FormatAtHome] = _FormatAtHome()

    @settled
    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        """`df.write`: exactly-once appends (with `mode("append")`)."""
        from s2_spark.spark.writer import batch_writer

        fmt = self.write_format
        fmt.options.check(self.options, "write")
        return batch_writer(fmt, self.options, schema, overwrite)

    @settled
    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        """`df.writeStream`: exactly-once across task retries and query restarts."""
        from s2_spark.spark.writer import stream_writer

        fmt = self.write_format
        fmt.options.check(self.options, "write")
        return stream_writer(fmt, self.options, schema, overwrite)
