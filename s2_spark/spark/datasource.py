"""The reading half every format shares: a `DataSource` over a format's `StreamBackend`."""

from __future__ import annotations

import inspect
from typing import TYPE_CHECKING, Any, ClassVar

from pyspark.sql.datasource import DataSource, DataSourceReader, DataSourceStreamReader
from pyspark.sql.types import StructType

from s2_spark.spark._compat import HAS_ADMISSION_CONTROL
from s2_spark.spark._worker_heap import settled
from s2_spark.spark.options import (
    RECORDS,
    OptionError,
    ReadFormat,
    ReadOptions,
    TriggerUnits,
    parse_read_options,
)

if TYPE_CHECKING:  # the readers and the backends (pyarrow) are imported when a read starts
    from s2_spark.backends.base import StreamBackend
    from s2_spark.spark.stream_reader import RangeStreamReader

__all__ = ["RangeDataSource", "document_options", "stream_reader"]


class RangeDataSource(DataSource):
    """The reading half every format shares: options, schema check, batch and stream
    readers over the format's `StreamBackend`. Subclasses name the format, its option
    parsing (`read_format`), its backend and its rows."""

    read_format: ClassVar[ReadFormat]

    def _read_options(self, *, streaming: bool) -> ReadOptions:
        return parse_read_options(self.options, streaming=streaming, fmt=self.read_format,
                                  trigger_units=self._trigger_units)

    def _trigger_units(self, options: ReadOptions) -> TriggerUnits:
        """What the per-trigger sizes count: records, unless the streams count bytes."""
        return RECORDS

    def _backend(self, options: ReadOptions) -> StreamBackend[Any]:
        raise NotImplementedError

    def _read_schema(self, options: ReadOptions) -> StructType:
        raise NotImplementedError

    def schema(self) -> StructType:
        return self._read_schema(self._read_options(streaming=False))

    def _check_schema(self, schema: Any, options: ReadOptions) -> StructType:
        expected = self._read_schema(options)
        if schema is not None and schema != expected:
            raise OptionError(
                f"format {self.name()} has a fixed schema and does not accept a "
                f"user-specified one: expected {expected.simpleString()}, got "
                f"{schema.simpleString()}"
            )
        return expected

    @settled
    def reader(self, schema: StructType) -> DataSourceReader:
        options = self._read_options(streaming=False)
        self._check_schema(schema, options)
        from s2_spark.spark.batch_reader import RangeBatchReader

        return RangeBatchReader(self._backend(options), options)

    @settled
    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        options = self._read_options(streaming=True)
        self._check_schema(schema, options)
        return stream_reader(self._backend(options), options)


def document_options(source: type[RangeDataSource]) -> None:
    """End the class docstring with its format's options, from their declaration."""
    options = source.read_format.options
    source.__doc__ = (
        f"{inspect.cleandoc(source.__doc__ or '')}\n\nReading options:\n\n"
        f"{options.bullets('read')}\n\nWriting options:\n\n{options.bullets('write')}\n"
    )


def stream_reader(backend: StreamBackend[Any], options: ReadOptions) -> RangeStreamReader:
    """The richest stream reader this PySpark can drive (`_admission` imports only on
    4.2+)."""
    if HAS_ADMISSION_CONTROL:
        from s2_spark.spark._admission import AdmittedStreamReader

        return AdmittedStreamReader(backend, options)
    from s2_spark.spark.stream_reader import RangeStreamReader

    return RangeStreamReader(backend, options)
