"""The S2 sink's partition writer: one Spark task's rows routed to many streams, each
written exactly once (no pyspark).

One writer routes its rows to many streams: grouped by stream in one pass per input
batch, each stream's rows in input order (`s2_stream_sink.StreamSink` writes one
stream; `s2_lease` is the lease protocol they share). Streams whose rows are all
buffered when the input ends (most small ones) are written several at once, with at most
`max_inflight_appends` appends in flight in total across the writer's streams, and a
writer's last append to a stream releases its lease in its own fence, so a small stream
costs one append (two when the token was not the one this process expected). If its ack
is lost and another writer takes the freed stream meanwhile, the writer finds its
releasing fence behind the other's fence records.
"""

from __future__ import annotations

import contextlib
import threading
import time
import zlib
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import wait as wait_all
from typing import TYPE_CHECKING, TypeVar

import pyarrow as pa

from s2_spark.backends._sink_rows import drop_command_rows, group_by_stream
from s2_spark.backends.s2_lease import ForeignFenceError, LeaseToken, WriterId, query_key
from s2_spark.backends.s2_stream_sink import (
    DATA_MAX_BYTES,
    DATA_MAX_RECORDS,
    DEFAULT_APPENDS_IN_FLIGHT,
    AppendBudget,
    SinkSettings,
    StreamSink,
    StreamWriteResult,
)
from s2_spark.client._append_session import MAX_INPUTS_PER_SESSION
from s2_spark.errors import NotFoundError, S2SparkError

if TYPE_CHECKING:
    from s2_spark.client import BasinClient

__all__ = [
    "DATA_MAX_BYTES",
    "DATA_MAX_RECORDS",
    "DEFAULT_APPENDS_IN_FLIGHT",
    "MAX_INPUTS_PER_SESSION",
    "MAX_STREAM_WORKERS",
    "AppendBudget",
    "ForeignFenceError",
    "LeaseToken",
    "PartitionWriter",
    "SinkSettings",
    "StreamSink",
    "StreamWriteResult",
    "WriterId",
    "query_key",
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
        self.sinks: dict[str, StreamSink] = {}
        self.dropped_commands = 0
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

    def _sink(self, name: str) -> StreamSink:
        sink = self.sinks.get(name)
        if sink is None:
            sink = StreamSink(self._basin, name, self.writer, self.settings,
                              on_wait=self._release_others, after_append=self._after_append,
                              budget=self._budget, cancel=self._cancel)
            self.sinks[name] = sink
        return sink

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
        full = [sink for name, cols in groups if (sink := self._sink(name)).buffer(*cols)]
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
        from s2_spark.client import SingleAppend

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
