"""The small interface the Spark layer needs from a stream service.

The Spark layer (offsets, admission control, partitions, readers) is protocol-neutral: it
plans ranges of positions per stream and asks a backend to list streams, resolve start and
end positions, and read one range as Arrow record batches. A position is a JSON value owned
by the backend (for S2, the next sequence number); the Spark layer stores it in offsets
as-is and only compares, counts, advances and splits positions through the backend.

Backends raise the service-neutral errors of `s2_spark.errors` (`NotFoundError` when a
stream does not exist, `DataLossError`, `UnavailableError`, ...); each service's own
errors derive from them, so the Spark layer catches no service's class.

Nothing here imports pyspark.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar

import pyarrow as pa

from s2_spark.backends._batches import read_in_order
from s2_spark.errors import NotFoundError

__all__ = [
    "LOOKUPS_IN_FLIGHT",
    "PREFETCH_RECORDS",
    "READS_IN_FLIGHT",
    "DataLossHandler",
    "PositionT",
    "RangeRead",
    "ReadSettings",
    "StreamBackend",
    "StreamWatch",
]

#: A position in one stream, as stored in offsets: any non-null JSON value the backend
#: chooses (S2: the next seq_num; Durable Streams: an object, see backends.durable).
PositionT = TypeVar("PositionT")

#: Called by `StreamBackend.read` for records of a planned range that are gone:
#: (stream, first missing position, end of the missing run, exclusive).
DataLossHandler = Callable[[str, Any, Any], None]


#: Lookups (tails) a backend sends at the same time by default.
LOOKUPS_IN_FLIGHT = 32
#: Small ranges of a packed partition read at the same time by default, and the size
#: (records) of a range that may be read ahead of its turn.
READS_IN_FLIGHT = 16
PREFETCH_RECORDS = 1000


@dataclass(frozen=True, slots=True)
class RangeRead:
    """Positions [start, end) of one stream; `from_origin`: a gap at `start` is no loss
    (the stream was read from its origin, and trimmed before it was found)."""

    stream: str
    start: Any
    end: Any
    from_origin: bool = False


@dataclass(frozen=True, slots=True)
class ReadSettings:
    """What a range read returns: record headers, and command records or not."""

    include_headers: bool = True
    include_command_records: bool = False


class StreamWatch(Protocol):
    """Which streams may have new records, learnt by waiting on the service rather than
    asking it on every plan (Spark plans an idle query every few milliseconds).

    `watch` names the streams and the positions planned so far, and returns those it
    cannot hold (more than the process may keep connections for): the caller looks those
    up itself. `quiet` says which of the others certainly have nothing at or after those
    positions (a record appended a moment ago may still be on its way: it shows at a
    later plan); `news_tails` gives, for streams that got records, the tail their news
    came with where it came with one and nothing came after it since (the caller may plan
    up to it without asking); `wait` returns when one of `streams` stops being quiet, or
    after `timeout` seconds.
    """

    def watch(self, positions: Mapping[str, Any]) -> set[str]: ...

    def news_tails(self, streams: Iterable[str]) -> dict[str, Any]: ...

    def quiet(self, positions: Mapping[str, Any]) -> set[str]: ...

    def wait(self, streams: Iterable[str], timeout: float) -> None: ...

    def close(self) -> None: ...


class StreamBackend(ABC, Generic[PositionT]):
    """One service's streams, as positions and ranges.

    Instances are pickled into Spark tasks: keep connections out of the pickled state and
    credentials out of `repr`.
    """

    #: Name of the service, used in messages ("S2").
    service: str = ""

    #: Whether batch reads may narrow their ranges by filters on the rows' `stream`,
    #: `seq_num` and `timestamp` columns: a record's `seq_num` is its position
    #: (`parse_position(seq_num)`), and record timestamps (epoch millis) never decrease
    #: along a stream, so `at_timestamp` splits a stream into records before and at or
    #: after a time. Services whose rows lack these columns keep the default.
    supports_filter_pushdown: bool = False

    # -- discovery -------------------------------------------------------------------

    @abstractmethod
    def list_streams(self, prefix: str) -> list[str]:
        """Names of the live streams starting with `prefix`, sorted."""

    @abstractmethod
    def describe(self, stream: str) -> str:
        """How to name `stream` in messages (e.g. "stream 'x' in basin 'b'")."""

    # -- positions -------------------------------------------------------------------

    @abstractmethod
    def parse_position(self, value: object) -> PositionT:
        """Validate a position a user wrote in JSON; ValueError says what is accepted."""

    @abstractmethod
    def origin(self) -> PositionT:
        """Where a stream that was never read begins (before any trimming)."""

    @abstractmethod
    def earliest(self, stream: str) -> PositionT:
        """The first position still readable (after trimming), or the tail if none."""

    @abstractmethod
    def latest(self, stream: str) -> PositionT:
        """The tail: the position the next appended record will take.

        Raises `s2_spark.errors.NotFoundError` (service-neutral) when the stream does not
        exist, as `earliest` and `at_timestamp` do.
        """

    def latest_many(self, streams: Sequence[str]) -> dict[str, PositionT | None]:
        """`latest` of each stream (None where it does not exist), `LOOKUPS_IN_FLIGHT` at
        a time; services that can send many lookups together do better."""
        def one(stream: str) -> PositionT | None:
            try:
                return self.latest(stream)
            except NotFoundError:
                return None

        if len(streams) <= 1:
            return {s: one(s) for s in streams}
        with ThreadPoolExecutor(max_workers=min(LOOKUPS_IN_FLIGHT, len(streams))) as pool:
            return dict(zip(streams, pool.map(one, streams), strict=True))

    def tail_watch(self) -> StreamWatch | None:
        """A watch over many streams for an idle streaming query (driver only), or None
        when the service offers no way to wait for records: then every plan looks up
        every stream's tail."""
        return None

    @abstractmethod
    def at_timestamp(self, stream: str, timestamp_ms: int) -> PositionT:
        """The first position whose record is at or after `timestamp_ms`, or the tail."""

    @abstractmethod
    def distance(self, start: PositionT, end: PositionT) -> int | None:
        """How many positions lie in [start, end) (0 when end <= start), or None when the
        service cannot tell without reading the range (Durable Streams offsets are
        opaque): then only `measure` counts, by reading."""

    def is_after(self, a: PositionT, b: PositionT) -> bool:
        """Whether position `a` lies after position `b`."""
        return (self.distance(b, a) or 0) > 0

    def measure(
        self, stream: str, start: PositionT, end: PositionT, limit: int
    ) -> tuple[int, bool]:
        """Records in [start, end), counted up to `limit`: (count, whether that is all of
        them). For pacing: a service that must read to count reads at most `limit`."""
        n = self.distance(start, end)
        assert n is not None, f"{type(self).__name__} must count ranges in measure()"
        return min(n, limit), n <= limit

    @abstractmethod
    def advance(self, start: PositionT, count: int) -> PositionT:
        """The position `count` records after `start`."""

    # -- reading ---------------------------------------------------------------------

    def read_ranges(
        self,
        ranges: Sequence[RangeRead],
        settings: ReadSettings,
        on_data_loss: DataLossHandler,
    ) -> Iterator[pa.RecordBatch]:
        """Exactly the records of every range, range after range (a packed partition).
        Meanwhile up to `READS_IN_FLIGHT` of the small ranges that follow (at most
        `PREFETCH_RECORDS` records) are read ahead; services that can send many small
        reads together do better."""
        def reader(r: RangeRead) -> Callable[[], Iterator[pa.RecordBatch]]:
            return lambda: self.read(r.stream, r.start, r.end, settings, on_data_loss,
                                     leading_gap_ok=r.from_origin)

        def small(i: int) -> bool:
            n = self.distance(ranges[i].start, ranges[i].end)
            return n is not None and n <= PREFETCH_RECORDS

        return read_in_order([reader(r) for r in ranges], ahead=READS_IN_FLIGHT,
                             prefetch=small)

    @abstractmethod
    def read(
        self,
        stream: str,
        start: PositionT,
        end: PositionT,
        settings: ReadSettings,
        on_data_loss: DataLossHandler,
        *,
        leading_gap_ok: bool = False,
    ) -> Iterator[pa.RecordBatch]:
        """Exactly the records of [start, end), in order, as Arrow batches.

        The batches follow the decoder's read schema (with or without headers, per
        `settings`). Positions of the range that are gone are reported to `on_data_loss`
        and skipped; `leading_gap_ok` means a gap right at `start` is not loss (a stream
        read from its origin whose first records were trimmed before it was discovered).
        """
