"""Exactly-once appends to S2 streams from retried, restarted or stale writers (no pyspark).

S2 has no server-side dedup, so the sink builds it from the two append conditions S2
has: the stream's fencing token and `match_seq_num`.

* A writer is one attempt at writing one input partition of one logical batch (a Spark
  micro-batch, or a whole batch job): `WriterId`. Its rows for a stream must come in the
  same order every time the batch is replayed (deterministic input per partition).
* The fencing token is a lease, `LeaseToken`: who holds the stream (query, generation,
  batch, partition, attempt), whether it is held or released, and how many of that
  partition's rows for this stream are in the stream already (`progress`).
* Every data append carries, as its last record, a `fence` command setting the token to
  the writer's lease with the new progress, and is conditioned on the previous token and
  on the tail. Data and progress land atomically, and a stale writer's append fails.
* Appends are pipelined: up to `max_inflight_appends` go out in one S2S session, each
  conditioned on the token the one before sets, so if one fails every later one fails
  too. Acks name the prefix that landed; after an error the token names the last append
  that landed, and the writer resumes after it.
* A writer's last append to a stream (`PartitionWriter`) releases the lease in its own
  fence (the token `release` would set), so a small stream costs two appends: taking the
  lease and the data. If its ack is lost and another writer takes the freed stream
  meanwhile, the writer finds its releasing fence behind the other's fence records.
* One writer routes its rows to many streams (`PartitionWriter`): grouped by stream in
  one pass per input batch, each stream's rows in input order. Streams whose rows are
  all buffered when the input ends (most small ones) are written several at once, with
  at most `max_inflight_appends` appends in flight in total across the writer's streams.
* A writer takes the stream by a compare-and-set on the token. What it finds decides where
  it resumes: its own partition's latest progress, zero for a fresh batch, or a backward
  scan of the batch's fence records (after a restart or a stolen lease). Finding a newer
  generation or attempt of its own partition means it is stale: `WriterFencedError`.
* Partitions of one batch writing the same stream take turns: a writer waits while
  another partition of the same generation holds the lease and steals it only after
  `lease_timeout` seconds without progress. Before waiting it releases the leases it
  holds that none of its threads is using; a thread using a lease never waits for
  another, so writers never wait on each other in a cycle. Leases of older generations
  (a killed or restarted query) are taken over at once.

The lease token is at most 36 bytes: ``w<state><mode><query>.<gen>.<batch>.<part>.<attempt>
.<progress>`` with numbers in base 36. Fence records stay in the stream (readers skip
command records by default).
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import threading
import time
import zlib
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import wait as wait_all
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeVar

import pyarrow as pa

from s2_spark.backends._sink_rows import drop_command_rows, group_by_stream
from s2_spark.client._append_session import MAX_INPUTS_PER_SESSION
from s2_spark.errors import (
    AlreadyExistsError,
    FencingTokenMismatchError,
    NotFoundError,
    RecordTooLargeError,
    S2SparkError,
    SeqNumMismatchError,
    ServiceError,
    WriterFencedError,
)
from s2_spark.retry import RetryLoop
from s2_spark.wire.appends import AppendBatch, encode_append_batches, encode_records

if TYPE_CHECKING:
    from s2_spark.client import AppendAck, BasinClient, StreamClient

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

MAX_TOKEN_BYTES = 36
#: Metered size of the fence record that ends every data append: 8 + 2 * 1 header
#: + len("fence") + the token.
FENCE_RESERVE = 8 + 2 + len("fence") + MAX_TOKEN_BYTES
DATA_MAX_RECORDS = 999
#: Appends a writer sends before reading their acks (about 1.7 MB of 100 B rows).
DEFAULT_APPENDS_IN_FLIGHT = 16
DATA_MAX_BYTES = 1024 * 1024 - FENCE_RESERVE
#: Streams one writer works on at once (its appends in flight are bounded separately).
MAX_STREAM_WORKERS = 32
_PROBE = "w-probe"
_DIGITS = "0123456789abcdefghijklmnopqrstuvwxyz"
_T = TypeVar("_T")


class ForeignFenceError(S2SparkError):
    """The target stream is fenced with a token that s2-spark did not set."""


class _Cancelled(S2SparkError):
    """Another stream of the same writer failed first; this one stops (never reported)."""


class AppendBudget:
    """Appends one writer has in flight, across all its streams, at most `limit`.

    A stream takes permits for one request (a fence, or a chain of appends) and gives
    them back when its response is read; permits are never held while waiting for
    anything else, so holding them cannot deadlock.
    """

    def __init__(self, limit: int) -> None:
        self.limit = max(1, limit)
        self._free = self.limit
        self._cond = threading.Condition()

    @contextlib.contextmanager
    def hold(self, want: int) -> Iterator[int]:
        """Wait for a free permit, then take up to `want`; yields how many were taken."""
        with self._cond:
            self._cond.wait_for(lambda: self._free > 0)
            taken = min(max(1, want), self._free)
            self._free -= taken
        try:
            yield taken
        finally:
            with self._cond:
                self._free += taken
                self._cond.notify_all()


def _b36(n: int) -> str:
    if n < 0:
        raise ValueError(f"cannot encode negative number {n}")
    out = ""
    while True:
        n, r = divmod(n, 36)
        out = _DIGITS[r] + out
        if n == 0:
            return out


def query_key(query_id: str) -> str:
    """Three base-36 characters naming a streaming query (stable across restarts)."""
    digest = int.from_bytes(hashlib.sha256(query_id.encode()).digest()[:4], "big")
    return _b36(digest % 36**3).rjust(3, "0")


@dataclass(frozen=True, slots=True)
class WriterId:
    """One attempt at writing one partition of one logical batch.

    `streaming`: a micro-batch of query `query` (batch ids repeat across restarts);
    otherwise a batch job (each job is its own logical batch, told apart by
    `generation`). `generation`: milliseconds when the batch was planned, so a restarted
    query's replay of batch N outranks the killed run's attempts.
    """

    query: str
    streaming: bool
    generation: int
    batch: int
    partition: int
    attempt: int

    def lease(self, *, held: bool, clean: bool, progress: int) -> LeaseToken:
        return LeaseToken(held, clean, self.streaming, self.query, self.generation,
                          self.batch, self.partition, self.attempt, progress)


@dataclass(frozen=True, slots=True)
class LeaseToken:
    """A fencing token set by this sink. `clean`: every record of this logical batch in
    the stream was written by the first attempt of its partition, in this generation,
    without a stolen lease, so such an attempt can trust what it remembers."""

    held: bool
    clean: bool
    streaming: bool
    query: str
    generation: int
    batch: int
    partition: int
    attempt: int
    progress: int

    def encode(self) -> str:
        mode = "s" if self.streaming else "b"
        raw = (
            f"w{'L' if self.held else 'R'}{mode.upper() if self.clean else mode}{self.query}."
            f"{_b36(self.generation)}.{_b36(self.batch)}.{_b36(self.partition)}."
            f"{_b36(self.attempt)}.{_b36(self.progress)}"
        )
        if len(raw) > MAX_TOKEN_BYTES:
            raise S2SparkError(
                f"lease token {raw!r} exceeds S2's {MAX_TOKEN_BYTES}-byte fencing token limit "
                "(batch id, partition, attempt or row count too large)"
            )
        return raw

    @classmethod
    def parse(cls, raw: str) -> LeaseToken | None:
        """The token, or None when s2-spark did not write it."""
        if len(raw) < 7 or raw[0] != "w" or raw[1] not in "LR" or raw[2] not in "sSbB":
            return None
        head, _, rest = raw.partition(".")
        query = head[3:]
        parts = rest.split(".")
        if len(query) != 3 or len(parts) != 5:
            return None
        try:
            gen, batch, part, attempt, progress = (int(p, 36) for p in parts)
        except ValueError:
            return None
        return cls(raw[1] == "L", raw[2].isupper(), raw[2] in "sS", query, gen, batch, part,
                   attempt, progress)


@dataclass(frozen=True, slots=True)
class SinkSettings:
    """Tuning and behaviour of the sink.

    `lease_timeout`: seconds a lease held by another partition of the same generation may
    go without progress before it is taken over. `idle_release`: a held lease with no
    append for this long is released between input chunks, so waiters are not starved.
    `flush_records` / `flush_bytes`: rows buffered before they are encoded and appended.
    `max_inflight_appends`: appends one writer has sent and not yet seen acknowledged,
    in total across its streams (one stream's go out as one session). `max_inflight_bytes`
    (metered): the most one stream sends in one session before reading the acks.
    """

    create_streams: bool = False
    max_records: int = DATA_MAX_RECORDS
    lease_timeout: float = 120.0
    idle_release: float = 10.0
    poll_initial: float = 0.02
    poll_max: float = 0.05
    flush_records: int = 8 * DATA_MAX_RECORDS
    flush_bytes: int = 4 * 1024 * 1024
    max_inflight_appends: int = DEFAULT_APPENDS_IN_FLIGHT
    max_inflight_bytes: int = 8 * 1024 * 1024


@dataclass(frozen=True, slots=True)
class StreamWriteResult:
    """What one writer did to one stream: rows appended, rows found already there."""

    stream: str
    appended: int
    skipped: int
    first_seq_num: int | None
    end_seq_num: int | None
    appends: int


class _Decision:
    __slots__ = ("clean", "kind", "progress", "reason", "scan")

    def __init__(self, kind: str, *, progress: int = 0, clean: bool = False,
                 scan: bool = False, reason: str = "") -> None:
        self.kind = kind  # "take", "wait", "stale"
        self.progress = progress
        self.clean = clean
        self.scan = scan
        self.reason = reason


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


def _fence_entry(token: str) -> tuple[bytes, int]:
    """The encoded `records` entry and metered size of a fence command record."""
    from s2_spark.client import AppendRecord

    batch = encode_records([AppendRecord.fence(token, timestamp=0)])[0]
    return batch.records_payload, batch.metered_bytes


class StreamSink:
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
        self._chunks: list[tuple[pa.Array, pa.Array | None, pa.Array | None]] = []
        self._buffered_rows = 0
        self._buffered_bytes = 0
        self._start = 0
        self._seen = 0
        # Lease state.
        self._lease: LeaseToken | None = None  # held lease, None when not holding
        self._last_token: str = ""  # last token we know the stream had
        self._tail: int | None = None
        self._progress = 0  # rows of this partition known to be in the stream
        self._known = False  # whether _progress is authoritative (set on first acquire)
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
    def holding(self) -> bool:
        return self._lease is not None

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

    # -- appending ----------------------------------------------------------------------

    def _take_buffer(self) -> tuple[pa.Array, pa.Array | None, pa.Array | None]:
        bodies = pa.concat_arrays([c[0] for c in self._chunks])
        return bodies, _concat_optional(self._chunks, 1), _concat_optional(self._chunks, 2)

    def _set_buffer(self, bodies: pa.Array, headers: pa.Array | None,
                    timestamps: pa.Array | None, start: int) -> None:
        self._chunks = [(bodies, headers, timestamps)] if len(bodies) else []
        self._buffered_rows = len(bodies)
        self._buffered_bytes = bodies.nbytes + (headers.nbytes if headers is not None else 0)
        self._start = start

    def _flush(self, *, final: bool, release: bool = False) -> None:
        """Append the buffered rows an earlier attempt has not; `final`: all of them, the
        last append releasing the lease when `release` is set."""
        if not self._chunks:
            return
        if self._lease is None:
            self._acquire()
        bodies, headers, timestamps = self._take_buffer()
        start = self._start
        # Rows an earlier attempt already appended are dropped, never re-sent.
        skip = min(max(0, self._progress - start), len(bodies))
        if skip:
            self._skipped += skip
            bodies = bodies.slice(skip)
            headers = headers.slice(skip) if headers is not None else None
            timestamps = timestamps.slice(skip) if timestamps is not None else None
            start += skip
        if len(bodies) == 0:
            self._set_buffer(bodies, headers, timestamps, start)
            return
        per_append = self.settings.max_records
        batches = encode_append_batches(bodies, headers, timestamps,
                                        max_records=per_append, max_bytes=DATA_MAX_BYTES)
        for b in batches:
            if b.metered_bytes > DATA_MAX_BYTES:
                raise RecordTooLargeError(
                    f"record {start + b.first_index} of partition {self.writer.partition} for "
                    f"{self._what} is {b.metered_bytes} metered bytes; the writer accepts at "
                    f"most {DATA_MAX_BYTES} (S2's 1 MiB per append minus {FENCE_RESERVE} "
                    "bytes for the exactly-once fence record)",
                    metered_bytes=b.metered_bytes, limit=DATA_MAX_BYTES,
                )
        keep_from = len(bodies)
        if not final and batches[-1].count < per_append:
            # A short last batch waits for more rows, so appends stay full.
            keep_from = batches[-1].first_index
            batches = batches[:-1]
        if batches:
            self._append_all(batches, release_last=final and release)
        self._set_buffer(bodies.slice(keep_from),
                         headers.slice(keep_from) if headers is not None else None,
                         timestamps.slice(keep_from) if timestamps is not None else None,
                         start + keep_from)

    def _append_all(self, batches: list[AppendBatch], *, release_last: bool = False) -> None:
        """Append `batches` in order, each with its progress fence, a chain per session;
        with `release_last` the last one's fence releases the lease.

        Input k of a chain is conditioned on the token input k-1 sets (and on the tail),
        so nothing waits for acks: if one input fails its condition every later one does
        too. Acks say exactly which prefix landed; anything else is settled by reading
        the token back (`_settle`), and the rest is sent again until the retry policy's
        timeout passes without an append landing. A chain that fails without landing
        anything halves the next one (a network that cuts long sessions still lets short
        ones through); one that lands whole doubles it again, up to the in-flight bound.
        """
        done = 0
        loop = RetryLoop(self._stream.config.retry, f"appends to {self._what}")
        while done < len(batches):
            self._check_cancel()
            # With an `after_append` hook each append is acknowledged before the next is
            # sent, so the hook sees the stream exactly as after that append (the
            # fault-injection tests stop a writer there).
            want = 1 if self._after_append is not None else self._window
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
        progress, condition, size = self._progress, self._last_token, 0
        for i in range(first, min(first + limit, len(batches))):
            batch = batches[i]
            if links and size + batch.metered_bytes > self.settings.max_inflight_bytes:
                break
            progress += batch.count
            held = not (release_last and i == len(batches) - 1)
            new = dataclasses.replace(lease, progress=progress, held=held)
            token = new.encode()
            entry, metered = _fence_entry(token)
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
        self._last_token = link.token
        self._progress = link.lease.progress
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

        The token names the last append that landed, since each sets its own. Raises
        when the stream was taken over, written by someone else, or `err` is final.
        """
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
            if not unacked[-1].lease.held and self._released_before_takeover(tokens):
                # The whole chain landed, the last append freed the stream and another
                # writer has taken it since: done, not fenced.
                for link in unacked:
                    self._landed(link, None)
                return len(unacked)
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

    def _fenced(self, current: str) -> WriterFencedError:
        return WriterFencedError(
            f"{self._what} was taken over by another writer (its fencing token is now "
            f"{current!r}); this attempt (partition {self.writer.partition}, attempt "
            f"{self.writer.attempt}, batch {self.writer.batch}) is stale and stops without "
            "writing more",
            stream=self.name,
        )

    # -- the lease ----------------------------------------------------------------------

    def release(self) -> None:
        """Mark the stream free for other partitions (keeps progress in the token)."""
        lease = self._lease
        if lease is None:
            return
        self._lease = None
        released = dataclasses.replace(lease, held=False)
        raw = released.encode()
        try:
            self._fence(raw, self._last_token)
            self._last_token = raw
        except FencingTokenMismatchError as exc:
            # Everything we appended is acknowledged; whoever took over continues.
            self._last_token = exc.expected_token
        self._tail = None

    def _fence(self, token: str, current: str) -> AppendAck:
        """Set the token if it is `current`. Timestamp 0: S2 keeps timestamps monotonic, so
        the fence takes the previous record's time instead of moving the stream's clock.
        Encoded directly (a one-record Arrow encode costs 20x more, once per stream)."""
        entry, metered = _fence_entry(token)
        with self._budget.hold(1):
            return self._stream.append_payload(AppendBatch(entry, 1, metered, 0),
                                               fencing_token=current, idempotent=True)

    def _check_cancel(self) -> None:
        if self._cancel is not None and self._cancel.is_set():
            raise _Cancelled(f"{self._what}: stopped, another stream of this task failed")

    def _probe(self) -> str:
        """The stream's current fencing token, learnt from a fence that cannot match."""
        try:
            self._with_stream(lambda: self._fence(_PROBE, _PROBE))
        except FencingTokenMismatchError as exc:
            return exc.expected_token
        return _PROBE

    def _with_stream(self, op: Callable[[], object]) -> object:
        """Run `op`, creating the stream first if it is missing and createStreams is on."""
        try:
            return op()
        except NotFoundError:
            if not self.settings.create_streams:
                raise NotFoundError(
                    f"{self._what} does not exist: create it first, or set the writer "
                    "option createStreams=true", status=404, code="stream_not_found",
                ) from None
            with contextlib.suppress(AlreadyExistsError):
                self._basin.create_stream(self.name)
            return op()

    def _decide(self, raw: str, *, stolen: bool) -> _Decision:
        me = self.writer
        first = me.attempt == 0
        if raw == "":
            return _Decision("take", progress=0, clean=first)
        t = LeaseToken.parse(raw)
        if t is None:
            raise ForeignFenceError(
                f"{self._what} is fenced with a token s2-spark did not set; another writer "
                "owns it. Write to another stream, or clear the token (a fence command with "
                "an empty token) if that writer is gone"
            )
        same_query = t.query == me.query and t.streaming == me.streaming
        if me.streaming and same_query:
            if t.batch < me.batch:
                return _Decision("take", progress=0, clean=first)
            if t.batch > me.batch:
                return _Decision("stale", reason=f"micro-batch {t.batch} already wrote it")
        if not same_query or (not me.streaming and t.generation != me.generation):
            # Another query or batch job: free once released (or abandoned).
            if t.held and not stolen:
                return _Decision("wait")
            return _Decision("take", progress=0, clean=first)
        # The same logical batch.
        if t.generation > me.generation:
            return _Decision("stale", reason="a newer run of this batch writes it")
        if t.generation < me.generation:
            return _Decision("take", scan=True)
        if t.partition == me.partition:
            if t.attempt > me.attempt:
                return _Decision("stale", reason=f"attempt {t.attempt} of this task writes it")
            return _Decision("take", progress=t.progress,
                             clean=t.clean and t.attempt == me.attempt)
        if t.held and not stolen:
            return _Decision("wait")
        if t.clean and first and not stolen:
            return _Decision("take", progress=self._progress, clean=True)
        return _Decision("take", scan=True)

    def _acquire(self) -> None:
        """Take the stream's lease (compare-and-set on the token), waiting if need be."""
        raw = self._last_token
        guessed = True  # `raw` is a guess until the service has confirmed it
        seen_at = time.monotonic()
        delay = self.settings.poll_initial
        while True:
            self._check_cancel()
            stolen = (not guessed) and (time.monotonic() - seen_at >= self.settings.lease_timeout)
            d = self._decide(raw, stolen=stolen)
            if d.kind == "stale":
                raise WriterFencedError(
                    f"{self._what}: this attempt (partition {self.writer.partition}, attempt "
                    f"{self.writer.attempt}, batch {self.writer.batch}) is stale ({d.reason}) "
                    "and stops without writing", stream=self.name,
                )
            if d.kind == "wait":
                if guessed:
                    new = self._probe()
                    guessed = False
                else:
                    if self._on_wait is not None:
                        self._on_wait(self)
                    time.sleep(delay)
                    delay = min(delay * 2, self.settings.poll_max)
                    new = self._probe()
                if new != raw:
                    seen_at = time.monotonic()
                    raw = new
                continue
            progress, clean = d.progress, d.clean
            if d.scan:
                progress = max(self._scan(), self._progress if self._known else 0)
                clean = False
            lease = self.writer.lease(held=True, clean=clean and not stolen, progress=progress)
            token = lease.encode()
            try:
                ack = self._with_stream(lambda t=token, r=raw: self._fence(t, r))  # type: ignore[misc]
            except FencingTokenMismatchError as exc:
                if exc.expected_token != raw:
                    seen_at = time.monotonic()
                raw = exc.expected_token
                guessed = False
                continue
            self._lease = lease
            self._last_token = token
            self._tail = ack.end.seq_num  # type: ignore[attr-defined]
            self._progress = progress
            self._known = True
            self.last_append = time.monotonic()
            return

    def _released_before_takeover(self, chain: list[str]) -> bool:
        """Whether the last of `chain` (tokens of appends sent after the token we knew,
        the last one releasing the lease) is in the stream: the newest of them, or of the
        token we knew, found in the fence records read backwards from the tail."""
        for raw in self._tokens_backwards():
            if raw in chain:
                return raw == chain[-1]
            if raw == self._last_token:
                return False
        return False

    def _scan(self) -> int:
        """This partition's progress, from the fence records of this logical batch, read
        backwards until one of an earlier batch (or another writer) marks where this
        batch began."""
        me = self.writer
        progress = 0
        for raw in self._tokens_backwards():
            t = LeaseToken.parse(raw)
            if (t is None or t.query != me.query or t.streaming != me.streaming
                    or (me.streaming and t.batch != me.batch)
                    or (not me.streaming and t.generation != me.generation)):
                return progress
            if t.partition != me.partition:
                continue
            if t.generation > me.generation or (
                    t.generation == me.generation and t.attempt > me.attempt):
                raise WriterFencedError(
                    f"{self._what}: a newer attempt of partition {me.partition} of batch "
                    f"{me.batch} already wrote it; this attempt is stale and stops",
                    stream=self.name,
                )
            progress = max(progress, t.progress)
        return progress

    def _tokens_backwards(self) -> Iterator[str]:
        """The stream's fence tokens, newest first: read a window at a time (doubling)
        backwards from the tail."""
        hi = self._stream.check_tail().seq_num
        window = 1000
        while hi > 0:
            lo = max(0, hi - window)
            yield from reversed(self._fence_tokens(lo, hi))
            hi = lo
            window = min(window * 2, 64000)

    def _fence_tokens(self, lo: int, hi: int) -> list[str]:
        """Bodies of the fence records in [lo, hi), in order."""
        tokens: list[str] = []
        pos = lo
        while pos < hi:
            decoded = self._stream.read(seq_num=pos, count=min(1000, hi - pos),
                                        include_command_records=True)
            if decoded.count == 0:
                break
            batch = decoded.batch
            seqs = batch.column("seq_num").to_pylist()
            headers = batch.column("headers").to_pylist()
            bodies = batch.column("body").to_pylist()
            for s, h, b in zip(seqs, headers, bodies, strict=True):
                if s >= hi:
                    break
                if h and len(h) == 1 and h[0]["name"] == b"" and h[0]["value"] == b"fence":
                    tokens.append(b.decode("utf-8", "replace"))
            pos = int(seqs[-1]) + 1
        return tokens


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
            done = self._each(order, lambda sink: sink.close(release_in_last_append=True))
        finally:
            self.abort()
        by_name = {result.stream: result for result in done}
        return [by_name[name] for name in self.sinks]

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
