"""Reading a Durable Streams range exactly, taking each message off the server once.

A range runs from `a = (Oa, ka)` to `b = (Ob, kb)`: `k` units (messages, or bytes) after a
server offset `O`. Nothing in the protocol bounds a read at an end offset, and a catch-up
answer runs from its offset to where the server decides (the reference server: the tail
as it is when the answer starts), so the answer that steps over `Ob` also holds units
appended after the plan. Its `Stream-Next-Offset` `B` is a header, known before its body:
the units in `[Ob, B)` are counted first, by reading only them (`units_between`), and that
many are held back from the end of the answer. Everything before `Ob` is thus read once;
only what arrived after planning is read twice.

Units are numbered from `Oa`, so a replay that gets longer answers cuts at the same unit.

Nothing here imports pyspark.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Generator, Iterator
from dataclasses import replace
from typing import TYPE_CHECKING

from s2_spark.errors import MalformedResponseError

if TYPE_CHECKING:
    from s2_spark.durable import PieceReader, ReadPiece

__all__ = ["EndedEarly", "offset_key", "range_units", "units_between"]

#: Reads `units_between` makes at most, chasing a tail that keeps moving.
CHASE_READS = 64

#: A catch-up read from an offset, in pieces.
Pieces = Callable[[str], "PieceReader"]


def offset_key(offset: str) -> tuple[int, str]:
    """Offsets order as strings (the protocol says so); "-1", the start, before all."""
    return (0, "") if offset == "-1" else (1, offset)


class EndedEarly(Exception):
    """The stream ends before the range does (deleted, recreated or trimmed)."""


def changed(what: str) -> MalformedResponseError:
    return MalformedResponseError(
        f"{what}: the stream was recreated or rewritten", code="content_changed"
    )


class _Chain:
    """Answer boundaries from one offset on, with the units before each."""

    def __init__(self, pieces: Pieces, offset: str) -> None:
        self._pieces = pieces
        self.marks = {offset: 0}
        self.end = offset
        self.up_to_date = False

    def extend(self, stop: str) -> None:
        """Read on from `end` to the tail, or until a boundary at `stop`."""
        units = self.marks[self.end]
        with self._pieces(self.end) as reader:
            for piece in reader:
                units += piece.units
                if piece.last:
                    self.end, self.up_to_date = piece.next_offset, piece.up_to_date
                    self.marks[self.end] = units
                    if self.end == stop:
                        return


def units_between(pieces: Pieces, lo: str, hi: str) -> int:
    """Units in `[lo, hi)`, two answer boundaries with `lo` before `hi`.

    Read from `lo` until `hi` is a boundary. When an answer steps over it (the reference
    server answers to the tail; a paging server ends pages where it likes), read from
    `hi` too, each chain on to the tail in turn, until both share a boundary (at the
    latest, the tail while nothing is appended between two reads): the difference of
    the two counts there. Each read takes only units no earlier read of its chain took.
    """
    a, b = _Chain(pieces, lo), _Chain(pieces, hi)
    a.extend(hi)
    for _ in range(CHASE_READS):
        common = a.marks.keys() & b.marks.keys()
        if common:
            at = min(common, key=offset_key)
            n = a.marks[at] - b.marks[at]
            if n < 0:
                raise changed(f"offset {hi!r} lies {-n} units before {lo!r}")
            return n
        behind, ahead = (a, b) if offset_key(a.end) < offset_key(b.end) else (b, a)
        if behind.up_to_date and behind is a and offset_key(a.end) < offset_key(hi):
            raise EndedEarly()
        behind.extend(ahead.end)
        if offset_key(behind.end) < offset_key(ahead.end):
            raise changed(f"reads from {lo!r} and {hi!r} reach different tails")
    raise RuntimeError(
        f"the stream kept growing while the units between offsets {lo!r} and {hi!r} were "
        f"counted ({CHASE_READS} reads); the read is retried by Spark"
    )


def _cut(piece: ReadPiece, lo: int, hi: int) -> ReadPiece:
    """Units [lo, hi) of `piece`."""
    if piece.messages is not None:
        return replace(piece, messages=piece.messages.slice(lo, hi - lo))
    return replace(piece, data=piece.data[lo:hi])


def _marked(
    pieces: Pieces, offset: str, mark: str
) -> Generator[tuple[ReadPiece, bool], None, None]:
    """Pieces from `offset` on, each wholly before the boundary `mark` (True) or at or
    after it (False). The answer that steps over `mark` is held back by the units it holds
    after `mark`, counted when its header arrives (again if a retry answers longer)."""
    if mark == offset:
        with pieces(offset) as reader:
            for piece in reader:
                yield piece, False
        return
    held: deque[ReadPiece] = deque()
    held_units = hold = 0
    answer_end: str | None = None
    before = True
    with pieces(offset) as reader:
        for piece in reader:
            if not before:
                yield piece, False
                continue
            if piece.next_offset != answer_end:
                answer_end = piece.next_offset
                crosses = offset_key(answer_end) > offset_key(mark)
                hold = units_between(pieces, mark, answer_end) if crosses else 0
            held.append(piece)
            held_units += piece.units
            while held_units > hold:  # release what certainly lies before `mark`
                first = held.popleft()
                n = min(first.units, held_units - hold)
                if n < first.units:
                    held.appendleft(_cut(first, n, first.units))
                    first = _cut(first, 0, n)
                held_units -= n
                yield first, True
            if piece.last and offset_key(answer_end) >= offset_key(mark):
                if held_units != hold:
                    raise changed(f"an answer ending at {answer_end!r} holds fewer units "
                                  f"than lie between {mark!r} and it")
                before = False
                if not held:  # tells the caller the mark is reached
                    yield _cut(piece, 0, 0), False
                while held:
                    yield held.popleft(), False
    if before:
        raise EndedEarly()


def range_units(
    pieces: Pieces, a: tuple[str, int], b: tuple[str, int], *, limit: int | None = None
) -> Iterator[ReadPiece]:
    """The units of [a, b) in order (at most `limit` of them), as piece slices."""
    (oa, ka), (ob, kb) = a, b
    seen = after = taken = 0  # units from Oa; of them at or after Ob; yielded
    want = limit if limit is not None else -1
    marked = _marked(pieces, oa, ob)
    try:
        for piece, is_before in marked:
            n = piece.units
            hi = n if is_before else min(n, kb - after)
            lo = min(max(ka - seen, 0), hi)
            if want >= 0:
                hi = min(hi, lo + want - taken)
            if hi > lo:
                yield _cut(piece, lo, hi) if (lo, hi) != (0, n) else piece
                taken += hi - lo
            seen += n
            after += 0 if is_before else n
            if (not is_before and after >= kb) or taken == want:
                return
        if kb > after:
            raise EndedEarly()
    finally:
        marked.close()
