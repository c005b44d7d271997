"""A replay whose rows come in another order: what its partition landed in the stream,
read back and found among its input rows by content.

A replayed micro-batch must give each partition the same rows, but not always in the
same order (a shuffle's blocks can be fetched in another order). Where the digest of the
replay's first rows is not the one a mark holds (`_digest`), the writer reads back the
data records of its partition's appends past what it has checked (`Landed` spans) and
skips exactly those rows of its input, as a multiset, appending the rest in the new
order. A row is its body and headers, and its timestamp where one was given and S2 kept
it: an input row given no timestamp is matched by body and headers as it comes; landed
rows whose timestamps S2 raised (timestamps stay monotonic) or replaced (arrival
timestamping) are matched by body and headers once the input has ended. Landed rows not
found in the input mean the input is not the same rows: the writer fails
(`ReplayMismatchError`) before writing anything more.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa

from s2_spark.backends.s2._history import Landed
from s2_spark.errors import ReplayMismatchError
from s2_spark.wire.appends import EncodedRecords, encode_entries

if TYPE_CHECKING:
    from s2_spark.s2 import StreamClient

__all__ = ["LandedRows", "read_landed"]


def _varint(buf: bytes, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        b = buf[pos]
        value |= (b & 0x7F) << shift
        pos += 1
        if b < 0x80:
            return value, pos
        shift += 7


def _split_entry(entry: bytes) -> tuple[bytes, int | None]:
    """A `records` entry (tag, length, AppendRecord) as (the record's fields but its
    timestamp, the timestamp or None): the encoder writes the timestamp first."""
    _, pos = _varint(entry, 1)
    if pos < len(entry) and entry[pos] == 0x08:
        ts, after = _varint(entry, pos + 1)
        return entry[after:], ts
    return entry[pos:], None


def _entries(records: EncodedRecords) -> list[bytes]:
    """Each row's encoded entry."""
    if not len(records):
        return []
    payload = bytes(records.payload)
    ends = records.ends.tolist()
    return [payload[lo:hi] for lo, hi in zip([0, *ends[:-1]], ends, strict=True)]


def _take(records: EncodedRecords, entries: list[bytes], keep: list[int]) -> EncodedRecords:
    """The rows `keep` (indices, in order) of `records`, whose entries are `entries`."""
    if len(keep) == len(entries):
        return records
    sizes = np.fromiter((len(entries[i]) for i in keep), np.int64, len(keep))
    return EncodedRecords(memoryview(b"".join(entries[i] for i in keep)), np.cumsum(sizes),
                          records.meters[np.asarray(keep, dtype=np.int64)])


class LandedRows:
    """The data records a partition landed (in stream order: fields but the timestamp,
    and the timestamp S2 stored), found one by one among a replay's input rows; the
    input rows that are not among them are held meanwhile."""

    def __init__(self, keys: list[bytes], stamps: list[int]) -> None:
        self.count = len(keys)
        self.remaining = len(keys)
        self._held: list[EncodedRecords] = []
        self._stamps = stamps
        self._keys = keys
        self._found: list[bytes | None] = [None] * len(keys)
        self._by_key: dict[bytes, list[int]] = {}
        for i in reversed(range(len(keys))):  # pop() takes the earliest first
            self._by_key.setdefault(keys[i], []).append(i)
        self._by_stamp: dict[tuple[bytes, int], list[int]] | None = None  # when first needed

    def _exact(self, key: bytes, ts: int) -> list[int] | None:
        if self._by_stamp is None:
            self._by_stamp = {}
            for i in reversed(range(len(self._keys))):
                if self._found[i] is None:
                    self._by_stamp.setdefault((self._keys[i], self._stamps[i]), []).append(i)
        return self._by_stamp.get((key, ts))

    def _pop(self, candidates: list[int] | None) -> int | None:
        while candidates:
            i = candidates.pop()
            if self._found[i] is None:
                return i
        return None

    def _found_as(self, i: int, entry: bytes) -> None:
        self._found[i] = entry
        self.remaining -= 1

    def held(self) -> EncodedRecords | None:
        """The input rows offered that are not landed ones, in order (None: none)."""
        if not self._held:
            return None
        if len(self._held) > 1:
            self._held = [EncodedRecords.concat(self._held)]
        return self._held[0]

    def offer(self, records: EncodedRecords) -> None:
        """Find landed rows among the next input rows: the exact ones (timestamp too),
        and by body and headers those given no timestamp; hold the rest."""
        self._held.append(self._offer(records))

    def _offer(self, records: EncodedRecords) -> EncodedRecords:
        if not self.remaining or not len(records):
            return records
        entries = _entries(records)
        keep: list[int] = []
        for k, entry in enumerate(entries):
            if not self.remaining:
                keep.extend(range(k, len(entries)))
                break
            key, ts = _split_entry(entry)
            i = self._pop(self._by_key.get(key) if ts is None else self._exact(key, ts))
            if i is None:
                keep.append(k)
            else:
                self._found_as(i, entry)
        return _take(records, entries, keep)

    def finish(self) -> None:
        """The input has ended: find the landed rows left by body and headers among the
        rows held (S2 raised or replaced their timestamps). Taken in order of the stored
        timestamp, each is the held row of its body and headers with the latest
        timestamp not after the stored one (S2 only raises a timestamp it keeps), else
        the earliest left."""
        held = self.held()
        if not self.remaining or held is None:
            return
        entries = _entries(held)
        by_key: dict[bytes, list[tuple[int, int]]] = {}
        for k, entry in enumerate(entries):
            key, ts = _split_entry(entry)
            by_key.setdefault(key, []).append((-1 if ts is None else ts, k))
        taken: set[int] = set()
        for key, rows in by_key.items():
            waiting = sorted((self._stamps[i], i) for i in self._by_key.get(key, ())
                             if self._found[i] is None)
            rows.sort()
            ready: list[tuple[int, int]] = []  # (-timestamp, k): the latest first
            j = 0
            for stamp, i in waiting:
                while j < len(rows) and rows[j][0] <= stamp:
                    heapq.heappush(ready, (-rows[j][0], rows[j][1]))
                    j += 1
                if ready:
                    k = heapq.heappop(ready)[1]
                elif j < len(rows):
                    k, j = rows[j][1], j + 1
                else:
                    break
                taken.add(k)
                self._found_as(i, entries[k])
        self._held = [_take(held, entries, [k for k in range(len(entries)) if k not in taken])]

    def entries(self) -> bytes:
        """The input rows found, in the landed rows' stream order (the digest of the
        partition's rows goes on from them)."""
        assert self.remaining == 0
        return b"".join(e for e in self._found if e is not None)


def read_landed(stream: StreamClient, landed: Sequence[Landed], what: str) -> LandedRows:
    """The data records of the appends `landed`, read back. A span the stream no longer
    holds whole (trimmed), or holding a command record, cannot be told apart from its
    input: that is an error naming the stream."""
    keys: list[bytes] = []
    stamps: list[int] = []
    for app in landed:
        pos = app.first
        while pos < app.end:
            decoded = stream.read(seq_num=pos, count=min(1000, app.end - pos),
                                  include_command_records=True)
            if decoded.count == 0 or decoded.first_seq_num != pos:
                raise ReplayMismatchError(
                    f"{what} no longer holds records {pos}..{app.end - 1}, written there by "
                    "an earlier attempt of this partition (trimmed by its retention?): the "
                    "replay cannot tell which of its rows they were", stream=stream.name)
            batch = decoded.batch.slice(0, min(decoded.count, app.end - pos))
            headers = batch.column("headers")
            if _has_command(headers):
                raise ReplayMismatchError(
                    f"{what} holds a command record among records {pos}..{app.end - 1}, "
                    "where an earlier attempt of this partition wrote data: the replay "
                    "cannot tell which of its rows were written", stream=stream.name)
            encoded = encode_entries(batch.column("body"), headers)
            keys += [_split_entry(e)[0] for e in _entries(encoded)]
            micros = batch.column("timestamp").cast(pa.int64()).to_numpy(zero_copy_only=False)
            stamps += (micros // 1000).tolist()
            pos += batch.num_rows
    return LandedRows(keys, stamps)


def _has_command(headers: pa.Array) -> bool:
    import pyarrow.compute as pc

    single = pc.fill_null(pc.equal(pc.list_value_length(headers), 1), False)
    if not pc.any(single).as_py():
        return False
    first = pc.list_element(pc.filter(headers, single), 0)
    return bool(pc.any(pc.equal(pc.binary_length(pc.struct_field(first, [0])), 0)).as_py())
