"""Driver lookups shared by the batch and streaming readers: which streams, where a bound
puts each, their tails, and the partitions a set of ranges makes.

Every lookup is one request per stream, so they run `LOOKUPS_IN_FLIGHT` at a time.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, TypeVar

from s2_spark.backends.base import LOOKUPS_IN_FLIGHT, StreamBackend
from s2_spark.errors import NotFoundError
from s2_spark.spark._stream_position import StreamTimestamp
from s2_spark.spark.options import BoundSpec, OptionError, ReadOptions
from s2_spark.spark.partitions import (
    PackedPartition,
    RangePartition,
    pack_ranges,
    split_ranges,
)

if TYPE_CHECKING:
    from s2_spark.spark._pushdown import Narrowing

__all__ = ["Backend", "MissingStreamError", "Planner", "Position", "per_stream",
           "plan_partitions"]

log = logging.getLogger("s2_spark.spark")

#: A position of the backend in use; the readers never look inside one.
Position = Any
Backend = StreamBackend[Any]

_T = TypeVar("_T")


def per_stream(fn: Callable[[str], _T], streams: Iterable[str]) -> dict[str, _T]:
    """`fn` for every stream, `LOOKUPS_IN_FLIGHT` at a time: one lookup per stream adds up."""
    names = list(streams)
    if len(names) <= 1:
        return {name: fn(name) for name in names}
    with ThreadPoolExecutor(max_workers=min(LOOKUPS_IN_FLIGHT, len(names))) as pool:
        return dict(zip(names, pool.map(fn, names), strict=True))


class MissingStreamError(OptionError):
    """A stream to plan does not exist, or is being deleted (`stream` names it)."""

    def __init__(self, message: str, *, stream: str | None = None) -> None:
        super().__init__(message)
        self.stream = stream  # (a default, so that a pickled one unpickles)


class Planner:
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

    def each(self, fn: Callable[[str], _T], streams: Iterable[str]) -> dict[str, _T]:
        """`fn` for every stream, as `per_stream`; under streamPrefix a stream found gone
        (deleted, or being deleted, since it was listed) is left out, not a failed plan:
        it was never read, so nothing of it is lost."""
        skipped = object()

        def one(stream: str) -> Any:
            try:
                return fn(stream)
            except MissingStreamError:
                if self.options.selection.prefix is None:
                    raise
                log.info("%s went away since it was listed; not read",
                         self.backend.describe(stream))
                return skipped

        return {s: v for s, v in per_stream(one, streams).items() if v is not skipped}

    def _missing(self, stream: str, err: NotFoundError | None = None) -> MissingStreamError:
        what = self.backend.describe(stream)
        if err is not None and err.deletion_pending:
            return MissingStreamError(
                f"{what} is being deleted, so it cannot be read: fix the stream/streams "
                "option, or create it again once the deletion is done", stream=stream)
        return MissingStreamError(
            f"{what} does not exist: create it first, or fix the stream/streams option",
            stream=stream)

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
        except NotFoundError as err:
            raise self._missing(stream, err) from None
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
        except NotFoundError as err:
            raise self._missing(stream, err) from None

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
        except NotFoundError as err:
            raise self._missing(stream, err) from None


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
