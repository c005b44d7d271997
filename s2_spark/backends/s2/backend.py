"""S2 as a Spark backend: positions are sequence numbers.

S2 facts this relies on: a record's position is its seq_num and the tail is the next one;
command records (fence, trim) take seq_nums too, so ranges count them even when they are
filtered out; a read from a trimmed seq_num starts at the first retained record, so a gap
between the asked and the first returned seq_num is data loss; a read session bounded by
`count` ends at the tail instead of waiting.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from s2_spark.backends._batches import coalesced, read_ahead, read_in_order
from s2_spark.backends._clients import SharedClients
from s2_spark.backends.base import (
    DataLossHandler,
    RangeRead,
    ReadSettings,
    StreamBackend,
    StreamWatch,
)
from s2_spark.backends.s2.options import S2Settings, seq_num_position
from s2_spark.errors import NotFoundError, ReadPastTailError, S2Error

if TYPE_CHECKING:
    from s2_spark.s2 import S2Client
    from s2_spark.wire.records import DecodedBatch

__all__ = ["S2Backend", "seq_num_position"]

log = logging.getLogger("s2_spark.s2")

#: Ranges up to this many records (one ReadBatch at most) are read by unary reads.
UNARY_RECORDS = 1000
#: Small ranges whose reads go out together, at most this many and this many records.
WINDOW_RANGES = 256
WINDOW_RECORDS = 64_000
#: Windows read ahead, each in a thread of its own, while a task takes the current one.
WINDOWS_AHEAD = 2
#: Payload bytes of consecutive ReadBatches a catch-up read decodes together into one
#: Arrow batch: about `COALESCE_ROWS` records of 100 B, which `coalesced` then hands on
#: as they are (one decode and no concatenation per 8 frames: a third of the read's CPU).
BATCH_BYTES = 1 << 20


def _new_client(settings: S2Settings) -> S2Client:
    from s2_spark.s2 import S2Client

    return S2Client(settings.config())


_CLIENTS: SharedClients[S2Settings, S2Client] = SharedClients(_new_client)


class S2Backend(StreamBackend[int]):
    """Streams of one S2 basin. The HTTP client is built lazily in each process."""

    service = "S2"
    # seq_nums are positions, and the service keeps timestamps monotonic per stream.
    supports_filter_pushdown = True

    def __init__(self, settings: S2Settings) -> None:
        self.settings = settings

    def __repr__(self) -> str:
        return f"S2Backend({self.settings!r})"

    def _basin(self) -> Any:
        return _CLIENTS.get(self.settings).basin(self.settings.basin)

    def _stream(self, stream: str) -> Any:
        return self._basin().stream(stream)

    # -- discovery -------------------------------------------------------------------

    def list_streams(self, prefix: str) -> list[str]:
        names = [
            info.name
            for info in self._basin().list_streams(prefix=prefix)
            if info.deleted_at is None
        ]
        return sorted(names)

    def describe(self, stream: str) -> str:
        return f"stream {stream!r} in basin {self.settings.basin!r}"

    # -- positions -------------------------------------------------------------------

    def parse_position(self, value: object) -> int:
        return seq_num_position(value)

    def origin(self) -> int:
        return 0

    def _first_at(self, stream: str, **start: int) -> int:
        try:
            decoded = self._stream(stream).read(
                count=1, include_command_records=True, include_headers=False, **start
            )
        except ReadPastTailError as exc:
            return int(exc.tail.seq_num)
        if decoded.count > 0:
            return int(decoded.first_seq_num)
        if decoded.tail is not None:
            return int(decoded.tail.seq_num)
        return self.latest(stream)

    def earliest(self, stream: str) -> int:
        return self._first_at(stream, seq_num=0)

    def latest(self, stream: str) -> int:
        return int(self._stream(stream).check_tail().seq_num)

    def latest_many(self, streams: Sequence[str]) -> dict[str, int | None]:
        """The tails of many streams, looked up together (`BasinClient.check_tails`)."""
        tails = self._basin().check_tails(streams)
        return {s: None if p is None else int(p.seq_num) for s, p in tails.items()}

    def tail_watch(self) -> StreamWatch:
        """Long-polls (S2 reads with `wait`) on every watched stream, one thread."""
        return self._basin().watch_tails()  # type: ignore[no-any-return]

    def at_timestamp(self, stream: str, timestamp_ms: int) -> int:
        return self._first_at(stream, timestamp=timestamp_ms)

    def distance(self, start: int, end: int) -> int:
        return max(0, end - start)

    def advance(self, start: int, count: int) -> int:
        return start + count

    # -- reading ---------------------------------------------------------------------

    def read(
        self,
        stream: str,
        start: int,
        end: int,
        settings: ReadSettings,
        on_data_loss: DataLossHandler,
        *,
        leading_gap_ok: bool = False,
    ) -> Iterator[pa.RecordBatch]:
        """Exactly the records of [start, end), in order, in batches of about
        `COALESCE_ROWS` rows, read and decoded in a thread a few batches ahead (a range
        that fits one ReadBatch is read in the calling thread: nothing to overlap)."""
        if end <= start:
            return
        frames = self._frames(stream, start, end, settings, on_data_loss, leading_gap_ok)
        if end - start <= UNARY_RECORDS:
            yield from frames
        else:
            yield from read_ahead(lambda: coalesced(frames))

    def read_ranges(
        self,
        ranges: Sequence[RangeRead],
        settings: ReadSettings,
        on_data_loss: DataLossHandler,
    ) -> Iterator[pa.RecordBatch]:
        """Exactly the records of every range, range after range. Ranges one unary read
        may hold go in windows whose reads are sent together (`BasinClient.read_many`),
        `WINDOWS_AHEAD` windows read in threads while this one is taken: one window's
        answers decoded while the next ones' are on the way (a window at a time left the
        server idle while its answers were decoded, and the client while it answered);
        a range its read does not finish, and every larger one, is read on as `read`
        reads it, in its turn."""
        sources: list[Callable[[], Iterator[pa.RecordBatch]]] = []
        windows: list[bool] = []
        for item in _windows(ranges):
            if isinstance(item, list):
                sources.append(functools.partial(self._window, item, settings, on_data_loss))
            else:
                sources.append(functools.partial(self.read, item.stream, item.start, item.end,
                                                 settings, on_data_loss,
                                                 leading_gap_ok=item.from_origin))
            windows.append(isinstance(item, list))
        return read_in_order(sources, ahead=WINDOWS_AHEAD, prefetch=windows.__getitem__)

    def _window(self, window: Sequence[RangeRead], settings: ReadSettings,
                on_data_loss: DataLossHandler) -> Iterator[pa.RecordBatch]:
        """The records of small ranges, their first reads sent together."""
        from s2_spark.s2 import SmallRead

        firsts = self._basin().read_many(
            [SmallRead(r.stream, r.start, r.end - r.start) for r in window if r.end > r.start],
            include_command_records=settings.include_command_records,
            include_headers=settings.include_headers)
        out: list[pa.RecordBatch] = []
        results = iter(firsts)
        for r in window:
            if r.end > r.start:
                out.extend(self._frames(r.stream, r.start, r.end, settings, on_data_loss,
                                        r.from_origin, next(results)))
        return iter(out)

    def _decoded(
        self, stream: str, start: int, end: int, settings: ReadSettings,
        first: DecodedBatch | S2Error | None = None,
    ) -> Iterator[DecodedBatch]:
        """The ReadBatches of [start, end). A small range (a streaming micro-batch near the
        tail) takes unary reads, whose connections go back to the pool, where a session
        stopped at its count is closed; each continues after the last record the one
        before delivered (S2's 1 MiB cap, or an answer cut short in transit). `first`:
        the first unary read's outcome, already made (`read_ranges`); the stream's client
        is made only for a read still to make (10 us a range of a window, most of which
        its first read finishes)."""
        kept = {"include_command_records": settings.include_command_records,
                "include_headers": settings.include_headers}
        if end - start > UNARY_RECORDS:
            with self._stream(stream).read_session(
                    seq_num=start, count=end - start, batch_bytes=BATCH_BYTES,
                    **kept) as session:
                yield from session
            return
        while start < end:
            if first is None:
                decoded = self._stream(stream).read(seq_num=start, count=end - start, **kept)
            elif isinstance(first, S2Error):
                raise first
            else:
                decoded, first = first, None
            yield decoded
            if decoded.last_seq_num is None:
                return
            start = decoded.last_seq_num + 1

    def _frames(
        self,
        stream: str,
        start: int,
        end: int,
        settings: ReadSettings,
        on_data_loss: DataLossHandler,
        leading_gap_ok: bool,
        made: DecodedBatch | S2Error | None = None,
    ) -> Iterator[pa.RecordBatch]:
        """Each ReadBatch's kept records before `end`, reporting gaps as data loss
        (`made`: the first read's outcome, when it was made already)."""
        expected = start
        try:
            for decoded in self._decoded(stream, start, end, settings, made):
                if decoded.count == 0:
                    continue
                first = int(decoded.first_seq_num)  # type: ignore[arg-type]
                last = int(decoded.last_seq_num)  # type: ignore[arg-type]
                if first > expected and not (leading_gap_ok and expected == start):
                    on_data_loss(stream, expected, min(first, end))
                yield decoded.batch if last < end else _cut(decoded.batch, end)
                expected = last + 1
                if expected >= end:
                    return
        except (NotFoundError, ReadPastTailError):
            pass
        if expected < end:
            # The session ended (or the stream vanished) before the planned end.
            on_data_loss(stream, expected, end)


def _windows(ranges: Sequence[RangeRead]) -> Iterator[list[RangeRead] | RangeRead]:
    """The ranges in order: consecutive small ones in windows (lists of up to
    `WINDOW_RANGES` and `WINDOW_RECORDS`), a larger one alone."""
    window: list[RangeRead] = []
    records = 0
    for r in ranges:
        if r.end - r.start > UNARY_RECORDS:
            if window:
                yield window
                window, records = [], 0
            yield r
            continue
        window.append(r)
        records += r.end - r.start
        if len(window) >= WINDOW_RANGES or records >= WINDOW_RECORDS:
            yield window
            window, records = [], 0
    if window:
        yield window


def _cut(batch: pa.RecordBatch, end: int) -> pa.RecordBatch:
    """The rows of `batch` before seq_num `end` (seq_nums ascend, so a prefix).
    `pyarrow.compute` (60 ms to import) is imported here: a source runner never cuts."""
    import pyarrow.compute as pc

    keep = pc.sum(pc.less(batch.column("seq_num"), end)).as_py() or 0
    return batch.slice(0, keep)
