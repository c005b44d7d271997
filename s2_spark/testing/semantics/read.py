"""Read sessions over a stream, following s2-lite's `read_session` step by step.

A session yields `Batch` (a slice of stored entries, at most 1000 records / 1 MiB) and
`Heartbeat` (the tail, sent when the session catches up and then, while it follows,
after a random delay drawn anew each time: 5-15 s, as s2-lite's `new_heartbeat_sleep`
in `lite/src/backend/read.rs`; tests may set a shorter range). It ends when a bound
(count, bytes, until) is reached, when it is caught up and may not follow, or when `wait`
passes without records.
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import math
import random
import time
from collections.abc import AsyncGenerator, AsyncIterator
from dataclasses import dataclass

from s2_spark.testing.semantics.deletion import streamer_gone
from s2_spark.testing.semantics.encryption import Sealer
from s2_spark.testing.semantics.errors import ApiError
from s2_spark.testing.semantics.records import MAX_BATCH_BYTES, MAX_BATCH_RECORDS
from s2_spark.testing.semantics.store import Store
from s2_spark.testing.semantics.stream import Stream

__all__ = [
    "HEARTBEAT_INTERVAL",
    "Batch",
    "Heartbeat",
    "HeartbeatInterval",
    "ReadSpec",
    "heartbeat_range",
    "read_session",
    "resolve_start",
]

#: Seconds between heartbeats of a following session: (low, high), drawn uniformly.
HeartbeatInterval = tuple[float, float]
#: s2-lite's: `rand::random_range(5_000..15_000)` ms (`lite/src/backend/read.rs`).
HEARTBEAT_INTERVAL: HeartbeatInterval = (5.0, 15.0)


def heartbeat_range(value: float | tuple[float, float]) -> HeartbeatInterval:
    """A heartbeat interval from seconds (fixed) or (low, high), checked."""
    low, high = (value, value) if isinstance(value, int | float) else value
    if not 0 < low <= high:
        raise ValueError(f"heartbeat interval must be 0 < low <= high seconds (got {value!r})")
    return float(low), float(high)


def _next_beat(interval: HeartbeatInterval) -> float:
    low, high = interval
    return low if low == high else random.uniform(low, high)


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


@dataclass(slots=True)
class _Bounds:
    """What a session may still send: records, metered bytes (None = unbounded), and the
    timestamp its records must stay below."""

    count: int | None
    bytes: int | None
    until: int | None

    def spent(self) -> bool:
        return self.count == 0 or self.bytes == 0


def _cut_batch(
    stream: Stream, pos: int, bounds: _Bounds, tail: tuple[int, int] | None
) -> Batch | None:
    """The next batch from `pos` (< the tail) within S2's batch limits and `bounds`, which
    it uses up; None when the next record is beyond a bound."""
    i = pos - stream.first_seq
    j = min(len(stream.entries), i + MAX_BATCH_RECORDS)
    if bounds.count is not None:
        j = min(j, i + bounds.count)
    bmax = MAX_BATCH_BYTES if bounds.bytes is None else min(MAX_BATCH_BYTES, bounds.bytes)
    base = stream.cum_before(i)
    j = min(j, bisect.bisect_right(stream.cum, base + bmax, i, j))
    if bounds.until is not None:
        j = bisect.bisect_left(stream.timestamps, bounds.until, i, j)
    if j <= i:
        return None
    metered = stream.cum[j - 1] - base
    batch = Batch(
        stream.entries[i:j],
        pos,
        stream.first_seq + j - 1,
        stream.timestamps[j - 1],
        metered,
        tail,
    )
    if bounds.count is not None:
        bounds.count -= j - i
    if bounds.bytes is not None:
        bounds.bytes -= metered
    return batch


async def _follow(
    stream: Stream, pos: int, deadline: float | None, heartbeat_interval: HeartbeatInterval
) -> AsyncGenerator[Heartbeat, None]:
    """Wait for a record at `pos` (or the stream's deletion), sending a heartbeat after
    each random delay; ends then, or at `deadline` with none arrived."""
    loop = asyncio.get_running_loop()
    next_beat = loop.time() + _next_beat(heartbeat_interval)
    while stream.next_seq <= pos and stream.deleted_at is None:
        now = loop.time()
        if deadline is not None and deadline <= now:
            return
        if next_beat <= now:
            yield Heartbeat(stream.tail)
            next_beat = loop.time() + _next_beat(heartbeat_interval)
            continue
        timeout = next_beat - now
        if deadline is not None:
            timeout = min(timeout, deadline - now)
        event = stream.changed_event()
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout if timeout != math.inf else None):
                await event.wait()


async def read_session(
    store: Store,
    stream: Stream,
    start_seq: int,
    spec: ReadSpec,
    heartbeat_interval: HeartbeatInterval,
    sealer: Sealer | None = None,
) -> AsyncIterator[Batch | Heartbeat]:
    """Yield batches and heartbeats until a bound, the end of catch-up, or `wait` ends it;
    an encrypted stream's records opened with `sealer`. A session that would follow a
    deleted stream ends with 503 once it has what was appended, the terminal trim
    included (s2-lite: its streamer is gone)."""
    pos = start_seq
    bounds = _Bounds(spec.count, spec.bytes, spec.until)
    wait = spec.wait
    may_follow = spec.may_follow()
    deadline: float | None = None
    following = False
    loop = asyncio.get_running_loop()
    while True:
        stream.apply_retention(store.clock())
        pos = max(pos, stream.first_seq)
        if pos < stream.next_seq:
            batch = _cut_batch(stream, pos, bounds, stream.tail if following else None)
            if batch is None:
                return  # the next record is beyond a bound
            pos = batch.last_seq + 1
            if sealer is not None:
                batch.entries = [sealer.open(e) for e in batch.entries]
            if wait is not None:
                deadline = loop.time() + wait
            yield batch
            if bounds.spent():
                return
            continue
        # Caught up with the tail.
        if not may_follow:
            return
        if stream.deleted_at is not None:
            raise streamer_gone()
        if deadline is None and wait is not None:
            deadline = loop.time() + wait
        if deadline is not None and deadline <= loop.time():
            return
        if not following:
            following = True
            yield Heartbeat(stream.tail)
        async with contextlib.aclosing(_follow(stream, pos, deadline, heartbeat_interval)) as beats:
            async for beat in beats:
                yield beat
        if stream.next_seq <= pos and stream.deleted_at is None:
            return  # `wait` passed without records


def wall_ms() -> int:
    return time.time_ns() // 1_000_000
