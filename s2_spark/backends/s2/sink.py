"""The S2 sink's partition writer: one Spark task's rows routed to many streams, each
written exactly once (no pyspark).

One writer routes its rows to many streams: grouped by stream in one pass per input
batch, each stream's rows in input order (`stream_sink.StreamSink` writes one
stream; `lease` is the lease protocol they share). Streams whose rows are all
buffered when the input ends (most small ones) are written several at once, with at most
`max_inflight_appends` appends in flight in total across the writer's streams, and a
writer's last append to a stream releases its lease in its own fence, so a small stream
costs one append (two when the token was not the one this process expected). If its ack
is lost and another writer takes the freed stream meanwhile, the writer finds its
releasing fence behind the other's fence records.

`S2SinkPlan` and `S2PartitionSink` fit this writer to the shared write path
(`backends.sink`): the plan opens a client and a writer per task attempt, the sink takes
the task's input batches as `InputLayout` places their columns.
"""

from __future__ import annotations

import contextlib
import threading
import time
import zlib
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import wait as wait_all
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeVar

import pyarrow as pa

from s2_spark.backends._sink_rows import drop_command_rows, group_by_stream
from s2_spark.backends.s2.lease import ForeignFenceError, LeaseToken, WriterId, query_key
from s2_spark.backends.s2.stream_sink import (
    DATA_MAX_BYTES,
    DATA_MAX_RECORDS,
    DEFAULT_APPENDS_IN_FLIGHT,
    AppendBudget,
    SinkSettings,
    StreamSink,
    StreamWriteResult,
)
from s2_spark.backends.sink import AfterAppend, SinksByStream, TaskAttempt
from s2_spark.errors import NotFoundError, OptionError, S2SparkError
from s2_spark.s2._append_session import MAX_INPUTS_PER_SESSION
from s2_spark.wire.records import HEADER_TYPE

if TYPE_CHECKING:
    from s2_spark.backends.s2.options import S2Settings
    from s2_spark.backends.sink import StreamWriteResult as AnyStreamWriteResult
    from s2_spark.s2 import BasinClient

__all__ = [
    "DATA_MAX_BYTES",
    "DATA_MAX_RECORDS",
    "DEFAULT_APPENDS_IN_FLIGHT",
    "MAX_INPUTS_PER_SESSION",
    "MAX_STREAM_WORKERS",
    "AppendBudget",
    "ForeignFenceError",
    "InputLayout",
    "LeaseToken",
    "PartitionWriter",
    "S2PartitionSink",
    "S2SinkPlan",
    "SinkSettings",
    "StreamSink",
    "StreamWriteResult",
    "WriterId",
    "check_target",
    "query_key",
    "writer_id",
]

#: Streams one writer works on at once (its appends in flight are bounded separately).
MAX_STREAM_WORKERS = 32
_T = TypeVar("_T")


class PartitionWriter:
    """All of one writer's rows: routed to per-stream sinks, in input order per stream.

    Rows are grouped by stream in one pass per input batch. Streams whose buffers fill up
    during `add` are flushed then; `close` flushes and releases the rest, several streams
    at once (at most `max_inflight_appends` appends in flight in total), each stream's
    last append releasing its lease. Rows that are S2 command records (exactly one header,
    with an empty name) are dropped: appending them would fence or trim the target
    instead of storing data.

    Before a sink waits for another writer's lease, the leases this writer holds and no
    thread of it is using are released; a thread holding a lease never waits for another
    one, so writers never wait on each other in a cycle. Leases idle for `idle_release`
    seconds are released between chunks. The first failure stops the other streams' work
    and is raised; `abort` then releases the leases still held.
    """

    def __init__(self, basin: BasinClient, writer: WriterId, settings: SinkSettings, *,
                 after_append: Callable[[StreamSink], None] | None = None) -> None:
        self._basin = basin
        self.writer = writer
        self.settings = settings
        self._after_append = after_append
        self._budget = AppendBudget(settings.max_inflight_appends)
        # With the test-only `after_append` hook, one stream at a time in the caller's
        # thread, in a fixed order: the hook counts appends across streams, and its
        # "exactly N appends landed" must not depend on thread timing.
        self._workers = 1 if after_append is not None else min(
            settings.max_inflight_appends, MAX_STREAM_WORKERS)
        self._pool: ThreadPoolExecutor | None = None
        self._cancel = threading.Event()
        self._busy: set[StreamSink] = set()  # sinks a thread of this writer is using
        self._idle = threading.Condition()
        self.sinks = SinksByStream(self._new_sink)  # every sink shares the state above
        self.dropped_commands = 0  # command rows left out (see the class docstring)

    def _new_sink(self, name: str) -> StreamSink:
        return StreamSink(self._basin, name, self.writer, self.settings,
                          on_wait=self._release_others, after_append=self._after_append,
                          budget=self._budget, cancel=self._cancel)

    def add(self, bodies: pa.Array, headers: pa.Array | None, timestamps: pa.Array | None,
            streams: pa.Array | str) -> None:
        """Add rows; `streams` is one stream name for all rows, or a string array."""
        if len(bodies) == 0:
            return
        columns, streams, dropped = drop_command_rows((bodies, headers, timestamps), streams)
        self.dropped_commands += dropped
        if isinstance(streams, str):
            groups = [(streams, columns)]
        else:
            if streams.null_count:
                import pyarrow.compute as pc

                i = int(pc.index(pc.is_null(streams), True).as_py())
                raise S2SparkError(
                    f"row {i} of this batch has a null `stream` column: every row needs the "
                    "target stream name, or set the writer option stream"
                )
            groups = group_by_stream(columns, streams) if len(streams) else []
        full = [sink for name, cols in groups if (sink := self.sinks[name]).buffer(*cols)]
        self._each(full, StreamSink.flush)
        now = time.monotonic()
        for sink in self.sinks.values():
            if sink.holding and now - sink.last_append >= self.settings.idle_release:
                sink.release()

    def close(self) -> list[StreamWriteResult]:
        """Flush every stream and release all leases; results in first-seen order.

        Streams are taken in an order of this partition's own (a hash of partition and
        name): partitions that share streams, and often meet them in the same order, then
        seldom want the same stream at the same time, so they rarely wait for each other.
        """
        part = self.writer.partition
        order = sorted(self.sinks.values(),
                       key=lambda sink: zlib.crc32(f"{part}/{sink.name}".encode()))
        try:
            self._write_singles(order)
            done = [sink.close() for sink in order if sink.settled]
            done += self._each([sink for sink in order if not sink.settled],
                               lambda sink: sink.close(release_in_last_append=True))
        finally:
            self.abort()
        by_name = {result.stream: result for result in done}
        return [by_name[name] for name in self.sinks]

    def _write_singles(self, sinks: list[StreamSink]) -> None:
        """Streams whose rows fit one append, and which this writer may take at once,
        are written by one append each, sent together (`BasinClient.append_each`): the
        fence of each takes the lease and releases it. Missing streams are created, all
        together, and sent once more; refused appends (another token), waits, read-backs
        and unknown outcomes are left to each sink's own `close`, after the others: by
        then the partitions racing for a stream have settled on its token."""
        from s2_spark.s2 import SingleAppend

        for _ in range(2):  # once more after creating the missing streams
            ready = [(sink, link) for sink in sinks
                     if (link := sink.single_append()) is not None]
            if not ready:
                return
            outcomes = self._basin.append_each(
                [SingleAppend(sink.name, link.payload, link.condition) for sink, link in ready],
                in_flight=self.settings.max_inflight_appends)
            sinks = [sink for (sink, link), outcome in zip(ready, outcomes, strict=True)
                     if not sink.after_single(link, outcome)
                     and isinstance(outcome, NotFoundError)]
            if not sinks or not self.settings.create_streams:
                return
            self._basin.create_streams([sink.name for sink in sinks])

    def abort(self) -> None:
        """Stop every stream's work and release every lease still held (after a failure:
        errors here are dropped, the first one is the one to report)."""
        self._cancel.set()
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None
        for sink in self.sinks.values():
            if sink.holding:
                with contextlib.suppress(Exception):
                    sink.release()

    # -- several streams at once ---------------------------------------------------------

    def _each(self, sinks: list[StreamSink], op: Callable[[StreamSink], _T]) -> list[_T]:
        """`op` on every sink, up to `_workers` at once; results in `sinks` order. The
        first failure cancels the others (they stop at their next request) and is
        raised once every thread is done with its sink."""
        if self._workers == 1 or len(sinks) <= 1:
            return [self._claimed(sink, op) for sink in sinks]
        if self._pool is None:
            self._pool = ThreadPoolExecutor(self._workers, thread_name_prefix="s2-sink")
        first: list[BaseException] = []
        lock = threading.Lock()

        def run(sink: StreamSink) -> _T:
            try:
                return self._claimed(sink, op)
            except BaseException as exc:
                with lock:
                    if not first:
                        first.append(exc)
                        self._cancel.set()
                raise

        futures = [self._pool.submit(run, sink) for sink in sinks]
        wait_all(futures)
        if first:
            raise first[0]
        return [f.result() for f in futures]

    def _claimed(self, sink: StreamSink, op: Callable[[StreamSink], _T]) -> _T:
        """`op(sink)` with the sink marked busy, so no other thread releases its lease."""
        with self._idle:
            self._idle.wait_for(lambda: sink not in self._busy)
            sink._check_cancel()
            self._busy.add(sink)
        try:
            return op(sink)
        finally:
            with self._idle:
                self._busy.discard(sink)
                self._idle.notify_all()

    def _release_others(self, waiting: StreamSink) -> None:
        """Before `waiting` waits for a lease: release the leases of this writer that no
        thread is using (a thread using one never waits for another, so no cycle)."""
        with self._idle:
            idle = [s for s in self.sinks.values()
                    if s is not waiting and s.holding and s not in self._busy]
            self._busy.update(idle)
        try:
            for sink in idle:
                sink.release()
        finally:
            with self._idle:
                self._busy.difference_update(idle)
                self._idle.notify_all()


# -- the shared write path (backends.sink) -----------------------------------------------


@dataclass(frozen=True, slots=True)
class InputLayout:
    """Where the accepted columns are in the input rows (None when absent)."""

    body: int
    headers: int | None
    timestamp: int | None
    stream: int | None
    names: tuple[str, ...]


def writer_id(attempt: TaskAttempt) -> WriterId:
    """The S2 writer of a task attempt: generation = when its job was planned, so a query
    restarted from its checkpoint outranks every attempt of the killed run."""
    job = attempt.job
    if attempt.query_id is None:
        return WriterId("job", False, job.planned_ms, 0, attempt.partition, attempt.attempt)
    assert attempt.batch is not None, "a streaming attempt has a micro-batch id"
    return WriterId(query_key(attempt.query_id), True, job.planned_ms, attempt.batch,
                    attempt.partition, attempt.attempt)


class S2PartitionSink:
    """A `PartitionWriter` as the shared `PartitionSink`: takes the task's input batches,
    whose columns `layout` places; `stream` (the option) overrides the stream column."""

    def __init__(self, writer: PartitionWriter, layout: InputLayout, stream: str | None
                 ) -> None:
        self.writer = writer
        self.layout = layout
        self.stream = stream

    @property
    def dropped_commands(self) -> int:
        return self.writer.dropped_commands

    def add(self, batch: pa.RecordBatch) -> None:
        lay = self.layout
        headers = None
        if lay.headers is not None:
            headers = batch.column(lay.headers)
            if pa.types.is_map(headers.type):  # Arrow input; the row path converts itself
                headers = _map_to_headers(headers)
        timestamps = batch.column(lay.timestamp) if lay.timestamp is not None else None
        streams: pa.Array | str
        if self.stream is not None:
            streams = self.stream
        else:
            assert lay.stream is not None
            streams = batch.column(lay.stream)
        self.writer.add(batch.column(lay.body), headers, timestamps, streams)

    def close(self) -> list[StreamWriteResult]:
        return self.writer.close()

    def abort(self) -> None:
        self.writer.abort()


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


@dataclass(frozen=True, slots=True)
class S2SinkPlan:
    """The checked basin, target and tuning of one write, shipped to its tasks."""

    settings: S2Settings
    stream: str | None  # the one target of every row (None: rows name theirs)
    sink: SinkSettings
    layout: InputLayout

    @contextlib.contextmanager
    def open(self, attempt: TaskAttempt, after_append: AfterAppend | None
             ) -> Iterator[S2PartitionSink]:
        """A client for the task and the attempt's writer, closed after it."""
        from s2_spark.s2 import S2Client

        with S2Client(self.settings.config()) as client:
            basin = client.basin(self.settings.basin)
            writer = PartitionWriter(basin, writer_id(attempt), self.sink,
                                     after_append=after_append)
            yield S2PartitionSink(writer, self.layout, self.stream)

    def finish(self, results: Sequence[AnyStreamWriteResult]) -> None:
        """Nothing to do once a job committed: every append released its stream."""
        return None


def check_target(settings: S2Settings, stream: str | None, sink: SinkSettings) -> None:
    """Fail fast (before any task runs) when the fixed target stream is missing, or
    create it (createStreams)."""
    if stream is None:
        return
    from s2_spark.s2 import S2Client

    with S2Client(settings.config()) as client:
        basin = client.basin(settings.basin)
        try:
            basin.stream(stream).check_tail()
        except NotFoundError:
            if not sink.create_streams:
                raise OptionError(
                    f"stream {stream!r} does not exist in basin {settings.basin!r}: create it "
                    "first, or set option createStreams=true"
                ) from None
            basin.ensure_stream(stream)
