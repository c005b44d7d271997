"""The S2 sink's partition writer: one Spark task's rows routed to many streams, each
written exactly once (no pyspark).

One writer routes its rows to many streams: grouped by stream in one pass per input
batch, each stream's rows in input order (`stream_sink.StreamSink` writes one stream;
`tokens` is what it leaves in the stream). Streams whose buffers fill up are flushed as
rows come, several at once. When the input ends, the streams whose rows fit one append
(most small ones) are written by one append each, sent together: those the writer has
no sink for, and can write without reading first, built in one pass for all of them
(`_first_appends`: no object per stream but its request and result); what a refusal or
a missing stream teaches is answered together in another round (creations too), and the
rest (reading marks back, bumps, long streams) is done per stream, several at once.
At most `max_inflight_appends` appends are in flight across the writer's streams.

`S2PartitionSink` fits this writer to the shared write path (`backends.sink`): it takes
the task's input batches as `InputLayout` places their columns. The plan that opens a
client and a writer per task attempt (`S2SinkPlan`) and the driver's check of the target
are in `plan`, which imports none of this until a task writes.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import wait as wait_all
from typing import TYPE_CHECKING, TypeVar

import numpy as np
import pyarrow as pa

from s2_spark.backends._sink_rows import drop_command_rows, stream_runs
from s2_spark.backends.s2._first_appends import FreshRows, landed_results
from s2_spark.backends.s2._history import first_window, read_windows
from s2_spark.backends.s2.settings import InputLayout
from s2_spark.backends.s2.stream_sink import (
    DATA_MAX_BYTES,
    DATA_MAX_RECORDS,
    DEFAULT_APPENDS_IN_FLIGHT,
    AppendBudget,
    SinkSettings,
    StreamSink,
    StreamWriteResult,
)
from s2_spark.backends.s2.tokens import (
    JOB_QUERY,
    DataMarks,
    ForeignFenceError,
    WriterId,
    query_key,
    run_key,
)
from s2_spark.backends.sink import SinksByStream, TaskAttempt
from s2_spark.errors import S2SparkError
from s2_spark.s2._append_session import MAX_INPUTS_PER_SESSION
from s2_spark.wire.appends import EncodedRecords, encode_entries
from s2_spark.wire.records import HEADER_TYPE

if TYPE_CHECKING:
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
    "PartitionWriter",
    "S2PartitionSink",
    "SinkSettings",
    "StreamSink",
    "StreamWriteResult",
    "WriterId",
    "query_key",
    "writer_id",
]

#: Streams one writer works on at once (its appends in flight are bounded separately).
MAX_STREAM_WORKERS = 32
#: Rounds of single appends sent together at close (a first try; after refusals and
#: creations; once more).
_SINGLE_ROUNDS = 3
#: Takeovers whose marks are read together: a bulk read holds every answer until its last
#: is in (64 records a stream, up to S2's 1 MiB a read). The first 32 at once (as many as
#: the writer's threads read alone before), then as many as held about `_TAKEOVER_BYTES`
#: so far, up to `_TAKEOVERS_MOST` (10 MB or so for 1024 streams of 100 B records).
_TAKEOVERS_FIRST = 32
_TAKEOVERS_MOST = 1024
_TAKEOVER_BYTES = 16 << 20
_T = TypeVar("_T")


class PartitionWriter:
    """All of one writer's rows: routed to per-stream sinks, in input order per stream.

    Rows are grouped by stream in one pass per input batch. Streams whose buffers fill up
    during `add` are flushed then; `close` writes the rest, several streams at once (at
    most `max_inflight_appends` appends in flight in total). Rows that are S2 command
    records (exactly one header, with an empty name) are dropped: appending them would
    fence or trim the target instead of storing data. The first failure stops the other
    streams' work and is raised.
    """

    def __init__(self, basin: BasinClient, writer: WriterId, settings: SinkSettings, *,
                 after_append: Callable[[StreamSink], None] | None = None) -> None:
        self._basin = basin
        self.writer = writer
        self.settings = settings
        self._after_append = after_append
        self._budget = AppendBudget(settings.max_inflight_appends)
        self._marks = DataMarks(writer)
        # With the test-only `after_append` hook, one stream at a time in the caller's
        # thread, in a fixed order: the hook counts appends across streams, and its
        # "exactly N appends landed" must not depend on thread timing.
        self._workers = 1 if after_append is not None else min(
            settings.max_inflight_appends, MAX_STREAM_WORKERS)
        self._pool: ThreadPoolExecutor | None = None
        self._cancel = threading.Event()
        self.sinks = SinksByStream(self._new_sink)
        # The rows of streams without a sink, whose first appends are built together
        # (`_first_appends`); not for a retried attempt (it bumps every stream first) nor
        # with the hook (one append at a time).
        self._fresh = (FreshRows() if writer.attempt == 0 and after_append is None
                       else None)
        self.dropped_commands = 0  # command rows left out (see the class docstring)

    def _new_sink(self, name: str) -> StreamSink:
        return StreamSink(self._basin, name, self.writer, self.settings,
                          after_append=self._after_append, budget=self._budget,
                          marks=self._marks, cancel=self._cancel)

    def add(self, bodies: pa.Array, headers: pa.Array | None, timestamps: pa.Array | None,
            streams: pa.Array | str) -> None:
        """Add rows; `streams` is one stream name for all rows, or a string array."""
        if len(bodies) == 0:
            return
        columns, streams, dropped = drop_command_rows((bodies, headers, timestamps), streams)
        self.dropped_commands += dropped
        if isinstance(streams, str):
            names = [streams]
            firsts, counts = np.zeros(1, np.int64), np.full(1, len(columns[0]), np.int64)
        else:
            if streams.null_count:
                import pyarrow.compute as pc

                i = int(pc.index(pc.is_null(streams), True).as_py())
                raise S2SparkError(
                    f"row {i} of this batch has a null `stream` column: every row needs the "
                    "target stream name, or set the writer option stream"
                )
            if not len(streams):
                return
            columns, names, firsts, counts = stream_runs(columns, streams)
        records = encode_entries(*columns)  # once, whatever the number of streams
        if self._fresh is None:
            full = [sink for name, start, n in zip(names, firsts.tolist(), counts.tolist(),
                                                   strict=True)
                    if (sink := self.sinks[name]).buffer_encoded(records.slice(start,
                                                                               start + n))]
        else:
            full = self._add_fresh(records, names, firsts, counts)
        self._each(full, StreamSink.flush)

    def _add_fresh(self, records: EncodedRecords, names: list[str], firsts: np.ndarray,
                   counts: np.ndarray) -> list[StreamSink]:
        """`add`'s rows kept by `FreshRows`, but those of streams that have a sink; the
        sinks due a flush (a stream whose rows reach one is given a sink now)."""
        fresh = self._fresh
        assert fresh is not None
        nums = fresh.number(names)
        full = []
        if self.sinks:
            has_sink = np.fromiter((name in self.sinks for name in names), np.bool_,
                                   len(names))
            for i in np.flatnonzero(has_sink).tolist():
                start = int(firsts[i])
                sink = self.sinks[names[i]]
                if sink.buffer_encoded(records.slice(start, start + int(counts[i]))):
                    full.append(sink)
            keep = ~has_sink
            nums, firsts, counts = nums[keep], firsts[keep], counts[keep]
        due = fresh.add(records, nums, firsts, counts, self.settings)
        return full + self._give_sinks(due)

    def _give_sinks(self, names: list[str]) -> list[StreamSink]:
        """Sinks for streams whose rows `FreshRows` kept: they hold them from now on."""
        assert self._fresh is not None
        sinks = [self.sinks[name] for name in names]
        for sink, chunks in zip(sinks, self._fresh.take(names), strict=True):
            for chunk in chunks:
                sink.buffer_encoded(chunk)
        return sinks

    def close(self) -> list[StreamWriteResult]:
        """Write every stream's rows; results in first-seen order."""
        by_name: dict[str, StreamWriteResult] = {}
        try:
            if self._fresh is not None:
                self._write_fresh(by_name)
            sinks = list(self.sinks.values())
            if self._fresh is not None:  # first-seen order, as without `FreshRows`
                index = self._fresh.index
                sinks.sort(key=lambda sink: index[sink.name])
            self._write_singles(sinks)
            done = [sink.close() for sink in sinks if sink.settled]
            done += self._each([sink for sink in sinks if not sink.settled], StreamSink.close)
        finally:
            self.abort()
        by_name.update((result.stream, result) for result in done)
        order = self._fresh.names if self._fresh is not None else self.sinks
        return [by_name[name] for name in order]

    def _write_fresh(self, results: dict[str, StreamWriteResult]) -> None:
        """The first append of every stream `FreshRows` can build one for, sent together
        (`BasinClient.append_bodies`); each that landed puts its result in `results`.
        Every other stream is given a sink with its rows: one whose append failed learns
        from the failure as from its own `single_append`'s (`single_failed`)."""
        assert self._fresh is not None
        basin = self._basin
        key = (basin.endpoint_url, basin.name)
        first = self._fresh.first_appends(self.writer, self.settings, key,
                                          backwards=bool(self.writer.partition % 2))
        self._give_sinks(first.others)
        if not first.names:
            return
        acks = basin.append_bodies(first.names, first.bodies, first.condition_sizes,
                                   in_flight=self.settings.max_inflight_appends,
                                   create_missing=self.settings.create_streams)
        failed = landed_results(first, acks, key, results)
        for sink, (_, err) in zip(self._give_sinks([name for name, _ in failed]), failed,
                                  strict=True):
            sink.single_failed(err)

    def _read_takeovers(self, sinks: list[StreamSink]) -> None:
        """The marks the takeovers among `sinks` wait for (a new run's first micro-batch
        meets an earlier run's token on every stream), read for all of them together:
        their tails in bulk, then the first window back from each (`first_window`) in
        bulk, so most are ready for `_write_singles`' next round. A stream whose tail or
        window did not come plainly (missing, an error, a read cut short), or whose marks
        reach further back, reads for itself, as before."""
        due = [sink for sink in sinks if sink.takes_over and not sink.settled]
        at, size = 0, _TAKEOVERS_FIRST
        while at < len(due):
            held = self._take_over_together(due[at:at + size])
            at += size
            size = max(1, min(_TAKEOVERS_MOST, size * _TAKEOVER_BYTES // max(held, 1)))

    def _take_over_together(self, due: list[StreamSink]) -> int:
        """`_read_takeovers` for some of them: their tails, then their first windows back,
        each in one bulk call; the bytes of records the reads held."""
        from s2_spark.s2 import SmallRead

        tails = self._basin.check_tails([sink.name for sink in due])
        ends = {sink.name: tail.seq_num for sink in due if (tail := tails[sink.name])}
        reads = [SmallRead(name, first_window(end), end - first_window(end))
                 for name, end in ends.items() if end]
        got = self._basin.read_many(reads)
        windows = dict(zip((r.stream for r in reads), read_windows(
            got, [ends[r.stream] for r in reads]), strict=True))
        for sink in due:
            end = ends.get(sink.name)
            if end == 0:  # nothing to read back
                sink.take_over(0, [])
            elif end is not None and (first := windows[sink.name]) is not None:
                sink.take_over(end, first)
        return sum(r.batch.nbytes for r in got if not isinstance(r, Exception))

    def _write_singles(self, sinks: list[StreamSink]) -> None:
        """Streams whose rows fit one append, and which need nothing read or bumped first,
        are written by one append each, sent together (`BasinClient.append_each`), a
        takeover's too once its marks are read (`_read_takeovers`, each round): a
        missing stream is created there and then (createStreams), and odd partitions go
        through the streams backwards, so tasks sharing new streams mostly meet each
        already created by the other. A refusal names the stream's token, and a sink
        that can answer it without reading goes in the next round; whatever is left
        (reads, bumps, unknown outcomes) is each sink's own `close`."""
        from s2_spark.s2 import SingleAppend

        if self.writer.partition % 2:
            sinks = sinks[::-1]
        for _ in range(_SINGLE_ROUNDS):
            self._read_takeovers(sinks)
            ready = [(sink, link) for sink in sinks
                     if (link := sink.single_append()) is not None]
            if not ready:
                return
            outcomes = self._basin.append_each(
                [SingleAppend(sink.name, link.payload, link.condition, sink.match_seq_num)
                 for sink, link in ready],
                in_flight=self.settings.max_inflight_appends,
                create_missing=self.settings.create_streams)
            for (sink, link), outcome in zip(ready, outcomes, strict=True):
                sink.after_single(link, outcome)
            sinks = [sink for sink in sinks if not sink.settled]

    def abort(self) -> None:
        """Stop every stream's work (after a failure; the first error is the one to
        report)."""
        self._cancel.set()
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None

    # -- several streams at once ---------------------------------------------------------

    def _each(self, sinks: list[StreamSink], op: Callable[[StreamSink], _T]) -> list[_T]:
        """`op` on every sink, up to `_workers` at once; results in `sinks` order. The
        first failure cancels the others (they stop at their next request) and is
        raised once every thread is done with its sink."""
        if self._workers == 1 or len(sinks) <= 1:
            return [op(sink) for sink in sinks]
        if self._pool is None:
            self._pool = ThreadPoolExecutor(self._workers, thread_name_prefix="s2-sink")
        first: list[BaseException] = []
        lock = threading.Lock()

        def run(sink: StreamSink) -> _T:
            try:
                return op(sink)
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


# -- the shared write path (backends.sink) -----------------------------------------------


def writer_id(attempt: TaskAttempt) -> WriterId:
    """The S2 writer of a task attempt: generation = when its micro-batch (job) was
    planned, so a query restarted from its checkpoint outranks every attempt of the
    killed run; run = the query's run (a new one at every start; where Spark does not
    say, each micro-batch counts as a run of its own, which costs a takeover per stream
    and micro-batch but stays exact)."""
    job = attempt.job
    if attempt.query_id is None:
        return WriterId(JOB_QUERY, False, run_key(job.job_id), job.planned_ms, 0,
                        attempt.partition, attempt.attempt)
    assert attempt.batch is not None, "a streaming attempt has a micro-batch id"
    run = attempt.run_id or f"{job.job_id}/{job.planned_ms}"
    return WriterId(query_key(attempt.query_id), True, run_key(run), job.planned_ms,
                    attempt.batch, attempt.partition, attempt.attempt)


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
