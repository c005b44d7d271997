"""Durable Streams as a Spark backend: exact replay over opaque offsets.

The protocol gives offsets only at response boundaries, a catch-up read runs from its
offset to wherever the server decides (the reference server: to the tail), and nothing
bounds a read at an end offset. Streams are append-only, so a read from one offset always
returns the same prefix. A position is therefore

    {"offset": O, "skip": k, "seen": n}

the point `k` units after the server offset `O`, where a unit is a message (JSON streams)
or a byte (other content types), and `n` counts units from the position the query began
at, so positions of one stream compare and subtract by `seen` alone. The tail is found by a
counting pass on the driver (`tail_after`: read from the last planned position to the
tail, count, and take the last response's offset). An executor reads a range [a, b) as:
catch-up from `a.offset`, drop `a.skip` units, take exactly `b.seen - a.seen`, stop. A
replay after more appends receives longer responses and cuts at the same unit, so a
micro-batch holds exactly the same rows. A tail position that reached the end of a closed
stream carries `"closed": true`.

Both passes read responses piece by piece (`DurableStream.read_pieces`): the reference
server answers a catch-up read with the whole backlog, and neither the driver nor a task
holds more than a piece of it (plus the rows of one Arrow batch).

Nothing here imports pyspark.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
import pyarrow as pa

from s2_spark.backends.base import DataLossHandler, ReadSettings, StreamBackend
from s2_spark.backends.durable_options import DurableSettings
from s2_spark.errors import (
    MalformedResponseError,
    NotFoundError,
    OffsetGoneError,
    StreamNotFoundError,
)

if TYPE_CHECKING:
    from s2_spark.durable import DurableStream, DurableStreamsClient, PieceReader, ReadPiece

__all__ = [
    "BYTES_ROW_LIMIT",
    "DurableBackend",
    "Position",
    "StreamKind",
    "check_offset_position",
    "read_schema_for",
]

log = logging.getLogger("s2_spark.durable")

#: JSON streams count messages, other content types count bytes.
StreamKind = Literal["json", "bytes"]
Position = dict[str, Any]

#: Rows of a byte stream hold at most this many bytes, cut from the range's start.
BYTES_ROW_LIMIT = 1 << 20
#: Arrow batches handed to Spark hold at most this many rows (slices, no copies).
_BATCH_ROWS = 1 << 16

_CLIENTS: dict[DurableSettings, DurableStreamsClient] = {}
_CLIENTS_LOCK = threading.Lock()


def check_offset_position(value: object) -> str:
    """A position a user wrote: an offset string the server gave, or "-1" (the start)."""
    if not isinstance(value, str) or not value or any(ord(c) < 0x21 for c in value):
        raise ValueError(
            "a Durable Streams position is an offset string from Stream-Next-Offset, or '-1' "
            f"for the start (got {value!r})"
        )
    if value == "now":
        raise ValueError("'now' is not a fixed position: use 'latest' instead of a JSON object")
    return value


def read_schema_for(kind: StreamKind) -> pa.Schema:
    """The rows a read returns, as Arrow (the Spark layer mirrors it)."""
    value = pa.string() if kind == "json" else pa.binary()
    return pa.schema(
        [
            pa.field("stream", pa.string()),
            pa.field("offset", pa.string()),
            pa.field("index", pa.int64()),
            pa.field("value", value),
        ]
    )


def _position(offset: str, skip: int, seen: int, closed: bool = False) -> Position:
    pos: Position = {"offset": offset, "skip": skip, "seen": seen}
    if closed:
        pos["closed"] = True
    return pos


@dataclass(frozen=True, slots=True)
class _Count:
    """What a counting pass found: units from its offset to the tail, and the tail."""

    units: int
    tail: str
    closed: bool


class DurableBackend(StreamBackend[Position]):
    """Durable Streams named by URL or path; one content kind for every stream read."""

    service = "Durable Streams"

    def __init__(self, settings: DurableSettings, kind: StreamKind) -> None:
        self.settings = settings
        self.kind = kind
        # The driver's last count per stream, (from offset, count): a paced query plans
        # from the same offset many times, and counts only what arrived since.
        self._counted: dict[str, tuple[str, _Count]] = {}

    def __repr__(self) -> str:
        return f"DurableBackend({self.settings!r}, kind={self.kind!r})"

    def _client(self) -> DurableStreamsClient:
        with _CLIENTS_LOCK:
            client = _CLIENTS.get(self.settings)
            if client is None:
                from s2_spark.durable import DurableStreamsClient

                client = _CLIENTS[self.settings] = DurableStreamsClient(self.settings.config())
        return client

    def _stream(self, stream: str) -> DurableStream:
        return self._client().stream(stream)  # a URL, or a path under baseUrl

    def _pieces(self, stream: str, offset: str) -> PieceReader:
        """Catch-up read in bounded pieces (answers without a content type are taken to
        be of this backend's kind)."""
        kind_type = "application/json" if self.kind == "json" else None
        return self._stream(stream).read_pieces(offset, content_type=kind_type)

    def _missing(self, stream: str, err: StreamNotFoundError | OffsetGoneError) -> NotFoundError:
        return NotFoundError(
            f"{self.describe(stream)} does not exist or is gone ({err})", status=err.status
        )

    # -- discovery -------------------------------------------------------------------

    def list_streams(self, prefix: str) -> list[str]:
        raise NotImplementedError("the Durable Streams protocol cannot list streams")

    def describe(self, stream: str) -> str:
        return f"Durable Stream {stream!r}"

    def content_kind(self, stream: str) -> StreamKind:
        """The kind of `stream` from its content type (HEAD)."""
        try:
            info = self._stream(stream).head()
        except (StreamNotFoundError, OffsetGoneError) as err:
            raise self._missing(stream, err) from None
        ctype = (info.content_type or "").split(";")[0].strip().lower()
        return "json" if ctype == "application/json" else "bytes"

    # -- positions -------------------------------------------------------------------

    def parse_position(self, value: object) -> Position:
        return _position(check_offset_position(value), 0, 0)

    def origin(self) -> Position:
        return _position("-1", 0, 0)

    def earliest(self, stream: str) -> Position:
        self.content_kind(stream)  # the stream must exist
        return self.origin()

    def latest(self, stream: str) -> Position:
        try:
            info = self._stream(stream).head()
        except (StreamNotFoundError, OffsetGoneError) as err:
            raise self._missing(stream, err) from None
        return _position(info.next_offset, 0, 0, info.closed)

    def at_timestamp(self, stream: str, timestamp_ms: int) -> Position:
        raise NotImplementedError("Durable Streams messages carry no timestamps")

    def distance(self, start: Position, end: Position) -> int:
        return max(0, int(end["seen"]) - int(start["seen"]))

    def advance(self, start: Position, count: int) -> Position:
        return _position(start["offset"], start["skip"] + count, start["seen"] + count)

    def tail_after(
        self, stream: str, start: Position, on_data_loss: DataLossHandler
    ) -> Position:
        """Count from `start`'s offset to the tail (one catch-up read on the reference
        server): the tail's offset with `seen` continued from `start`.

        When `start` is gone (410) but the stream is not, the loss is reported; if that
        returns (failOnDataLoss=false), the count restarts at the first retained message,
        which is where executors read such a range from (see `read`).
        """
        try:
            counted = self._count(stream, start["offset"])
        except OffsetGoneError:
            self.latest(stream)  # a stream gone as a whole raises NotFoundError
            on_data_loss(stream, start, start)
            counted = self._count(stream, "-1")
            return _position(counted.tail, 0, start["seen"] + counted.units, counted.closed)
        if counted.units < start["skip"]:
            raise MalformedResponseError(
                f"{self.describe(stream)} holds {counted.units} units after offset "
                f"{start['offset']!r}, fewer than the {start['skip']} already read from "
                "there: the stream's content changed",
                code="content_changed",
            )
        seen = start["seen"] - start["skip"] + counted.units
        return _position(counted.tail, 0, seen, counted.closed)

    def locate(self, stream: str, value: object, start: Position) -> Position:
        """An end offset as a position: units from `start` to it are the difference of two
        counts to the same tail (the protocol has no read bounded at an end offset)."""
        end = check_offset_position(value)
        for _ in range(5):
            to_tail = self._count(stream, end)
            from_start = self._count(stream, start["offset"])
            if from_start.tail == to_tail.tail:  # no append between the two counts
                units = from_start.units - to_tail.units - start["skip"]
                if units < 0:
                    raise ValueError(
                        f"the end offset {end!r} of {self.describe(stream)} lies before the "
                        "start position"
                    )
                return _position(end, 0, start["seen"] + units)
        raise RuntimeError(
            f"{self.describe(stream)} kept growing while its end offset {end!r} was located; "
            "try again, or end at 'latest'"
        )

    def _count(self, stream: str, offset: str) -> _Count:
        """Units from `offset` to the tail; continues the last count from the same offset
        (streams are append-only, so counts from one offset only grow)."""
        known = self._counted.get(stream)
        if known is not None and known[0] == offset:
            more = self._count_from(stream, known[1].tail)
            counted = _Count(known[1].units + more.units, more.tail, more.closed)
        else:
            counted = self._count_from(stream, offset)
        self._counted[stream] = (offset, counted)
        return counted

    def _count_from(self, stream: str, offset: str) -> _Count:
        units, tail, closed = 0, offset, False
        try:
            with self._pieces(stream, offset) as pieces:
                for piece in pieces:
                    self._check_kind(piece)
                    units += piece.units
                    if piece.last:
                        tail, closed = piece.next_offset, piece.closed
        except StreamNotFoundError as err:
            raise self._missing(stream, err) from None
        return _Count(units, tail, closed)

    def _check_kind(self, piece: ReadPiece) -> None:
        if self.kind == "json" and piece.content_type is not None and not piece.json_mode:
            raise MalformedResponseError(
                f"a stream read as JSON answered with content type {piece.content_type!r}: "
                "was it deleted and recreated with another content type?",
                code="content_type_changed",
            )

    # -- reading ---------------------------------------------------------------------

    def read(
        self,
        stream: str,
        start: Position,
        end: Position,
        settings: ReadSettings,
        on_data_loss: DataLossHandler,
        *,
        leading_gap_ok: bool = False,
    ) -> Iterator[pa.RecordBatch]:
        want = self.distance(start, end)
        if want == 0:
            return
        cut = _RangeCut(self, stream, start["offset"], int(start["skip"]), want, end)
        try:
            yield from cut.batches()
            return
        except (StreamNotFoundError, OffsetGoneError, _EndedEarly):
            on_data_loss(stream, start, end)  # raises unless failOnDataLoss=false
        if cut.rows or cut.gone is None:
            return
        # failOnDataLoss=false and the offset is gone (410, retention): read on from the
        # first retained message, as many units as the plan counted.
        log.warning("%s: reading %d units from its start instead", self.describe(stream), want)
        try:
            yield from _RangeCut(self, stream, "-1", 0, want, None).batches()
        except (StreamNotFoundError, OffsetGoneError, _EndedEarly):
            on_data_loss(stream, start, end)


class _EndedEarly(Exception):
    """The stream holds fewer units than planned (it was deleted, recreated or trimmed)."""


class _RangeCut:
    """Read `want` units from `skip` units after `offset`, as rows, checking the plan."""

    def __init__(
        self,
        backend: DurableBackend,
        stream: str,
        offset: str,
        skip: int,
        want: int,
        end: Position | None,
    ) -> None:
        self.backend = backend
        self.stream = stream
        self.offset = offset
        self.skip = skip
        self.want = want
        self.end = end
        self.schema = read_schema_for(backend.kind)
        self.index = skip  # units after `offset` before the next row
        self.pending = bytearray()  # byte streams: the row being filled
        self.rows = 0  # rows yielded so far
        self.gone: OffsetGoneError | None = None

    def batches(self) -> Iterator[pa.RecordBatch]:
        for batch in self._batches():
            self.rows += batch.num_rows
            yield batch

    def _batches(self) -> Iterator[pa.RecordBatch]:
        backend, taken, passed = self.backend, 0, 0
        with backend._pieces(self.stream, self.offset) as reader:
            for piece in self._pieces(reader):
                backend._check_kind(piece)
                units = piece.units
                lo = min(max(self.skip - passed, 0), units)
                hi = min(lo + self.want - taken, units)
                passed += units
                if hi > lo:
                    yield from self._rows(piece, lo, hi)
                    taken += hi - lo
                if piece.last or taken == self.want:
                    self._check_boundary(piece.next_offset, taken)
                if taken == self.want:
                    break
        if self.pending:
            yield self._bytes_row()
        if taken < self.want:
            raise _EndedEarly()

    def _pieces(self, reader: Iterator[ReadPiece]) -> Iterator[ReadPiece]:
        try:
            yield from reader
        except OffsetGoneError as err:
            self.gone = err
            raise

    def _check_boundary(self, next_offset: str, taken: int) -> None:
        """A response boundary at the planned end offset must come exactly at the planned
        count (offsets are unique and ordered: an overshoot is detectable)."""
        end = self.end
        if end is None or end["skip"] != 0:
            return
        at_end = next_offset == end["offset"]
        if (at_end and taken != self.want) or (taken == self.want and next_offset < end["offset"]):
            raise MalformedResponseError(
                f"{self.backend.describe(self.stream)} no longer matches the planned range "
                f"ending at offset {end['offset']!r} ({taken} of {self.want} units read at "
                f"offset {next_offset!r}): the stream was recreated or rewritten",
                code="content_changed",
            )

    def _rows(self, piece: ReadPiece, lo: int, hi: int) -> Iterator[pa.RecordBatch]:
        if piece.messages is None:
            yield from self._byte_rows(memoryview(piece.data)[lo:hi])
            return
        values = piece.messages.slice(lo, hi - lo)
        for at in range(0, len(values), _BATCH_ROWS):
            part = values.slice(at, _BATCH_ROWS)
            yield self._batch(part, self.index)
            self.index += len(part)

    def _byte_rows(self, data: memoryview) -> Iterator[pa.RecordBatch]:
        while data:
            room = BYTES_ROW_LIMIT - len(self.pending)
            self.pending += data[:room]
            data = data[room:]
            if len(self.pending) == BYTES_ROW_LIMIT:
                yield self._bytes_row()

    def _bytes_row(self) -> pa.RecordBatch:
        row = self._batch(pa.array([bytes(self.pending)], pa.binary()), self.index)
        self.index += len(self.pending)
        self.pending = bytearray()
        return row

    def _batch(self, values: pa.Array, first_index: int) -> pa.RecordBatch:
        n = len(values)
        index = pa.array(np.arange(first_index, first_index + n, dtype=np.int64))
        columns = [_repeat(self.stream, n), _repeat(self.offset, n), index, values]
        return pa.RecordBatch.from_arrays(columns, schema=self.schema)


def _repeat(text: str, n: int) -> pa.Array:
    """A string column of `n` copies of `text`, built from buffers (no Python list)."""
    data = text.encode()
    offsets = np.arange(n + 1, dtype=np.int32) * len(data)
    return pa.StringArray.from_buffers(n, pa.py_buffer(offsets), pa.py_buffer(data * n))
