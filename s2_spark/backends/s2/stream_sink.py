"""One writer's rows for one S2 stream, appended exactly once (no pyspark).

S2 has no server-side dedup, so the sink builds it from the two append conditions S2
has: the stream's fencing token and `match_seq_num` (the vocabulary: `tokens`; the
decisions: `_stream_token`; docs/writing.md has the whole argument).

* A writer is one attempt at writing one input partition of one micro-batch (or batch
  job), `WriterId`; its rows for a stream must come in the same order on every replay.
* Every data append ends with two fence records: the writer's *mark* (who, and how many
  of its partition's rows for the stream are in with it) and the *token* the stream keeps
  after it. Data and mark land together.
* While one run of a query writes a stream, the token is the run's and stays so: every
  writer of the run conditions its appends on it without knowing who wrote last, so the
  tasks of a micro-batch write the same streams at once, one append per task and stream
  in the common case, and a writer of an earlier run is refused.
* Appends are pipelined: up to `max_inflight_appends` go out in one S2S session; S2
  applies a session's inputs in order and stops at the first that fails, so a partition's
  rows land in input order, and acks name the prefix that landed.
* When a writer cannot know what of its rows are in (a retried or speculative attempt,
  an append whose outcome was lost, a replay after a restart) it reads the marks back
  first, after a bump where another attempt of its task could still append.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import pyarrow as pa

from s2_spark.backends.s2._stream_token import StreamToken
from s2_spark.backends.s2.settings import (
    DATA_MAX_BYTES,
    DATA_MAX_RECORDS,
    DEFAULT_APPENDS_IN_FLIGHT,
    FENCE_RESERVE,
    AppendBudget,
    SinkSettings,
)
from s2_spark.backends.s2.tokens import WriterId, fence_entry
from s2_spark.errors import (
    FencingTokenMismatchError,
    NotFoundError,
    RecordTooLargeError,
    S2SparkError,
    SeqNumMismatchError,
    ServiceError,
)
from s2_spark.retry import RetryLoop
from s2_spark.s2._append_session import MAX_INPUTS_PER_SESSION
from s2_spark.wire.appends import AppendBatch, EncodedRecords, encode_entries

if TYPE_CHECKING:
    from s2_spark.s2 import AppendAck, BasinClient, StreamClient

__all__ = [
    "DATA_MAX_BYTES",
    "DATA_MAX_RECORDS",
    "DEFAULT_APPENDS_IN_FLIGHT",
    "FENCE_RESERVE",
    "AppendBudget",
    "SinkSettings",
    "StreamSink",
    "StreamWriteResult",
]

#: Refusals in a row without an append landing before the writer gives up: the stream is
#: being taken over again and again (another query writing it at the same time).
_MAX_REFUSALS = 50


@dataclass(frozen=True, slots=True)
class StreamWriteResult:
    """What one writer did to one stream: rows appended, rows found already there (the
    shared `backends.sink.StreamWriteResult` fields are derived from these)."""

    stream: str
    appended: int
    skipped: int
    first_seq_num: int | None
    end_seq_num: int | None
    appends: int

    @property
    def rows(self) -> int:
        """The writer's rows for the stream: appended now or found already there."""
        return self.appended + self.skipped

    @property
    def replayed_rows(self) -> int:
        return self.skipped

    @property
    def replayed_appends(self) -> None:
        """Not told: the rows found already there are counted, not their appends."""
        return None


@dataclass(frozen=True, slots=True)
class _Link:
    """One append: data, mark and token, the token it is conditioned on, and the
    partition's progress once it lands."""

    payload: AppendBatch
    count: int
    condition: str
    progress: int


class StreamSink(StreamToken):
    """One writer's rows for one stream: buffered, appended exactly once, in order.

    Feed rows with `add` (Arrow arrays: bodies, optional headers and timestamps), then
    `close`. `budget` bounds the appends in flight across the streams of one writer (one
    sink alone: its own); once `cancel` is set the sink stops at its next request (another
    stream of the writer failed). `after_append` (tests) runs after every acknowledged
    append, each sent alone.
    """

    def __init__(
        self,
        basin: BasinClient,
        name: str,
        writer: WriterId,
        settings: SinkSettings,
        *,
        after_append: Callable[[StreamSink], None] | None = None,
        budget: AppendBudget | None = None,
        cancel: threading.Event | None = None,
    ) -> None:
        self.name = name
        self.writer = writer
        self.settings = settings
        self._basin = basin
        self._stream_client: StreamClient | None = None  # made when first needed
        self._after_append = after_append
        self._budget = budget or AppendBudget(settings.max_inflight_appends)
        self._cancel = cancel
        self._what = f"stream {name!r} in basin {basin.name!r}"
        self._key = (basin.endpoint_url, basin.name, name)
        # Buffered rows, encoded; index of the first buffered row among this partition's
        # rows for the stream; rows seen so far.
        self._chunks: list[EncodedRecords] = []
        self._buffered_rows = 0
        self._buffered_bytes = 0
        self._start = 0
        self._seen = 0
        self._progress = 0  # rows of this partition known to be in the stream
        self._own_progress = 0  # of those, appended by this writer
        self._init_token()
        # Appends per chain (halved after a chain that landed nothing, see _send).
        self._window = max(1, min(settings.max_inflight_appends, MAX_INPUTS_PER_SESSION))
        # Results.
        self.appended = 0
        self.appends = 0
        self._skipped = 0
        self._first_seq: int | None = None
        self._end_seq: int | None = None

    def __repr__(self) -> str:
        return f"StreamSink({self._what}, writer={self.writer!r})"

    @property
    def _stream(self) -> StreamClient:
        if self._stream_client is None:
            self._stream_client = self._basin.stream(self.name)
        return self._stream_client

    @property
    def settled(self) -> bool:
        """Whether `close` has nothing left to send."""
        return not self._chunks

    # -- input --------------------------------------------------------------------------

    def add(self, bodies: pa.Array, headers: pa.Array | None = None,
            timestamps: pa.Array | None = None) -> None:
        """Buffer rows (in order); appends whenever enough are buffered."""
        if self.buffer(bodies, headers, timestamps):
            self.flush()

    def buffer(self, bodies: pa.Array, headers: pa.Array | None = None,
               timestamps: pa.Array | None = None) -> bool:
        """Buffer rows (in order) without appending; whether enough are buffered to
        `flush` (the caller may flush several streams at once)."""
        return self.buffer_encoded(encode_entries(bodies, headers, timestamps))

    def buffer_encoded(self, records: EncodedRecords) -> bool:
        """`buffer` for rows encoded already (a writer encodes all its streams' at once)."""
        n = len(records)
        if n:
            self._chunks.append(records)
            self._buffered_rows += n
            self._buffered_bytes += records.nbytes
            self._seen += n
        return (self._buffered_rows >= self.settings.flush_records
                or self._buffered_bytes >= self.settings.flush_bytes)

    def flush(self) -> None:
        """Append the full appends buffered; a short last one waits for more rows."""
        self._flush(final=False)

    def close(self) -> StreamWriteResult:
        """Append everything buffered; what this writer did to the stream."""
        self._flush(final=True)
        if self._progress > self._seen:
            raise S2SparkError(
                f"{self._what} already holds {self._progress} rows of partition "
                f"{self.writer.partition} of this batch, but the input has only {self._seen}: "
                "the input is not deterministic, so exactly-once cannot hold (make each "
                "partition's rows and their order the same on every replay)"
            )
        return StreamWriteResult(self.name, self.appended, self._skipped, self._first_seq,
                                 self._end_seq, self.appends)

    # -- one append for the whole stream, sent with other streams' ----------------------

    def single_append(self) -> _Link | None:
        """The one append that writes every buffered row, when they fit one and nothing
        must be read or bumped first; else None. Many streams' go out together
        (`PartitionWriter.close`); `after_single` records what became of each."""
        if (not self.ready or not self._chunks or self._match is not None
                or self._after_append is not None
                or self._buffered_rows > self.settings.max_records):
            return None
        records, start = self._buffered()
        if self._progress > start:
            return None  # rows to skip: the usual path
        batches = records.batches(self.settings.max_records, DATA_MAX_BYTES)
        if len(batches) != 1 or batches[0].metered_bytes > DATA_MAX_BYTES:
            return None
        return self._chain(batches, 0, 1)[0]

    def after_single(self, link: _Link, outcome: AppendAck | ServiceError) -> bool:
        """Record the outcome of `single_append`'s append; whether the stream is done.
        If not, the sink knows what to do next (`ready` again, or `close` reads first)."""
        if not isinstance(outcome, ServiceError):
            self._landed(link, outcome)
            self._consume(link.count)
            return True
        if not (outcome.unsent and outcome.retryable):
            self._failed(outcome)
        return False

    # -- appending ----------------------------------------------------------------------

    def _buffered(self) -> tuple[EncodedRecords, int]:
        """The buffered rows, and the index of the first, without taking them."""
        records = EncodedRecords.concat(self._chunks)
        self._chunks = [records]
        return records, self._start

    def _consume(self, n: int) -> None:
        """Drop the first `n` buffered rows: they are in the stream."""
        records, start = self._buffered()
        self._keep(records.slice(n), start + n)

    def _keep(self, records: EncodedRecords, start: int) -> None:
        """Buffer exactly these rows (from row `start` on) instead."""
        self._chunks = [records] if len(records) else []
        self._buffered_rows = len(records)
        self._buffered_bytes = records.nbytes
        self._start = start

    def _flush(self, *, final: bool) -> None:
        """Append the buffered rows the stream does not have yet (`final`: all of them;
        else a short last append waits for more). After a refusal, a missing stream or an
        unknown outcome, decide again from what was learnt and go on from there."""
        loop = RetryLoop(self._stream.config.retry, f"appends to {self._what}")
        refusals = 0
        while self._chunks:
            self._check_cancel()
            self._prepare()
            batches = self._next_batches(final=final)
            if not batches:
                return
            before = self.appends
            err = self._send(batches)
            if err is None:
                return
            if self.appends > before:
                loop.progressed()
                refusals = 0
            if isinstance(err, FencingTokenMismatchError | SeqNumMismatchError):
                refusals += 1
                if refusals > _MAX_REFUSALS:
                    raise S2SparkError(
                        f"{self._what} was taken over {_MAX_REFUSALS} times in a row while "
                        "this writer appended: another query or application writes it "
                        "(each target stream needs one writer at a time)") from err
            elif err.retryable:
                loop.failed(err)  # backs off; raises once the retry timeout passes

    def _next_batches(self, *, final: bool) -> list[AppendBatch]:
        """The buffered rows past what the stream has, encoded into appends (a short last
        one left buffered unless `final`); rows found in the stream are dropped."""
        records, start = self._buffered()
        skip = min(max(0, self._progress - start), len(records))
        if skip:
            # Rows whose appends' answers were lost are this writer's own; the rest an
            # earlier attempt's or run's.
            own = min(max(0, self._own_progress - start), skip)
            self.appended += own
            self._skipped += skip - own
            records = records.slice(skip)
            start += skip
            self._keep(records, start)
        if len(records) == 0:
            return []
        per_append = self.settings.max_records
        batches = records.batches(per_append, DATA_MAX_BYTES)
        for b in batches:
            if b.metered_bytes > DATA_MAX_BYTES:
                raise RecordTooLargeError(
                    f"record {start + b.first_index} of partition {self.writer.partition} for "
                    f"{self._what} is {b.metered_bytes} metered bytes; the writer accepts at "
                    f"most {DATA_MAX_BYTES} (S2's 1 MiB per append minus {FENCE_RESERVE} "
                    "bytes for the exactly-once mark and token)",
                    metered_bytes=b.metered_bytes, limit=DATA_MAX_BYTES,
                )
        if not final and batches[-1].count < per_append:
            batches = batches[:-1]  # a short last append waits for more rows
        return batches

    def _send(self, batches: list[AppendBatch]) -> ServiceError | None:
        """Append `batches` in order, chains of them per S2S session, each input after
        the first conditioned on the token the first sets. Returns None when all landed,
        else the error that stopped them once what it means is recorded (the rows that
        landed are consumed either way)."""
        done = 0
        while done < len(batches):
            self._check_cancel()
            # A takeover goes alone (only it is conditioned on the tail); with the
            # `after_append` hook each append is acknowledged before the next is sent.
            alone = self._after_append is not None or self._match is not None
            want = 1 if alone else min(self._window, len(batches) - done)
            with self._budget.hold(want) as most:
                chain = self._chain(batches, done, most)
                res = self._stream.append_chain(
                    [link.payload for link in chain],
                    fencing_tokens=[link.condition for link in chain],
                    match_seq_num=self._match,
                )
            for link, ack in zip(chain, res.acks, strict=False):
                self._landed(link, ack)
            landed = sum(link.count for link in chain[:len(res.acks)])
            self._consume(landed)
            done += len(res.acks)
            if res.error is not None:
                if not res.acks:
                    self._window = max(1, self._window // 2)
                self._failed(res.error)
                return res.error
            self._window = min(self._window * 2, self.settings.max_inflight_appends)
        return None

    def _chain(self, batches: list[AppendBatch], first: int, limit: int) -> list[_Link]:
        """The next appends to send together: at most `limit`, within the in-flight byte
        bound (at least one), each ending with this writer's mark and the token."""
        links: list[_Link] = []
        progress, condition, size = self._progress, self._condition, 0
        sets_entry, sets_metered = fence_entry(self._sets)
        for batch in batches[first:first + limit]:
            if links and size + batch.metered_bytes > self.settings.max_inflight_bytes:
                break
            progress += batch.count
            mark_entry, mark_metered = fence_entry(self.writer.mark(progress).encode())
            payload = AppendBatch(batch.records_payload + mark_entry + sets_entry,
                                  batch.count + 2,
                                  batch.metered_bytes + mark_metered + sets_metered,
                                  batch.first_index)
            links.append(_Link(payload, batch.count, condition, progress))
            condition, size = self._sets, size + payload.metered_bytes
        return links

    def _landed(self, link: _Link, ack: AppendAck) -> None:
        """Record one append as in the stream."""
        self._progress = self._own_progress = link.progress
        self._remember(self._sets)
        self._condition, self._match = self._sets, None
        self._read_to = ack.end.seq_num
        if self._first_seq is None:
            self._first_seq = ack.start.seq_num
        self._end_seq = ack.end.seq_num - 1
        self.appended += link.count
        self.appends += 1
        if self._after_append is not None:
            self._after_append(self)

    def _failed(self, err: ServiceError) -> None:
        """What an append that did not land (or whose outcome is unknown) means for the
        next one; raises when it is final."""
        if isinstance(err, FencingTokenMismatchError):
            self._learn(err.expected_token)
        elif isinstance(err, SeqNumMismatchError) and self._match is not None:
            self._takeover_refused()
        elif isinstance(err, NotFoundError):
            self._create_missing(err)
        elif not err.retryable:
            raise err
        elif not err.unsent:
            self._must_bump = True  # it may have landed: bump, then the marks tell

