"""The `durable-streams` writers: `df.write` and `df.writeStream.format("durable-streams")`.

Each Spark task appends its partition through `s2_spark.backends.durable_sink.PartitionWriter`,
which makes the appends exactly-once with the server's idempotent producers (see that
module). This module only maps Spark to it: who the task is (query id and micro-batch id
from the task's local properties, or the job id made here on the driver; the partition),
and the input columns to Arrow arrays. Arrow batches are used where Spark offers them
(`DataSourceArrowWriter`; `DataSourceStreamArrowWriter` from Spark 4.1), rows otherwise.
"""

from __future__ import annotations

import logging
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

from s2_spark.backends.durable_sink import (
    PartitionWriter,
    ProducerIdentity,
    StreamTarget,
    StreamWriteResult,
    TargetError,
    close_streams,
    new_job_id,
    open_target,
)
from s2_spark.errors import OptionError
from s2_spark.spark._compat import HAS_STREAM_ARROW_WRITER
from s2_spark.spark._durable_writer_options import (
    DurableInputLayout,
    DurableWriteOptions,
    check_durable_input,
    parse_durable_write_options,
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

if HAS_STREAM_ARROW_WRITER:
    from pyspark.sql.datasource import DataSourceStreamArrowWriter
else:  # Spark 4.0: the row writer is used, this base only keeps the class definable
    DataSourceStreamArrowWriter = DataSourceStreamWriter  # type: ignore[misc,assignment]

__all__ = ["DurableCommitMessage", "batch_writer", "stream_writer"]

log = logging.getLogger("s2_spark.spark")


@dataclass
class DurableCommitMessage(WriterCommitMessage):
    """What one task wrote: per stream, rows, requests, and requests already there."""

    partition: int
    attempt: int
    results: list[StreamWriteResult] = field(default_factory=list)


class _Job(WriterJob):
    """The part shared by batch and streaming writers: options, layout, identity."""

    def __init__(self, options: DurableWriteOptions, layout: DurableInputLayout,
                 target: StreamTarget | None, *, job_id: str | None) -> None:
        self.options = options
        self.layout = layout
        self.target = target  # the checked fixed target (None: rows route themselves)
        self.job_id = job_id  # batch jobs only

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(target={self.options.target!r}, "
                f"settings={self.options.settings!r})")

    def _identity(self) -> ProducerIdentity:
        from pyspark import TaskContext

        ctx = TaskContext.get()
        if ctx is None:
            raise RuntimeError("the durable-streams writer runs inside Spark tasks only")
        if self.job_id is not None:
            return ProducerIdentity.job(self.job_id, ctx.partitionId(), ctx.attemptNumber())
        batch = ctx.getLocalProperty("streaming.sql.batchId")
        query = ctx.getLocalProperty("sql.streaming.queryId")
        if batch is None or not query:
            raise RuntimeError("Spark did not tell the task its query id and micro-batch id")
        return ProducerIdentity.streaming(query, int(batch), ctx.partitionId(),
                                          ctx.attemptNumber())

    def write_batches(self, batches: Iterator[pa.RecordBatch]) -> DurableCommitMessage:
        from s2_spark.durable import DurableStreamsClient

        me = self._identity()
        hook = fault_hook(self.options.test_fault, me.batch if me.batch is not None else 0)
        lay = self.layout
        fixed = None
        if self.target is not None:
            assert self.options.target is not None
            fixed = (self.options.target, self.target)
        with DurableStreamsClient(self.options.settings.config()) as client:
            out = PartitionWriter(client, me, self.options.sink, lay.kind, fixed=fixed,
                                  route_column=lay.route_column, after_append=hook)
            try:
                for batch in batches:
                    if batch.num_rows:
                        routes = batch.column(lay.route) if lay.route is not None else None
                        out.add(batch.column(lay.payload), routes)
                results = out.close()
            except BaseException:
                out.abort()
                raise
        return DurableCommitMessage(me.partition, me.attempt, results)

    def write_rows(self, rows: Iterator[Any]) -> DurableCommitMessage:
        return self.write_batches(_rows_to_batches(rows, self.layout))

    def summarize(self, messages: list[WriterCommitMessage | None], what: str) -> list[str]:
        """Log what the tasks did; return the URLs of the streams written."""
        rows = appends = duplicates = 0
        urls: dict[str, None] = {}
        for m in messages:
            if isinstance(m, DurableCommitMessage):
                for r in m.results:
                    rows += r.rows
                    appends += r.appends
                    duplicates += r.duplicates
                    urls[r.url] = None
        log.info("durable-streams writer %s: %d rows in %d append requests, %d of them "
                 "already written (replayed)", what, rows, appends, duplicates)
        return list(urls)


def _rows_to_batches(rows: Iterator[Any], layout: DurableInputLayout) -> Iterator[pa.RecordBatch]:
    """Spark Rows -> Arrow batches (for Spark versions without the Arrow stream writer)."""
    n = len(layout.names)
    for chunk in chunk_rows(rows):
        columns: list[pa.Array] = [pa.nulls(len(chunk))] * n
        columns[layout.payload] = pa.array([as_bytes(r[layout.payload]) for r in chunk],
                                           pa.binary())
        if layout.route is not None:
            columns[layout.route] = pa.array([r[layout.route] for r in chunk], pa.string())
        yield pa.RecordBatch.from_arrays(columns, names=list(layout.names))


def _check_target(options: DurableWriteOptions, layout: DurableInputLayout) -> StreamTarget | None:
    """Fail fast (before any task runs): the fixed target must exist (or be created), be
    open, and take the input's message column."""
    url = options.target_url()
    if url is None:
        return None
    from s2_spark.durable import DurableStreamsClient

    assert options.target is not None
    with DurableStreamsClient(options.settings.config()) as client:
        try:
            return open_target(client, url, options.target, options.sink, layout.kind)
        except TargetError as err:
            raise OptionError(f"option {options.target_option}: {err}") from None


class DurableBatchWriter(_Job, ArrowInput, DataSourceArrowWriter):
    """`df.write.format("durable-streams")`: each task appends its partition exactly once
    (retried and speculative attempts included); `closeStreamOnFinish` closes every
    stream the job wrote once the job commits."""

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        urls = self.summarize(messages, "job")
        if not self.options.close_on_finish:
            return
        fixed = self.options.target_url()
        if fixed is not None and fixed not in urls:
            urls.append(fixed)
        from s2_spark.durable import DurableStreamsClient

        with DurableStreamsClient(self.options.settings.config()) as client:
            close_streams(client, urls)
        log.info("durable-streams writer: closed %d streams (closeStreamOnFinish)", len(urls))

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        self.summarize(messages, "job aborted")


class DurableStreamArrowWriter(_Job, ArrowInput, MicroBatchCommits, DataSourceStreamArrowWriter):
    """`df.writeStream.format("durable-streams")` on Spark 4.1+: Arrow batches in."""


class DurableStreamRowWriter(_Job, RowInput, MicroBatchCommits, DataSourceStreamWriter):
    """`df.writeStream.format("durable-streams")` on Spark 4.0: rows in, Arrow per chunk."""


def _checked(options: Any, schema: StructType, overwrite: bool, *, streaming: bool
             ) -> tuple[DurableWriteOptions, DurableInputLayout, StreamTarget | None]:
    """Options, columns and the fixed target, checked on the driver before any task."""
    if overwrite:
        mode = ("output mode complete is not supported, use outputMode('append') or 'update'"
                if streaming else "save mode overwrite is not supported, use mode('append')")
        raise OptionError(f"format durable-streams appends to streams: {mode}")
    opts = parse_durable_write_options(options, streaming=streaming)
    layout = check_durable_input(schema, opts)
    return opts, layout, _check_target(opts, layout)


def batch_writer(options: Any, schema: StructType, overwrite: bool) -> DataSourceWriter:
    """The writer for `df.write.format("durable-streams")`; one job id for all its tasks."""
    opts, layout, target = _checked(options, schema, overwrite, streaming=False)
    return DurableBatchWriter(opts, layout, target, job_id=new_job_id())


def stream_writer(options: Any, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
    """The writer for `df.writeStream.format("durable-streams")`."""
    opts, layout, target = _checked(options, schema, overwrite, streaming=True)
    cls = DurableStreamArrowWriter if HAS_STREAM_ARROW_WRITER else DurableStreamRowWriter
    return cls(opts, layout, target, job_id=None)
