"""The `durable-streams` data source: reads with exact replay, exactly-once writes."""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any

from pyspark.sql.types import BinaryType, LongType, StringType, StructField, StructType

from s2_spark._options import Option, OptionSet
from s2_spark.backends.durable.options import (
    DURABLE_CONNECTION_OPTIONS,
    DURABLE_SELECTION_OPTIONS,
    StreamKind,
    check_offset_position,
    parse_durable_connection,
    parse_durable_selection,
)
from s2_spark.errors import NotFoundError, OptionError
from s2_spark.spark._writing import WritingDataSource
from s2_spark.spark.datasource import RangeDataSource, document_options
from s2_spark.spark.durable._writer_options import DURABLE_WRITE_OPTIONS
from s2_spark.spark.options import (
    BYTE_TRIGGER_OPTIONS,
    BYTES,
    DISCOVERY_INTERVAL_MS,
    INCLUDE_COMMAND_RECORDS,
    INCLUDE_HEADERS,
    MAX_RECORDS_PER_PARTITION,
    MIN_PARTITIONS,
    READ_OPTIONS,
    RECORDS,
    ReadFormat,
    ReadOptions,
    TriggerUnits,
)

if TYPE_CHECKING:  # the backend (the client, pyarrow) is imported when a read starts
    from s2_spark.backends.base import StreamBackend
    from s2_spark.backends.durable.sink import DurableInputLayout
    from s2_spark.spark.durable._writer_options import DurableWriteOptions
    from s2_spark.spark.writer import WriteFormat

    #: Made on first use (`__getattr__`): the writers are imported by a write, not by a
    #: reading interpreter that unpickles the data source.
    DURABLE_WRITE_FORMAT: WriteFormat[DurableWriteOptions, DurableInputLayout]

__all__ = [
    "DURABLE_OPTIONS",
    "DURABLE_READ_FORMAT",
    "DURABLE_WRITE_FORMAT",
    "DurableStreamsDataSource",
    "durable_read_schema",
]

_ONE_TASK = (
    "a Durable Streams read can only start at an offset the server gave, so each stream is "
    "read by one task per micro-batch (splitting would re-read the stream once per task)"
)
_S2_ONLY = "it applies to S2 records (format s2) only"
_NAMED = "the protocol cannot list streams, so a read names its streams and never lists them"
_NOT_WRITTEN = (
    "it selects streams to read; to write, set option url (one stream URL) or stream (a "
    "path under baseUrl), or give the rows a url or stream column"
)
_VALUE_TYPES: dict[str, StreamKind] = {"string": "json", "binary": "bytes"}

VALUE_TYPE = Option(
    "valueType", "string, binary",
    "Fixes the value column without looking the streams up: string for JSON streams, "
    "binary for other content types (default: from their content type); a stream of the "
    "other kind then fails the read.", roles=("read",))
_S2_READ_ONLY = (MIN_PARTITIONS, MAX_RECORDS_PER_PARTITION, DISCOVERY_INTERVAL_MS,
                 INCLUDE_HEADERS, INCLUDE_COMMAND_RECORDS)

#: Every option of format durable-streams, reading and writing: the one declaration.
DURABLE_OPTIONS = OptionSet(
    "durable-streams",
    (*DURABLE_CONNECTION_OPTIONS, *DURABLE_SELECTION_OPTIONS, VALUE_TYPE,
     *(o for o in READ_OPTIONS if o not in _S2_READ_ONLY), *BYTE_TRIGGER_OPTIONS,
     *DURABLE_WRITE_OPTIONS),
    refused=(
        ("read", MIN_PARTITIONS.name, _ONE_TASK),
        ("read", MAX_RECORDS_PER_PARTITION.name, _ONE_TASK),
        ("read", INCLUDE_HEADERS.name, _S2_ONLY),
        ("read", INCLUDE_COMMAND_RECORDS.name, _S2_ONLY),
        ("read", DISCOVERY_INTERVAL_MS.name, _NAMED),
        ("write", "urls", _NOT_WRITTEN),
        ("write", "streams", _NOT_WRITTEN),
    ),
    documented_in="help(s2_spark.spark.DurableStreamsDataSource) and docs/durable-streams.md",
)

DURABLE_READ_FORMAT = ReadFormat(
    name="durable-streams",
    connection=parse_durable_connection,
    selection=parse_durable_selection,
    check_position=check_offset_position,
    position_example='{"/events": "0000000000000000_0000000000000512"} (an offset the server '
    "gave in Stream-Next-Offset, or \"-1\")",
    timestamps=False,
    options=DURABLE_OPTIONS,
)


#: Where `DURABLE_WRITE_FORMAT` is found: by pickled writers, and by the data source
#: (`write_format`).
_WRITE_FORMAT_HOME = (__name__, "DURABLE_WRITE_FORMAT")


@functools.cache
def _write_format() -> WriteFormat[DurableWriteOptions, DurableInputLayout]:
    """`DURABLE_WRITE_FORMAT`, made once. Pickled writers name it (`home`) rather than
    carry its option declarations."""
    from s2_spark.spark.durable._writer import write_format

    return write_format(DURABLE_OPTIONS, home=_WRITE_FORMAT_HOME)


def __getattr__(name: str) -> Any:
    """`DURABLE_WRITE_FORMAT`, imported with the writers on first use (PEP 562)."""
    if name == _WRITE_FORMAT_HOME[1]:
        return _write_format()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def durable_read_schema(kind: StreamKind) -> StructType:
    """Rows of JSON streams (`value` string: one message's JSON text) or of byte streams
    (`value` binary: consecutive pieces of the stream's bytes)."""
    return StructType(
        [
            StructField("stream", StringType()),
            StructField("offset", StringType()),
            StructField("index", LongType()),
            StructField("value", StringType() if kind == "json" else BinaryType()),
        ]
    )


class DurableStreamsDataSource(RangeDataSource, WritingDataSource):
    """Read and write Durable Streams with Spark, exactly-once (format ``durable-streams``).

    Rows: ``stream string, offset string, index bigint, value string`` for JSON streams
    (``application/json``: one row per message, ``value`` its JSON text) and
    ``value binary`` for every other content type (the stream's bytes, cut into rows of at
    most 1 MiB from the start of each micro-batch's range). ``offset`` is the server offset
    the micro-batch's read of the stream started at and ``index`` counts messages (bytes)
    after it before the row: a position that does not depend on how the server chunked its
    responses. ``stream`` is the stream as the options name it.

    Offsets are JSON objects mapping each stream to ``{"offset", "skip"}``: a server
    offset and units (messages or bytes) after it; ``"closed": true`` marks a stream whose
    end was reached. A micro-batch without a limit ends at each stream's tail from HEAD
    and its task reads the range once, cut exactly there; a replayed micro-batch reads
    exactly the same rows (see docs/durable-streams.md, "Exact replay").

    Options (values are strings, names case-insensitive): declared once in
    `DURABLE_OPTIONS`, which checks them and makes the tables of the docs and the list at
    the end of this text. Every bad value, and every name the format does not know, fails
    at ``load()`` / ``save()`` / ``start()``.

    Reads, streaming reads and writes work on every PySpark 4.x (limits per trigger need
    4.2+).

    Writing (``df.write`` with ``mode("append")``, ``df.writeStream`` with a checkpoint)
    takes the message of each row from ``value`` or ``body`` (JSON streams: one JSON
    value's text per row, ``value`` a string, ``body`` a string or UTF-8 binary; other
    content types: the bytes, string or binary) and routes rows with option ``url`` /
    ``stream`` or else a ``url`` / ``stream`` column; ``offset`` and ``index`` are ignored,
    so read rows can be written back as they are.

    Writes are exactly-once across task retries and query restarts through the server's
    idempotent producers (see ``s2_spark.backends.durable.sink`` and
    docs/durable-streams.md): producer
    ``spark-<query id>-p<partition>`` at epoch = micro-batch id, seq = request index, so
    a replay is answered as duplicates and a zombie of an older micro-batch is fenced out
    (403). Batch jobs use ``spark-job-<job id>-p<partition>`` at epoch 0.
    """

    read_format = DURABLE_READ_FORMAT
    write_format_home = _WRITE_FORMAT_HOME

    @classmethod
    def name(cls) -> str:
        return "durable-streams"

    def _trigger_units(self, options: ReadOptions) -> TriggerUnits:
        """JSON streams count messages, the others bytes; the other unit's options fail."""
        kind = self._kind(options)
        units, other = (RECORDS, BYTES) if kind == "json" else (BYTES, RECORDS)
        for name, use in ((other.maximum, units.maximum), (other.minimum, units.minimum)):
            if name.raw(self.options) is not None:
                raise OptionError(
                    f"option {name.name} does not apply to {kind} streams: use {use.name} (JSON "
                    "streams count messages, other content types count bytes)"
                )
        return units

    def _kind(self, options: ReadOptions) -> StreamKind:
        """The content kind shared by every selected stream (one HEAD per stream)."""
        cached: StreamKind | None = getattr(self, "_cached_kind", None)
        if cached is not None:
            return cached
        declared = (VALUE_TYPE.raw(self.options) or "").strip().lower()
        if declared:
            if declared not in _VALUE_TYPES:
                raise OptionError(
                    f"option valueType={declared!r} is not accepted: use 'string' (JSON "
                    "streams) or 'binary' (every other content type)"
                )
            self._cached_kind = _VALUE_TYPES[declared]
            return self._cached_kind
        from s2_spark.backends.durable.backend import DurableBackend

        probe = DurableBackend(options.connection, "json")
        kinds: dict[str, StreamKind] = {}
        for stream in options.selection.streams:
            try:
                kinds[stream] = probe.content_kind(stream)
            except NotFoundError:
                raise OptionError(
                    f"{probe.describe(stream)} does not exist: create it first, or fix the "
                    "url/urls/stream/streams option (a query restarted after its stream was "
                    "deleted: set option valueType so that failOnDataLoss decides)"
                ) from None
        if len(set(kinds.values())) > 1:
            raise OptionError(
                "the selected streams mix JSON and byte streams, whose rows differ "
                f"({kinds}): read them with separate queries"
            )
        kind = next(iter(kinds.values()))
        self._cached_kind = kind
        return kind

    def _backend(self, options: ReadOptions) -> StreamBackend[Any]:
        from s2_spark.backends.durable.backend import DurableBackend

        return DurableBackend(options.connection, self._kind(options))

    def _read_schema(self, options: ReadOptions) -> StructType:
        return durable_read_schema(self._kind(options))


document_options(DurableStreamsDataSource)
