"""The `s2` data source: S2 records as rows, exactly-once writes."""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any

from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from s2_spark._options import OptionSet
from s2_spark.backends.s2.options import (
    S2_CONNECTION_OPTIONS,
    S2_SELECTION_OPTIONS,
    parse_s2_connection,
    parse_s2_selection,
    seq_num_position,
)
from s2_spark.spark._writing import WritingDataSource
from s2_spark.spark.datasource import RangeDataSource, document_options
from s2_spark.spark.options import (
    BYTE_TRIGGER_OPTIONS,
    READ_OPTIONS,
    ReadFormat,
    ReadOptions,
)
from s2_spark.spark.s2._writer_options import S2_WRITE_OPTIONS

if TYPE_CHECKING:  # the backend (the client, pyarrow) is imported when a read starts
    from s2_spark.backends.base import StreamBackend
    from s2_spark.backends.s2.settings import InputLayout
    from s2_spark.spark.s2._writer_options import WriteOptions
    from s2_spark.spark.writer import WriteFormat

    #: Made on first use (`__getattr__`): the writers, the sink and its plan are
    #: imported by a write, not by a reading interpreter that unpickles the data source.
    S2_WRITE_FORMAT: WriteFormat[WriteOptions, InputLayout]

__all__ = ["S2_OPTIONS", "S2_READ_FORMAT", "S2_WRITE_FORMAT", "S2DataSource", "read_schema"]

_NOT_WRITTEN = (
    "options streams/streamPrefix select streams to read; to write, set option stream "
    "(one target stream) or give the rows a `stream` column"
)

_IN_RECORDS = "S2 micro-batches are sized in records: use minRecordsPerTrigger / " \
    "maxRecordsPerTrigger"

#: Every option of format s2, reading and writing: the one declaration.
S2_OPTIONS = OptionSet(
    "s2",
    (*S2_CONNECTION_OPTIONS, *S2_SELECTION_OPTIONS, *READ_OPTIONS, *S2_WRITE_OPTIONS),
    refused=(("write", "streams", _NOT_WRITTEN), ("write", "streamPrefix", _NOT_WRITTEN),
             *(("read", o.name, _IN_RECORDS) for o in BYTE_TRIGGER_OPTIONS)),
    documented_in="help(s2_spark.spark.S2DataSource) and docs/reading.md, docs/writing.md",
)


def read_schema(include_headers: bool = True) -> StructType:
    """The rows a read returns; `headers` is left out when includeHeaders=false."""
    fields = [
        StructField("stream", StringType()),
        StructField("seq_num", LongType()),
        StructField("timestamp", TimestampType()),
    ]
    if include_headers:
        header = StructType([StructField("name", BinaryType()), StructField("value", BinaryType())])
        fields.append(StructField("headers", ArrayType(header)))
    fields.append(StructField("body", BinaryType()))
    return StructType(fields)


S2_READ_FORMAT = ReadFormat(
    name="s2",
    connection=lambda options: parse_s2_connection(options, purpose="read from"),
    selection=lambda options, _connection: parse_s2_selection(options),
    check_position=seq_num_position,
    position_example='{"events": 42} (the next seq_num to read)',
    options=S2_OPTIONS,
)


#: Where `S2_WRITE_FORMAT` is found: by pickled writers, and by the data source
#: (`write_format`).
_WRITE_FORMAT_HOME = (__name__, "S2_WRITE_FORMAT")


@functools.cache
def _write_format() -> WriteFormat[WriteOptions, InputLayout]:
    """`S2_WRITE_FORMAT`, made once. Pickled writers name it (`home`) rather than carry its
    option declarations."""
    from s2_spark.spark.s2._writer import write_format

    return write_format(S2_OPTIONS, home=_WRITE_FORMAT_HOME)


def __getattr__(name: str) -> Any:
    """`S2_WRITE_FORMAT`, imported with the write path on first use (PEP 562)."""
    if name == _WRITE_FORMAT_HOME[1]:
        return _write_format()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


class S2DataSource(RangeDataSource, WritingDataSource):
    """Read and write S2 streams with Spark, exactly-once (format name ``s2``).

    Rows: ``stream string, seq_num bigint, timestamp timestamp,
    headers array<struct<name: binary, value: binary>>, body binary``. Streaming offsets are
    JSON objects mapping each stream to the next seq_num to read, so a batch replayed from
    the checkpoint reads exactly the same records.

    Options (values are strings, names case-insensitive): declared once in
    `S2_OPTIONS`, which checks them and makes the tables of the docs and the list at the
    end of this text. Every bad value, and every name the format does not know, fails
    before any task runs.

    Writing (``df.write`` with ``mode("append")``, ``df.writeStream`` with a checkpoint)
    takes input columns ``body`` (binary or string, required), ``headers`` (the reader's
    type, or map<string, string|binary>), ``timestamp`` (timestamp or bigint epoch millis)
    and ``stream`` (routes each row); ``seq_num`` is ignored so read rows can be written
    back as they are.

    Writes are exactly-once across task retries and query restarts (see docs/writing.md): each
    append carries a fence record with the writer's progress, conditioned on the previous
    fencing token and the tail, so a replay resumes where the earlier attempt stopped and a
    stale attempt is fenced out.
    """

    read_format = S2_READ_FORMAT
    write_format_home = _WRITE_FORMAT_HOME

    @classmethod
    def name(cls) -> str:
        return "s2"

    def _backend(self, options: ReadOptions) -> StreamBackend[Any]:
        from s2_spark.backends.s2.backend import S2Backend

        return S2Backend(options.connection)

    def _read_schema(self, options: ReadOptions) -> StructType:
        return read_schema(options.include_headers)


document_options(S2DataSource)
