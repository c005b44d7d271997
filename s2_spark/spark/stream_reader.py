"""The streaming reader: micro-batches over positions, offsets {stream: next position}
(compact over more than `COMPACT_ABOVE` streams: `s2_spark._offset_codec`).

The driver plans (tails, admission, the tail watch, discovery); each task reads exactly one
planned partition (`_read_task`). Reader state kept on the driver (AvailableNow target,
last seen tails, the watch) is dropped from the pickles tasks get.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator, KeysView, Mapping, Sequence
from typing import Any, Literal

import pyarrow as pa
from pyspark.sql.datasource import DataSourceStreamReader, InputPartition

from s2_spark._offset_codec import OffsetCodec
from s2_spark.backends.base import StreamWatch
from s2_spark.errors import DataLossError
from s2_spark.spark._discovery import Discovery
from s2_spark.spark._planner import Backend, Planner, Position, per_stream, plan_partitions
from s2_spark.spark._read_task import LOSS_HINT, read_partition
from s2_spark.spark._trigger_hold import TriggerHold
from s2_spark.spark.options import ReadOptions
from s2_spark.spark.partitions import fair_share

__all__ = ["IDLE_WAIT", "UNWATCHED_PER_PLAN", "RangeStreamReader"]

log = logging.getLogger("s2_spark.spark")

#: Seconds a plan that finds every stream quiet waits for a record (see `_tails`).
IDLE_WAIT = 1.0
#: Streams the tail watch cannot hold that one plan looks up (see `_unwatched_skipped`).
UNWATCHED_PER_PLAN = 256


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
        # Streams found empty and not read before (absent from offsets until they hold
        # records): watched from the origin, so idle plans do not look them up each time.
        self._empty: set[str] = set()
        # Tails `latest` was resolved to, not asked again by the first plan (the watch,
        # armed from them, tells of any record that came since).
        self._fresh: dict[str, Position] = {}
        # Streams read before and found deleted, reported (failOnDataLoss=false) and not
        # watched any more; under streamPrefix they leave the offsets too.
        self._gone: set[str] = set()
        # Offsets as Spark stores them: compact over many streams.
        self._codec = OffsetCodec()
        # The last set of streams `_selected` found all selected.
        self._all_selected: set[str] | None = None
        # minRecordsPerTrigger (PySpark 4.2+): whether a trigger waits for more records.
        minimum = options.min_units_per_trigger
        self._hold = None if minimum is None else TriggerHold(
            minimum, options.max_trigger_delay_ms, backend, self._count_ranges)

    #: What the driver keeps for planning: positions of every stream, the watch.
    _DRIVER_ONLY = frozenset({"_target", "_reported", "_planned", "_initial", "_watch",
                              "_discovered", "_unwatched", "_empty", "_fresh", "_hold",
                              "_codec", "_gone", "_all_selected"})

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
            if (options.starting.kind == "earliest" and options.max_units_per_trigger is None
                    and options.min_units_per_trigger is None):
                self._initial = self._planned = {}
                return {}
            planner = Planner(self._backend, self._options)
            streams = planner.discover()
            found: dict[str, Position | None] = {}
            if options.starting.kind == "latest":
                found = self._backend.latest_many(streams)  # together, not one by one
            self._initial = self._planned = {
                **planner.each(
                    lambda stream: planner.resolve(options.starting, stream, default="earliest"),
                    [s for s in streams if found.get(s) is None]),  # missing ones: as before
                **{s: tail for s, tail in found.items() if tail is not None}}
            if options.starting.kind == "latest":
                self._fresh = dict(self._initial)
        return self._codec.encode(self._initial)

    def latestOffset(self) -> dict[str, Any]:  # type: ignore[override]
        """PySpark < 4.2: from the last end planned. A new query's first call comes before
        `initialOffset()`, so the start is resolved first (a restarted query, whose start
        Spark takes from its checkpoint, plans to the tails either way)."""
        if self._initial is None:
            self.initialOffset()
        return self._codec.encode(self._plan(self._planned, max_units=None))

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
        return self._selected(start.keys()) | set(self._discovery().recent())

    def _selected(self, streams: KeysView[str]) -> set[str]:
        """Those of `streams` the options select. Over 100,000 streams an idle plan asks
        about the same ones every time: a set that was all selected last time is not
        asked about one by one again."""
        if self._all_selected is not None and streams == self._all_selected:
            return set(self._all_selected)
        matches = self._options.selection.matches
        selected = {s for s in streams if matches(s)}
        self._all_selected = set(selected) if len(selected) == len(streams) else None
        return selected

    def _discovery(self) -> Discovery:
        """The selected streams that exist, listed again every discoveryIntervalMs
        (explicitly named streams are never listed)."""
        if self._discovered is None:
            planner = Planner(self._backend, self._options)
            self._discovered = Discovery(planner.discover,
                                         self._options.discovery_interval_ms / 1000)
        return self._discovered

    def _tails_of_new_streams(self, start: dict[str, Any], tails: dict[str, Position],
                              plan_began: float) -> dict[str, Position]:
        """Before a prefix plan reports nothing new, the streams a listing made now finds
        that it has not seen: `processAllAvailable()` and idle queries see a stream
        created a moment ago, while busy plans list only every discoveryIntervalMs. Over
        many streams (more than `QUICK_LISTING`), the listing is left to the background
        and the plan takes what it finds (`Discovery.now_if_quick`)."""
        backend = self._backend
        handed_at = self._discovery().handed_at
        if (self._options.selection.prefix is None or self._target is not None
                or (handed_at is not None and handed_at >= plan_began)
                or any(s not in start or backend.is_after(t, start[s])
                       for s, t in tails.items())):
            return {}
        listed = self._discovery().now_if_quick()
        if listed is None:
            return {}
        new = [s for s in listed if s not in start and s not in tails and s not in self._empty]
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
            origin = self._backend.origin()
            if start.keys() <= streams:  # (in C: an idle plan over many streams)
                known = {**dict.fromkeys((streams & self._empty) - start.keys(), origin),
                         **start}
            else:
                known = {s: start.get(s, origin) for s in streams
                         if s in start or s in self._empty}
            if held:
                known.update((s, held[s]) for s in streams if s in held)
            quiet = watch.quiet(known)
            if self._idle:
                held_for = hold.remaining() if hold is not None and held else IDLE_WAIT
                watch.wait(quiet, min(IDLE_WAIT, held_for))
                quiet = watch.quiet(known)
            kept = {s: held[s] for s in quiet if s in held}
            kept.update((s, p) for s, p in self._fresh.items()
                        if s in streams and start.get(s) == p)
            quiet |= kept.keys()
            self._empty &= quiet  # the others are looked up now
            streams -= quiet
            streams -= self._unwatched_skipped(streams)
            told = watch.news_tails(streams)
            streams -= told.keys()
        else:
            told = {}
        self._fresh = {}
        found_tails: dict[str, Position | None] = {
            **kept, **told, **self._backend.latest_many(sorted(streams))}
        if self._available_now and self._target is None:
            self._target = {s: tail for s, tail in found_tails.items() if tail is not None}
        tails: dict[str, Position] = {}
        for stream, found in found_tails.items():
            if found is None:
                if stream in start:
                    self._on_gone(stream, start[stream])
                    continue
                if self._options.selection.prefix is not None:
                    continue  # listed, never read, deleted since: nothing of it is lost
                raise Planner(self._backend, self._options)._missing(stream)
            self._gone.discard(stream)
            tail = found
            if self._target is not None and self._backend.is_after(tail, self._target[stream]):
                tail = self._target[stream]
            tails[stream] = tail
        return tails

    def _plan(self, start: dict[str, Any], *, max_units: int | None,
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
            end = {**start, **self._ends(start, begin, tails, max_units)}
        if self._options.selection.prefix is not None:
            for stream in self._gone & end.keys():
                del end[stream]  # not listed any more: a new stream if it comes back
        if hold is not None:
            hold.planned(start, end)
        self._planned = end
        self._idle = end == start
        origin = backend.origin()
        self._empty -= end.keys()
        self._empty.update(s for s, t in tails.items()
                           if s not in end and not backend.is_after(t, origin))
        if self._watch:
            self._watch_from({**end, **dict.fromkeys(self._empty, origin),
                              **(hold.tails(start) if hold is not None else {})})
        return end

    def _watch_from(self, positions: dict[str, Position]) -> None:
        """Have the watch wait for records at or after these positions."""
        assert self._watch
        selected = self._selected(positions.keys())
        if self._gone or len(selected) != len(positions):
            positions = {s: p for s, p in positions.items()
                         if s in selected and s not in self._gone}
        over = self._watch.watch(positions)
        if set(self._unwatched) != over:
            self._unwatched = sorted(over)

    def _count_ranges(self, ranges: Mapping[str, tuple[Position, Position]],
                      limit: int) -> dict[str, int]:
        """Records in each range, counted up to `limit` (for `TriggerHold`)."""
        backend = self._backend
        return per_stream(lambda s: backend.measure(s, *ranges[s], limit)[0], sorted(ranges))

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
              tails: dict[str, Position], max_units: int | None) -> dict[str, Position]:
        """Where the next range of each stream in `begin` ends: at its tail, or with a
        limit at its fair share of `max_units` (counted only up to the limit, which for
        a service that counts by reading is all it reads). A range that goes all the way
        ends at the tail itself, for some services a better position than the start
        advanced (one that records the stream closed); streams not read before appear
        only once they hold records."""
        backend = self._backend
        if max_units is None:
            return {s: tails[s] for s, pos in begin.items()
                    if s in start or backend.is_after(tails[s], pos)}
        counted = per_stream(
            lambda s: backend.measure(s, begin[s], tails[s], max_units), sorted(begin))
        grant = fair_share({s: n for s, (n, _) in counted.items()}, max_units)
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
                f"Data loss: {what}; {LOSS_HINT}", stream=stream, start=tail, end=pos
            )
        log.warning("failOnDataLoss=false: %s; %s", what, going_on)

    def _on_gone(self, stream: str, pos: Position) -> None:
        """A stream read before is deleted (or being deleted): what was appended to it
        since the last plan may never be read. Fail, or log once and go on without it,
        per failOnDataLoss (as Spark's Kafka source does for a deleted topic)."""
        if stream in self._gone:
            return
        what = (
            f"{self._backend.describe(stream)} was deleted (or is being deleted) after it "
            f"was read up to {pos}: records appended to it since may never have been read"
        )
        if self._options.fail_on_data_loss:
            raise DataLossError(
                f"Data loss: {what}; {LOSS_HINT}", stream=stream, start=pos, end=None
            )
        log.warning("failOnDataLoss=false: %s; going on with the other streams", what)
        self._gone.add(stream)

    def reportLatestOffset(self) -> dict[str, Any] | None:
        return None if self._reported is None else self._codec.encode(self._reported)

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[InputPartition]:
        start, end = self._codec.decode(start), self._codec.decode(end)
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
