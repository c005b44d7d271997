"""One writer's rows for one S2 stream, appended exactly once (no pyspark).

S2 has no server-side dedup, so the sink builds it from the two append conditions S2
has: the stream's fencing token and `match_seq_num` (the vocabulary: `tokens`; the
decisions: `_stream_token`; docs/writing.md has the whole argument).

* A writer is one attempt at writing one input partition of one micro-batch (or batch
  job), `WriterId`; its rows for a stream must be the same rows on every replay, in any
  order.
* Every data append ends with two fence records: the writer's *mark* (who, how many of
  its partition's rows for the stream are in with it, and their digest) and the *token*
  the stream keeps after it. Data and mark land together.
* While one run of a query writes a stream, the token is the run's and stays so: every
  writer of the run conditions its appends on it without knowing who wrote last, so the
  tasks of a micro-batch write the same streams at once, one append per task and stream
  in the common case, and a writer of an earlier run is refused.
* Appends are pipelined: up to `max_inflight_appends` go out in one S2S session; S2
  applies a session's inputs in order and stops at the first that fails, so a partition's
  rows land in input order, and acks name the prefix that landed.
* When a writer cannot know what of its rows are in (a retried or speculative attempt,
  an append whose outcome was lost, a replay after a restart) it reads the marks back
  first, after a bump where another attempt of its task could still append. It skips
  its rows up to each of its partition's marks whose digest they have (the same rows in
  the same order); past the first that differs, it reads back what landed and skips
  those rows by content (`_replay`).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa

from s2_spark.backends.s2._digest import NO_ROWS, RowsDigest
from s2_spark.backends.s2._history import Landed
from s2_spark.backends.s2._replay import LandedRows, read_landed
from s2_spark.backends.s2._stream_token import StreamToken
from s2_spark.backends.s2.results import StreamWriteResult
from s2_spark.backends.s2.settings import (
    DATA_MAX_BYTES,
    DATA_MAX_RECORDS,
    DEFAULT_APPENDS_IN_FLIGHT,
    FENCE_RESERVE,
    AppendBudget,
    SinkSettings,
)
from s2_spark.backends.s2.tokens import DataMarks, WriterId, fence_entry
from s2_spark.errors import (
    FencingTokenMismatchError,
    NotFoundError,
    RecordTooLargeError,
    ReplayMismatchError,
    S2SparkError,
    SeqNumMismatchError,
    ServiceError,
)
from s2_spark.retry import RetryLoop
from s2_spark.s2._append_session import MAX_INPUTS_PER_SESSION
from s2_spark.wire.appends import AppendBatch, EncodedRecords, chunked_batches, encode_entries

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
class _Link:
    """One append: data, mark and token, the token it is conditioned on, and the
    partition's progress and digest once it lands."""

    payload: AppendBatch
    count: int
    condition: str
    progress: int
    digest: RowsDigest


class StreamSink(StreamToken):
    """One writer's rows for one stream: buffered, appended exactly once, in order.

    Feed rows with `add` (Arrow arrays: bodies, optional headers and timestamps), then
    `close`. `budget` bounds the appends in flight across the streams of one writer (one
    sink alone: its own), and `marks` encodes the writer's marks (shared by its streams;
    one sink alone: its own); once `cancel` is set the sink stops at its next request
    (another stream of the writer failed). `after_append` (tests) runs after every
    acknowledged append, each sent alone.
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
        marks: DataMarks | None = None,
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
        self._data_marks = marks or DataMarks(writer)
        self._digest = NO_ROWS  # digest of the partition's rows in the stream before _start
        self._ahead: tuple[Landed, ...] = ()  # its appends found past _start, unchecked
        # A replay in another order: the rows its partition landed past _start, being
        # found in the input (holding the input rows that are not among them meanwhile).
        self._landed_rows: LandedRows | None = None
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
        """Whether `close` has nothing left to send or check."""
        return not self._chunks and not self._replaying

    @property
    def _replaying(self) -> bool:
        """Whether rows found in the stream are still to be checked or found."""
        return bool(self._ahead) or self._landed_rows is not None

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
        return StreamWriteResult(self.name, self.appended, self._skipped, self._first_seq,
                                 self._end_seq, self.appends)

    # -- one append for the whole stream, sent with other streams' ----------------------

    def single_append(self) -> _Link | None:
        """The one append that writes every buffered row, when they fit one and nothing
        must be read or bumped first (a takeover's is conditioned on `match_seq_num` too);
        else None. Many streams' go out together (`PartitionWriter.close`);
        `after_single` records what became of each."""
        if (not self.ready or not self._chunks
                or self._after_append is not None or self._replaying
                or self._buffered_rows > self.settings.max_records):
            return None
        batches = chunked_batches(self._chunks, self.settings.max_records, DATA_MAX_BYTES)
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
        self.single_failed(outcome)
        return False

    def single_failed(self, outcome: ServiceError) -> None:
        """The one append of `single_append` (or the one a writer built for the stream in
        bulk, the same bytes) failed with `outcome`: what that means for the next one."""
        if not (outcome.unsent and outcome.retryable):
            self._failed(outcome)

    # -- appending ----------------------------------------------------------------------

    def _buffered(self) -> tuple[EncodedRecords, int]:
        """The buffered rows, and the index of the first, without taking them (in one
        buffer from then on: for a replay's checks; appends are cut from the buffers as
        they are, `chunked_batches`)."""
        if not self._chunks:
            return _NO_ROWS, self._start
        records = EncodedRecords.concat(self._chunks)
        self._chunks = [records]
        return records, self._start

    def _consume(self, n: int) -> None:
        """Drop the first `n` buffered rows: they are in the stream (the rest stay in the
        buffers they are in: no copy)."""
        self._start += n
        self._buffered_rows -= n
        if not self._buffered_rows:  # all of them (a single append's, at close)
            self._chunks, self._buffered_bytes = [], 0
            return
        chunks, k, left = self._chunks, 0, n
        while k < len(chunks) and left >= len(chunks[k]):
            left -= len(chunks[k])
            k += 1
        rest = chunks[k:]
        if left:
            rest[0] = rest[0].slice(left)
        self._chunks = rest
        self._buffered_bytes = sum(c.nbytes for c in rest)

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
        if not (self._chunks or (final and self._replaying)):
            return  # settled (most streams of a fan-out, by `PartitionWriter`'s singles)
        loop = RetryLoop(self._stream.config.retry, f"appends to {self._what}")
        refusals = 0
        while self._chunks or (final and self._replaying):
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
        one left buffered unless `final`); rows found in the stream are dropped (`_settle`;
        none while it waits for more input)."""
        if not self._settle(final=final):
            return []
        if not self._chunks:
            return []
        start, per_append = self._start, self.settings.max_records
        batches = chunked_batches(self._chunks, per_append, DATA_MAX_BYTES)
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

    # -- rows found in the stream ------------------------------------------------------

    def _settle(self, *, final: bool) -> bool:
        """Drop the buffered rows that the marks read back show in the stream: up to each
        append of the partition found (`_ahead`), as far as the input has come, where the
        digest of the rows up to it is the one its mark holds (the same rows in the same
        order; a mark from before digests is trusted by count, as then). From the first
        that differs on, find the rows that landed by content (`_find_landed`). Whether
        the rows left may be appended now (False: more input is needed first)."""
        while self._ahead and self._landed_rows is None:
            landed = self._ahead[0]
            records, start = self._buffered()
            need = landed.progress - start
            if need <= 0:
                self._ahead = self._ahead[1:]
                continue
            if len(records) < need:
                if final:
                    raise self._mismatch(f"this attempt has only {self._seen} rows for it")
                return False  # at most one append's rows wait for the rest of them
            digest = self._digest.extend(records.slice(0, need).payload)
            if landed.digest is None or digest.matches(landed.digest):
                self._drop_landed(need, digest)
                self._ahead = self._ahead[1:]
                continue
            ahead, self._ahead = self._ahead, ()
            self._landed_rows = self._read_landed(ahead, start)
        if self._landed_rows is not None:
            return self._find_landed(final=final)
        return True

    def _drop_landed(self, n: int, digest: RowsDigest) -> None:
        """The first `n` buffered rows are in the stream, with `digest` after them: drop
        them. Those whose appends' answers were lost are this writer's own; the rest an
        earlier attempt's or run's."""
        own = min(max(0, self._own_progress - self._start), n)
        self.appended += own
        self._skipped += n - own
        self._consume(n)
        self._digest = digest

    def _read_landed(self, ahead: tuple[Landed, ...], start: int) -> LandedRows:
        """The data records of the appends `ahead` (the partition's rows past `start`),
        read back."""
        first = ahead[0]
        if any(a.first < 0 for a in ahead) or first.progress - (first.end - first.first) != start:
            w = self.writer
            raise S2SparkError(
                f"{self._what}: the marks of partition {w.partition} of micro-batch {w.batch} "
                f"do not say where its rows {start}..{self._progress - 1} are, so this replay, "
                "whose rows come in another order, cannot tell which of them were written")
        rows = read_landed(self._stream, ahead, self._what)
        if rows.count != ahead[-1].progress - start:
            raise self._mismatch(f"its appends hold {rows.count} data records")
        return rows

    def _find_landed(self, *, final: bool) -> bool:
        """A replay in another order: find the landed rows among the input rows as they
        come, holding back the others (nothing is appended until every landed row is
        found); then drop those, and the held rows are appended in their new order."""
        landed = self._landed_rows
        assert landed is not None
        records, start = self._buffered()
        if len(records):
            landed.offer(records)
            self._keep(_NO_ROWS, start)
        if landed.remaining and final:
            landed.finish()
        if landed.remaining:
            if final:
                raise self._mismatch(
                    f"{landed.remaining} of them are not among this attempt's "
                    f"{self._seen} rows")
            return False
        self._skipped += landed.count
        self._digest = self._digest.extend(landed.entries())
        self._keep(landed.held() or _NO_ROWS, start + landed.count)
        self._landed_rows = None
        return True

    def _mismatch(self, why: str) -> ReplayMismatchError:
        w = self.writer
        return ReplayMismatchError(
            f"{self._what} already holds {self._progress} rows of partition {w.partition} "
            f"of micro-batch {w.batch}, written by an earlier attempt, but {why}: this "
            "replay's rows are not the rows that attempt wrote, so exactly-once cannot hold "
            "and nothing more is written. Make each partition's rows the same on every "
            "replay (their order may change)", stream=self.name)

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
        bound (at least one), each ending with this writer's mark (with the digest of
        the partition's rows so far) and the token."""
        links: list[_Link] = []
        progress, digest, condition, size = self._progress, self._digest, self._condition, 0
        sets_entry, sets_metered = fence_entry(self._sets)
        for batch in batches[first:first + limit]:
            if links and size + batch.metered_bytes > self.settings.max_inflight_bytes:
                break
            progress += batch.count
            for part in batch.records_parts():
                digest = digest.extend(part)
            mark_entry, mark_metered = fence_entry(self._data_marks.encode(progress, digest))
            payload = AppendBatch(batch.records_payload, batch.count + 2,
                                  batch.metered_bytes + mark_metered + sets_metered,
                                  batch.first_index, (*batch.more, mark_entry, sets_entry))
            links.append(_Link(payload, batch.count, condition, progress, digest))
            condition, size = self._sets, size + payload.metered_bytes
        return links

    def _landed(self, link: _Link, ack: AppendAck) -> None:
        """Record one append as in the stream."""
        self._progress = self._own_progress = link.progress
        self._digest = link.digest
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


_NO_ROWS = EncodedRecords(memoryview(b""), np.zeros(0, np.int64), np.zeros(0, np.int64))
