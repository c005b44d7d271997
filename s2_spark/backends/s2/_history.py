"""A stream's marks read back for one writer: how far its partition got, and whether a
newer attempt or run has the stream (the I/O half of `tokens`).

Marks are fence records, so reading them means reading the records around them. Two
ways: `back` from a point (the tail, or the writer's own bump) to where the writer's
micro-batch began on the stream, when the writer knows nothing yet; `forward` over a
span the writer has not seen, when it has read or appended up to the span's start.

Besides how far its partition got, a writer learns where each append of its partition
is (`Landed`): an append is its data records, its mark and a token, so the data of an
append whose mark is at seq_num s and says the partition reached p rows are the p - q
records before s, q being what the partition had before it (the most any earlier mark
of the partition says). A replay checks its rows against the marks' digests and, where
they differ, reads those records back (`_replay`).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from s2_spark.backends.s2.tokens import Mark, WriterId, is_token, parse_mark

if TYPE_CHECKING:
    from s2_spark.s2 import StreamClient
    from s2_spark.wire.records import DecodedBatch

__all__ = ["History", "Landed", "StreamMarks", "first_window", "read_windows"]

#: Records read in the first window back from the tail (doubling up to `_MAX_WINDOW`):
#: the marks a writer looks for are usually the stream's last few records.
_FIRST_WINDOW = 64
_MAX_WINDOW = 64_000


@dataclass(frozen=True, slots=True)
class Landed:
    """One append of the writer's partition found in the stream: its data records are
    the seq_nums [first, end) (`end`: its mark's), after which the partition has
    `progress` rows in the stream, whose digest the mark holds (None: a mark written
    before digests, trusted by count as then)."""

    first: int
    end: int
    progress: int
    digest: str | None


@dataclass(frozen=True, slots=True)
class History:
    """What a stream's marks before `end` (a seq_num) say to one writer.

    `progress`: the most rows of the writer's partition of its micro-batch any mark shows
    in the stream; `own`: of those, the most its own marks show (appends of its whose
    answer was lost). `landed`: the partition's appends found, in stream order. `stale`:
    why the writer must stop (a newer attempt of its task, a newer micro-batch or run
    wrote the stream), or None. `clean`: no earlier run of the query left marks of this
    micro-batch, so every writer of this run may trust that its rows start at zero.
    """

    progress: int
    own: int
    landed: tuple[Landed, ...]
    stale: str | None
    clean: bool
    end: int


def summarize(me: WriterId, marks: list[tuple[int, Mark]], end: int, before: int = 0
              ) -> History:
    """The history `marks` (this writer's query or job only, with their seq_nums, in
    stream order) make for `me`; `before`: the partition's rows known to be in the
    stream before the first of them."""
    progress, own, stale, clean = before, 0, None, True
    landed: list[Landed] = []
    for seq, m in marks:
        if me.streaming and m.generation > me.generation:
            what = "run" if m.batch <= me.batch else f"micro-batch ({m.batch})"
            stale = stale or f"a newer {what} of this query wrote it"
        if m.batch != me.batch:
            continue
        if m.generation < me.generation:
            clean = False
        if m.partition == me.partition:
            if m.generation == me.generation and m.attempt > me.attempt:
                stale = stale or f"attempt {m.attempt} of this task writes it"
            if m.data and m.progress > progress:
                landed.append(Landed(seq - (m.progress - progress), seq, m.progress,
                                     m.digest))
            progress = max(progress, m.progress)
            if m.generation == me.generation and m.attempt == me.attempt:
                own = max(own, m.progress)
    return History(progress, own, tuple(landed), stale, clean, end)


class StreamMarks:
    """Reads one stream's marks for writer `me`."""

    def __init__(self, stream: StreamClient, me: WriterId) -> None:
        self._stream = stream
        self._me = me

    def back(self, end: int | None = None, *, first: list[tuple[int, str]] | None = None
             ) -> History:
        """The marks before `end` (default: the tail), read backwards until the stream's
        records before `me`'s micro-batch: a data mark of an earlier micro-batch of the
        query, another writer's mark, or a fence record s2-spark did not write. `first`:
        the fence records of the first window back from `end` (`first_window`), read
        already (a writer reads its streams' in bulk)."""
        if end is None:
            end = self._stream.check_tail().seq_num
        me = self._me
        found: list[tuple[int, Mark]] = []
        for seq, raw in self._fences_back(end, first):
            m = parse_mark(raw)
            if m is None:
                if is_token(raw):
                    continue  # it follows a mark
                break
            if not me.same_writer_kind(m) or (me.streaming and m.data and m.batch < me.batch):
                break
            found.append((seq, m))
        return summarize(me, found[::-1], end)

    def forward(self, start: int, end: int | None = None, *, before: int = 0) -> History:
        """The marks in [start, end) (default: up to the tail); `before`: the rows of the
        writer's partition known to be in the stream before `start`."""
        if end is None:
            end = self._stream.check_tail().seq_num
        me = self._me
        found = [(seq, m) for seq, raw in self._fences(start, end)
                 if (m := parse_mark(raw)) is not None and me.same_writer_kind(m)]
        return summarize(me, found, end, before)

    def _fences_back(self, end: int, first: list[tuple[int, str]] | None
                     ) -> Iterator[tuple[int, str]]:
        """The fence records before `end` (seq_num, body), newest first: a window at a
        time, each twice the last (the first one's given as `first`, if it is)."""
        hi, window = end, _FIRST_WINDOW
        while hi > 0:
            lo = max(0, hi - window)
            yield from reversed(self._fences(lo, hi) if first is None else first)
            first, hi = None, lo
            window = min(window * 2, _MAX_WINDOW)

    def _fences(self, lo: int, hi: int) -> list[tuple[int, str]]:
        """The fence records in [lo, hi) (seq_num, body), in order."""
        bodies: list[tuple[int, str]] = []
        pos = lo
        while pos < hi:
            decoded = self._stream.read(seq_num=pos, count=min(1000, hi - pos),
                                        include_command_records=True)
            if decoded.count == 0 or decoded.last_seq_num is None:
                break
            bodies += _fences_in([decoded.batch], [hi])[0]
            pos = decoded.last_seq_num + 1
        return bodies


def first_window(end: int) -> int:
    """Where `StreamMarks.back`'s first window before `end` starts (it ends at `end`)."""
    return max(0, end - _FIRST_WINDOW)


def read_windows(results: Sequence[DecodedBatch | Exception], ends: Sequence[int]
                 ) -> list[list[tuple[int, str]] | None]:
    """For each i, the fence records of the first window back from `ends[i]`, from
    `results[i]`, its read made elsewhere (`read_many`, with command records and
    headers), picked out of all the reads in one pass; None unless that read came plainly
    and reached its end (`back` then reads for itself)."""
    out: list[list[tuple[int, str]] | None] = [None] * len(results)
    owners: list[int] = []
    batches: list[pa.RecordBatch] = []
    for i, (result, end) in enumerate(zip(results, ends, strict=True)):
        if isinstance(result, Exception):
            continue
        out[i] = []  # a read of nothing, as `_fences` takes one, has none
        if result.count and result.last_seq_num is not None:
            if result.last_seq_num + 1 < end:
                out[i] = None
            else:
                owners.append(i)
                batches.append(result.batch)
    if owners:
        picked = _fences_in(batches, [ends[i] for i in owners])
        for i, fences in zip(owners, picked, strict=True):
            out[i] = fences
    return out


def _fences_in(batches: list[pa.RecordBatch], ends: Sequence[int]
               ) -> list[list[tuple[int, str]]]:
    """The fence records of each read's batch (with command records and headers) before
    its end (seq_num, body), in order, picked out of all of them in one Arrow pass (the
    data records around them are most of what is read)."""
    table = pa.Table.from_batches(batches)
    if len(batches) > 1:  # one chunk: Arrow's kernels over 1024 small ones took 4x as long
        table = table.combine_chunks()
    mask = _fence_mask(table.column("headers").combine_chunks())
    owners = np.repeat(np.arange(len(batches)), [len(b) for b in batches])[np.asarray(mask)]
    fences = table.filter(mask)
    out: list[list[tuple[int, str]]] = [[] for _ in batches]
    for k, seq, body in zip(owners.tolist(), fences.column("seq_num").to_pylist(),
                            fences.column("body").to_pylist(), strict=True):
        if seq < ends[k]:
            out[k].append((seq, body.decode("utf-8", "replace")))
    return out


def _fence_mask(headers: pa.Array) -> pa.Array:
    """Which records are fence commands: one header, with an empty name and the value
    "fence"."""
    single = pc.fill_null(pc.equal(pc.list_value_length(headers), 1), False)
    first = pc.list_element(pc.if_else(single, headers, pa.nulls(len(headers), headers.type)), 0)
    name, value = pc.struct_field(first, [0]), pc.struct_field(first, [1])
    fence = pc.and_(pc.equal(pc.binary_length(name), 0), pc.equal(value, pa.scalar(b"fence")))
    return pc.fill_null(fence, False)
