"""Input rows of the S2 sink: command rows dropped, the rest grouped by target stream.

Pure Arrow and numpy (no I/O, no pyspark). Grouping takes one pass whatever the number of
streams (a mask per stream would cost rows x streams), and keeps each stream's rows in
input order: exactly-once replays skip a prefix of them, so their order must not change.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

__all__ = ["Columns", "drop_command_rows", "group_by_stream", "order_by_stream", "stream_runs"]

#: bodies, headers, timestamps (headers and timestamps optional).
Columns = tuple[pa.Array, pa.Array | None, pa.Array | None]


def drop_command_rows(
    columns: Columns, streams: pa.Array | str
) -> tuple[Columns, pa.Array | str, int]:
    """`columns` and `streams` without the rows that are S2 command records (exactly one
    header, with an empty name), and how many were dropped: appending them would fence
    or trim the target instead of storing data."""
    bodies, headers, timestamps = columns
    if headers is None:
        return columns, streams, 0
    single = pc.fill_null(pc.equal(pc.list_value_length(headers), 1), False)
    if not pc.any(single).as_py():
        return columns, streams, 0
    first = pc.list_element(pc.if_else(single, headers, pa.nulls(len(headers), headers.type)), 0)
    names = pc.struct_field(first, [0])
    command = pc.fill_null(pc.equal(pc.binary_length(names), 0), False)
    if not pc.any(command).as_py():
        return columns, streams, 0
    keep = pc.invert(command)
    dropped = len(bodies) - pc.sum(keep).as_py()
    kept = (pc.filter(bodies, keep), pc.filter(headers, keep),
            pc.filter(timestamps, keep) if timestamps is not None else None)
    return kept, streams if isinstance(streams, str) else pc.filter(streams, keep), dropped


def order_by_stream(columns: Columns, streams: pa.Array
                    ) -> tuple[Columns, list[tuple[str, int, int]]]:
    """The rows reordered so that each target stream's are together, streams in
    first-seen order and rows in input order, and each stream's (name, first row, rows).
    `streams` must have no nulls."""
    taken, names, firsts, counts = stream_runs(columns, streams)
    return taken, list(zip(names, firsts.tolist(), counts.tolist(), strict=True))


def stream_runs(columns: Columns, streams: pa.Array
                ) -> tuple[Columns, list[str], np.ndarray, np.ndarray]:
    """`order_by_stream` with the streams' names, first rows and row counts apart (two
    int64 arrays: a writer of thousands of streams takes them in bulk).

    Dictionary-encodes `streams` (codes in first-seen order), sorts the row indices by
    code with a stable sort and takes each column once in that order. `streams` must have
    no nulls.
    """
    encoded = pc.dictionary_encode(streams)
    names: list[str] = encoded.dictionary.to_pylist()
    if len(names) == 1:
        return (columns, names, np.zeros(1, np.int64),
                np.full(1, len(streams), np.int64))
    codes = encoded.indices.to_numpy(zero_copy_only=False)
    # numpy sorts 16-bit integers stably by radix (linear), int32 codes by merge sort (3x
    # the time for a 10,000-row batch).
    order = np.argsort(codes.astype(np.int16) if len(names) <= 1 << 15 else codes,
                       kind="stable")
    counts = np.bincount(codes, minlength=len(names)).astype(np.int64)
    firsts = np.cumsum(counts) - counts
    taken = tuple(_take(c, order) for c in columns)
    bodies, headers, timestamps = taken
    assert bodies is not None
    if not counts.all():  # a name without rows (none that pyarrow makes, but safe)
        some = np.flatnonzero(counts)
        names, firsts, counts = [names[i] for i in some.tolist()], firsts[some], counts[some]
    return (bodies, headers, timestamps), names, firsts, counts


def group_by_stream(columns: Columns, streams: pa.Array) -> list[tuple[str, Columns]]:
    """The rows of each target stream (`order_by_stream`), as columns of their own."""
    taken, spans = order_by_stream(columns, streams)
    if len(spans) == 1:
        return [(spans[0][0], taken)]
    return [(name, _slice(taken, start, n)) for name, start, n in spans]


def _take(column: pa.Array | None, order: np.ndarray) -> pa.Array | None:
    return None if column is None else column.take(order)


def _slice(columns: Sequence[pa.Array | None], start: int, n: int) -> Columns:
    bodies, headers, timestamps = (c.slice(start, n) if c is not None else None
                                   for c in columns)
    assert bodies is not None
    return bodies, headers, timestamps
