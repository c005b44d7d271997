"""The `durable-streams` data source: reads with exact replay, exactly-once writes."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from pyspark.sql.datasource import DataSourceStreamWriter, DataSourceWriter
from pyspark.sql.types import BinaryType, LongType, StringType, StructField, StructType

from s2_spark._option_values import get, get_positive_int
from s2_spark.backends.base import StreamBackend
from s2_spark.backends.durable import DurableBackend, StreamKind, check_offset_position
from s2_spark.backends.durable_options import parse_durable_connection, parse_durable_selection
from s2_spark.errors import NotFoundError, OptionError
from s2_spark.spark.datasource import RangeDataSource
from s2_spark.spark.options import ReadFormat, ReadOptions, require_admission_control

__all__ = ["DURABLE_READ_FORMAT", "DurableStreamsDataSource", "durable_read_schema"]

_ONE_TASK = (
    "a Durable Streams read can only start at an offset the server gave, so each stream is "
    "read by one task per micro-batch (splitting would re-read the stream once per task)"
)
_S2_ONLY = "it applies to S2 records (format s2) only"
_VALUE_TYPES: dict[str, StreamKind] = {"string": "json", "binary": "bytes"}

DURABLE_READ_FORMAT = ReadFormat(
    name="durable-streams",
    connection=parse_durable_connection,
    selection=parse_durable_selection,
    check_position=check_offset_position,
    position_example='{"/events": "0000000000000000_0000000000000512"} (an offset the server '
    "gave in Stream-Next-Offset, or \"-1\")",
    timestamps=False,
    unsupported=(
        ("minPartitions", _ONE_TASK),
        ("maxRecordsPerPartition", _ONE_TASK),
        ("includeHeaders", _S2_ONLY),
        ("includeCommandRecords", _S2_ONLY),
    ),
)


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


class DurableStreamsDataSource(RangeDataSource):
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
    exactly the same rows (see the README, "Exact replay").

    Options (values are strings; every bad value fails at ``load()``):

    * exactly one of ``url`` (one stream URL), ``urls`` (comma-separated URLs), or
      ``stream`` / ``streams`` (paths under ``baseUrl``). Every stream must exist and all
      must be JSON streams, or all byte streams.
    * ``valueType``: ``string`` (JSON streams) or ``binary`` (other content types) fixes the
      ``value`` column without looking the streams up (default: from their content type);
      a stream of the other kind then fails the read.
    * ``baseUrl``: the server's URL, for paths.
    * ``bearerToken``: sent as ``Authorization: Bearer ...``; ``secretHeaders``: a JSON
      object of extra request headers. Spark redacts both; they never appear in offsets,
      logs or errors.
    * ``startingPosition``: ``earliest`` (default), ``latest``, or a JSON object of stream
      to offset (streams left out start at earliest). A checkpoint always wins.
    * ``endingPosition`` (batch reads only; default ``latest``): ``latest`` or a JSON
      object of stream to offset, exclusive.
    * ``maxRecordsPerTrigger`` (JSON streams) / ``maxBytesPerTrigger`` (byte streams):
      at most this many messages / bytes per micro-batch, shared fairly across streams
      (PySpark 4.2+; also paces ``trigger(availableNow=True)``).
    * ``maxStreamsPerPartition`` (default 1000): small ranges of many streams share a task,
      read concurrently inside it (as for format ``s2``); ``1`` gives every stream its own.
    * ``failOnDataLoss`` (default ``true``): a planned range that is gone (410 Gone after
      retention, a deleted stream) fails the query naming the stream; ``false`` logs a
      warning and reads on from the first retained message.
    * ``retryTimeoutMs`` (default 120000): how long a failing request is retried, with
      backoff and jitter, without progress (records delivered, appends acknowledged start
      it over) before the task or plan fails; ``0`` turns retries off. Dead pooled
      connections are retried at once and never count.
    * ``sslCaFile``: a PEM bundle of CA certificates to trust (a private CA);
      ``sslCertFile`` / ``sslKeyFile`` / ``sslKeyPassword``: a client certificate where the
      service requires one. Paths must be readable on every node; Spark redacts the
      password. Proxies and CA bundles from the environment (``HTTPS_PROXY``,
      ``NO_PROXY``, ``SSL_CERT_FILE``) are honoured on every node.

    Reads, streaming reads and writes work on every PySpark 4.x (limits per trigger need
    4.2+).

    Writing (``df.write`` with ``mode("append")``, ``df.writeStream`` with a checkpoint)
    takes the message of each row from ``value`` or ``body`` (JSON streams: one JSON
    value's text per row, ``value`` a string, ``body`` a string or UTF-8 binary; other
    content types: the bytes, string or binary) and routes rows with option ``url`` /
    ``stream`` or else a ``url`` / ``stream`` column; ``offset`` and ``index`` are ignored,
    so read rows can be written back as they are. Options: the connection options above,
    plus

    * ``url`` (a stream URL) or ``stream`` (a path under ``baseUrl``, or a URL): the target
      of every row (overrides the columns). It must exist (or be created), be open and
      take the message column, checked before any task runs.
    * ``createStreams`` (default ``false``): create missing targets, with ``contentType``
      (default ``application/json``; only with ``createStreams=true``).
    * ``closeStreamOnFinish`` (default ``false``; ``df.write`` only): close every stream
      the job wrote once the job commits.
    * ``maxMessagesPerAppend`` (default 10000) / ``maxBytesPerAppend`` (default 1048576):
      how append requests are cut; keep them unchanged across restarts of a query.

    Writes are exactly-once across task retries and query restarts through the server's
    idempotent producers (see ``s2_spark.backends.durable_sink`` and the README): producer
    ``spark-<query id>-p<partition>`` at epoch = micro-batch id, seq = request index, so
    a replay is answered as duplicates and a zombie of an older micro-batch is fenced out
    (403). Batch jobs use ``spark-job-<job id>-p<partition>`` at epoch 0.
    """

    read_format = DURABLE_READ_FORMAT

    @classmethod
    def name(cls) -> str:
        return "durable-streams"

    def _read_options(self, *, streaming: bool) -> ReadOptions:
        options = super()._read_options(streaming=streaming)
        kind = self._kind(options)
        unit, other = (
            ("maxRecordsPerTrigger", "maxBytesPerTrigger")
            if kind == "json"
            else ("maxBytesPerTrigger", "maxRecordsPerTrigger")
        )
        if get(self.options, other) is not None:
            raise OptionError(
                f"option {other} does not apply to {kind} streams: use {unit} (JSON streams "
                "count messages, other content types count bytes)"
            )
        if kind == "bytes":
            limit = get_positive_int(self.options, "maxBytesPerTrigger")
            if limit is not None:
                require_admission_control("maxBytesPerTrigger")
                options = replace(options, max_records_per_trigger=limit)
        return options

    def _kind(self, options: ReadOptions) -> StreamKind:
        """The content kind shared by every selected stream (one HEAD per stream)."""
        cached: StreamKind | None = getattr(self, "_cached_kind", None)
        if cached is not None:
            return cached
        declared = (get(self.options, "valueType") or "").strip().lower()
        if declared:
            if declared not in _VALUE_TYPES:
                raise OptionError(
                    f"option valueType={declared!r} is not accepted: use 'string' (JSON "
                    "streams) or 'binary' (every other content type)"
                )
            self._cached_kind = _VALUE_TYPES[declared]
            return self._cached_kind
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
        return DurableBackend(options.connection, self._kind(options))

    def _read_schema(self, options: ReadOptions) -> StructType:
        return durable_read_schema(self._kind(options))

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        """`df.write.format("durable-streams")`: idempotent-producer appends."""
        from s2_spark.spark._durable_writer import batch_writer

        return batch_writer(self.options, schema, overwrite)

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        """`df.writeStream.format("durable-streams")`: exactly-once across retries and
        restarts (see s2_spark.spark._durable_writer)."""
        from s2_spark.spark._durable_writer import stream_writer

        return stream_writer(self.options, schema, overwrite)
