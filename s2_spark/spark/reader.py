"""Streaming and batch readers over a `StreamBackend`.

The driver plans: it lists streams, resolves starting/ending positions, applies admission
control and cuts ranges into partitions. Executors read: each task reads exactly one
planned range of one stream and yields the decoder's Arrow batches unchanged. Reader state
kept on the driver (AvailableNow target, last seen tails) is never needed by `read()`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, Literal, TypeVar

import pyarrow as pa
from pyspark.sql.datasource import DataSourceReader, DataSourceStreamReader, InputPartition

from s2_spark.backends._batches import coalesced
from s2_spark.backends.base import (
    LOOKUPS_IN_FLIGHT,
    DataLossHandler,
    RangeRead,
    ReadSettings,
    StreamBackend,
    StreamWatch,
)
from s2_spark.errors import DataLossError, NotFoundError
from s2_spark.spark._compat import HAS_ADMISSION_CONTROL
from s2_spark.spark._discovery import Discovery
from s2_spark.spark._stream_position import StreamTimestamp
from s2_spark.spark._trigger_hold import TriggerHold
from s2_spark.spark.options import BoundSpec, OptionError, ReadOptions
from s2_spark.spark.planning import (
    PackedPartition,
    RangePartition,
    fair_share,
    pack_ranges,
    split_ranges,
)

if TYPE_CHECKING:
    from pyspark.sql.datasource import Filter

    from s2_spark.spark._pushdown import Narrowing

__all__ = ["RangeBatchReader", "RangeStreamReader", "stream_reader"]

log = logging.getLogger("s2_spark.spark")

#: Seconds a plan that finds every stream quiet waits for a record (see `_tails`).
IDLE_WAIT = 1.0
#: Streams the tail watch cannot hold that one plan looks up (see `_unwatched_skipped`).
UNWATCHED_PER_PLAN = 256
_LOSS_HINT = "set the option failOnDataLoss=false to skip missing records and go on"


_T = TypeVar("_T")

#: A position of the backend in use; the reader never looks inside one.
Position = Any
Backend = StreamBackend[Any]


def _per_stream(fn: Callable[[str], _T], streams: Iterable[str]) -> dict[str, _T]:
    """`fn` for every stream, `LOOKUPS_IN_FLIGHT` at a time: one lookup per stream adds up."""
    names = list(streams)
    if len(names) <= 1:
        return {name: fn(name) for name in names}
    with ThreadPoolExecutor(max_workers=min(LOOKUPS_IN_FLIGHT, len(names))) as pool:
        return dict(zip(names, pool.map(fn, names), strict=True))


class _Planner:
    """Driver-side lookups shared by the batch and streaming readers."""

    def __init__(self, backend: Backend, options: ReadOptions) -> None:
        self.backend = backend
        self.options = options

    def discover(self) -> list[str]:
        """The selected streams that exist now (explicit ones must exist)."""
        selection = self.options.selection
        if selection.prefix is not None:
            return self.backend.list_streams(selection.prefix)
        return list(selection.streams)

    def _missing(self, stream: str) -> OptionError:
        return OptionError(
            f"{self.backend.describe(stream)} does not exist: create it first, or fix the "
            "stream/streams option"
        )

    def narrow(
        self, stream: str, start: Position, end: Position, narrowing: Narrowing
    ) -> tuple[Position, Position]:
        """[start, end) cut down to what pushed filters on seq_num and timestamp allow."""
        backend = self.backend
        lows, highs = [start], [end]
        if narrowing.seq_lo is not None:
            lows.append(backend.parse_position(narrowing.seq_lo))
        if narrowing.seq_hi is not None:
            highs.append(backend.parse_position(narrowing.seq_hi))
        try:
            if narrowing.ts_lo_ms is not None:
                lows.append(backend.at_timestamp(stream, narrowing.ts_lo_ms))
            if narrowing.ts_hi_ms is not None:
                highs.append(backend.at_timestamp(stream, narrowing.ts_hi_ms))
        except NotFoundError:
            raise self._missing(stream) from None
        low = start
        for pos in lows:
            if backend.is_after(pos, low):
                low = pos
        high = end
        for pos in highs:
            if backend.is_after(high, pos):
                high = pos
        return (high, high) if backend.is_after(low, high) else (low, high)

    def tail(self, stream: str) -> Position:
        try:
            return self.backend.latest(stream)
        except NotFoundError:
            raise self._missing(stream) from None

    def resolve(
        self,
        spec: BoundSpec,
        stream: str,
        *,
        default: str,
        tail: Position | None = None,
    ) -> Position:
        """Where `spec` puts `stream`; streams a JSON spec leaves out take `default`.

        `latest` is `tail` when the caller already looked it up, so one plan sees one tail;
        a time after every record before that tail (one appended since) is that tail too.
        A time, for all streams or this one (`StreamTimestamp`), is its first record at or
        after the time, or its tail when every record is older.
        """
        kind: str = spec.kind
        timestamp_ms = spec.timestamp_ms
        if kind == "positions":
            given = dict(spec.positions)
            pos = given.get(stream)
            if stream not in given:
                kind = default
            elif isinstance(pos, StreamTimestamp):
                kind, timestamp_ms = "timestamp", pos.ms
            else:
                return self.backend.parse_position(pos)
        try:
            if kind == "earliest":
                return self.backend.earliest(stream)
            if kind == "timestamp":
                found = self.backend.at_timestamp(stream, timestamp_ms)
                return tail if tail is not None and self.backend.is_after(found, tail) else found
            return self.backend.latest(stream) if tail is None else tail
        except NotFoundError:
            raise self._missing(stream) from None


def loss_handler(backend: Backend, options: ReadOptions) -> DataLossHandler:
    """Fail, or log and go on, per failOnDataLoss, when planned records are gone."""

    def on_data_loss(stream: str, start: Position, end: Position) -> None:
        span = f"records [{start}, {end})" if start != end else f"records from {start}"
        what = (
            f"{span} of {backend.describe(stream)} were planned to be read but are gone "
            "(trimmed by retention or a trim command, or the stream was deleted)"
        )
        if options.fail_on_data_loss:
            raise DataLossError(
                f"Data loss: {what}; {_LOSS_HINT}", stream=stream, start=start, end=end
            )
        log.warning("Skipping lost records (failOnDataLoss=false): %s", what)

    return on_data_loss


def plan_partitions(
    backend: Backend, options: ReadOptions, ranges: Mapping[str, tuple[Position, Position, bool]]
) -> list[RangePartition | PackedPartition]:
    """Ranges cut (long ones) and packed (small ones) into partitions, per the options."""
    parts = split_ranges(
        backend,
        ranges,
        min_partitions=options.min_partitions,
        max_records_per_partition=options.max_records_per_partition,
    )
    return pack_ranges(
        backend,
        parts,
        min_partitions=options.min_partitions,
        max_records_per_partition=options.max_records_per_partition,
        max_streams_per_partition=options.max_streams_per_partition,
    )


def read_partition(
    backend: Backend, options: ReadOptions, partition: InputPartition
) -> Iterator[pa.RecordBatch]:
    """Read one planned partition on an executor; data loss fails or is logged per option.

    A packed partition's ranges are read in their planned order (`read_ranges`: the
    backend reads small ones ahead), and their rows go out in batches of about
    `COALESCE_ROWS`."""
    on_data_loss = loss_handler(backend, options)
    settings = ReadSettings(
        include_headers=options.include_headers,
        include_command_records=options.include_command_records,
    )
    if isinstance(partition, RangePartition):
        return backend.read(partition.stream, partition.start, partition.end, settings,
                            on_data_loss, leading_gap_ok=partition.from_origin)
    assert isinstance(partition, PackedPartition)
    ranges = [RangeRead(r.stream, r.start, r.end, r.from_origin) for r in partition.ranges]
    return coalesced(backend.read_ranges(ranges, settings, on_data_loss))


class RangeStreamReader(DataSourceStreamReader):
    """Micro-batches over positions; offsets are {stream: next position}.

    This class runs on every PySpark 4.x: Spark before 4.2 calls `latestOffset()` with no
    arguments, so each micro-batch takes everything available from the last planned end.
    `AdmittedStreamReader` (4.2+) adds admission control and AvailableNow pacing.
    """

    def __init__(self, backend: Backend, options: ReadOptions) -> None:
        self._backend = backend
        self._options = options
        # trigger(availableNow=True): the tails to stop at, taken at the first plan after
        # prepareForTriggerAvailableNow (the first plan knows the start to count from).
        self._available_now = False
        self._target: dict[str, Position] | None = None
        self._reported: dict[str, Position] | None = None
        # The last end this driver process planned or was asked to read up to: the start of
        # the next micro-batch when Spark does not pass it (PySpark < 4.2).
        self._planned: dict[str, Any] = {}
        self._initial: dict[str, Any] | None = None
        # Driver only (dropped when pickled for tasks): the backend's watch (False: it has
        # none) and the last discovery (when, what).
        self._watch: StreamWatch | Literal[False] | None = None
        self._discovered: Discovery | None = None
        self._idle = False  # the last plan found nothing new
        # Streams the watch cannot hold, in the order they are looked up in turn.
        self._unwatched: list[str] = []
        # minRecordsPerTrigger (PySpark 4.2+): whether a trigger waits for more records.
        minimum = options.min_records_per_trigger
        self._hold = None if minimum is None else TriggerHold(
            minimum, options.max_trigger_delay_ms, backend, self._count_ranges)

    #: What the driver keeps for planning: positions of every stream, the watch.
    _DRIVER_ONLY = frozenset({"_target", "_reported", "_planned", "_initial", "_watch",
                              "_discovered", "_unwatched", "_hold"})

    def __getstate__(self) -> dict[str, Any]:
        """All but the driver's planning state, which pickled into every task made each
        task's start grow with the number of streams."""
        return {k: v for k, v in self.__dict__.items() if k not in self._DRIVER_ONLY}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["_backend"], state["_options"])  # type: ignore[misc]
        self.__dict__.update(state)

    def stop(self) -> None:
        if self._watch:
            self._watch.close()
        self._watch = None

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self._options!r})"

    def initialOffset(self) -> dict[str, Any]:
        """Resolved once per query: Spark asks again when it plans the first batch, and
        `latest` or a timestamp resolved anew would then start after the end it planned.

        `earliest` without a per-trigger limit is `{}`: every stream is then new to the
        first plan and read from its origin (records trimmed before are no loss), which
        spares one request per stream. A limit or a minimum needs the true first positions
        to count from."""
        if self._initial is None:
            options = self._options
            if (options.starting.kind == "earliest" and options.max_records_per_trigger is None
                    and options.min_records_per_trigger is None):
                self._initial = self._planned = {}
                return {}
            planner = _Planner(self._backend, self._options)
            self._initial = self._planned = _per_stream(
                lambda stream: planner.resolve(self._options.starting, stream, default="earliest"),
                planner.discover(),
            )
        return dict(self._initial)

    def latestOffset(self) -> dict[str, Any]:  # type: ignore[override]
        """PySpark < 4.2: from the last end planned. A new query's first call comes before
        `initialOffset()`, so the start is resolved first (a restarted query, whose start
        Spark takes from its checkpoint, plans to the tails either way)."""
        if self._initial is None:
            self.initialOffset()
        return self._plan(self._planned, max_records=None)

    def prepareForTriggerAvailableNow(self) -> None:
        self._available_now = True
        self._target = None

    def _streams(self, start: dict[str, Any]) -> set[str]:
        """The streams this plan covers: under AvailableNow those of the target not yet
        read to it; else those already read that the options still select (the others
        keep their position and are not read) and those discovery finds."""
        backend = self._backend
        if self._target is not None:
            return {s for s, end in self._target.items()
                    if s not in start or backend.is_after(end, start[s])}
        selection = self._options.selection
        return {s for s in start if selection.matches(s)} | set(self._discovery().recent())

    def _discovery(self) -> Discovery:
        """The selected streams that exist, listed again every discoveryIntervalMs
        (explicitly named streams are never listed)."""
        if self._discovered is None:
            planner = _Planner(self._backend, self._options)
            self._discovered = Discovery(planner.discover,
                                         self._options.discovery_interval_ms / 1000)
        return self._discovered

    def _tails_of_new_streams(self, start: dict[str, Any], tails: dict[str, Position],
                              plan_began: float) -> dict[str, Position]:
        """Before a prefix plan reports nothing new, the streams a listing made now finds
        that it has not seen: `processAllAvailable()` and idle queries see a stream
        created a moment ago, while busy plans list only every discoveryIntervalMs."""
        backend = self._backend
        listed_at = self._discovery().listed_at
        if (self._options.selection.prefix is None or self._target is not None
                or (listed_at is not None and listed_at >= plan_began)
                or any(s not in start or backend.is_after(t, start[s])
                       for s, t in tails.items())):
            return {}
        new = [s for s in self._discovery().now() if s not in start and s not in tails]
        found = self._backend.latest_many(new)
        return {s: tail for s, tail in found.items() if tail is not None}

    def _tail_watch(self) -> StreamWatch | None:
        """The backend's watch, started at the first plan of a query that runs on (none
        for AvailableNow, which plans a fixed set once)."""
        if self._available_now:
            return None
        if self._watch is None:
            self._watch = self._backend.tail_watch() or False
        return self._watch or None

    def _tails(self, start: dict[str, Any], hold: TriggerHold | None) -> dict[str, Position]:
        """Current tails of the streams that may have moved, capped at the AvailableNow
        target. Streams the watch knows are quiet are not asked. After a plan that found
        nothing new, this one first waits up to IDLE_WAIT seconds for a quiet stream to
        get a record: Spark asks again within milliseconds, so this way the service sees
        about one request per stream per watch wait (and per IDLE_WAIT for streams that
        cannot be watched), and an arriving record ends the wait at once. After a plan
        that `hold` held, streams are quiet at the tails it saw, which are kept, and the
        wait ends when the hold's delay does."""
        streams = self._streams(start)
        held = hold.tails(start) if hold is not None else {}
        watch = self._tail_watch()
        kept: dict[str, Position] = {}
        if watch is not None:
            known = {s: held[s] if s in held else start[s]
                     for s in streams if s in held or s in start}
            quiet = watch.quiet(known)
            if self._idle:
                held_for = hold.remaining() if hold is not None and held else IDLE_WAIT
                watch.wait(quiet, min(IDLE_WAIT, held_for))
                quiet = watch.quiet(known)
            kept = {s: held[s] for s in quiet if s in held}
            streams -= quiet
            streams -= self._unwatched_skipped(streams)
            told = watch.news_tails(streams)
            streams -= told.keys()
        else:
            told = {}
        found_tails: dict[str, Position | None] = {
            **kept, **told, **self._backend.latest_many(sorted(streams))}
        if self._available_now and self._target is None:
            self._target = {s: tail for s, tail in found_tails.items() if tail is not None}
        tails: dict[str, Position] = {}
        for stream, found in found_tails.items():
            if found is None:
                if stream in start or self._options.selection.prefix is not None:
                    continue  # deleted: nothing more to plan; a planned range reports loss
                raise _Planner(self._backend, self._options)._missing(stream)
            tail = found
            if self._target is not None and self._backend.is_after(tail, self._target[stream]):
                tail = self._target[stream]
            tails[stream] = tail
        return tails

    def _plan(self, start: dict[str, Any], *, max_records: int | None,
              hold: TriggerHold | None = None) -> dict[str, Any]:
        """The next end offset from `start`: all that is available, or a fair share of it;
        `start` itself while `hold` holds the trigger (too few new records)."""
        backend = self._backend
        began = time.monotonic()
        tails = self._tails(start, hold)
        tails.update(self._tails_of_new_streams(start, tails, began))
        self._reported = {**start, **tails}
        begin: dict[str, Position] = {}
        for stream, tail in tails.items():
            pos = start.get(stream, backend.origin())
            if stream in start and backend.is_after(pos, tail):
                self._on_truncated(stream, tail, pos, going_on=f"waiting for it to pass {pos}")
                continue
            begin[stream] = pos
        if hold is not None and hold.holds(start, begin, tails):
            end = dict(start)
        else:
            end = {**start, **self._ends(start, begin, tails, max_records)}
        if hold is not None:
            hold.planned(start, end)
        self._planned = end
        self._idle = end == start
        if self._watch:
            self._watch_from({**end, **(hold.tails(start) if hold is not None else {})})
        return end

    def _watch_from(self, positions: dict[str, Position]) -> None:
        """Have the watch wait for records at or after these positions."""
        assert self._watch
        selection = self._options.selection
        over = self._watch.watch({s: p for s, p in positions.items() if selection.matches(s)})
        if set(self._unwatched) != over:
            self._unwatched = sorted(over)

    def _count_ranges(self, ranges: Mapping[str, tuple[Position, Position]],
                      limit: int) -> dict[str, int]:
        """Records in each range, counted up to `limit` (for `TriggerHold`)."""
        backend = self._backend
        return _per_stream(lambda s: backend.measure(s, *ranges[s], limit)[0], sorted(ranges))

    def _unwatched_skipped(self, streams: set[str]) -> set[str]:
        """Of the streams the watch cannot hold, those this plan leaves alone: a plan
        looks up `UNWATCHED_PER_PLAN` of them, in turn, so each is still looked up every
        few plans but a plan's cost and requests stay bounded at any count."""
        rest = self._unwatched
        if len(rest) <= UNWATCHED_PER_PLAN:
            return set()
        self._unwatched = rest[UNWATCHED_PER_PLAN:] + rest[:UNWATCHED_PER_PLAN]
        return set(rest[UNWATCHED_PER_PLAN:]) & streams

    def _ends(self, start: dict[str, Any], begin: dict[str, Position],
              tails: dict[str, Position], max_records: int | None) -> dict[str, Position]:
        """Where the next range of each stream in `begin` ends: at its tail, or with a
        limit at its fair share of `max_records` (counted only up to the limit, which for
        a service that counts by reading is all it reads). A range that goes all the way
        ends at the tail itself, for some services a better position than the start
        advanced (one that records the stream closed); streams not read before appear
        only once they hold records."""
        backend = self._backend
        if max_records is None:
            return {s: tails[s] for s, pos in begin.items()
                    if s in start or backend.is_after(tails[s], pos)}
        counted = _per_stream(
            lambda s: backend.measure(s, begin[s], tails[s], max_records), sorted(begin))
        grant = fair_share({s: n for s, (n, _) in counted.items()}, max_records)
        ends: dict[str, Position] = {}
        for stream, n in grant.items():
            pending, whole = counted[stream]
            if whole and n == pending and (n > 0 or stream in start):
                ends[stream] = tails[stream]
            elif n > 0:
                ends[stream] = backend.advance(begin[stream], n)
        return ends

    def _on_truncated(
        self, stream: str, tail: Position, pos: Position, *, going_on: str
    ) -> None:
        """A stream now ends before what was already read: fail, or log and go on."""
        what = (
            f"{self._backend.describe(stream)} ends at {tail}, before the position {pos} "
            "already read: it was deleted and recreated, or truncated"
        )
        if self._options.fail_on_data_loss:
            raise DataLossError(
                f"Data loss: {what}; {_LOSS_HINT}", stream=stream, start=tail, end=pos
            )
        log.warning("failOnDataLoss=false: %s; %s", what, going_on)

    def reportLatestOffset(self) -> dict[str, Any] | None:
        return self._reported

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[InputPartition]:
        self._planned = dict(end)
        backend = self._backend
        origin = backend.origin()
        ranges: dict[str, tuple[Position, Position, bool]] = {}
        for stream, pos in end.items():
            if stream not in start:
                ranges[stream] = (origin, pos, True)
            elif backend.is_after(start[stream], pos):
                # Only when Spark < 4.2 planned without the start: nothing to read here.
                self._on_truncated(stream, pos, start[stream], going_on=f"reading on from {pos}")
            else:
                ranges[stream] = (start[stream], pos, False)
        return plan_partitions(backend, self._options, ranges)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return read_partition(self._backend, self._options, partition)

    def commit(self, end: dict[str, Any]) -> None:
        """Nothing to do: positions live in Spark's checkpoint, not in the service."""


def stream_reader(backend: Backend, options: ReadOptions) -> RangeStreamReader:
    """The richest stream reader this PySpark can drive."""
    if HAS_ADMISSION_CONTROL:
        from s2_spark.spark._admission import AdmittedStreamReader

        return AdmittedStreamReader(backend, options)
    return RangeStreamReader(backend, options)


#: The base `pushFilters` (None before PySpark 4.1, where nothing calls it).
_BASE_PUSH_FILTERS: Any = getattr(DataSourceReader, "pushFilters", None)


class _BoundPushFilters:
    """`RangeBatchReader.pushFilters` bound to a reader.

    PySpark 4.1+ fails every read of a reader whose `pushFilters.__func__` is not
    `DataSourceReader.pushFilters` while spark.sql.python.filterPushdown.enabled is false
    (its default), so that a source relying on pushdown does not silently lose it. This
    reader's pushdown only narrows the planned ranges, and without the conf Spark evaluates
    every filter itself, so reads must go on working as before: the bound method shows the
    base method as its `__func__`.
    """

    __func__ = staticmethod(_BASE_PUSH_FILTERS)

    def __init__(self, reader: RangeBatchReader) -> None:
        self.__self__ = reader

    def __call__(self, filters: list[Filter]) -> Iterable[Filter]:
        return self.__self__._push_filters(filters)


class _PushFilters:
    """The descriptor behind `RangeBatchReader.pushFilters` (see `_BoundPushFilters`)."""

    def __get__(self, reader: RangeBatchReader | None, owner: Any = None) -> Any:
        return self if reader is None else _BoundPushFilters(reader)


class RangeBatchReader(DataSourceReader):
    """One range per stream, [startingPosition, endingPosition), cut into partitions.

    On PySpark 4.1+ with spark.sql.python.filterPushdown.enabled=true, filters on `stream`,
    `seq_num` and `timestamp` narrow the ranges (see s2_spark.spark._pushdown) when the
    backend supports it; other backends push nothing.
    """

    def __init__(self, backend: Backend, options: ReadOptions) -> None:
        self._backend = backend
        self._options = options
        self._narrowing: Narrowing | None = None

    def __repr__(self) -> str:
        pushed = "" if not self._narrowing else f", pushed={self._narrowing.describe()!r}"
        return f"RangeBatchReader({self._options!r}{pushed})"

    pushFilters = _PushFilters()

    def _push_filters(self, filters: list[Filter]) -> Iterable[Filter]:
        """Keep what filters on stream, seq_num and timestamp allow; return the filters
        Spark must still evaluate (those not fully expressed by the narrowed ranges)."""
        if not self._backend.supports_filter_pushdown:
            return filters
        from s2_spark.spark._pushdown import translate

        narrowing, keep = translate(filters)
        self._narrowing = narrowing if narrowing else None
        if narrowing:
            log.info("Batch read narrowed by pushed filters: %s", narrowing.describe())
        return keep

    def partitions(self) -> Sequence[InputPartition]:
        backend, options = self._backend, self._options
        planner = _Planner(backend, options)
        ending = options.ending or BoundSpec("latest")
        narrowing = self._narrowing

        def bounds(stream: str) -> tuple[Position, Position, Position, Position, Position]:
            start = planner.resolve(options.starting, stream, default="earliest")
            tail = planner.tail(stream)
            end = planner.resolve(ending, stream, default="latest", tail=tail)
            lo, hi = start, end
            if narrowing is not None and not backend.is_after(start, end):
                lo, hi = planner.narrow(stream, start, end, narrowing)
            return tail, start, end, lo, hi

        streams = planner.discover()
        if narrowing is not None and narrowing.streams is not None:
            streams = [s for s in streams if s in narrowing.streams]
        ranges: dict[str, tuple[Position, Position, bool]] = {}
        for stream, (tail, start, end, lo, hi) in _per_stream(bounds, streams).items():
            if backend.is_after(end, tail):
                raise OptionError(
                    f"option endingPosition puts {backend.describe(stream)} at {end}, past "
                    f"its tail {tail}: those records do not exist yet"
                )
            if backend.is_after(start, end):
                raise OptionError(
                    f"option startingPosition puts {backend.describe(stream)} at {start}, "
                    f"after its end {end} (endingPosition "
                    f"{ending.describe()}, exclusive)"
                )
            ranges[stream] = (lo, hi, False)
        parts = plan_partitions(backend, options, ranges)
        # Spark wants at least one partition; an empty range reads nothing.
        return parts or [RangePartition("", backend.origin(), backend.origin())]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return read_partition(self._backend, self._options, partition)
