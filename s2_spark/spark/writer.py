"""The writing half every format shares: `df.write` and `df.writeStream` over a format's
`WriteFormat` and its service's partition sink (`s2_spark.backends.sink`).

On the driver a format checks its options, its input columns and its target, and plans
the sink. Each task learns from Spark who it is (`TaskAttempt`: the query and micro-batch,
or the job; the partition and attempt), opens its partition sink from the plan, writes
every batch through it (aborting it on failure) and reports per stream what it wrote;
commit and abort log the totals. Arrow batches are used where Spark offers them
(`DataSourceArrowWriter`; `DataSourceStreamArrowWriter` from Spark 4.1), rows otherwise
(the format turns them into Arrow). Nothing here knows a protocol: that is the sinks'.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any, Generic, Protocol, TypeVar

from pyspark.sql.datasource import (
    DataSourceArrowWriter,
    DataSourceStreamWriter,
    DataSourceWriter,
    WriterCommitMessage,
)
from pyspark.sql.types import StructType

from s2_spark._options import OptionSet
from s2_spark.backends.sink import (
    SinkPlan,
    StreamWriteResult,
    TaskAttempt,
    WriteJob,
    describe_results,
    write_partition,
)
from s2_spark.errors import OptionError
from s2_spark.spark._compat import HAS_STREAM_ARROW_WRITER
from s2_spark.spark._worker_heap import settled
from s2_spark.spark._write_common import fault_hook

if TYPE_CHECKING:  # the writers only pass Arrow batches on: no pyarrow to unpickle one
    import pyarrow as pa

if HAS_STREAM_ARROW_WRITER:
    from pyspark.sql.datasource import DataSourceStreamArrowWriter
else:  # Spark 4.0: the row writer is used, this base only keeps the class definable
    DataSourceStreamArrowWriter = DataSourceStreamWriter  # type: ignore[misc,assignment]

__all__ = [
    "WriteCommitMessage",
    "WriteFormat",
    "WriterOptions",
    "batch_writer",
    "query_run_id",
    "stream_writer",
]

log = logging.getLogger("s2_spark.spark")


class WriterOptions(Protocol):
    """What the shared writers read from a format's checked options."""

    @property
    def test_fault(self) -> str | None:
        """The test-only fault hook (`_write_common.TEST_FAULT`)."""
        ...


OptionsT = TypeVar("OptionsT", bound=WriterOptions)
LayoutT = TypeVar("LayoutT")


@dataclass(frozen=True, slots=True)
class WriteFormat(Generic[OptionsT, LayoutT]):
    """What one format adds to the shared writers (as `ReadFormat` does to the readers).

    `parse` checks the writer options (`streaming`: for `df.writeStream`) and raises
    `OptionError` for the first bad one; `check_input` maps the input columns to the
    format's layout, or raises naming the offending column; `plan` checks the target on
    the driver and returns the `SinkPlan` the tasks open their sinks from;
    `rows_to_batches` turns Spark Rows (Spark 4.0's stream writers get rows) into the
    Arrow batches the sink takes. `options` declares every option of the format (reading
    and writing), checked first.

    `home` (module, attribute) names where the format is defined: a writer then pickles
    a reference to it instead of the format itself, whose option declarations (their
    docs) were most of a pickled writer's 8.5 KB.
    """

    name: str
    options: OptionSet
    parse: Callable[[Mapping[str, str], bool], OptionsT]
    check_input: Callable[[StructType, OptionsT], LayoutT]
    plan: Callable[[OptionsT, LayoutT], SinkPlan]
    rows_to_batches: Callable[[Iterator[Any], LayoutT], Iterator[pa.RecordBatch]]
    home: tuple[str, str] | None = None

    def __reduce__(self) -> tuple[Any, ...]:
        if self.home is not None:
            return _format_at, self.home
        return WriteFormat, tuple(getattr(self, f.name) for f in fields(self))


def _format_at(module: str, attribute: str) -> WriteFormat[Any, Any]:
    """The format a pickled writer names (`WriteFormat.home`)."""
    import importlib

    found = getattr(importlib.import_module(module), attribute)
    if not isinstance(found, WriteFormat) or found.home != (module, attribute):
        raise TypeError(f"{module}.{attribute} is not the write format a writer was pickled with")
    return found


@dataclass
class WriteCommitMessage(WriterCommitMessage):
    """What one task wrote: per stream, its service's `StreamWriteResult`; and the rows it
    left out as commands (S2 command records)."""

    partition: int
    attempt: int
    results: list[StreamWriteResult] = field(default_factory=list)
    dropped_commands: int = 0


class _Writer(Generic[OptionsT, LayoutT]):
    """The part every writer shares: the checked options, layout and plan, who the task
    is, the write itself, and the summary of what the tasks wrote."""

    def __init__(self, fmt: WriteFormat[OptionsT, LayoutT], options: OptionsT,
                 layout: LayoutT, plan: SinkPlan, job: WriteJob) -> None:
        self.fmt = fmt
        self.options = options
        self.layout = layout
        self.plan = plan
        self.job = job

    def __repr__(self) -> str:
        return f"{type(self).__name__}(format={self.fmt.name!r}, options={self.options!r})"

    def _attempt(self) -> TaskAttempt:
        from pyspark import TaskContext

        ctx = TaskContext.get()
        if ctx is None:
            raise RuntimeError(f"the {self.fmt.name} writer runs inside Spark tasks only")
        if not self.job.streaming:
            return TaskAttempt(self.job, ctx.partitionId(), ctx.attemptNumber())
        batch = ctx.getLocalProperty("streaming.sql.batchId")
        query = ctx.getLocalProperty("sql.streaming.queryId")
        if batch is None or not query:
            raise RuntimeError("Spark did not tell the task its query id and micro-batch id")
        return TaskAttempt(self.job, ctx.partitionId(), ctx.attemptNumber(), query, int(batch),
                           query_run_id(ctx.getLocalProperty, query))

    @settled
    def write_batches(self, batches: Iterator[pa.RecordBatch]) -> WriteCommitMessage:
        me = self._attempt()
        hook = fault_hook(self.options.test_fault, me.batch if me.batch is not None else 0)
        with self.plan.open(me, hook) as sink:
            results = write_partition(sink, batches)
        return WriteCommitMessage(me.partition, me.attempt, results, sink.dropped_commands)

    def write_rows(self, rows: Iterator[Any]) -> WriteCommitMessage:
        return self.write_batches(self.fmt.rows_to_batches(rows, self.layout))

    def summarize(self, messages: list[WriterCommitMessage | None], what: str
                  ) -> list[StreamWriteResult]:
        """Log what the tasks wrote (`what`: "job", "micro-batch 3 aborted", ...)."""
        results = [r for m in messages if isinstance(m, WriteCommitMessage) for r in m.results]
        log.info("%s writer %s: %s", self.fmt.name, what, describe_results(results))
        return results


class _ArrowInput(_Writer[OptionsT, LayoutT]):
    """`write` for Arrow writers (`DataSourceArrowWriter`, `DataSourceStreamArrowWriter`)."""

    def write(self, iterator: Iterator[pa.RecordBatch]) -> WriteCommitMessage:
        return self.write_batches(iterator)


class _MicroBatchCommits(_Writer[OptionsT, LayoutT]):
    """`commit` / `abort` of stream writers: a summary of the micro-batch in the log."""

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        self.summarize(messages, f"micro-batch {batchId}")

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        self.summarize(messages, f"micro-batch {batchId} aborted")


class BatchWriter(_ArrowInput[OptionsT, LayoutT], DataSourceArrowWriter):
    """`df.write`: each task appends its partition exactly once (retried and speculative
    attempts included); once the job commits, the plan finishes it (Durable Streams'
    closeStreamOnFinish)."""

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        done = self.plan.finish(self.summarize(messages, "job"))
        if done is not None:
            log.info("%s writer: %s", self.fmt.name, done)

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        self.summarize(messages, "job aborted")


class StreamArrowWriter(_ArrowInput[OptionsT, LayoutT], _MicroBatchCommits[OptionsT, LayoutT],
                        DataSourceStreamArrowWriter):
    """`df.writeStream` on Spark 4.1+: Arrow batches in, exactly-once appends."""


class StreamRowWriter(_MicroBatchCommits[OptionsT, LayoutT], DataSourceStreamWriter):
    """`df.writeStream` on Spark 4.0: rows in, converted to Arrow per chunk."""

    def write(self, iterator: Iterator[Any]) -> WriteCommitMessage:
        return self.write_rows(iterator)


_RUN_ID = re.compile(r"^runId = ([0-9a-fA-F-]{36})$", re.MULTILINE)
_UUID = re.compile(r"^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$")


def query_run_id(local_property: Callable[[str], str | None], query_id: str) -> str | None:
    """The run id of the streaming query a task belongs to (new at every start of the
    query), from what Spark's stream execution sets on its jobs: the job description
    ("runId = ..."), else the job group (the run id, unless a platform replaced it);
    None when neither says."""
    match = _RUN_ID.search(local_property("spark.job.description") or "")
    if match is not None:
        return match.group(1).lower()
    group = local_property("spark.jobGroup.id") or ""
    if _UUID.match(group) and group.lower() != query_id.lower():
        return group.lower()
    return None


def _checked(fmt: WriteFormat[OptionsT, LayoutT], options: Mapping[str, str],
             schema: StructType, overwrite: bool, *, streaming: bool
             ) -> tuple[OptionsT, LayoutT, SinkPlan]:
    """Options, columns and target, checked on the driver before any task runs."""
    if overwrite:
        mode = ("output mode complete is not supported, use outputMode('append') or 'update'"
                if streaming else "save mode overwrite is not supported, use mode('append')")
        raise OptionError(f"format {fmt.name} appends to streams: {mode}")
    opts = fmt.parse(options, streaming)
    layout = fmt.check_input(schema, opts)
    return opts, layout, fmt.plan(opts, layout)


def batch_writer(fmt: WriteFormat[Any, Any], options: Mapping[str, str], schema: StructType,
                 overwrite: bool) -> DataSourceWriter:
    """The writer for `df.write.format(...)`; checks options, columns and target first."""
    opts, layout, plan = _checked(fmt, options, schema, overwrite, streaming=False)
    return BatchWriter(fmt, opts, layout, plan, WriteJob.plan(streaming=False))


#: Seconds an interpreter trusts a stream writer's checks (options, columns, target) that
#: passed. Spark asks for a new stream writer twice a micro-batch (to plan its tasks, then
#: to commit it), in interpreters that live as long as the session and are not told which
#: query or run asks: looking the target up each time cost a client and a request a
#: call. A query started again later is checked again; one started sooner in the same
#: session (its target deleted meanwhile, say) meets the problem in its tasks, which fail
#: with the service's typed error instead.
CHECKS_TRUSTED_FOR = 60.0
_passed: dict[tuple[str, frozenset[tuple[str, str]], str, bool],
              tuple[float, tuple[Any, Any, SinkPlan]]] = {}


def _checked_recently(fmt: WriteFormat[OptionsT, LayoutT], options: Mapping[str, str],
                      schema: StructType, overwrite: bool
                      ) -> tuple[OptionsT, LayoutT, SinkPlan]:
    """`_checked` for a stream writer, done again only `CHECKS_TRUSTED_FOR` seconds after
    it last passed for the same format, options and input (kept in this interpreter
    only)."""
    key = (fmt.name, frozenset(options.items()), schema.json(), overwrite)
    now = time.monotonic()
    passed = _passed.get(key)
    if passed is not None and now - passed[0] < CHECKS_TRUSTED_FOR:
        return passed[1]
    checked = _checked(fmt, options, schema, overwrite, streaming=True)
    for stale in [k for k, (at, _) in _passed.items() if now - at >= CHECKS_TRUSTED_FOR]:
        del _passed[stale]
    _passed[key] = (now, checked)
    return checked


def stream_writer(fmt: WriteFormat[Any, Any], options: Mapping[str, str], schema: StructType,
                  overwrite: bool) -> DataSourceStreamWriter:
    """The writer for `df.writeStream.format(...)`; checks options, columns and target
    first (`_checked_recently`)."""
    opts, layout, plan = _checked_recently(fmt, options, schema, overwrite)
    cls = StreamArrowWriter if HAS_STREAM_ARROW_WRITER else StreamRowWriter
    return cls(fmt, opts, layout, plan, WriteJob.plan(streaming=True))
