"""The `s2` data source: S2 records as rows, exactly-once writes."""

from __future__ import annotations

from typing import Any

from pyspark.sql.datasource import DataSourceStreamWriter, DataSourceWriter
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from s2_spark.backends.base import StreamBackend
from s2_spark.backends.s2 import seq_num_position
from s2_spark.backends.s2_options import parse_s2_connection, parse_s2_selection
from s2_spark.spark.datasource import RangeDataSource
from s2_spark.spark.options import ReadFormat, ReadOptions

__all__ = ["S2_READ_FORMAT", "S2DataSource", "read_schema"]


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
)


class S2DataSource(RangeDataSource):
    """Read and write S2 streams with Spark, exactly-once (format name ``s2``).

    Rows: ``stream string, seq_num bigint, timestamp timestamp,
    headers array<struct<name: binary, value: binary>>, body binary``. Streaming offsets are
    JSON objects mapping each stream to the next seq_num to read, so a batch replayed from
    the checkpoint reads exactly the same records.

    Options (values are strings; every bad value fails before any task runs):

    * ``basin`` (required): the basin to read from.
    * exactly one of ``stream`` (a stream name), ``streams`` (comma-separated names) or
      ``streamPrefix`` (every stream whose name starts with it; streams created while a
      query runs are found by the next listing, see ``discoveryIntervalMs``, and read from
      their beginning).
    * ``endpoint``: one URL for account and basin operations (s2-lite, the local server).
      Or, for S2 cloud, ``accountEndpoint`` / ``basinEndpoint`` (defaults
      https://a.s2.dev and https://{basin}.b.s2.dev). Env: S2_ENDPOINT etc.
    * ``accessToken``: the S2 access token (default: the S2_ACCESS_TOKEN environment
      variable of the driver). Spark redacts it in plans; it never appears in offsets,
      partitions, logs or errors.
    * ``startingPosition``: ``earliest`` (default), ``latest``, ``timestamp:<epoch millis>``
      (the first record at or after that time), or a JSON object of stream to seq_num such
      as ``{"events": 42}`` (streams left out start at earliest). Applies when a query
      starts without a checkpoint; a checkpoint always wins.
    * ``endingPosition`` (batch reads only; default ``latest``): ``latest``,
      ``timestamp:<epoch millis>`` or JSON like ``startingPosition``; exclusive, like
      Kafka's endingOffsets (streams left out end at latest).
    * ``maxRecordsPerTrigger``: at most this many records per micro-batch, shared fairly
      across streams (also paces ``trigger(availableNow=True)``).
    * ``minPartitions`` / ``maxRecordsPerPartition``: split long seq_num ranges into several
      tasks (at least this many tasks in total / at most this many records per task).
    * ``maxStreamsPerPartition`` (default 1000): small ranges of many streams share a task,
      read concurrently inside it: up to this many streams and about 100,000 records per
      task (each stream counting 100 extra for its request); ``1`` gives every stream its
      own task. Packing depends only on the planned offsets and the options, so a replayed
      micro-batch has the same rows in the same partitions on any cluster.
    * ``discoveryIntervalMs`` (default 1000): how often a streaming query whose plans keep
      finding data lists the streams of ``streamPrefix`` again (a plan that would find
      nothing new lists them first); new streams are read from their beginning.
    * ``includeHeaders`` (default ``true``): ``false`` drops the ``headers`` column.
    * ``includeCommandRecords`` (default ``false``): command records (fence, trim) are
      skipped and offsets move past them; ``true`` returns them as rows.
    * ``failOnDataLoss`` (default ``true``): records of a planned range that were trimmed,
      or a stream deleted, fail the query naming the stream and missing seq_num range;
      ``false`` logs a warning and goes on.
    * ``retryTimeoutMs`` (default 120000): how long a failing request is retried, with
      backoff and jitter, without progress (records delivered, appends acknowledged start
      it over) before the task or plan fails; ``0`` turns retries off. Dead pooled
      connections are retried at once and never count.
    * ``sslCaFile``: a PEM bundle of CA certificates to trust (a private CA);
      ``sslCertFile`` / ``sslKeyFile`` / ``sslKeyPassword``: a client certificate where the
      service requires one. Paths must be readable on every node; Spark redacts the
      password. Proxies and CA bundles from the environment (``HTTPS_PROXY``,
      ``NO_PROXY``, ``SSL_CERT_FILE``) are honoured on every node.

    Writing (``df.write`` with ``mode("append")``, ``df.writeStream`` with a checkpoint)
    takes input columns ``body`` (binary or string, required), ``headers`` (the reader's
    type, or map<string, string|binary>), ``timestamp`` (timestamp or bigint epoch millis)
    and ``stream`` (routes each row); ``seq_num`` is ignored so read rows can be written
    back as they are. Options: the connection options above, plus

    * ``stream``: the target stream for every row (overrides the ``stream`` column).
    * ``createStreams`` (default ``false``): create missing target streams; otherwise a
      missing stream fails the query, naming it.
    * ``maxRecordsPerAppend`` (1..999, default 999): records per append request.
    * ``leaseTimeoutMs`` (default 120000): how long a task waits for another task of the
      same micro-batch that holds a target stream without appending before taking over.
    * ``maxAppendsInFlight`` (1..256, default 64): appends a task has sent and not yet
      seen acknowledged, in total across its target streams (one stream's go out in one
      S2S session).

    Writes are exactly-once across task retries and query restarts (see the README): each
    append carries a fence record with the writer's progress, conditioned on the previous
    fencing token and the tail, so a replay resumes where the earlier attempt stopped and a
    stale attempt is fenced out.
    """

    read_format = S2_READ_FORMAT

    @classmethod
    def name(cls) -> str:
        return "s2"

    def _backend(self, options: ReadOptions) -> StreamBackend[Any]:
        from s2_spark.backends.s2 import S2Backend

        return S2Backend(options.connection)

    def _read_schema(self, options: ReadOptions) -> StructType:
        return read_schema(options.include_headers)

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        """`df.write.format("s2")`: exactly-once appends (see s2_spark.spark._s2_writer)."""
        from s2_spark.spark._s2_writer import batch_writer

        return batch_writer(self.options, schema, overwrite)

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        """`df.writeStream.format("s2")`: exactly-once across retries and restarts."""
        from s2_spark.spark._s2_writer import stream_writer

        return stream_writer(self.options, schema, overwrite)
