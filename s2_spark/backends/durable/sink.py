"""Exactly-once appends to Durable Streams from retried, restarted or stale writers (no pyspark).

Durable Streams deduplicates on the server: an append carrying `Producer-Id`,
`Producer-Epoch` and `Producer-Seq` is applied once per (id, epoch, seq), a repeat is
answered 204, and an epoch older than the producer's current one is answered 403. The
sink maps a writer onto that:

* A writer is one attempt at one input partition of one logical batch: `ProducerIdentity`.
  Streaming: producer id ``spark-<query id>-p<partition>`` (the query id lives in the
  checkpoint, so it survives restarts), epoch = the micro-batch id. Batch jobs: producer id
  ``spark-job-<job id>-p<partition>`` (a job id made once per job), epoch 0.
* Each target stream gets its own `IdempotentProducer`; seq n is the n-th append request of
  this writer's rows for that stream, from 0. Requests are cut deterministically from the
  rows in input order (at most `max_messages` messages and about `max_bytes` bytes each),
  so every attempt at the same partition sends the same (epoch, seq) -> body pairs.
* A retried task, or a micro-batch replayed after a restart, sends the same pairs again:
  the server answers 204 for what it has and appends the rest. A zombie attempt of an
  older micro-batch, once a newer micro-batch wrote with the same producer, gets 403 and
  stops with `WriterFencedError`.

What this needs: the same rows in the same order per partition on every replay, the same
batching options across a restart, and producer state kept by the server for as long as
a micro-batch can be replayed (the reference server keeps it for 7 days).

`stream_sink.StreamSink` writes one stream (request cutting, JSON checks, the
producer; its names are importable from here too); `PartitionWriter` here routes one
attempt's rows to those sinks, and
`DurableSinkPlan` / `DurablePartitionSink` fit it to the shared write path
(`backends.sink`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from s2_spark.backends.durable.stream_sink import (
    DEFAULT_CONTENT_TYPE,
    Payload,
    ProducerIdentity,
    SinkSettings,
    StreamSink,
    StreamTarget,
    StreamWriteResult,
    TargetError,
    payload_problem,
)
from s2_spark.backends.sink import AfterAppend, SinksByStream, TaskAttempt
from s2_spark.errors import S2SparkError, StreamConflictError, StreamNotFoundError

if TYPE_CHECKING:  # pyarrow is imported where a task's rows arrive
    import pyarrow as pa

    from s2_spark.backends.durable.options import DurableSettings
    from s2_spark.backends.sink import StreamWriteResult as AnyStreamWriteResult
    from s2_spark.durable import DurableStreamsClient

__all__ = [
    "DurableInputLayout",
    "DurablePartitionSink",
    "DurableSinkPlan",
    "PartitionWriter",
    "check_target",
    "close_streams",
    "open_target",
    "producer_identity",
]



def open_target(
    client: DurableStreamsClient,
    url: str,
    shown: str,
    settings: SinkSettings,
    payload: Payload,
) -> StreamTarget:
    """HEAD the stream (creating it when missing and allowed) and check that it can take
    the payload; raise `TargetError` naming the stream (`shown`) otherwise."""
    s = client.stream(url)
    try:
        info = s.head()
    except StreamNotFoundError:
        if not settings.create_streams:
            raise TargetError(
                f"stream {shown!r} does not exist: create it first, or set option "
                "createStreams=true (with option contentType, default "
                f"{DEFAULT_CONTENT_TYPE})"
            ) from None
        with contextlib.suppress(StreamConflictError):  # created meanwhile, another config
            s.create(settings.content_type)
        info = s.head()
    content_type = info.content_type or "application/octet-stream"
    if info.closed:
        raise TargetError(
            f"stream {shown!r} is closed: nothing more can be appended to it (write to "
            "another stream)"
        )
    problem = payload_problem(payload, content_type)
    if problem is not None:
        raise TargetError(f"stream {shown!r} cannot take these rows: {problem}")
    return StreamTarget(url, content_type)


def check_target(settings: DurableSettings, url: str, shown: str, sink: SinkSettings,
                 payload: Payload) -> StreamTarget:
    """`open_target` with a client of its own (on the driver, before any task runs)."""
    from s2_spark.durable import DurableStreamsClient

    with DurableStreamsClient(settings.config()) as client:
        return open_target(client, url, shown, sink, payload)


def _as_binary(arr: pa.Array) -> pa.Array:
    """A string or binary array as `binary` (int32 offsets; zero-copy where possible)."""
    import pyarrow as pa

    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks()
    t = arr.type
    if pa.types.is_binary(t):
        return arr
    if pa.types.is_string(t):
        return arr.view(pa.binary())
    if pa.types.is_large_string(t):
        arr = arr.view(pa.large_binary())
    return arr.cast(pa.binary())



class PartitionWriter:
    """One attempt at one partition: routes rows to per-stream sinks, in input order.

    `fixed`: the one target of every row (checked on the driver), or None when rows carry
    their target in a column (`route_column`: ``stream``, a path under `base_url` or an
    absolute URL, or ``url``, an absolute URL); such streams are checked (and created when
    allowed) when the first row for them arrives.
    """

    def __init__(
        self,
        client: DurableStreamsClient,
        identity: ProducerIdentity,
        settings: SinkSettings,
        payload: Payload,
        *,
        fixed: tuple[str, StreamTarget] | None = None,
        route_column: str = "stream",
        after_append: Callable[[StreamSink], None] | None = None,
    ) -> None:
        self._client = client
        self.identity = identity
        self.settings = settings
        self.payload = payload
        self._fixed = fixed
        self._route_column = route_column
        self._after_append = after_append
        self.sinks = SinksByStream(self._new_sink)
        self._rows = 0

    def _resolve(self, name: str) -> str:
        absolute = name.startswith(("http://", "https://")) and len(name) > len("https://")
        if absolute:
            return name
        if self._route_column == "url":
            raise S2SparkError(
                f"column url holds {name!r}, which is not an absolute http:// or https:// "
                "URL (use column stream for paths under option baseUrl)"
            )
        base = self._client.config.base_url
        if base is None:
            raise S2SparkError(
                f"column stream holds the path {name!r}, but option baseUrl is not set: set "
                "baseUrl, or route with absolute stream URLs"
            )
        return self._client.config.stream_url(name)

    def _new_sink(self, name: str) -> StreamSink:
        if self._fixed is not None and name == self._fixed[0]:
            target = self._fixed[1]
        else:
            target = open_target(self._client, self._resolve(name), name, self.settings,
                                 self.payload)
        return StreamSink(self._client, target, name, self.identity, self.settings,
                          after_append=self._after_append)

    def add(self, values: pa.Array, routes: pa.Array | None = None) -> None:
        """Add rows: their payloads (string or binary), and their targets unless fixed."""
        import pyarrow as pa
        import pyarrow.compute as pc

        n = len(values)
        if n == 0:
            return
        values = _as_binary(values)
        if values.null_count:
            i = int(pc.index(pc.is_null(values), True).as_py())
            raise S2SparkError(
                f"row {self._rows + i} of this task has a null {self.payload.column}: every row "
                "needs a message (filter out or replace nulls first)"
            )
        if self._fixed is not None or routes is None:
            assert self._fixed is not None, "rows need a route column when no target is fixed"
            self._rows += n
            self.sinks[self._fixed[0]].add(values)
            return
        if isinstance(routes, pa.ChunkedArray):
            routes = routes.combine_chunks()
        if routes.null_count:
            i = int(pc.index(pc.is_null(routes), True).as_py())
            raise S2SparkError(
                f"row {self._rows + i} of this task has a null {self._route_column} column: "
                f"every row needs its target stream, or set option {self._route_column}"
            )
        self._rows += n
        names = pc.unique(routes).to_pylist()
        if len(names) == 1:
            self.sinks[names[0]].add(values)
            return
        for name in names:  # first-seen order; each stream's rows keep their order
            self.sinks[name].add(pc.filter(values, pc.equal(routes, name)))

    def close(self) -> list[StreamWriteResult]:
        """Flush every stream (in first-seen order) and wait for every answer."""
        results = []
        try:
            for sink in self.sinks.values():
                results.append(sink.close())
        except BaseException:
            self.abort()
            raise
        return results

    def abort(self) -> None:
        for sink in self.sinks.values():
            sink.abort()


def close_streams(client: DurableStreamsClient, urls: list[str]) -> None:
    """Close streams (EOF for readers); closing a closed stream succeeds."""
    for url in urls:
        client.stream(url).close()


# -- the shared write path (backends.sink) -----------------------------------------------


@dataclass(frozen=True, slots=True)
class DurableInputLayout:
    """Where the message and the route are in the input rows."""

    payload: int
    kind: Payload
    route: int | None  # None when the target is fixed by an option
    route_column: str
    names: tuple[str, ...]


def producer_identity(attempt: TaskAttempt) -> ProducerIdentity:
    """The producer of a task attempt: per query and micro-batch when streaming (the
    query id lives in the checkpoint), per job id for a batch job."""
    if attempt.query_id is None:
        return ProducerIdentity.job(attempt.job.job_id, attempt.partition, attempt.attempt)
    assert attempt.batch is not None, "a streaming attempt has a micro-batch id"
    return ProducerIdentity.streaming(attempt.query_id, attempt.batch, attempt.partition,
                                      attempt.attempt)


class DurablePartitionSink:
    """A `PartitionWriter` as the shared `PartitionSink`: takes the task's input batches,
    whose message and route columns `layout` places."""

    dropped_commands = 0  # Durable Streams has no command records

    def __init__(self, writer: PartitionWriter, layout: DurableInputLayout) -> None:
        self.writer = writer
        self.layout = layout

    def add(self, batch: pa.RecordBatch) -> None:
        lay = self.layout
        routes = batch.column(lay.route) if lay.route is not None else None
        self.writer.add(batch.column(lay.payload), routes)

    def close(self) -> list[StreamWriteResult]:
        return self.writer.close()

    def abort(self) -> None:
        self.writer.abort()


@dataclass(frozen=True, slots=True)
class DurableSinkPlan:
    """The checked target and tuning of one write, shipped to its tasks.

    `target`: the one target of every row as the options name it, with `checked` its
    URL and content type (None: rows name their streams). `close_on_finish`: close every
    stream a batch job wrote once it commits.
    """

    settings: DurableSettings
    target: str | None
    checked: StreamTarget | None
    sink: SinkSettings
    layout: DurableInputLayout
    close_on_finish: bool = False

    @contextlib.contextmanager
    def open(self, attempt: TaskAttempt, after_append: AfterAppend | None
             ) -> Iterator[DurablePartitionSink]:
        """A client for the task and the attempt's writer, closed after it."""
        from s2_spark.durable import DurableStreamsClient

        lay = self.layout
        fixed = None
        if self.checked is not None:
            assert self.target is not None
            fixed = (self.target, self.checked)
        with DurableStreamsClient(self.settings.config()) as client:
            writer = PartitionWriter(client, producer_identity(attempt), self.sink, lay.kind,
                                     fixed=fixed, route_column=lay.route_column,
                                     after_append=after_append)
            yield DurablePartitionSink(writer, lay)

    def finish(self, results: Sequence[AnyStreamWriteResult]) -> str | None:
        """closeStreamOnFinish: close every stream the job wrote (and the fixed target)."""
        if not self.close_on_finish:
            return None
        urls = list(dict.fromkeys(r.url for r in results if isinstance(r, StreamWriteResult)))
        if self.checked is not None and self.checked.url not in urls:
            urls.append(self.checked.url)
        from s2_spark.durable import DurableStreamsClient

        with DurableStreamsClient(self.settings.config()) as client:
            close_streams(client, urls)
        return f"closed {len(urls)} streams (closeStreamOnFinish)"
