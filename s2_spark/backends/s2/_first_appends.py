"""A writer's first append to each of many streams, built for all of them in one pass
(no pyspark, no I/O).

A fan-out task (a stream per user) writes a few rows to each of thousands of streams:
one append each, holding the rows, the writer's mark and the token, and for most of them
nothing must be read or bumped first. `StreamSink`'s per-stream work for that append (a
sink, its token guess, the digest, the mark, the request, an ack decoded into objects, a
result) cost the writing thread three times what the server spends on the append. Here
it is done for all such streams at once: their rows are kept as byte ranges of the
writer's encoded input batches (`FreshRows`: no object per stream), their conditions
decided once per token this process saw (`first_tokens`, the sink's own decision), and
their bodies built in one call (`first_bodies`: `_fastwire.sink_bodies`, or the Python
below it), byte for byte what `StreamSink._chain` builds for a stream's first append.

Anything else about a stream (more rows than one append takes, a flush while rows come,
a token that asks for a read or a bump, an append that failed or whose answer is odd)
gives it its own `StreamSink` with the same rows (`FreshRows.take`), which goes on
exactly as it did before.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from itertools import islice
from typing import TYPE_CHECKING, Any

import numpy as np

from s2_spark.backends.s2._digest import NO_ROWS
from s2_spark.backends.s2._stream_token import first_tokens, remember_all, seen_tokens
from s2_spark.backends.s2.results import StreamWriteResult
from s2_spark.backends.s2.settings import DATA_MAX_BYTES, SinkSettings
from s2_spark.backends.s2.tokens import DataMarks, WriterId, data_mark, fence_entry
from s2_spark.errors import ServiceError
from s2_spark.wire._accelerator import fastwire
from s2_spark.wire.appends import EncodedRecords, encode_varint

if TYPE_CHECKING:
    from s2_spark.s2._many import BodyAcks

__all__ = ["FirstAppends", "FreshRows", "first_bodies", "landed_results", "token_suffix"]

_EMPTY = np.zeros(0, np.int64)
_NO_RECORDS = EncodedRecords(memoryview(b""), _EMPTY, _EMPTY)


class FreshRows:
    """The rows of the streams a writer has no `StreamSink` for (yet): each input batch's
    encoded records, and per batch the byte range and rows of each stream (arrays). Every
    stream the writer meets is numbered here first, in first-seen order (`names`)."""

    def __init__(self) -> None:
        self.index: dict[str, int] = {}  # stream -> its number
        self.names: list[str] = []
        self._batches: list[EncodedRecords] = []
        # Per batch: stream number, first row, rows, first byte, end byte of each run.
        self._runs: list[tuple[np.ndarray, ...]] = []
        # Per stream: rows, encoded bytes, metered bytes so far; taken by a sink.
        self.rows = _EMPTY
        self.nbytes = _EMPTY
        self.metered = _EMPTY
        self.taken = np.zeros(0, np.bool_)

    def number(self, names: list[str]) -> np.ndarray:
        """The numbers of `names`, new ones numbered as they come."""
        index = self.index
        nums = np.fromiter((index.setdefault(n, len(index)) for n in names), np.int64,
                           len(names))
        if len(index) > len(self.names):
            self.names.extend(islice(index, len(self.names), None))
            grow = len(index) - len(self.rows)
            self.rows, self.nbytes, self.metered = (
                np.concatenate((a, np.zeros(grow, np.int64)))
                for a in (self.rows, self.nbytes, self.metered))
            self.taken = np.concatenate((self.taken, np.zeros(grow, np.bool_)))
        return nums

    def add(self, records: EncodedRecords, nums: np.ndarray, firsts: np.ndarray,
            counts: np.ndarray, settings: SinkSettings) -> list[str]:
        """Keep rows `firsts[i]` .. of `records` (`counts[i]` of them) for stream
        `nums[i]` (each number once); the streams whose rows reach a flush now."""
        if not len(nums):
            return []
        ends = records.ends
        stops = firsts + counts
        los = np.where(firsts > 0, ends[np.maximum(firsts - 1, 0)], 0)
        his = ends[stops - 1]
        metered = np.concatenate(([0], np.cumsum(records.meters)))
        self.rows[nums] += counts
        self.nbytes[nums] += his - los
        self.metered[nums] += metered[stops] - metered[firsts]
        self._batches.append(records)
        self._runs.append((nums, firsts, counts, los, his))
        due = (self.rows[nums] >= settings.flush_records) | (
            self.nbytes[nums] >= settings.flush_bytes)
        return [self.names[k] for k in nums[due].tolist()]

    def take(self, names: list[str]) -> list[list[EncodedRecords]]:
        """Each stream's rows, in order, as slices of the input batches: its sink's from
        now on (it is left out of `first_appends`). One pass over the batches for all of
        them; a batch none of whose streams is left here is let go."""
        chunks: list[list[EncodedRecords]] = [[] for _ in names]
        if not names:
            return chunks
        nums = np.fromiter((self.index[n] for n in names), np.int64, len(names))
        self.taken[nums] = True
        where = self._where(nums)
        for b, (runs, firsts, counts, _, _) in enumerate(self._runs):
            pos = where[runs]
            mine = pos >= 0
            for k, start, n in zip(pos[mine].tolist(), firsts[mine].tolist(),
                                   counts[mine].tolist(), strict=True):
                chunks[k].append(self._batches[b].slice(start, start + n))
            if len(runs) and self.taken[runs].all():
                self._batches[b] = _NO_RECORDS
                self._runs[b] = (_EMPTY,) * 5
        return chunks

    def _where(self, nums: np.ndarray) -> np.ndarray:
        """For every stream number, its place in `nums`, or -1 (a run's streams then
        found by one indexing)."""
        where = np.full(len(self.names), -1, np.int64)
        where[nums] = np.arange(len(nums))
        return where

    def first_appends(self, writer: WriterId, settings: SinkSettings,
                      key: tuple[str, str], *, backwards: bool) -> FirstAppends:
        """The first append of every stream that can have one at once: rows that fit one
        append, a condition known without reading (`first_tokens`); the rest to be
        taken by sinks (`FirstAppends.others`). `key`: the basin's endpoint and name (the
        streams' tokens seen); `backwards`: streams in reverse first-seen order."""
        marks = DataMarks(writer)
        fits = ~self.taken & (self.rows > 0) & (self.rows <= settings.max_records) & (
            self.metered <= DATA_MAX_BYTES)
        if not marks.fits(settings.max_records):
            fits[:] = False  # a mark could be too long: each sink raises it as before
        nums = np.flatnonzero(fits)[::-1] if backwards else np.flatnonzero(fits)
        codes, conditions = _conditions(writer, key, [self.names[k] for k in nums.tolist()])
        others = [self.names[k] for k in np.flatnonzero(~self.taken & ~fits).tolist()]
        others += [self.names[k] for k in nums[codes < 0].tolist()]
        nums, codes = nums[codes >= 0], codes[codes >= 0]
        suffixes = [token_suffix(sets, condition) for condition, sets in conditions]
        bodies = self._bodies(nums, marks.head, [s for s, _ in suffixes], codes)
        return FirstAppends([self.names[k] for k in nums.tolist()], self.rows[nums].tolist(),
                            bodies, [suffixes[j][1] for j in codes.tolist()],
                            [sets for _, sets in conditions], codes.tolist(), others)

    def _bodies(self, nums: np.ndarray, head: str, suffixes: list[bytes],
                codes: np.ndarray) -> list[bytes]:
        """The bodies of streams `nums` (`first_bodies`), from their runs in every batch."""
        if not len(nums):
            return []
        where = self._where(nums)
        seg_stream, seg_batch, seg_lo, seg_hi = [], [], [], []
        for b, (runs, _, _, los, his) in enumerate(self._runs):
            pos = where[runs]
            mine = pos >= 0
            seg_stream.append(pos[mine])
            seg_batch.append(np.full(int(mine.sum()), b, np.int64))
            seg_lo.append(los[mine])
            seg_hi.append(his[mine])
        stream = np.concatenate(seg_stream)
        order = np.argsort(stream, kind="stable")  # per stream, batches in input order
        per = np.bincount(stream, minlength=len(nums))
        firsts = np.concatenate(([0], np.cumsum(per))).astype(np.int64)
        return first_bodies([r.payload for r in self._batches],
                            np.concatenate(seg_batch)[order], np.concatenate(seg_lo)[order],
                            np.concatenate(seg_hi)[order], firsts,
                            self.rows[nums].astype(np.int64), head, suffixes,
                            codes.astype(np.int64))


@dataclass(slots=True)
class FirstAppends:
    """The first appends of `names`: body i holds stream i's `counts[i]` rows, its
    condition the last `condition_sizes[i]` bytes, and sets token `sets[codes[i]]`.
    `others`: the streams to be taken by sinks instead."""

    names: list[str]
    counts: list[int]
    bodies: list[bytes]
    condition_sizes: list[int]
    sets: list[str]
    codes: list[int]
    others: list[str]


def _conditions(writer: WriterId, key: tuple[str, str], names: list[str]
                ) -> tuple[np.ndarray, list[tuple[str, str]]]:
    """What each stream's first append is conditioned on and sets, decided once per
    token this process last saw on them (`first_tokens`): an index into the (condition,
    sets) pairs returned, -1 where the append cannot go out at once."""
    seen = seen_tokens([(*key, name) for name in names])
    tokens = {s: first_tokens(writer, s) for s in set(seen)}
    pairs = list(dict.fromkeys(t for t in tokens.values() if t is not None))
    index = {t: j for j, t in enumerate(pairs)}
    codes = np.fromiter((-1 if (t := tokens[s]) is None else index[t] for s in seen),
                        np.int64, len(seen))
    return codes, pairs


def token_suffix(sets: str, condition: str) -> tuple[bytes, int]:
    """What follows a first append's mark: the fence record setting token `sets`, then
    the condition on token `condition` (AppendInput field 3), and the condition's size."""
    raw = condition.encode()
    tail = b"\x1a" + encode_varint(len(raw)) + raw
    return fence_entry(sets)[0] + tail, len(tail)


def first_bodies(payloads: Sequence[Any], seg_payload: np.ndarray, seg_lo: np.ndarray,
                 seg_hi: np.ndarray, firsts: np.ndarray, counts: np.ndarray, head: str,
                 suffixes: list[bytes], suffix_of: np.ndarray) -> list[bytes]:
    """Stream k's first append, as `StreamSink._chain` builds it: its records (segments
    `firsts[k]` .. `firsts[k + 1]`, each bytes `seg_lo` .. `seg_hi` of payload
    `seg_payload`), the mark of `counts[k]` rows with their digest, and
    `suffixes[suffix_of[k]]` (`token_suffix`). In one C call where the accelerator is."""
    if fastwire is not None:
        return fastwire.sink_bodies(list(payloads), seg_payload, seg_lo, seg_hi, firsts,  # type: ignore[no-any-return]
                                    counts, head.encode(), suffixes, suffix_of)
    return first_bodies_python(payloads, seg_payload, seg_lo, seg_hi, firsts, counts, head,
                               suffixes, suffix_of)


def first_bodies_python(payloads: Sequence[Any], seg_payload: np.ndarray,
                        seg_lo: np.ndarray, seg_hi: np.ndarray, firsts: np.ndarray,
                        counts: np.ndarray, head: str, suffixes: list[bytes],
                        suffix_of: np.ndarray) -> list[bytes]:
    """`first_bodies` in Python, from the sink's own pieces: the reference the C one is
    checked against."""
    views = [memoryview(p).cast("B") for p in payloads]
    out = []
    for k in range(len(counts)):
        records = b"".join(
            views[int(seg_payload[s])][int(seg_lo[s]):int(seg_hi[s])]
            for s in range(int(firsts[k]), int(firsts[k + 1])))
        mark = data_mark(head, int(counts[k]), NO_ROWS.extend(records))
        out.append(records + fence_entry(mark)[0] + suffixes[int(suffix_of[k])])
    return out


def landed_results(first: FirstAppends, acks: BodyAcks, key: tuple[str, str],
                   results: dict[str, StreamWriteResult]) -> list[tuple[str, ServiceError]]:
    """Each first append that landed: its stream's result in `results`, as the stream's
    sink would report it (every row appended, by one append), and its token remembered
    as the sink remembers it (`remember_all`). The others: each stream with its error,
    for a sink to take on."""
    starts, ends, failed = acks.starts, acks.ends, []
    for i, outcome in acks.others.items():
        if isinstance(outcome, ServiceError):
            failed.append((i, outcome))
        else:  # an ack read by `ack_of` (an answer spelt otherwise)
            starts[i], ends[i] = outcome.start.seq_num, outcome.end.seq_num
    gone = {i for i, _ in failed}
    landed = [i for i in range(len(first.names)) if i not in gone] if gone else range(
        len(first.names))
    names, counts = first.names, first.counts
    results.update((names[i], StreamWriteResult(names[i], counts[i], 0, starts[i],
                                                ends[i] - 1, 1)) for i in landed)
    by_token: dict[int, list[tuple[str, str, str]]] = {}
    for i in landed:
        by_token.setdefault(first.codes[i], []).append((*key, names[i]))
    for code, keys in by_token.items():
        remember_all(keys, first.sets[code])
    return [(names[i], err) for i, err in failed]
