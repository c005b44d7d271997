"""Read sessions over a stream, following s2-lite's `read_session` step by step.

A session yields `Batch` (a slice of stored entries, at most 1000 records / 1 MiB) and
`Heartbeat` (the tail, sent when the session catches up and then every heartbeat
interval while it follows). It ends when a bound (count, bytes, until) is reached,
when it is caught up and may not follow, or when `wait` passes without records.
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import math
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass

from s2_spark.testing._errors import ApiError
from s2_spark.testing._records import MAX_BATCH_BYTES, MAX_BATCH_RECORDS
from s2_spark.testing._store import Store
from s2_spark.testing._stream import Stream

__all__ = ["Batch", "Heartbeat", "ReadSpec", "read_session", "resolve_start"]


@dataclass(slots=True)
class ReadSpec:
    """Where a read starts and what bounds it (None = unbounded)."""

    seq_num: int | None = None
    timestamp: int | None = None
    tail_offset: int | None = None
    clamp: bool = False
    count: int | None = None
    bytes: int | None = None
    until: int | None = None
    wait: float | None = None

    @property
    def limited(self) -> bool:
        return self.count is not None or self.bytes is not None

    def may_follow(self) -> bool:
        return (not self.limited and self.until is None) or (
            self.wait is not None and self.wait > 0
        )


@dataclass(slots=True)
class Batch:
    entries: list[bytes]
    first_seq: int
    last_seq: int
    last_ts: int
    metered: int
    tail: tuple[int, int] | None


@dataclass(slots=True)
class Heartbeat:
    tail: tuple[int, int]


def resolve_start(store: Store, stream: Stream, spec: ReadSpec) -> int:
    """The first seq_num to read, or ApiError 416 (s2-lite `read_start_seq_num`)."""
    stream.apply_retention(store.clock())
    tail_seq, tail_ts = stream.tail
    by_ts = False
    if spec.seq_num is not None:
        seq = spec.seq_num
        beyond = seq > tail_seq
    elif spec.timestamp is not None:
        by_ts = True
        seq = 0
        beyond = spec.timestamp > tail_ts
    else:
        seq = max(tail_seq - (spec.tail_offset or 0), 0)
        beyond = False
    if beyond:
        if not spec.clamp:
            raise ApiError.unwritten(tail_seq, tail_ts)
        seq, by_ts = tail_seq, False
    if not by_ts and seq == tail_seq and not spec.may_follow():
        raise ApiError.unwritten(tail_seq, tail_ts)
    if by_ts:
        assert spec.timestamp is not None
        return stream.seq_for_timestamp(spec.timestamp)
    return seq


async def read_session(
    store: Store,
    stream: Stream,
    start_seq: int,
    spec: ReadSpec,
    heartbeat_interval: float,
) -> AsyncIterator[Batch | Heartbeat]:
    """Yield batches and heartbeats until a bound, the end of catch-up, or `wait` ends it."""
    pos = start_seq
    count_left = spec.count
    bytes_left = spec.bytes
    until = spec.until
    wait = spec.wait
    may_follow = spec.may_follow()
    deadline: float | None = None
    following = False
    loop = asyncio.get_running_loop()
    while True:
        if stream.deleted:
            raise ApiError.standard(404, "stream_not_found", f"stream {stream.name} not found")
        stream.apply_retention(store.clock())
        pos = max(pos, stream.first_seq)
        if pos < stream.next_seq:
            i = pos - stream.first_seq
            j = min(len(stream.entries), i + MAX_BATCH_RECORDS)
            if count_left is not None:
                j = min(j, i + count_left)
            bmax = MAX_BATCH_BYTES if bytes_left is None else min(MAX_BATCH_BYTES, bytes_left)
            base = stream.cum_before(i)
            j = min(j, bisect.bisect_right(stream.cum, base + bmax, i, j))
            if until is not None:
                j = bisect.bisect_left(stream.timestamps, until, i, j)
            if j <= i:
                return  # the next record is beyond a bound
            metered = stream.cum[j - 1] - base
            batch = Batch(
                stream.entries[i:j],
                pos,
                stream.first_seq + j - 1,
                stream.timestamps[j - 1],
                metered,
                stream.tail if following else None,
            )
            pos = batch.last_seq + 1
            if count_left is not None:
                count_left -= j - i
            if bytes_left is not None:
                bytes_left -= metered
            if wait is not None:
                deadline = loop.time() + wait
            yield batch
            if count_left == 0 or bytes_left == 0:
                return
            continue
        # Caught up with the tail.
        if not may_follow:
            return
        if deadline is None and wait is not None:
            deadline = loop.time() + wait
        if deadline is not None and deadline <= loop.time():
            return
        if not following:
            following = True
            yield Heartbeat(stream.tail)
        next_beat = loop.time() + heartbeat_interval
        while stream.next_seq <= pos and not stream.deleted:
            now = loop.time()
            if deadline is not None and deadline <= now:
                return
            if next_beat <= now:
                yield Heartbeat(stream.tail)
                next_beat = loop.time() + heartbeat_interval
                continue
            timeout = next_beat - now
            if deadline is not None:
                timeout = min(timeout, deadline - now)
            event = stream.changed_event()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(timeout if timeout != math.inf else None):
                    await event.wait()


def wall_ms() -> int:
    return time.time_ns() // 1_000_000
