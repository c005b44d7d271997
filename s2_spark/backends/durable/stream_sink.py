"""One writer's rows for one Durable Streams stream, appended exactly once (no pyspark).

`StreamSink` cuts the rows into append requests deterministically, in input order (at
most `max_messages` messages and about `max_bytes` bytes each), and sends them through
one `IdempotentProducer`: seq n is the n-th request, so every attempt at the same
partition sends the same (epoch, seq) -> body pairs, and the server applies each once.
`ProducerIdentity` says whose producer it is (see `sink`, which routes a
partition's rows to these sinks, for the whole scheme).

A JSON stream (``application/json``) takes one message per row: the row's JSON text, which
must be exactly one JSON value (checked before sending, so a row cannot turn into two
messages). Any other content type takes the rows' bytes, concatenated.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from s2_spark.backends.sink import PickledAsFields
from s2_spark.errors import (
    DurableStreamsError,
    MalformedResponseError,
    S2SparkError,
    StaleEpochError,
    StreamClosedError,
    StreamNotFoundError,
    WriterFencedError,
)

if TYPE_CHECKING:  # numpy and pyarrow are imported where rows are cut and sent
    import numpy as np
    import pyarrow as pa

    from s2_spark.durable import DurableStream, DurableStreamsClient, IdempotentProducer

__all__ = [
    "DEFAULT_CONTENT_TYPE",
    "Payload",
    "ProducerIdentity",
    "SinkSettings",
    "StreamSink",
    "StreamTarget",
    "StreamWriteResult",
    "TargetError",
    "payload_problem",
]

DEFAULT_CONTENT_TYPE = "application/json"
_PREVIEW = 40


class TargetError(S2SparkError):
    """A target stream cannot take the rows: missing, closed, or of another content type."""



@dataclass(frozen=True, slots=True)
class ProducerIdentity:
    """Who appends: the producer id and epoch one attempt at one partition writes with."""

    producer_id: str
    epoch: int
    partition: int
    attempt: int
    batch: int | None  # the micro-batch id; None for a batch job

    @classmethod
    def streaming(cls, query_id: str, batch: int, partition: int, attempt: int) -> ProducerIdentity:
        """Micro-batch `batch` of the query `query_id` (stable across restarts)."""
        return cls(f"spark-{query_id}-p{partition}", batch, partition, attempt, batch)

    @classmethod
    def job(cls, job_id: str, partition: int, attempt: int) -> ProducerIdentity:
        """A batch job: one epoch (0); retried and speculative attempts share it."""
        return cls(f"spark-job-{job_id}-p{partition}", 0, partition, attempt, None)

    def describe(self) -> str:
        what = "a batch job" if self.batch is None else f"micro-batch {self.batch}"
        return f"{what}, partition {self.partition}, attempt {self.attempt}"


@dataclass(frozen=True, slots=True)
class SinkSettings:
    """Tuning and behaviour of the sink.

    `create_streams`: create a missing target with `content_type`. `max_messages` /
    `max_bytes`: how append requests are cut (a row larger than `max_bytes` goes alone).
    `max_in_flight`: pipelined requests per stream.
    """

    create_streams: bool = False
    content_type: str = DEFAULT_CONTENT_TYPE
    max_messages: int = 10_000
    max_bytes: int = 1 << 20
    max_in_flight: int = 4


@dataclass(frozen=True, slots=True)
class Payload:
    """The input column holding each row's message: `value` or `body`, string or binary."""

    column: Literal["value", "body"]
    text: bool


def _is_json(content_type: str) -> bool:
    from s2_spark.durable._reads import is_json

    return is_json(content_type)


def payload_problem(payload: Payload, content_type: str) -> str | None:
    """Why the payload column does not fit a stream of `content_type` (None: it fits).

    JSON streams take `value` string (one message's JSON text, as the reader returns it) or
    `body` (string or UTF-8 binary JSON text). A binary `value` is what the reader returns
    for byte streams: pieces of bytes, not messages, so it is refused for JSON streams.
    Other content types take either column, string (UTF-8) or binary.
    """
    if _is_json(content_type) and payload.column == "value" and not payload.text:
        return (
            f"content type {content_type} takes one JSON message per row: column value must "
            "be a string of JSON text (a binary value is a byte stream's data; rename it to "
            "body if it holds UTF-8 JSON text, one value per row)"
        )
    return None


@dataclass(frozen=True, slots=True)
class StreamTarget:
    """A checked target: its URL and content type."""

    url: str
    content_type: str

    @property
    def json(self) -> bool:
        return _is_json(self.content_type)



@dataclass(frozen=True, slots=True)
class StreamWriteResult(PickledAsFields):
    """What one writer did to one stream: rows sent, requests, and requests the server
    already had (answered as duplicates: written by an earlier attempt)."""

    stream: str
    url: str
    rows: int
    appends: int
    duplicates: int

    @property
    def replayed_rows(self) -> None:
        """Not told: the server answers for requests, not for their rows."""
        return None

    @property
    def replayed_appends(self) -> int:
        return self.duplicates



def _offsets(arr: pa.Array) -> np.ndarray[Any, Any]:
    """The int32 value offsets of a binary array (respecting slices)."""
    import numpy as np

    buf = arr.buffers()[1]
    return np.frombuffer(buf, dtype=np.int32, count=len(arr) + 1, offset=arr.offset * 4)


def _preview(value: bytes) -> str:
    text = value[:_PREVIEW].decode("utf-8", "replace")
    return repr(text + ("..." if len(value) > _PREVIEW else ""))


class StreamSink:
    """One writer's rows for one stream, cut into requests and appended exactly once.

    Feed rows with `add` (a binary array, in input order), then `close`. `after_append`
    (tests) is called after each acknowledged request, with this sink.
    """

    def __init__(
        self,
        client: DurableStreamsClient,
        target: StreamTarget,
        shown: str,
        identity: ProducerIdentity,
        settings: SinkSettings,
        *,
        after_append: Callable[[StreamSink], None] | None = None,
    ) -> None:
        from s2_spark.durable import IdempotentProducer

        self.name = shown
        self.target = target
        self.identity = identity
        self.settings = settings
        self._after_append = after_append
        self._json = target.json
        stream: DurableStream = client.stream(target.url, content_type=target.content_type)
        self.producer: IdempotentProducer = IdempotentProducer(
            stream,
            identity.producer_id,
            epoch=identity.epoch,
            max_batch_bytes=settings.max_bytes,
            max_batch_messages=settings.max_messages,
            max_in_flight=settings.max_in_flight,
        )
        # The request being filled: slices of input arrays, their messages and bytes
        # counted as the producer counts them (each message + 1 separator).
        self._parts: list[pa.Array] = []
        self._count = 0
        self._size = 0
        self._first_row = 0  # index (among this stream's rows) of the request's first row
        self.rows = 0  # rows added so far

    def __repr__(self) -> str:
        return f"StreamSink({self.name!r}, producer={self.identity.producer_id!r})"

    @property
    def appends(self) -> int:
        """Requests acknowledged so far (new or duplicate)."""
        return self.producer.acknowledged

    def add(self, values: pa.Array) -> None:
        """Add rows (binary, no nulls) in input order; full requests are sent."""
        n = len(values)
        if n == 0:
            return
        import numpy as np

        offsets = _offsets(values)
        lengths = np.diff(offsets).astype(np.int64)
        # cum[j]: what the request would count after taking values[0..j] (from empty).
        cum = np.cumsum(lengths + 1)
        s = self.settings
        i = 0
        while i < n:
            base = int(cum[i - 1]) if i else 0
            # A value may join while the request stays within max_bytes (counting its own
            # bytes but not its separator) and below max_messages; a request's first value
            # always joins.
            fits = int(np.searchsorted(cum, s.max_bytes + 1 - self._size + base, "right"))
            cut = min(fits, i + s.max_messages - self._count, n)
            if cut <= i and self._count == 0:
                cut = i + 1
            if cut > i:
                self._parts.append(values.slice(i, cut - i))
                self._size += int(cum[cut - 1]) - base
                self._count += cut - i
                self.rows += cut - i
                i = cut
            if i < n:
                self._send()

    def _send(self) -> None:
        if not self._parts:
            return
        parts, count, first = self._parts, self._count, self._first_row
        self._parts, self._count, self._size = [], 0, 0
        self._first_row += count
        import pyarrow as pa

        values = parts[0] if len(parts) == 1 else pa.concat_arrays(parts)
        if self._json:
            body = self._json_body(values, first)
        else:
            offsets = _offsets(values)
            start, end = int(offsets[0]), int(offsets[-1])
            data = values.buffers()[2]
            body = b"" if data is None else data.slice(start, end - start).to_pybytes()
            if not body:
                return  # nothing to append (empty rows); the same on every attempt
        try:
            self.producer.append_encoded(body)
            if self._after_append is not None:
                self.producer.flush()  # the hook fires once the request is acknowledged
        except DurableStreamsError as exc:
            raise self._explain(exc) from exc
        if self._after_append is not None:
            self._after_append(self)

    def _json_body(self, values: pa.Array, first: int) -> bytes:
        import pyarrow as pa
        import pyarrow.compute as pc

        from s2_spark.wire.durable import split_json_array

        lists = pa.ListArray.from_arrays(pa.array([0, len(values)], pa.int32()), values)
        joined = pc.binary_join(lists, b",")[0].as_buffer()
        body: bytes = b"[" + joined.to_pybytes() + b"]"
        try:
            offsets, _ = split_json_array(body)
            ok = len(offsets) - 1 == len(values)
        except MalformedResponseError:
            ok = False
        if not ok:
            self._bad_json(values, first)
        return body

    def _bad_json(self, values: pa.Array, first: int) -> None:
        from s2_spark.wire.durable import split_json_array

        for i, v in enumerate(values.to_pylist()):
            try:
                offsets, _ = split_json_array(b"[" + v + b"]")
                one = len(offsets) == 2
            except MalformedResponseError:
                one = False
            if not one:
                raise S2SparkError(
                    f"row {first + i} of this task's rows for stream {self.name!r} is not one "
                    f"JSON value ({_preview(v)}): a JSON stream takes one message per row, "
                    "its JSON text (write byte data to a stream of another content type)"
                )
        raise S2SparkError(  # pragma: no cover - the whole batch is valid row by row
            f"the rows for stream {self.name!r} do not form a JSON array of messages"
        )

    def _explain(self, exc: DurableStreamsError) -> S2SparkError:
        me = self.identity
        if isinstance(exc, StaleEpochError):
            if me.batch is None:
                return WriterFencedError(
                    f"stream {self.name!r}: producer {me.producer_id!r} was fenced by epoch "
                    f"{exc.current_epoch}, which this batch job did not write (another writer "
                    "uses its producer id); this attempt stops",
                    stream=self.name,
                )
            return WriterFencedError(
                f"stream {self.name!r}: this attempt of micro-batch {me.batch} (partition "
                f"{me.partition}, attempt {me.attempt}) is stale: a newer micro-batch "
                f"({exc.current_epoch}) owns producer {me.producer_id!r}, so this zombie "
                "task stops without writing (the newer micro-batch has these rows)",
                stream=self.name,
            )
        if isinstance(exc, StreamClosedError):
            return TargetError(
                f"stream {self.name!r} was closed while {me.describe()} was appending to it; "
                "nothing more can be appended"
            )
        if isinstance(exc, StreamNotFoundError):
            return TargetError(
                f"stream {self.name!r} disappeared while {me.describe()} was appending to it"
            )
        exc.add_note(
            f"while appending to stream {self.name!r} ({me.describe()}, producer "
            f"{me.producer_id!r})"
        )
        return exc

    def close(self) -> StreamWriteResult:
        """Send what is buffered, wait for every answer, release the producer's threads."""
        self._send()
        try:
            self.producer.close()
        except DurableStreamsError as exc:
            raise self._explain(exc) from exc
        p = self.producer
        return StreamWriteResult(self.name, self.target.url, self.rows, p.acknowledged,
                                 p.duplicates)

    def abort(self) -> None:
        """Stop after a failure: wait for requests on the wire, send nothing more."""
        with contextlib.suppress(Exception):
            self.producer.__exit__(S2SparkError, None, None)
