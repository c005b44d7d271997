"""The `s2` writers: `df.write.format("s2")` and `df.writeStream.format("s2")`.

Each Spark task writes its partition through `s2_spark.backends.s2_sink.PartitionWriter`,
which makes the appends exactly-once (see that module). This module only maps Spark to
it: who the writer is (query, micro-batch, partition, attempt, planning time), and the
input columns to Arrow arrays. Arrow batches are used where Spark offers them
(`DataSourceArrowWriter`; `DataSourceStreamArrowWriter` from Spark 4.1), rows otherwise.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import (
    DataSourceArrowWriter,
    DataSourceStreamWriter,
    DataSourceWriter,
    WriterCommitMessage,
)
from pyspark.sql.types import StructType

from s2_spark.backends.s2_sink import (
    PartitionWriter,
    StreamWriteResult,
    WriterId,
    query_key,
)
from s2_spark.errors import NotFoundError
from s2_spark.spark._compat import HAS_STREAM_ARROW_WRITER
from s2_spark.spark._s2_writer_options import (
    InputLayout,
    WriteOptions,
    check_input,
    parse_write_options,
)
from s2_spark.spark._write_common import (
    ArrowInput,
    MicroBatchCommits,
    RowInput,
    WriterJob,
    as_bytes,
    chunk_rows,
    fault_hook,
)
from s2_spark.spark.options import OptionError
from s2_spark.wire.records import HEADER_TYPE

if HAS_STREAM_ARROW_WRITER:
    from pyspark.sql.datasource import DataSourceStreamArrowWriter
else:  # Spark 4.0: the row writer is used, this base only keeps the class definable
    DataSourceStreamArrowWriter = DataSourceStreamWriter  # type: ignore[misc,assignment]

__all__ = [
    "S2CommitMessage",
    "batch_writer",
    "stream_writer",
]

log = logging.getLogger("s2_spark.spark")

@dataclass
class S2CommitMessage(WriterCommitMessage):
    """What one task wrote: per stream, rows appended and rows found already written."""

    partition: int
    attempt: int
    results: list[StreamWriteResult] = field(default_factory=list)
    dropped_commands: int = 0


class _Job(WriterJob):
    """The part shared by batch and streaming writers: options, layout, identity."""

    def __init__(self, options: WriteOptions, layout: InputLayout, *, streaming: bool) -> None:
        self.options = options
        self.layout = layout
        self.streaming = streaming
        # Planning time: a query restarted from its checkpoint replays a micro-batch with a
        # later generation, which outranks every attempt of the killed run.
        self.generation = time.time_ns() // 1_000_000

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(basin={self.options.settings.basin!r}, "
                f"stream={self.options.stream!r})")

    def _writer_id(self) -> WriterId:
        from pyspark import TaskContext

        ctx = TaskContext.get()
        if ctx is None:
            raise RuntimeError("the s2 writer runs inside Spark tasks only")
        if self.streaming:
            batch_raw = ctx.getLocalProperty("streaming.sql.batchId")
            query = ctx.getLocalProperty("sql.streaming.queryId") or ""
            if batch_raw is None:
                raise RuntimeError("Spark did not tell the task its micro-batch id")
            return WriterId(query_key(query), True, self.generation, int(batch_raw),
                            ctx.partitionId(), ctx.attemptNumber())
        return WriterId("job", False, self.generation, 0, ctx.partitionId(),
                        ctx.attemptNumber())

    def _columns(self, batch: pa.RecordBatch) -> tuple[pa.Array, pa.Array | None,
                                                       pa.Array | None, pa.Array | str]:
        lay = self.layout
        body = batch.column(lay.body)
        headers = None
        if lay.headers is not None:
            headers = batch.column(lay.headers)
            if pa.types.is_map(headers.type):  # Arrow input; the row path converts itself
                headers = _map_to_headers(headers)
        timestamps = batch.column(lay.timestamp) if lay.timestamp is not None else None
        streams: pa.Array | str
        if self.options.stream is not None:
            streams = self.options.stream
        else:
            assert lay.stream is not None
            streams = batch.column(lay.stream)
        return body, headers, timestamps, streams

    def write_batches(self, batches: Iterator[pa.RecordBatch]) -> S2CommitMessage:
        from s2_spark.client import S2Client

        me = self._writer_id()
        hook = fault_hook(self.options.test_fault, me.batch)
        with S2Client(self.options.settings.config()) as client:
            basin = client.basin(self.options.settings.basin)
            out = PartitionWriter(basin, me, self.options.sink, after_append=hook)
            try:
                for batch in batches:
                    if batch.num_rows:
                        out.add(*self._columns(batch))
                results = out.close()
            except BaseException:
                out.abort()
                raise
        return S2CommitMessage(me.partition, me.attempt, results, out.dropped_commands)

    def write_rows(self, rows: Iterator[Any]) -> S2CommitMessage:
        return self.write_batches(_rows_to_batches(rows, self.layout))

    def summarize(self, messages: list[WriterCommitMessage | None], what: str) -> None:
        appended = skipped = 0
        for m in messages:
            if isinstance(m, S2CommitMessage):
                appended += sum(r.appended for r in m.results)
                skipped += sum(r.skipped for r in m.results)
        log.info("s2 writer %s: %d records appended, %d already present (replayed)",
                 what, appended, skipped)


def _map_to_headers(arr: pa.Array) -> pa.Array:
    """map<string, string|binary> -> list<struct<name binary, value binary>>, in map order."""
    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks()
    keys = arr.keys.cast(pa.binary())
    items = arr.items.cast(pa.binary())
    struct = pa.StructArray.from_arrays([keys, items], names=["name", "value"])
    offsets = arr.offsets
    return pa.ListArray.from_arrays(offsets, struct, type=HEADER_TYPE,
                                    mask=arr.is_null() if arr.null_count else None)


def _rows_to_batches(rows: Iterator[Any], layout: InputLayout) -> Iterator[pa.RecordBatch]:
    """Spark Rows -> Arrow batches (for Spark versions without the Arrow stream writer)."""
    for chunk in chunk_rows(rows):
        yield _rows_batch(chunk, layout)


def _rows_batch(rows: list[Any], layout: InputLayout) -> pa.RecordBatch:
    n = len(layout.names)
    columns: list[pa.Array] = [pa.nulls(len(rows))] * n
    columns[layout.body] = pa.array([as_bytes(r[layout.body]) for r in rows], pa.binary())
    if layout.headers is not None:
        hs: list[list[dict[str, bytes | None]] | None] = []
        for r in rows:
            h = r[layout.headers]
            if h is None:
                hs.append(None)
            elif isinstance(h, dict):
                hs.append([{"name": as_bytes(k), "value": as_bytes(v)} for k, v in h.items()])
            else:
                hs.append([{"name": as_bytes(x["name"]), "value": as_bytes(x["value"])}
                           for x in h])
        columns[layout.headers] = pa.array(hs, HEADER_TYPE)
    if layout.timestamp is not None:
        ts = [r[layout.timestamp] for r in rows]
        if any(hasattr(t, "timestamp") for t in ts if t is not None):
            columns[layout.timestamp] = pa.array(
                [None if t is None else int(t.timestamp() * 1000) for t in ts], pa.int64())
        else:
            columns[layout.timestamp] = pa.array(ts, pa.int64())
    if layout.stream is not None:
        columns[layout.stream] = pa.array([r[layout.stream] for r in rows], pa.string())
    return pa.RecordBatch.from_arrays(columns, names=list(layout.names))


def _check_target(options: WriteOptions) -> None:
    """Fail fast (before any task runs) when the fixed target stream is missing."""
    if options.stream is None:
        return
    from s2_spark.client import S2Client

    with S2Client(options.settings.config()) as client:
        basin = client.basin(options.settings.basin)
        try:
            basin.stream(options.stream).check_tail()
        except NotFoundError:
            if not options.sink.create_streams:
                raise OptionError(
                    f"stream {options.stream!r} does not exist in basin "
                    f"{options.settings.basin!r}: create it first, or set option "
                    "createStreams=true"
                ) from None
            basin.ensure_stream(options.stream)


class S2BatchWriter(_Job, ArrowInput, DataSourceArrowWriter):
    """`df.write.format("s2")`: each task appends its partition exactly once."""

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        self.summarize(messages, "job")

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        self.summarize(messages, "job aborted")


class S2StreamArrowWriter(_Job, ArrowInput, MicroBatchCommits, DataSourceStreamArrowWriter):
    """`df.writeStream.format("s2")` on Spark 4.1+: Arrow batches in, exactly-once appends."""


class S2StreamRowWriter(_Job, RowInput, MicroBatchCommits, DataSourceStreamWriter):
    """`df.writeStream.format("s2")` on Spark 4.0: rows in, converted to Arrow per chunk."""


def batch_writer(options: Any, schema: StructType, overwrite: bool) -> DataSourceWriter:
    """The writer for `df.write.format("s2")`; checks options and columns first."""
    if overwrite:
        raise OptionError(
            "format s2 appends to streams: save mode overwrite is not supported, use "
            "mode('append')"
        )
    opts = parse_write_options(options)
    layout = check_input(schema, opts)
    _check_target(opts)
    return S2BatchWriter(opts, layout, streaming=False)


def stream_writer(options: Any, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
    """The writer for `df.writeStream.format("s2")`; checks options and columns first."""
    if overwrite:
        raise OptionError(
            "format s2 appends to streams: output mode complete is not supported, use "
            "outputMode('append') or 'update'"
        )
    opts = parse_write_options(options)
    layout = check_input(schema, opts)
    _check_target(opts)
    cls = S2StreamArrowWriter if HAS_STREAM_ARROW_WRITER else S2StreamRowWriter
    return cls(opts, layout, streaming=True)
