"""Durable Streams as a Spark backend: exact replay over opaque offsets.

The protocol gives offsets only at response boundaries, a catch-up read runs from its
offset to wherever the server decides (the reference server: to the tail), and nothing
bounds a read at an end offset. Streams are append-only, so a read from one offset always
returns the same prefix. A position is therefore

    {"offset": O, "skip": k}

the point `k` units after the server offset `O`, where a unit is a message (JSON streams)
or a byte (other content types); `"closed": true` marks a tail that is the end of a
closed stream. Positions need no count from anywhere else, so a restarted query plans
with or without Spark handing it the start (PySpark < 4.2 does not).

An unpaced micro-batch ends at each stream's tail from HEAD (`Stream-Next-Offset`), one
request per stream and no data read on the driver. The executor reads the range once and
cuts exactly at that boundary (`_range`). A paced micro-batch counts, on the
driver, only up to its limit (`measure`), and may end inside an answer as `(offset, skip)`.

Reads take responses piece by piece (`DurableStream.read_pieces`): the reference server
answers a catch-up read with the whole backlog, and neither the driver nor a task holds
more than a piece of it (plus the rows of one Arrow batch and the units held back from the
answer that steps over the range's end).

Nothing here imports pyspark.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa

from s2_spark.backends._batches import read_ahead
from s2_spark.backends._clients import SharedClients
from s2_spark.backends.base import DataLossHandler, ReadSettings, StreamBackend
from s2_spark.backends.durable._range import EndedEarly, offset_key, range_units
from s2_spark.backends.durable.options import DurableSettings, StreamKind, check_offset_position
from s2_spark.errors import (
    MalformedResponseError,
    NotFoundError,
    OffsetGoneError,
    StreamNotFoundError,
)

if TYPE_CHECKING:
    from s2_spark.durable import DurableStream, DurableStreamsClient, PieceReader, ReadPiece
    from s2_spark.durable._watch import DurableTailWatch

__all__ = [
    "BYTES_ROW_LIMIT",
    "DurableBackend",
    "Position",
    "StreamKind",
    "check_offset_position",
    "read_schema_for",
]

log = logging.getLogger("s2_spark.durable")

Position = dict[str, Any]

#: Rows of a byte stream hold at most this many bytes, cut from the range's start.
BYTES_ROW_LIMIT = 1 << 20
#: Arrow batches handed to Spark hold at most this many rows (slices, no copies).
_BATCH_ROWS = 1 << 16



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


def _position(offset: str, skip: int = 0, closed: bool = False) -> Position:
    pos: Position = {"offset": offset, "skip": skip}
    if closed:
        pos["closed"] = True
    return pos


def _key(pos: Position) -> tuple[tuple[int, str], int]:
    return offset_key(pos["offset"]), int(pos["skip"])


def _new_client(settings: DurableSettings) -> DurableStreamsClient:
    from s2_spark.durable import DurableStreamsClient

    return DurableStreamsClient(settings.config())


_CLIENTS: SharedClients[DurableSettings, DurableStreamsClient] = SharedClients(_new_client)


class DurableBackend(StreamBackend[Position]):
    """Durable Streams named by URL or path; one content kind for every stream read."""

    service = "Durable Streams"

    def __init__(self, settings: DurableSettings, kind: StreamKind) -> None:
        self.settings = settings
        self.kind = kind

    def __repr__(self) -> str:
        return f"DurableBackend({self.settings!r}, kind={self.kind!r})"

    def _client(self) -> DurableStreamsClient:
        return _CLIENTS.get(self.settings)

    def _stream(self, stream: str) -> DurableStream:
        return self._client().stream(stream)  # a URL, or a path under baseUrl

    def _pieces(self, stream: str, offset: str) -> PieceReader:
        """Catch-up read in bounded pieces (answers without a content type are taken to
        be of this backend's kind)."""
        kind_type = "application/json" if self.kind == "json" else None
        return self._stream(stream).read_pieces(offset, content_type=kind_type)

    def _missing(self, stream: str, err: StreamNotFoundError | OffsetGoneError) -> NotFoundError:
        """The service-neutral not-found the backend interface promises (a stream gone
        whole, 410, is missing too)."""
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
        return _position(check_offset_position(value))

    def origin(self) -> Position:
        return _position("-1")

    def earliest(self, stream: str) -> Position:
        self.content_kind(stream)  # the stream must exist
        return self.origin()

    def latest(self, stream: str) -> Position:
        try:
            info = self._stream(stream).head()
        except (StreamNotFoundError, OffsetGoneError) as err:
            raise self._missing(stream, err) from None
        return _position(info.next_offset, 0, info.closed)

    def tail_watch(self) -> DurableTailWatch:
        """Long-polls (`live=long-poll`) from every watched stream's tail, one thread."""
        return self._client().watch_tails()

    def at_timestamp(self, stream: str, timestamp_ms: int) -> Position:
        raise NotImplementedError("Durable Streams messages carry no timestamps")

    def distance(self, start: Position, end: Position) -> int | None:
        """Known without reading only within one answer's offset (or for an empty range)."""
        if _key(end) <= _key(start):
            return 0
        if end["offset"] == start["offset"]:
            return int(end["skip"]) - int(start["skip"])
        return None

    def is_after(self, a: Position, b: Position) -> bool:
        return _key(a) > _key(b)

    def advance(self, start: Position, count: int) -> Position:
        return _position(start["offset"], start["skip"] + count)

    def measure(
        self, stream: str, start: Position, end: Position, limit: int
    ) -> tuple[int, bool]:
        """Units in [start, end) up to `limit`, by reading that many (a gone start counts
        as nothing more to pace: the range goes to `end`, and its read reports the loss)."""
        known = self.distance(start, end)
        if known is not None:
            return min(known, limit), known <= limit
        units = 0
        try:
            for piece in self._range_units(stream, start, end, limit=limit):
                units += piece.units
        except OffsetGoneError:
            return 0, True
        except StreamNotFoundError as err:
            raise self._missing(stream, err) from None
        except EndedEarly:
            pass  # the read reports it
        return units, units < limit

    def _range_units(self, stream: str, start: Position, end: Position,
                     *, limit: int | None = None) -> Iterator[ReadPiece]:
        def pieces(offset: str) -> PieceReader:
            return self._pieces(stream, offset)

        for piece in range_units(pieces, (start["offset"], int(start["skip"])),
                                 (end["offset"], int(end["skip"])), limit=limit):
            self._check_kind(piece)
            yield piece

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
        if not self.is_after(end, start):
            return
        rows = _Rows(self.kind, stream, start["offset"], int(start["skip"]))
        try:
            # Read in a thread, a few batches ahead: the server goes on sending while
            # Spark takes a batch.
            yield from read_ahead(lambda: rows.batches(self._range_units(stream, start, end)))
            return
        except (StreamNotFoundError, EndedEarly):
            on_data_loss(stream, start, end)  # raises unless failOnDataLoss=false
            return
        except OffsetGoneError:
            on_data_loss(stream, start, end)
            if rows.count:
                return
        # failOnDataLoss=false and the offset is gone (410, retention): read on from the
        # first retained message to the planned end.
        log.warning("%s: reading from its first retained message instead",
                    self.describe(stream))
        rows = _Rows(self.kind, stream, "-1", 0)
        try:
            yield from rows.batches(self._range_units(stream, self.origin(), end))
        except (StreamNotFoundError, OffsetGoneError, EndedEarly):
            on_data_loss(stream, start, end)


class _Rows:
    """Pieces of one range as rows: `offset` is the range's start offset, `index` the
    units after it (so a replay with other answer boundaries gives the same rows)."""

    def __init__(self, kind: StreamKind, stream: str, offset: str, skip: int) -> None:
        self.stream = stream
        self.offset = offset
        self.schema = read_schema_for(kind)
        self.index = skip  # units after `offset` before the next row
        self.pending = bytearray()  # byte streams: the row being filled
        self.count = 0  # rows yielded so far

    def batches(self, pieces: Iterator[ReadPiece]) -> Iterator[pa.RecordBatch]:
        for piece in pieces:
            for batch in self._rows(piece):
                self.count += batch.num_rows
                yield batch
        if self.pending:
            self.count += 1
            yield self._bytes_row()

    def _rows(self, piece: ReadPiece) -> Iterator[pa.RecordBatch]:
        if piece.messages is None:
            yield from self._byte_rows(memoryview(piece.data))
            return
        values = piece.messages
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
        from s2_spark.wire.durable import binary_array  # a task's reader unpickles without

        row = self._batch(binary_array([bytes(self.pending)]), self.index)
        self.index += len(self.pending)
        self.pending = bytearray()
        return row

    def _batch(self, values: pa.Array, first_index: int) -> pa.RecordBatch:
        n = len(values)
        index = np.arange(first_index, first_index + n, dtype=np.int64)
        # From buffers, not pa.array, which imports pandas (wire.durable._EMPTY_STRINGS).
        columns = [_repeat(self.stream, n), _repeat(self.offset, n),
                   pa.Array.from_buffers(pa.int64(), n, [None, pa.py_buffer(index)]), values]
        return pa.RecordBatch.from_arrays(columns, schema=self.schema)


def _repeat(text: str, n: int) -> pa.Array:
    """A string column of `n` copies of `text`, built from buffers (no Python list)."""
    data = text.encode()
    offsets = np.arange(n + 1, dtype=np.int32) * len(data)
    return pa.StringArray.from_buffers(n, pa.py_buffer(offsets), pa.py_buffer(data * n))
