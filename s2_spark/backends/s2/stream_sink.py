"""One writer's rows for one S2 stream, appended exactly once (no pyspark).

S2 has no server-side dedup, so the sink builds it from the two append conditions S2
has: the stream's fencing token and `match_seq_num` (the lease protocol: `lease`; taking
and releasing it: `_stream_lease`).

* A writer is one attempt at writing one input partition of one logical batch
  (`WriterId`); its rows for a stream must come in the same order on every replay.
* Every data append carries, as its last record, a `fence` command setting the token to
  the writer's lease with the new progress, and is conditioned on the previous token (and
  on the tail, once known). Data and progress land atomically, and a stale writer's
  append fails.
* The lease is taken by the first data append itself: conditioned on the token the
  writer expects (a guess, until the service has shown it: the token this process last
  saw on the stream, or none for a stream it never met), its fence sets the lease. If the
  token was another, nothing landed: the writer decides again from the token the answer
  names (take, wait, or stop as stale; `lease.decide`) and sends again. So a small
  stream costs one append when the guess is right, two when it is not.
* Appends are pipelined: up to `max_inflight_appends` go out in one S2S session, each
  conditioned on the token the one before sets, so if one fails every later one fails
  too. Acks name the prefix that landed; after an error the token names the last append
  that landed, and the writer resumes after it.
* Partitions of one batch writing the same stream take turns: a writer waits while
  another partition of the same generation holds the lease and steals it only after
  `lease_timeout` seconds without progress (`on_wait` first lets the caller release the
  leases it holds elsewhere). Leases of older generations are taken over at once.
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import pyarrow as pa

from s2_spark.backends.s2._stream_lease import (
    StreamLease,
    _TakeRefused,
    guessed_token,
)
from s2_spark.backends.s2.lease import FenceRecords, LeaseToken, WriterId, decide, fence_entry
from s2_spark.backends.s2.settings import (
    DATA_MAX_BYTES,
    DATA_MAX_RECORDS,
    DEFAULT_APPENDS_IN_FLIGHT,
    FENCE_RESERVE,
    AppendBudget,
    SinkSettings,
)
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
from s2_spark.wire.appends import AppendBatch, encode_append_batches

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


def _concat_optional(
    chunks: list[tuple[pa.Array, pa.Array | None, pa.Array | None]], i: int
) -> pa.Array | None:
    """Concatenate column `i` of the chunks; chunks without it count as nulls."""
    columns: list[pa.Array | None] = [c[i] for c in chunks]
    present = [a for a in columns if a is not None]
    if not present:
        return None
    kind = present[0].type
    return pa.concat_arrays([
        a if a is not None else pa.nulls(len(c[0]), kind)
        for a, c in zip(columns, chunks, strict=True)
    ])


@dataclass(frozen=True, slots=True)
class _Link:
    """One append of a chain: data plus its fence, the token it is conditioned on, and
    the lease (with the new progress) its fence sets."""

    payload: AppendBatch
    count: int
    condition: str
    lease: LeaseToken
    token: str


Columns = tuple[pa.Array, pa.Array | None, pa.Array | None]


class StreamSink(StreamLease):
    """One writer's rows for one stream: buffered, appended exactly once, in order.

    Feed rows with `add` (Arrow arrays: bodies, optional headers and timestamps), then
    `close`. `on_wait` is called before blocking on another writer's lease so the caller
    can release the leases it holds on other streams. `budget` bounds the appends in
    flight across the streams of one writer (one sink alone: its own); once `cancel` is
    set the sink stops at its next request (another stream of the writer failed).
    """

    def __init__(
        self,
        basin: BasinClient,
        name: str,
        writer: WriterId,
        settings: SinkSettings,
        *,
        on_wait: Callable[[StreamSink], None] | None = None,
        after_append: Callable[[StreamSink], None] | None = None,
        budget: AppendBudget | None = None,
        cancel: threading.Event | None = None,
    ) -> None:
        self.name = name
        self.writer = writer
        self.settings = settings
        self._basin = basin
        self._stream: StreamClient = basin.stream(name)
        self._on_wait = on_wait
        self._after_append = after_append
        self._budget = budget or AppendBudget(settings.max_inflight_appends)
        self._cancel = cancel
        self._what = f"stream {name!r} in basin {basin.name!r}"
        # Buffered rows: chunks of (bodies, headers, timestamps); global row index of the
        # first buffered row; rows of this partition seen so far.
        self._chunks: list[Columns] = []
        self._buffered_rows = 0
        self._buffered_bytes = 0
        self._start = 0
        self._seen = 0
        # Lease state. `_lease` is the lease held, or about to be taken by the next append
        # (`_taking`), conditioned on `_last_token`: the token the stream has, as far as
        # this sink knows (a guess while `_guessed`).
        self._key = (self._stream.config.basin_base_url(basin.name)[0], basin.name, name)
        self._lease: LeaseToken | None = None
        self._taking = False
        self._last_token: str = guessed_token(self._key)
        self._guessed = True
        self._tail: int | None = None
        # A single append sent for this sink elsewhere whose outcome is unknown.
        self._unsettled: tuple[_Link, ServiceError] | None = None
        self._progress = 0  # rows of this partition known to be in the stream
        self._known = False  # whether _progress is authoritative (a lease of ours landed)
        self.last_append = 0.0
        # Appends per chain (halved after a chain that landed nothing, see _append_all).
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
    def settled(self) -> bool:
        """Whether `close` has nothing to send: no rows buffered, no lease, no outcome to
        settle."""
        return not self._chunks and self._lease is None and self._unsettled is None

    @property
    def holding(self) -> bool:
        """Whether this sink holds the stream's lease (one it took, not yet released)."""
        return self._lease is not None and not self._taking

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
        n = len(bodies)
        if n:
            self._chunks.append((bodies, headers, timestamps))
            self._buffered_rows += n
            self._buffered_bytes += bodies.nbytes + (headers.nbytes if headers is not None
                                                     else 0)
            self._seen += n
        return (self._buffered_rows >= self.settings.flush_records
                or self._buffered_bytes >= self.settings.flush_bytes)

    def flush(self) -> None:
        """Append the full appends buffered; a short last one waits for more rows."""
        self._flush(final=False)

    def close(self, *, release_in_last_append: bool = False) -> StreamWriteResult:
        """Append everything buffered and release the stream.

        `release_in_last_append`: the last data append's fence sets the released lease
        itself (the token `release` would set), saving a round trip per stream. Off by
        default so a lone sink leaves the same records as always (a release fence).
        """
        self._flush(final=True, release=release_in_last_append)
        if self._known and self._progress > self._seen:
            raise S2SparkError(
                f"{self._what} already holds {self._progress} rows of partition "
                f"{self.writer.partition} of this batch, but the input has only {self._seen}: "
                "the input is not deterministic, so exactly-once cannot hold (make each "
                "partition's rows and their order the same on every replay)"
            )
        self.release()
        return StreamWriteResult(self.name, self.appended, self._skipped, self._first_seq,
                                 self._end_seq, self.appends)

    # -- one append for the whole stream, sent with other streams' ----------------------

    def single_append(self) -> _Link | None:
        """The one append that writes every buffered row, taking the lease and releasing
        it in its fence, when the rows fit one append and the token this sink expects
        lets it take the stream at once (no wait, no read-back); else None, and the sink
        is as it was. Many streams' go out together (`PartitionWriter.close`);
        `after_single` records what became of it."""
        if (self._lease is not None or not self._chunks or self._after_append is not None
                or self._buffered_rows > self.settings.max_records):
            return None
        d = decide(self.writer, self._last_token, stolen=False, known=self._progress,
                   what=self._what)
        if d.kind != "take" or d.scan:
            return None
        columns, start = self._buffered()
        if d.progress > start:
            return None  # rows to skip: the usual path
        batches = encode_append_batches(*columns, max_records=self.settings.max_records,
                                        max_bytes=DATA_MAX_BYTES)
        if len(batches) != 1 or batches[0].metered_bytes > DATA_MAX_BYTES:
            return None
        self._lease = self.writer.lease(held=True, clean=d.clean, progress=d.progress)
        self._taking, self._tail = True, None
        return self._chain(batches, 0, 1, release_last=True)[0]

    def after_single(self, link: _Link, outcome: AppendAck | ServiceError) -> bool:
        """Record the outcome of `single_append`'s append; whether the stream is done
        (its rows in, the lease released). If not, `close` goes on as usual: from the
        token a refusal named, after creating a missing stream, or settling an unknown
        outcome by the token first."""
        if not isinstance(outcome, ServiceError):
            self._landed(link, outcome)
            self._consume(link.count)
            return True
        if isinstance(outcome, FencingTokenMismatchError):
            self._saw(outcome.expected_token)
        if isinstance(outcome, FencingTokenMismatchError | NotFoundError) or outcome.unsent:
            self._lease, self._taking = None, False  # nothing landed
        else:
            self._unsettled = (link, outcome)
        return False

    # -- appending ----------------------------------------------------------------------

    def _buffered(self) -> tuple[Columns, int]:
        """The buffered rows, and the index of the first, without taking them."""
        bodies = pa.concat_arrays([c[0] for c in self._chunks])
        columns = (bodies, _concat_optional(self._chunks, 1), _concat_optional(self._chunks, 2))
        self._chunks = [columns]
        return columns, self._start

    def _consume(self, n: int) -> None:
        """Drop the first `n` buffered rows: they are in the stream."""
        columns, start = self._buffered()
        self._keep(_sliced(columns, n), start + n)

    def _keep(self, columns: Columns, start: int) -> None:
        """Buffer exactly these rows (from row `start` on) instead."""
        bodies = columns[0]
        self._chunks = [columns] if len(bodies) else []
        self._buffered_rows = len(bodies)
        self._buffered_bytes = bodies.nbytes + (columns[1].nbytes if columns[1] is not None
                                                else 0)
        self._start = start

    def _flush(self, *, final: bool, release: bool = False) -> None:
        """Append the buffered rows an earlier attempt has not; `final`: all of them, the
        last append releasing the lease when `release` is set. When the append that was
        to take the lease finds another token, decide again and start over."""
        if self._unsettled is not None:
            link, err = self._unsettled
            self._unsettled = None
            with contextlib.suppress(_TakeRefused):
                if self._settle([link], err):
                    self._consume(link.count)
        while self._chunks:
            if self._lease is None:
                self._acquire()
            try:
                self._flush_once(final=final, release=release)
                return
            except _TakeRefused:
                continue

    def _flush_once(self, *, final: bool, release: bool) -> None:
        lease = self._lease
        assert lease is not None
        columns, start = self._buffered()
        # Rows an earlier attempt already appended are dropped, never re-sent.
        skip = min(max(0, lease.progress - start), len(columns[0]))
        if skip:
            columns = _sliced(columns, skip)
            start += skip
        if len(columns[0]) == 0:
            if self._taking:
                self._take_without_data()
            self._skipped += skip
            self._keep(columns, start)
            return
        per_append = self.settings.max_records
        batches = encode_append_batches(*columns, max_records=per_append,
                                        max_bytes=DATA_MAX_BYTES)
        for b in batches:
            if b.metered_bytes > DATA_MAX_BYTES:
                raise RecordTooLargeError(
                    f"record {start + b.first_index} of partition {self.writer.partition} for "
                    f"{self._what} is {b.metered_bytes} metered bytes; the writer accepts at "
                    f"most {DATA_MAX_BYTES} (S2's 1 MiB per append minus {FENCE_RESERVE} "
                    "bytes for the exactly-once fence record)",
                    metered_bytes=b.metered_bytes, limit=DATA_MAX_BYTES,
                )
        keep_from = len(columns[0])
        if not final and batches[-1].count < per_append:
            # A short last batch waits for more rows, so appends stay full.
            keep_from = batches[-1].first_index
            batches = batches[:-1]
        if batches:
            self._append_all(batches, release_last=final and release)
        self._skipped += skip
        self._keep(_sliced(columns, keep_from), start + keep_from)

    def _append_all(self, batches: list[AppendBatch], *, release_last: bool = False) -> None:
        """Append `batches` in order, each with its progress fence, a chain per session;
        with `release_last` the last one's fence releases the lease.

        Input k of a chain is conditioned on the token input k-1 sets (and on the tail
        once known), so nothing waits for acks: if one input fails its condition every
        later one does too. Acks say exactly which prefix landed; anything else is settled
        by reading the token back (`_settle`), and the rest is sent again until the retry
        policy's timeout passes without an append landing. A chain that fails without
        landing anything halves the next one (a network that cuts long sessions still
        lets short ones through); one that lands whole doubles it again. Raises
        `_TakeRefused` when the chain was to take the lease and the token was another.
        """
        done = 0
        loop = RetryLoop(self._stream.config.retry, f"appends to {self._what}")
        while done < len(batches):
            self._check_cancel()
            # With an `after_append` hook each append is acknowledged before the next is
            # sent, so the hook sees the stream exactly as after that append (the
            # fault-injection tests stop a writer there).
            want = 1 if self._after_append is not None else min(self._window,
                                                                len(batches) - done)
            with self._budget.hold(want) as most:
                chain = self._chain(batches, done, most, release_last=release_last)
                res = self._stream.append_chain(
                    [link.payload for link in chain],
                    fencing_tokens=[link.condition for link in chain],
                    match_seq_num=self._tail,
                )
            for link, ack in zip(chain, res.acks, strict=False):
                self._landed(link, ack)
            done += len(res.acks)
            if res.error is None:
                self._window = min(self._window * 2, self.settings.max_inflight_appends)
                continue
            if self._taking and isinstance(res.error, NotFoundError):
                self._create_missing()
                continue
            settled = self._settle(chain[len(res.acks):], res.error)
            done += settled
            if res.acks or settled:
                loop.progressed()
            else:
                self._window = max(1, self._window // 2)
                loop.failed(res.error)

    def _chain(self, batches: list[AppendBatch], first: int, limit: int, *,
               release_last: bool) -> list[_Link]:
        """The next appends to send together: at most `limit`, within the in-flight byte
        bound (at least one). With `release_last` the fence of the last of `batches` sets
        the released lease (as `release` would), so no release append follows."""
        lease = self._lease
        assert lease is not None
        links: list[_Link] = []
        progress, condition, size = lease.progress, self._last_token, 0
        for i in range(first, min(first + limit, len(batches))):
            batch = batches[i]
            if links and size + batch.metered_bytes > self.settings.max_inflight_bytes:
                break
            progress += batch.count
            held = not (release_last and i == len(batches) - 1)
            new = dataclasses.replace(lease, progress=progress, held=held)
            token = new.encode()
            entry, metered = fence_entry(token)
            payload = AppendBatch(batch.records_payload + entry, batch.count + 1,
                                  batch.metered_bytes + metered, batch.first_index)
            links.append(_Link(payload, batch.count, condition, new, token))
            condition, size = token, size + payload.metered_bytes
        return links

    def _landed(self, link: _Link, ack: AppendAck | None) -> None:
        """Record one append as in the stream (`ack` None: known from the token only). An
        append whose fence released the lease leaves the stream free, as `release` does."""
        held = link.lease.held
        self._lease = link.lease if held else None
        self._taking = False
        self._saw(link.token)
        self._progress = link.lease.progress
        self._known = True
        self._tail = ack.end.seq_num if ack is not None and held else None
        if ack is not None:
            if self._first_seq is None:
                self._first_seq = ack.start.seq_num
            self._end_seq = ack.end.seq_num - 1
        self.appended += link.count
        self.appends += 1
        self.last_append = time.monotonic()
        if self._after_append is not None:
            self._after_append(self)

    def _settle(self, unacked: list[_Link], err: ServiceError) -> int:
        """After `err` stopped a chain: how many of `unacked` landed (recorded here).

        The token names the last append that landed, since each sets its own. A chain
        that was to take the lease and landed nothing raises `_TakeRefused` (its lease is
        dropped); otherwise raises when the stream was taken over, written by someone
        else, or `err` is final.
        """
        # A token mismatch answers for the first unacked append: it did not land, nor
        # did those after it. Any other failure leaves the outcome to the token.
        definite = isinstance(err, FencingTokenMismatchError)
        if isinstance(err, FencingTokenMismatchError):
            current = err.expected_token
        elif isinstance(err, SeqNumMismatchError) or err.retryable:
            current = self._probe()
        else:
            raise err
        tokens = [link.token for link in unacked]
        if current in tokens:
            landed = tokens.index(current) + 1
            for link in unacked[:landed]:
                self._landed(link, None)
            return landed
        if current != self._last_token:
            if not definite and not unacked[-1].lease.held and FenceRecords(
                    self._stream, self._what).landed_before(tokens, self._last_token):
                # The whole chain landed, the last append freed the stream and another
                # writer has taken it since: done, not fenced.
                for link in unacked:
                    self._landed(link, None)
                return len(unacked)
            if self._taking:
                self._lease, self._taking = None, False
                self._saw(current)
                raise _TakeRefused()
            self._lease = None
            raise self._fenced(current) from None
        if isinstance(err, SeqNumMismatchError):
            raise S2SparkError(
                f"{self._what} was appended to by a writer that does not use its "
                "fencing token while this query held it; each target stream must be "
                "written by one s2-spark query only"
            ) from None
        if not err.retryable:
            raise err
        return 0



def _sliced(columns: Columns, offset: int) -> Columns:
    return (columns[0].slice(offset),
            columns[1].slice(offset) if columns[1] is not None else None,
            columns[2].slice(offset) if columns[2] is not None else None)
