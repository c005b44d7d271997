"""Check the writer's options and input columns on the driver, before any task runs.

Connection options are the reader's (basin, endpoint / accountEndpoint / basinEndpoint,
accessToken), checked the same way. The input may carry `body` (required), `headers`,
`timestamp` and `stream`; the reader's own columns are accepted as they are (its `seq_num`
is ignored), so a read can be written back unchanged.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    DataType,
    IntegerType,
    LongType,
    MapType,
    StringType,
    StructType,
    TimestampNTZType,
    TimestampType,
)

from s2_spark._options import Option
from s2_spark.backends.s2.options import S2Settings, parse_s2_connection
from s2_spark.backends.s2.settings import (
    DATA_MAX_RECORDS,
    DEFAULT_APPENDS_IN_FLIGHT,
    InputLayout,
    SinkSettings,
)
from s2_spark.errors import OptionError
from s2_spark.s2._limits import MAX_INPUTS_PER_SESSION
from s2_spark.spark._write_common import TEST_FAULT, column_type_error, input_columns

__all__ = [
    "ACCEPTED_COLUMNS",
    "S2_WRITE_OPTIONS",
    "InputLayout",
    "WriteOptions",
    "check_input",
    "parse_write_options",
]

TARGET_STREAM = Option(
    "stream", "a stream name (1-512 bytes)",
    "The target stream of every row (overrides the stream column).", roles=("write",))
CREATE_STREAMS = Option(
    "createStreams", "true, false",
    "Create missing target streams; otherwise a missing stream fails the query, naming it.",
    default=False, roles=("write",))
MAX_RECORDS_PER_APPEND = Option(
    "maxRecordsPerAppend", f"1..{DATA_MAX_RECORDS}", "Records per append request.",
    default=DATA_MAX_RECORDS, roles=("write",))
LEASE_TIMEOUT_MS = Option(
    "leaseTimeoutMs", "milliseconds, a positive integer",
    "No longer used: the tasks of a micro-batch write the same streams at once instead of "
    "taking turns. Still accepted (and checked), so queries written for 0.1 start.",
    roles=("write",))
MAX_APPENDS_IN_FLIGHT = Option(
    "maxAppendsInFlight", f"1..{MAX_INPUTS_PER_SESSION}",
    "Appends a task has sent and not yet seen acknowledged, in total across its target "
    "streams (one stream's go out in one S2S session).",
    default=DEFAULT_APPENDS_IN_FLIGHT, roles=("write",))
#: The options only the `s2` writer takes (the connection options are shared).
S2_WRITE_OPTIONS = (TARGET_STREAM, CREATE_STREAMS, MAX_RECORDS_PER_APPEND, LEASE_TIMEOUT_MS,
                    MAX_APPENDS_IN_FLIGHT, TEST_FAULT)

ACCEPTED_COLUMNS = (
    "body (binary or string, required), "
    "headers (array<struct<name: binary|string, value: binary|string>> or "
    "map<string, string|binary>), "
    "timestamp (timestamp, or bigint epoch milliseconds), "
    "stream (string; the option stream overrides it), "
    "seq_num (ignored, so the reader's rows can be written as they are)"
)



@dataclass(frozen=True, slots=True)
class WriteOptions:
    """The writer's options, checked. The access token never appears in repr."""

    settings: S2Settings
    stream: str | None
    sink: SinkSettings
    test_fault: str | None = field(default=None, repr=False)


def parse_write_options(options: Mapping[str, str]) -> WriteOptions:
    """Check every writer option; raise `OptionError` for the first bad one."""
    settings = parse_s2_connection(options, purpose="write to")
    stream_raw = TARGET_STREAM.raw(options)
    stream = None
    if stream_raw is not None:
        stream = stream_raw.strip()
        if not stream or len(stream.encode()) > 512:
            raise OptionError(
                f"option stream={stream_raw!r} is not accepted: use a stream name of 1-512 "
                "bytes"
            )
    per_append = MAX_RECORDS_PER_APPEND.amount(options)
    if per_append > DATA_MAX_RECORDS + 1:
        raise OptionError(
            f"option maxRecordsPerAppend={per_append} is not accepted: use 1..{DATA_MAX_RECORDS}"
            " (S2 takes 1000 records per append; two are the exactly-once mark and token)"
        )
    # 999 was the most before the mark took a record of its own: it means the most now.
    per_append = min(per_append, DATA_MAX_RECORDS)
    LEASE_TIMEOUT_MS.count(options)  # still checked, no longer used
    in_flight = MAX_APPENDS_IN_FLIGHT.amount(options)
    if in_flight > MAX_INPUTS_PER_SESSION:
        raise OptionError(
            f"option maxAppendsInFlight={in_flight} is not accepted: use "
            f"1..{MAX_INPUTS_PER_SESSION} (appends sent before their acknowledgements)"
        )
    sink = SinkSettings(
        create_streams=CREATE_STREAMS.flag(options),
        max_records=per_append,
        max_inflight_appends=in_flight,
    )
    return WriteOptions(settings=settings, stream=stream, sink=sink,
                        test_fault=TEST_FAULT.raw(options))


def _is_text(t: DataType) -> bool:
    return isinstance(t, BinaryType | StringType)


def _bad(column: str, t: DataType, accepted: str) -> OptionError:
    return column_type_error("s2", column, t.simpleString(), accepted, ACCEPTED_COLUMNS)


_HEADERS = ("array<struct<name: binary|string, value: binary|string>> or "
            "map<string, string|binary>")


def _check_headers(t: DataType) -> None:
    if isinstance(t, MapType):
        if not (isinstance(t.keyType, StringType) and _is_text(t.valueType)):
            raise _bad("headers", t, "map<string, string|binary> or "
                       "array<struct<name, value>>")
    elif isinstance(t, ArrayType) and isinstance(t.elementType, StructType):
        inner = t.elementType
        names = [f.name.lower() for f in inner.fields]
        if sorted(names) != ["name", "value"] or not all(
                _is_text(f.dataType) for f in inner.fields):
            raise _bad("headers", t, _HEADERS)
    else:
        raise _bad("headers", t, _HEADERS)


def check_input(schema: StructType, options: WriteOptions) -> InputLayout:
    """Map the input columns, or raise naming the offending column and the accepted ones."""
    found = input_columns(schema, "s2", ("body", "headers", "timestamp", "stream", "seq_num"),
                          ACCEPTED_COLUMNS)
    if "body" not in found:
        raise OptionError(
            f"the input has no column body (columns: {', '.join(schema.fieldNames()) or 'none'})"
            f": format s2 needs one. Accepted columns: {ACCEPTED_COLUMNS}"
        )
    fields = schema.fields
    body_t = fields[found["body"]].dataType
    if not _is_text(body_t):
        raise _bad("body", body_t, "binary or string")
    if "headers" in found:
        _check_headers(fields[found["headers"]].dataType)
    if "timestamp" in found:
        t = fields[found["timestamp"]].dataType
        if not isinstance(t, TimestampType | TimestampNTZType | LongType | IntegerType):
            raise _bad("timestamp", t, "timestamp or bigint (epoch milliseconds)")
    if "stream" in found:
        t = fields[found["stream"]].dataType
        if not isinstance(t, StringType):
            raise _bad("stream", t, "string")
    if "stream" not in found and options.stream is None:
        raise OptionError(
            "no target stream: set option stream, or give the rows a string column stream"
        )
    return InputLayout(
        body=found["body"],
        headers=found.get("headers"),
        timestamp=found.get("timestamp"),
        stream=found.get("stream") if options.stream is None else None,
        names=tuple(schema.fieldNames()),
    )
