"""Conformance: S2's official Python client (`s2-sdk`) against our local S2 server.

The tests drive the server through `s2-sdk` (plus one raw look at compressed S2S frames),
so a pass proves the server speaks S2 (JSON control plane, protobuf unary data plane, S2S
sessions over h2c, compressed bodies) the way S2's own client expects. Expected values
follow s2-lite, the behavioural reference; exceptions are s2-sdk's typed errors.
"""

from __future__ import annotations

import asyncio
import os
import queue
import re
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, TypeVar

import httpx
import pytest
from _s2_target import token
from s2_sdk import (
    S2,
    AppendInput,
    BasinConfig,
    Batching,
    CommandRecord,
    Compression,
    Endpoints,
    EnsureStatus,
    FencingTokenMismatchError,
    ReadLimit,
    ReadSession,
    ReadUnwrittenError,
    Record,
    Retry,
    S2Basin,
    S2ServerError,
    S2Stream,
    SeqNum,
    SeqNumMismatchError,
    SequencedRecord,
    StreamConfig,
    StreamPosition,
    TailOffset,
    Timestamp,
    Timestamping,
    TimestampingMode,
    metered_bytes,
)

#: What this proves is that the local server speaks S2 as S2's own client expects.
pytestmark = pytest.mark.local_server

R = TypeVar("R")
TOKEN = "conformance-token"
DEADLINE = 15.0  # seconds any single wait may take before the test fails

Unique = Callable[[str], str]
# Client timestamps in tests are offsets from an hour ago: old enough to be exact (never
# capped at arrival time), recent enough for any retention to keep them.
BASE_MS = (time.time_ns() // 1_000_000 - 3_600_000) // 1000 * 1000


def ts(offset_ms: int) -> int:
    """A client timestamp `offset_ms` after BASE_MS."""
    return BASE_MS + offset_ms


def run(coro: Coroutine[Any, Any, R], timeout: float = 60.0) -> R:
    """Run one async test body on a fresh event loop, bounded by a deadline."""
    return asyncio.run(asyncio.wait_for(coro, timeout))


def sdk(url: str, compression: Compression = Compression.NONE) -> S2:
    """An s2-sdk client pointed at the local server; no retries, so server faults surface."""
    return S2(
        token(TOKEN),
        endpoints=Endpoints(url, url),
        retry=Retry(max_attempts=1),
        compression=compression,
    )


async def new_basin(s2: S2, unique: Unique) -> S2Basin:
    name = unique("cf")
    info = await s2.create_basin(name)
    assert info.name == name
    return s2.basin(name)


def rows(records: list[SequencedRecord]) -> list[tuple[int, int, list[tuple[bytes, bytes]], bytes]]:
    return [(r.seq_num, r.timestamp, r.headers, r.body) for r in records]


def seq_bodies(records: list[SequencedRecord]) -> list[tuple[int, bytes]]:
    return [(r.seq_num, r.body) for r in records]


def pos(position: StreamPosition) -> tuple[int, int]:
    return (position.seq_num, position.timestamp)


class Collector:
    """Drains a read session in the background; tests wait on record counts with deadlines."""

    def __init__(self, session: ReadSession) -> None:
        self.session = session
        self.records: list[SequencedRecord] = []
        self._changed = asyncio.Event()
        self.task = asyncio.create_task(self._run())

    async def _run(self) -> None:
        try:
            async for batch in self.session:
                self.records.extend(batch.records)
                self._changed.set()
        finally:
            self._changed.set()

    async def wait_for(self, count: int) -> list[SequencedRecord]:
        async with asyncio.timeout(DEADLINE):
            while len(self.records) < count:
                if self.task.done():
                    self.task.result()  # re-raise the session's error, if any
                    raise AssertionError(f"session ended with {seq_bodies(self.records)}")
                self._changed.clear()
                await self._changed.wait()
        return self.records

    async def close(self) -> None:
        await self.session.close()
        await asyncio.wait_for(self.task, DEADLINE)


async def within(aw: Awaitable[R]) -> R:
    return await asyncio.wait_for(aw, DEADLINE)


# ---------------------------------------------------------------- control plane


def test_basin_create_ensure_list_delete(s2_server: Any, unique: Unique) -> None:
    prefix = unique("lb")
    names = [f"{prefix}-{suffix}" for suffix in ("a", "b", "c")]

    async def body() -> None:
        async with sdk(s2_server.url) as s2:
            for name in names[:2]:
                info = await s2.create_basin(name)
                assert info.name == name
                assert info.deleted_at is None

            with pytest.raises(S2ServerError) as exists:
                await s2.create_basin(names[0])
            assert (exists.value.status_code, exists.value.code) == (409, "resource_already_exists")

            created = await s2.ensure_basin(names[2])
            assert (created.basin.name, created.status) == (names[2], EnsureStatus.CREATED)
            again = await s2.ensure_basin(names[2])
            assert (again.basin.name, again.status) == (names[2], EnsureStatus.CONFIG_UNCHANGED)

            page = await s2.list_basins(prefix=prefix)
            assert [b.name for b in page.items] == names
            assert page.has_more is False

            first = await s2.list_basins(prefix=prefix, limit=2)
            assert [b.name for b in first.items] == names[:2]
            assert first.has_more is True
            rest = await s2.list_basins(prefix=prefix, start_after=names[1])
            assert [b.name for b in rest.items] == names[2:]
            assert rest.has_more is False
            assert [b.name async for b in s2.list_all_basins(prefix=prefix)] == names
            # A limit of 0 or above 1000 means the default, 1000 (s2-lite `ListLimit`).
            for limit in (0, 5000):
                page = await s2.list_basins(prefix=prefix, limit=limit)
                assert ([b.name for b in page.items], page.has_more) == (names, False)
            # A cursor before the prefix lists from the prefix (s2-lite `lite/src/backend/
            # kv/basin_meta.rs`, `ser_key_range`; the spec's "must be >= prefix" is not
            # enforced there).
            page = await s2.list_basins(prefix=prefix, start_after="a")
            assert [b.name for b in page.items] == names

            await s2.delete_basin(names[1])
            assert [b.name async for b in s2.list_all_basins(prefix=prefix)] == [
                names[0],
                names[2],
            ]

            missing = unique("missing")
            with pytest.raises(S2ServerError) as not_found:
                await s2.delete_basin(missing)
            assert (not_found.value.status_code, not_found.value.code) == (404, "basin_not_found")
            await s2.delete_basin(missing, ignore_not_found=True)
            with pytest.raises(S2ServerError) as no_config:
                await s2.get_basin_config(missing)
            assert (no_config.value.status_code, no_config.value.code) == (404, "basin_not_found")

    run(body())


def test_stream_create_ensure_list_delete(s2_server: Any, unique: Unique) -> None:
    async def body() -> None:
        async with sdk(s2_server.url) as s2:
            basin = await new_basin(s2, unique)
            names = ["logs/a", "logs/b", "logs/c", "metrics/x"]
            for name in names[:3]:
                info = await basin.create_stream(name)
                assert (info.name, info.deleted_at) == (name, None)

            with pytest.raises(S2ServerError) as exists:
                await basin.create_stream("logs/a")
            assert (exists.value.status_code, exists.value.code) == (409, "resource_already_exists")

            ensured = await basin.ensure_stream("metrics/x")
            assert (ensured.stream.name, ensured.status) == ("metrics/x", EnsureStatus.CREATED)
            unchanged = await basin.ensure_stream("metrics/x")
            assert unchanged.status == EnsureStatus.CONFIG_UNCHANGED

            everything = await basin.list_streams()
            assert [s.name for s in everything.items] == names
            assert everything.has_more is False
            logs = await basin.list_streams(prefix="logs/")
            assert [s.name for s in logs.items] == names[:3]
            first = await basin.list_streams(prefix="logs/", limit=2)
            assert ([s.name for s in first.items], first.has_more) == (names[:2], True)
            rest = await basin.list_streams(prefix="logs/", start_after="logs/b")
            assert ([s.name for s in rest.items], rest.has_more) == (["logs/c"], False)
            after_all = await basin.list_streams(start_after="metrics/x")
            assert (after_all.items, after_all.has_more) == ([], False)

            await basin.delete_stream("logs/b")
            assert [s.name async for s in basin.list_all_streams()] == [
                "logs/a",
                "logs/c",
                "metrics/x",
            ]
            with pytest.raises(S2ServerError) as gone:
                await basin.delete_stream("never-created")
            assert (gone.value.status_code, gone.value.code) == (404, "stream_not_found")
            await basin.delete_stream("never-created", ignore_not_found=True)
            with pytest.raises(S2ServerError) as no_config:
                await basin.get_stream_config("never-created")
            assert (no_config.value.status_code, no_config.value.code) == (404, "stream_not_found")

            with pytest.raises(S2ServerError) as no_basin:
                await s2.basin(unique("nobasin")).create_stream("s")
            assert (no_basin.value.status_code, no_basin.value.code) == (404, "basin_not_found")

    run(body())


def test_stream_config_round_trip(s2_server: Any, unique: Unique) -> None:
    async def body() -> None:
        async with sdk(s2_server.url) as s2:
            basin = await new_basin(s2, unique)
            await basin.create_stream(
                "aged",
                config=StreamConfig(
                    retention_policy=3600,
                    timestamping=Timestamping(mode=TimestampingMode.ARRIVAL),
                ),
            )
            aged = await basin.get_stream_config("aged")
            assert aged.retention_policy == 3600
            assert aged.timestamping is not None
            assert aged.timestamping.mode == TimestampingMode.ARRIVAL

            await basin.create_stream(
                "forever",
                config=StreamConfig(
                    retention_policy="infinite",
                    timestamping=Timestamping(mode=TimestampingMode.CLIENT_REQUIRE),
                ),
            )
            forever = await basin.get_stream_config("forever")
            assert forever.retention_policy == "infinite"
            assert forever.timestamping is not None
            assert forever.timestamping.mode == TimestampingMode.CLIENT_REQUIRE

            await basin.create_stream(
                "other",
                config=StreamConfig(storage_class="standard", delete_on_empty_min_age=600),
            )
            other_config = await basin.get_stream_config("other")
            assert (other_config.storage_class, other_config.delete_on_empty_min_age) == (
                "standard",
                600,
            )

            # PATCH changes only the fields given.
            patched = await basin.reconfigure_stream(
                "aged", config=StreamConfig(retention_policy=60)
            )
            assert patched.retention_policy == 60
            assert patched.timestamping is not None
            assert patched.timestamping.mode == TimestampingMode.ARRIVAL
            assert (await basin.get_stream_config("aged")).retention_policy == 60

            # Ensure with the same config is a no-op; with another config it updates.
            same = StreamConfig(
                retention_policy="infinite",
                timestamping=Timestamping(mode=TimestampingMode.CLIENT_REQUIRE),
            )
            assert (await basin.ensure_stream("forever", config=same)).status == (
                EnsureStatus.CONFIG_UNCHANGED
            )
            other = StreamConfig(
                retention_policy=7200,
                timestamping=Timestamping(mode=TimestampingMode.CLIENT_PREFER),
            )
            assert (await basin.ensure_stream("forever", config=other)).status == (
                EnsureStatus.CONFIG_UPDATED
            )
            updated = await basin.get_stream_config("forever")
            assert updated.retention_policy == 7200
            assert updated.timestamping is not None
            assert updated.timestamping.mode == TimestampingMode.CLIENT_PREFER

    run(body())


def test_timestamping_modes_take_effect(s2_server: Any, unique: Unique) -> None:
    async def body() -> None:
        async with sdk(s2_server.url) as s2:
            basin = await new_basin(s2, unique)
            await basin.create_stream(
                "arrival", config=StreamConfig(timestamping=Timestamping(TimestampingMode.ARRIVAL))
            )
            await basin.create_stream(
                "require",
                config=StreamConfig(timestamping=Timestamping(TimestampingMode.CLIENT_REQUIRE)),
            )
            before_ms = int(time.time() * 1000)
            ack = await basin.stream("arrival").append(
                AppendInput(records=[Record(body=b"a", timestamp=1000)])
            )
            assert ack.start.seq_num == 0
            assert ack.start.timestamp >= before_ms  # client timestamp ignored

            with pytest.raises(S2ServerError) as missing:
                await basin.stream("require").append(AppendInput(records=[Record(body=b"r")]))
            assert (missing.value.status_code, missing.value.code) == (422, "invalid")
            ack = await basin.stream("require").append(
                AppendInput(records=[Record(body=b"r", timestamp=ts(1234))])
            )
            assert (pos(ack.start), pos(ack.end)) == ((0, ts(1234)), (1, ts(1234)))

            # Future client timestamps are capped at arrival time unless `uncapped`.
            await basin.create_stream("capped")
            await basin.create_stream(
                "uncapped", config=StreamConfig(timestamping=Timestamping(uncapped=True))
            )
            future = int(time.time() * 1000) + 3_600_000
            capped = await basin.stream("capped").append(
                AppendInput(records=[Record(body=b"f", timestamp=future)])
            )
            after_ms = int(time.time() * 1000)
            assert before_ms <= capped.start.timestamp <= after_ms
            kept = await basin.stream("uncapped").append(
                AppendInput(records=[Record(body=b"f", timestamp=future)])
            )
            assert kept.start.timestamp == future
            config = await basin.get_stream_config("uncapped")
            assert config.timestamping is not None and config.timestamping.uncapped is True

            # Timestamps never go backwards: an older one is raised to the stream's maximum.
            monotonic = await basin.stream("require").append(
                AppendInput(
                    records=[
                        Record(body=b"x", timestamp=ts(1000)),
                        Record(b"y", timestamp=ts(2000)),
                    ]
                )
            )
            assert (pos(monotonic.start), pos(monotonic.end)) == ((1, ts(1234)), (3, ts(2000)))

    run(body())


def test_retention_age_counts_from_append_not_client_timestamp(
    s2_server: Any, unique: Unique
) -> None:
    """s2-lite expires records by a TTL set when they are written (slatedb
    `ExpireAfter(age)`), so a backfilled record with an old client timestamp stays readable
    for the whole retention age after its append."""

    async def body() -> None:
        async with sdk(s2_server.url) as s2:
            basin = await new_basin(s2, unique)
            await basin.create_stream("backfill", config=StreamConfig(retention_policy=3600))
            stream = basin.stream("backfill")
            old = [Record(body=b"1970", timestamp=1000), Record(body=b"2001", timestamp=10**12)]
            ack = await stream.append(AppendInput(records=old))
            assert (pos(ack.start), pos(ack.end)) == ((0, 1000), (2, 10**12))
            batch = await stream.read(start=SeqNum(0))
            assert rows(batch.records) == [(0, 1000, [], b"1970"), (1, 10**12, [], b"2001")]

    run(body())


def test_basin_config_defaults_and_auto_create(s2_server: Any, unique: Unique) -> None:
    async def body() -> None:
        async with sdk(s2_server.url) as s2:
            name = unique("cfg")
            await s2.create_basin(
                name,
                config=BasinConfig(
                    default_stream_config=StreamConfig(retention_policy=1234),
                    create_stream_on_append=True,
                ),
            )
            config = await s2.get_basin_config(name)
            assert config.default_stream_config is not None
            assert config.default_stream_config.retention_policy == 1234
            assert config.create_stream_on_append is True
            basin = s2.basin(name)
            await basin.create_stream("inherits")
            assert (await basin.get_stream_config("inherits")).retention_policy == 1234

            ack = await basin.stream("auto").append(AppendInput(records=[Record(body=b"a")]))
            assert (ack.start.seq_num, ack.end.seq_num) == (0, 1)
            assert [s.name for s in (await basin.list_streams()).items] == ["auto", "inherits"]
            assert (await basin.get_stream_config("auto")).retention_policy == 1234

            updated = await s2.reconfigure_basin(
                name, config=BasinConfig(create_stream_on_append=False)
            )
            assert updated.create_stream_on_append is False
            with pytest.raises(S2ServerError) as missing:
                await basin.stream("auto2").append(AppendInput(records=[Record(body=b"a")]))
            assert (missing.value.status_code, missing.value.code) == (404, "stream_not_found")

    run(body())


@pytest.mark.local_server
def test_access_token_is_enforced_and_never_echoed(unique: Unique) -> None:
    from s2_spark.testing import LocalS2Server

    secret = "s3cret-token-value"

    async def body(url: str) -> None:
        async with S2(secret, endpoints=Endpoints(url, url), retry=Retry(max_attempts=1)) as s2:
            basin = await new_basin(s2, unique)
            await basin.create_stream("s")
            await basin.stream("s").append(AppendInput(records=[Record(body=b"ok")]))
            basin_name = basin.name
        wrong = "wrong-token-value"
        async with S2(wrong, endpoints=Endpoints(url, url), retry=Retry(max_attempts=1)) as bad:
            with pytest.raises(S2ServerError) as listing:
                await bad.list_basins()
            stream = bad.basin(basin_name).stream("s")
            with pytest.raises(S2ServerError) as reading:
                await stream.read(start=SeqNum(0))
            with pytest.raises(S2ServerError) as following:
                async with stream.read_session(start=SeqNum(0)) as session:
                    async for _ in session:
                        pass
            appender = stream.append_session()
            ticket = await appender.submit(AppendInput(records=[Record(body=b"no")]))
            with pytest.raises(S2ServerError) as appending:
                await within(ticket)
            with pytest.raises(S2ServerError):
                await within(appender.close())
        for error in (listing, reading, following, appending):
            assert (error.value.status_code, error.value.code) == (403, "permission_denied")
            assert secret not in str(error.value) and wrong not in str(error.value)

    with LocalS2Server(token=secret) as server:
        run(body(server.url))


# ---------------------------------------------------------------- unary data plane

FIVE = [
    Record(body=b"zero", headers=[(b"k", b"v0")], timestamp=ts(1000)),
    Record(body=b"one", headers=[(b"k", b"v1"), (b"x", b"")], timestamp=ts(2000)),
    Record(body=b"", headers=[], timestamp=ts(3000)),
    Record(body=b"\x00\xffbinary", headers=[(b"bin\x00", b"\xfe")], timestamp=ts(4000)),
    Record(body=b"four", timestamp=ts(5000)),
]
FIVE_ROWS = [(i, r.timestamp, r.headers, r.body) for i, r in enumerate(FIVE)]


async def stream_with_five(s2: S2, unique: Unique) -> S2Stream:
    return (await basin_with_five(s2, unique)).stream("s")


async def basin_with_five(s2: S2, unique: Unique) -> S2Basin:
    """A new basin whose stream "s" holds FIVE at seq_nums 0-4 (tail 5, timestamp ts(5000))."""
    basin = await new_basin(s2, unique)
    await basin.create_stream("s")
    stream = basin.stream("s")
    first = await stream.append(AppendInput(records=FIVE[:3]))
    assert (pos(first.start), pos(first.end), pos(first.tail)) == (
        (0, ts(1000)),
        (3, ts(3000)),
        (3, ts(3000)),
    )
    second = await stream.append(AppendInput(records=FIVE[3:]))
    assert (pos(second.start), pos(second.end), pos(second.tail)) == (
        (3, ts(4000)),
        (5, ts(5000)),
        (5, ts(5000)),
    )
    return basin


def test_unary_append_read_each_start_kind(s2_server: Any, unique: Unique) -> None:
    async def body() -> None:
        async with sdk(s2_server.url) as s2:
            stream = await stream_with_five(s2, unique)
            assert rows((await stream.read(start=SeqNum(0))).records) == FIVE_ROWS
            assert rows((await stream.read(start=SeqNum(3))).records) == FIVE_ROWS[3:]
            # A timestamp start resolves to the first record at or after it.
            assert rows((await stream.read(start=Timestamp(ts(2000)))).records) == FIVE_ROWS[1:]
            assert rows((await stream.read(start=Timestamp(ts(2001)))).records) == FIVE_ROWS[2:]
            assert rows((await stream.read(start=Timestamp(0))).records) == FIVE_ROWS
            assert rows((await stream.read(start=TailOffset(2))).records) == FIVE_ROWS[3:]
            assert rows((await stream.read(start=TailOffset(99))).records) == FIVE_ROWS
            assert pos(await stream.check_tail()) == (5, ts(5000))

    run(body())


def test_unary_read_limits(s2_server: Any, unique: Unique) -> None:
    async def body() -> None:
        async with sdk(s2_server.url) as s2:
            stream = await stream_with_five(s2, unique)
            counted = await stream.read(start=SeqNum(1), limit=ReadLimit(count=2))
            assert rows(counted.records) == FIVE_ROWS[1:3]

            # Metered sizes (8 + 2*headers + names + values + body): 17, 19, 8, 23, 12.
            assert [metered_bytes([r]) for r in FIVE] == [17, 19, 8, 23, 12]
            by_bytes = await stream.read(start=SeqNum(0), limit=ReadLimit(bytes=44))
            assert rows(by_bytes.records) == FIVE_ROWS[:3]
            one_short = await stream.read(start=SeqNum(0), limit=ReadLimit(bytes=43))
            assert rows(one_short.records) == FIVE_ROWS[:2]
            too_small = await stream.read(start=SeqNum(0), limit=ReadLimit(bytes=10))
            assert too_small.records == []
            # A zero count or byte limit is a bound that nothing fits (s2-lite `ReadLimit`).
            assert (await stream.read(start=SeqNum(0), limit=ReadLimit(count=0))).records == []
            assert (await stream.read(start=SeqNum(0), limit=ReadLimit(bytes=0))).records == []

            until = await stream.read(start=SeqNum(0), until_timestamp=ts(3000))
            assert rows(until.records) == FIVE_ROWS[:2]
            none_before = await stream.read(start=SeqNum(0), until_timestamp=ts(1000))
            assert none_before.records == []

            both = await stream.read(
                start=SeqNum(0), limit=ReadLimit(count=4, bytes=1000), until_timestamp=ts(4500)
            )
            assert rows(both.records) == FIVE_ROWS[:4]

    run(body())


def test_unary_read_past_tail_and_clamp(s2_server: Any, unique: Unique) -> None:
    async def body() -> None:
        async with sdk(s2_server.url) as s2:
            basin = await new_basin(s2, unique)
            await basin.create_stream("empty")
            with pytest.raises(ReadUnwrittenError) as empty:
                await basin.stream("empty").read(start=SeqNum(0))
            assert empty.value.status_code == 416
            assert pos(empty.value.tail) == (0, 0)

            stream = await stream_with_five(s2, unique)
            for start in (SeqNum(5), SeqNum(6), SeqNum(1000), Timestamp(ts(5001))):
                with pytest.raises(ReadUnwrittenError) as past:
                    await stream.read(start=start)
                assert past.value.status_code == 416
                assert pos(past.value.tail) == (5, ts(5000))
            # Clamping moves the start to the tail, where a unary read without `wait` can
            # return nothing, so it is still 416 (s2-lite `read_start_seq_num`).
            with pytest.raises(ReadUnwrittenError) as clamped:
                await stream.read(start=SeqNum(1000), clamp_to_tail=True)
            assert pos(clamped.value.tail) == (5, ts(5000))
            # With a wait the clamped read long-polls and comes back empty.
            waited = await stream.read(start=SeqNum(1000), clamp_to_tail=True, wait=1)
            assert waited.records == []

            # A long poll at the tail returns what another task appends meanwhile (if the
            # append lands first, the read finds it at once: same answer either way).
            polling = asyncio.create_task(stream.read(start=SeqNum(5), wait=10))
            await stream.append(AppendInput(records=[Record(body=b"late", timestamp=ts(6000))]))
            polled = await within(polling)
            assert rows(polled.records) == [(5, ts(6000), [], b"late")]

    run(body())


def test_unary_append_conditions(s2_server: Any, unique: Unique) -> None:
    async def body() -> None:
        async with sdk(s2_server.url) as s2:
            basin = await basin_with_five(s2, unique)
            stream = basin.stream("s")
            with pytest.raises(SeqNumMismatchError) as seq:
                await stream.append(AppendInput(records=[Record(body=b"x")], match_seq_num=4))
            assert (seq.value.status_code, seq.value.expected_seq_num) == (412, 5)
            ok = await stream.append(
                AppendInput(records=[Record(body=b"x", timestamp=ts(6000))], match_seq_num=5)
            )
            assert (pos(ok.start), pos(ok.end)) == ((5, ts(6000)), (6, ts(6000)))

            # The fencing token starts out empty.
            with pytest.raises(FencingTokenMismatchError) as unset:
                await stream.append(AppendInput(records=[Record(body=b"y")], fencing_token="t"))
            assert (unset.value.status_code, unset.value.expected_fencing_token) == (412, "")
            empty_ok = await stream.append(
                AppendInput(records=[Record(body=b"y", timestamp=ts(7000))], fencing_token="")
            )
            assert empty_ok.start.seq_num == 6
            assert pos(await stream.check_tail()) == (7, ts(7000))

            with pytest.raises(S2ServerError) as missing:
                await basin.stream("never-created").append(AppendInput(records=[Record(body=b"z")]))
            assert (missing.value.status_code, missing.value.code) == (404, "stream_not_found")

    run(body())


def test_batch_caps_of_unary_reads_and_sessions(s2_server: Any, unique: Unique) -> None:
    """Unary reads return at most 1000 records / 1 MiB; sessions split into such batches."""

    async def body() -> None:
        async with sdk(s2_server.url) as s2:
            basin = await new_basin(s2, unique)
            await basin.create_stream("many")
            many = basin.stream("many")
            for k in range(3):
                batch = [Record(body=f"{k}-{i}".encode()) for i in range(1000)]
                ack = await many.append(AppendInput(records=batch))
                assert (ack.start.seq_num, ack.end.seq_num) == (1000 * k, 1000 * k + 1000)
            first = await many.read(start=SeqNum(0))
            assert [r.seq_num for r in first.records] == list(range(1000))
            capped = await many.read(start=SeqNum(1500), limit=ReadLimit(count=2500))
            assert [r.seq_num for r in capped.records] == list(range(1500, 2500))

            got: list[SequencedRecord] = []
            sizes: list[int] = []
            async with many.read_session(start=SeqNum(0), limit=ReadLimit(count=2500)) as session:
                async for read_batch in session:
                    sizes.append(len(read_batch.records))
                    got.extend(read_batch.records)
            assert [r.seq_num for r in got] == list(range(2500))
            assert max(sizes) <= 1000
            assert got[2499].body == b"2-499"

            await basin.create_stream("big")
            big = basin.stream("big")
            body_300k = b"b" * (300 * 1024)
            for _ in range(4):
                await big.append(AppendInput(records=[Record(body=body_300k)]))
            by_size = await big.read(start=SeqNum(0))
            assert [(r.seq_num, len(r.body)) for r in by_size.records] == [
                (0, len(body_300k)),
                (1, len(body_300k)),
                (2, len(body_300k)),
            ]

    run(body())


# ---------------------------------------------------------------- command records


def test_fence_command_rejects_stale_writers(s2_server: Any, unique: Unique) -> None:
    async def body() -> None:
        async with sdk(s2_server.url) as s2:
            stream = await stream_with_five(s2, unique)
            ack = await stream.append(AppendInput(records=[CommandRecord.fence("writer-1")]))
            assert (ack.start.seq_num, ack.end.seq_num) == (5, 6)

            with pytest.raises(FencingTokenMismatchError) as stale:
                await stream.append(
                    AppendInput(records=[Record(body=b"stale")], fencing_token="writer-0")
                )
            assert stale.value.expected_fencing_token == "writer-1"
            fenced_ok = await stream.append(
                AppendInput(records=[Record(body=b"fresh")], fencing_token="writer-1")
            )
            assert fenced_ok.start.seq_num == 6

            # Fence commands obey the current token too; an empty body clears the fence.
            with pytest.raises(FencingTokenMismatchError):
                await stream.append(
                    AppendInput(records=[CommandRecord.fence("writer-2")], fencing_token="nope")
                )
            await stream.append(
                AppendInput(records=[CommandRecord.fence("")], fencing_token="writer-1")
            )
            cleared = await stream.append(
                AppendInput(records=[Record(body=b"any")], fencing_token="")
            )
            assert cleared.start.seq_num == 8

            batch = await stream.read(start=SeqNum(5))
            assert [
                (r.seq_num, r.headers, r.body, r.is_command_record()) for r in batch.records
            ] == [
                (5, [(b"", b"fence")], b"writer-1", True),
                (6, [], b"fresh", False),
                (7, [(b"", b"fence")], b"", True),
                (8, [], b"any", False),
            ]
            plain = await stream.read(start=SeqNum(5), ignore_command_records=True)
            assert seq_bodies(plain.records) == [(6, b"fresh"), (8, b"any")]

    run(body())


def test_trim_command_removes_records_from_reads(s2_server: Any, unique: Unique) -> None:
    async def body() -> None:
        async with sdk(s2_server.url) as s2:
            stream = await stream_with_five(s2, unique)
            ack = await stream.append(AppendInput(records=[CommandRecord.trim(3)]))
            assert (ack.start.seq_num, ack.end.seq_num) == (5, 6)
            trim_row = (5, [(b"", b"trim")], (3).to_bytes(8, "big"))

            # s2-lite trims in the background, so wait (with a deadline) for it to apply.
            async with asyncio.timeout(DEADLINE):
                while True:
                    batch = await stream.read(start=SeqNum(0))
                    if batch.records and batch.records[0].seq_num == 3:
                        break
                    await asyncio.sleep(0.05)
            assert [(r.seq_num, r.headers, r.body) for r in batch.records] == [
                (3, FIVE[3].headers, FIVE[3].body),
                (4, [], b"four"),
                trim_row,
            ]
            # A trim below the first retained record changes nothing.
            await stream.append(AppendInput(records=[CommandRecord.trim(1)]))
            after = await stream.read(start=SeqNum(0), ignore_command_records=True)
            assert seq_bodies(after.records) == [(3, FIVE[3].body), (4, b"four")]
            assert (await stream.check_tail()).seq_num == 7

            # A trim can reach through its own record but not past it.
            await stream.append(AppendInput(records=[CommandRecord.trim(1000)]))
            async with asyncio.timeout(DEADLINE):
                while (await stream.read(start=SeqNum(0))).records:
                    await asyncio.sleep(0.05)
            assert pos(await stream.check_tail())[0] == 8
            after_all = await stream.append(AppendInput(records=[Record(body=b"next")]))
            assert after_all.start.seq_num == 8
            assert seq_bodies((await stream.read(start=SeqNum(0))).records) == [(8, b"next")]

    run(body())


# ---------------------------------------------------------------- append sessions


def test_append_session_pipelines_and_reports_mismatches(s2_server: Any, unique: Unique) -> None:
    async def body() -> None:
        async with sdk(s2_server.url) as s2:
            basin = await new_basin(s2, unique)
            await basin.create_stream("s")
            stream = basin.stream("s")

            async with stream.append_session() as session:
                tickets = [
                    await session.submit(
                        AppendInput(
                            records=[
                                Record(body=f"b{i}-r{j}".encode(), timestamp=ts(100 * i + j))
                                for j in range(3)
                            ],
                            match_seq_num=3 * (i - 1),
                        )
                    )
                    for i in range(1, 11)
                ]
                acks = [await within(t) for t in tickets]
            assert [(a.start.seq_num, a.end.seq_num) for a in acks] == [
                (3 * i, 3 * i + 3) for i in range(10)
            ]
            assert [(a.start.timestamp, a.end.timestamp) for a in acks] == [
                (ts(100 * i), ts(100 * i + 2)) for i in range(1, 11)
            ]

            session = stream.append_session()
            good = await session.submit(AppendInput(records=[Record(body=b"ok")], match_seq_num=30))
            bad = await session.submit(AppendInput(records=[Record(body=b"no")], match_seq_num=7))
            after = await session.submit(AppendInput(records=[Record(body=b"late")]))
            assert (await within(good)).start.seq_num == 30
            with pytest.raises(SeqNumMismatchError) as seq:
                await within(bad)
            assert (seq.value.status_code, seq.value.expected_seq_num) == (412, 31)
            with pytest.raises(SeqNumMismatchError):
                await within(after)
            with pytest.raises(SeqNumMismatchError):
                await within(session.close())

            await stream.append(AppendInput(records=[CommandRecord.fence("sess-1")]))
            session = stream.append_session()
            stale = await session.submit(
                AppendInput(records=[Record(body=b"stale")], fencing_token="sess-0")
            )
            with pytest.raises(FencingTokenMismatchError) as fence:
                await within(stale)
            assert (fence.value.status_code, fence.value.expected_fencing_token) == (412, "sess-1")
            with pytest.raises(FencingTokenMismatchError):
                await within(session.close())

            async with stream.append_session() as session:
                fresh = await session.submit(
                    AppendInput(records=[Record(body=b"fresh")], fencing_token="sess-1")
                )
                assert (await within(fresh)).start.seq_num == 32

            tail_batch = await stream.read(start=SeqNum(29))
            assert seq_bodies(tail_batch.records) == [
                (29, b"b10-r2"),
                (30, b"ok"),
                (31, b"sess-1"),
                (32, b"fresh"),
            ]

    run(body())


def test_producer_assigns_seq_nums_and_reports_mismatches(s2_server: Any, unique: Unique) -> None:
    async def body() -> None:
        async with sdk(s2_server.url) as s2:
            basin = await new_basin(s2, unique)
            await basin.create_stream("s")
            stream = basin.stream("s")
            await stream.append(AppendInput(records=[CommandRecord.fence("prod-1")]))

            async with stream.producer(
                fencing_token="prod-1", match_seq_num=1, batching=Batching(max_records=4)
            ) as producer:
                tickets = [await producer.submit(Record(body=f"p{i}".encode())) for i in range(10)]
                acks = [await within(t) for t in tickets]
            assert [a.seq_num for a in acks] == list(range(1, 11))
            assert [(a.batch.start.seq_num, a.batch.end.seq_num) for a in acks] == (
                [(1, 5)] * 4 + [(5, 9)] * 4 + [(9, 11)] * 2
            )
            batch = await stream.read(start=SeqNum(1))
            assert seq_bodies(batch.records) == [(i + 1, f"p{i}".encode()) for i in range(10)]

            producer = stream.producer(match_seq_num=5)
            ticket = await producer.submit(Record(body=b"x"))
            with pytest.raises(SeqNumMismatchError) as seq:
                await within(ticket)
            assert seq.value.expected_seq_num == 11
            with pytest.raises(SeqNumMismatchError):
                await within(producer.close())

            producer = stream.producer(fencing_token="prod-0")
            ticket = await producer.submit(Record(body=b"x"))
            with pytest.raises(FencingTokenMismatchError) as fence:
                await within(ticket)
            assert fence.value.expected_fencing_token == "prod-1"
            with pytest.raises(FencingTokenMismatchError):
                await within(producer.close())

            assert (await stream.check_tail()).seq_num == 11

    run(body())


# ---------------------------------------------------------------- read sessions


def test_read_session_catches_up_then_follows(s2_server: Any, unique: Unique) -> None:
    async def body() -> None:
        async with sdk(s2_server.url) as s2:
            basin = await new_basin(s2, unique)
            await basin.create_stream("s")
            stream = basin.stream("s")
            await stream.append(
                AppendInput(records=[Record(body=f"old{i}".encode()) for i in range(3)])
            )

            reader = Collector(stream.read_session(start=SeqNum(0)))
            caught_up = await within(reader.session.caught_up())
            assert caught_up.seq_num == 3
            assert seq_bodies(await reader.wait_for(3)) == [
                (0, b"old0"),
                (1, b"old1"),
                (2, b"old2"),
            ]

            async def writer() -> None:
                async with stream.append_session() as session:
                    t1 = await session.submit(AppendInput(records=[Record(body=b"new3")]))
                    t2 = await session.submit(
                        AppendInput(records=[Record(body=b"new4"), Record(body=b"new5")])
                    )
                    await t1
                    await t2
                await stream.append(AppendInput(records=[Record(body=b"new6")]))

            writing = asyncio.create_task(writer())
            records = await reader.wait_for(7)
            await within(writing)
            assert seq_bodies(records) == [
                (0, b"old0"),
                (1, b"old1"),
                (2, b"old2"),
                (3, b"new3"),
                (4, b"new4"),
                (5, b"new5"),
                (6, b"new6"),
            ]
            assert [r.timestamp for r in records] == sorted(r.timestamp for r in records)
            assert (await within(reader.session.caught_up())).seq_num == 7
            await reader.close()

            # A tail-offset session starts N records before the tail and follows too.
            tailing = Collector(stream.read_session(start=TailOffset(2)))
            await within(tailing.session.caught_up())
            await stream.append(AppendInput(records=[Record(body=b"new7")]))
            assert seq_bodies(await tailing.wait_for(3)) == [
                (5, b"new5"),
                (6, b"new6"),
                (7, b"new7"),
            ]
            await tailing.close()

    run(body())


def test_read_session_bounds_clamp_and_past_tail(s2_server: Any, unique: Unique) -> None:
    async def body() -> None:
        async with sdk(s2_server.url) as s2:
            stream = await stream_with_five(s2, unique)

            async def drain(session: ReadSession) -> list[SequencedRecord]:
                out: list[SequencedRecord] = []
                async with session:
                    async for batch in session:
                        out.extend(batch.records)
                return out

            # Bounded sessions end by themselves once the bound or the tail is reached.
            assert (
                rows(
                    await within(
                        drain(stream.read_session(start=SeqNum(1), limit=ReadLimit(count=3)))
                    )
                )
                == FIVE_ROWS[1:4]
            )
            assert (
                rows(
                    await within(
                        drain(stream.read_session(start=SeqNum(0), limit=ReadLimit(bytes=44)))
                    )
                )
                == FIVE_ROWS[:3]
            )
            assert (
                rows(
                    await within(
                        drain(
                            stream.read_session(start=Timestamp(ts(2000)), until_timestamp=ts(4000))
                        )
                    )
                )
                == FIVE_ROWS[1:3]
            )
            assert (
                rows(
                    await within(
                        drain(stream.read_session(start=SeqNum(2), limit=ReadLimit(count=100)))
                    )
                )
                == FIVE_ROWS[2:]
            )
            assert (
                rows(
                    await within(
                        drain(
                            stream.read_session(
                                start=SeqNum(0),
                                ignore_command_records=True,
                                limit=ReadLimit(count=2),
                            )
                        )
                    )
                )
                == (FIVE_ROWS[:2])
            )

            with pytest.raises(ReadUnwrittenError) as past:
                await within(drain(stream.read_session(start=SeqNum(9))))
            assert pos(past.value.tail) == (5, ts(5000))

            # Clamped, a session past the tail starts at the tail and follows it.
            clamped = Collector(stream.read_session(start=SeqNum(9), clamp_to_tail=True))
            assert (await within(clamped.session.caught_up())).seq_num == 5
            await stream.append(AppendInput(records=[Record(body=b"five", timestamp=ts(6000))]))
            assert rows(await clamped.wait_for(1)) == [(5, ts(6000), [], b"five")]
            await clamped.close()

    run(body())


def test_read_session_wait_and_stream_deletion(s2_server: Any, unique: Unique) -> None:
    async def body() -> None:
        async with sdk(s2_server.url) as s2:
            basin = await new_basin(s2, unique)
            stream = basin.stream("s")
            await basin.create_stream("s")
            await stream.append(AppendInput(records=[Record(body=b"only")]))

            # `wait` bounds the idle time of an unbounded session: it ends on its own.
            got: list[SequencedRecord] = []
            async with stream.read_session(start=SeqNum(0), wait=1) as session:
                async for batch in session:
                    got.extend(batch.records)
            assert seq_bodies(got) == [(0, b"only")]

            # Deleting a followed stream (s2-lite `streamer.rs` `append_terminal_trim`,
            # `read.rs`): the follower gets the terminal trim, a `trim` command record to
            # 2^64-1, then its session ends with 503 `unavailable` (the streamer is gone).
            follower = Collector(stream.read_session(start=SeqNum(0)))
            await within(follower.session.caught_up())
            await basin.delete_stream("s")
            with pytest.raises(S2ServerError) as deleted:
                await follower.wait_for(3)
            assert (deleted.value.status_code, deleted.value.code) == (503, "unavailable")
            trim = (2**64 - 1).to_bytes(8, "big")
            assert seq_bodies(follower.records) == [(0, b"only"), (1, trim)]
            assert follower.records[1].headers == [(b"", b"trim")]

    run(body())


def test_rejected_append_session_leaves_the_connection_alone(
    s2_server: Any, unique: Unique
) -> None:
    """An append session answered early (404) while its request body still streams must fail
    with that 404 and leave other streams on the same HTTP/2 connection running."""

    async def body() -> None:
        async with sdk(s2_server.url) as s2:
            basin = await new_basin(s2, unique)
            await basin.create_stream("live")
            live = basin.stream("live")
            reader = Collector(live.read_session(start=SeqNum(0)))
            await within(reader.session.caught_up())
            for _ in range(3):
                session = basin.stream("missing").append_session()
                tickets = [
                    await session.submit(AppendInput(records=[Record(body=b"x" * 50_000)]))
                    for _ in range(5)
                ]
                for ticket in tickets:
                    with pytest.raises(S2ServerError) as rejected:
                        await within(ticket)
                    assert (rejected.value.status_code, rejected.value.code) == (
                        404,
                        "stream_not_found",
                    )
                with pytest.raises(S2ServerError):
                    await within(session.close())
            await live.append(AppendInput(records=[Record(body=b"still here")]))
            assert seq_bodies(await reader.wait_for(1)) == [(0, b"still here")]
            await reader.close()

    run(body())


# ---------------------------------------------------------------- compression


@pytest.mark.parametrize("compression", [Compression.ZSTD, Compression.GZIP])
def test_sessions_with_compression(
    s2_server: Any, unique: Unique, compression: Compression
) -> None:
    # Bodies over 1 KiB so the S2S frames really are compressed both ways.
    bodies = [(f"{i:04d}" * 700).encode() for i in range(12)]

    async def body() -> str:
        async with sdk(s2_server.url, compression) as s2:
            # With compression on, s2-sdk also sends unary bodies (JSON control plane,
            # protobuf appends) with a Content-Encoding.
            basin = await new_basin(s2, unique)
            await basin.create_stream("unary")
            unary = basin.stream("unary")
            ack = await unary.append(AppendInput(records=[Record(body=b) for b in bodies[:2]]))
            assert (ack.start.seq_num, ack.end.seq_num) == (0, 2)
            assert seq_bodies((await unary.read(start=SeqNum(0))).records) == [
                (0, bodies[0]),
                (1, bodies[1]),
            ]
            await basin.create_stream("s")
            basin_name = basin.name
            stream = basin.stream("s")
            reader = Collector(stream.read_session(start=SeqNum(0)))
            async with stream.append_session() as session:
                tickets = [
                    await session.submit(
                        AppendInput(records=[Record(body=b) for b in bodies[i : i + 3]])
                    )
                    for i in range(0, 12, 3)
                ]
                acks = [await within(t) for t in tickets]
            assert [a.start.seq_num for a in acks] == [0, 3, 6, 9]
            assert seq_bodies(await reader.wait_for(12)) == list(enumerate(bodies))
            await reader.close()

            async with stream.producer() as producer:
                ticket = await producer.submit(Record(body=b"z" * 5000))
                assert (await within(ticket)).seq_num == 12
            bounded: list[SequencedRecord] = []
            async with stream.read_session(start=SeqNum(10), limit=ReadLimit(count=3)) as s:
                async for batch in s:
                    bounded.extend(batch.records)
            assert seq_bodies(bounded) == [(10, bodies[10]), (11, bodies[11]), (12, b"z" * 5000)]
        return basin_name

    basin_name = run(body())

    # The SDK would also accept plain frames, so look at the wire: a raw S2S read that
    # accepts this encoding gets frames whose flag byte names it (CC bits: zstd 01, gzip 10).
    response = httpx.get(
        f"{s2_server.url}/v1/streams/s/records",
        params={"seq_num": 0, "count": 13},
        headers={
            "s2-basin": basin_name,
            "content-type": "s2s/proto",
            "accept": "s2s/proto",
            "accept-encoding": compression.value,
            "authorization": f"Bearer {token(TOKEN)}",
        },
        timeout=DEADLINE,
    )
    assert response.status_code == 200
    data, flags = response.content, []
    while data:
        length = int.from_bytes(data[:3], "big")
        flags.append(data[3])
        data = data[3 + length :]
    assert not any(flag & 0x80 for flag in flags)  # no terminal (error) frame
    expected = {Compression.ZSTD: 1, Compression.GZIP: 2}[compression]
    assert {(flag >> 5) & 0b11 for flag in flags} == {expected}


# ---------------------------------------------------------------- the "done when"


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_done_when_cli_server_serves_s2_sdk(unique: Unique) -> None:
    """`python -m s2_spark.testing --port N` in a subprocess; the client side is only s2-sdk."""
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "s2_spark.testing", "--port", str(port)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    try:
        url = wait_for_url(proc, port)

        async def body() -> None:
            async with sdk(url) as s2:
                basin = await new_basin(s2, unique)
                await basin.create_stream("events")
                stream = basin.stream("events")
                reader = Collector(stream.read_session(start=SeqNum(0)))
                async with stream.producer(match_seq_num=0) as producer:
                    tickets = [
                        await producer.submit(Record(body=f"e{i}".encode())) for i in range(5)
                    ]
                    assert [(await within(t)).seq_num for t in tickets] == list(range(5))
                await stream.append(
                    AppendInput(records=[CommandRecord.fence("owner-2")], match_seq_num=5)
                )
                with pytest.raises(FencingTokenMismatchError) as fenced:
                    await stream.append(
                        AppendInput(records=[Record(body=b"zombie")], fencing_token="owner-1")
                    )
                assert fenced.value.expected_fencing_token == "owner-2"
                await stream.append(
                    AppendInput(records=[Record(body=b"e6")], fencing_token="owner-2")
                )
                records = await reader.wait_for(7)
                assert seq_bodies(records) == [(i, f"e{i}".encode()) for i in range(5)] + [
                    (5, b"owner-2"),
                    (6, b"e6"),
                ]
                assert records[5].is_command_record()
                await reader.close()

        run(body())
    finally:
        proc.kill()
        proc.wait(timeout=10)
        if proc.stdout is not None:
            proc.stdout.close()


def wait_for_url(proc: subprocess.Popen[str], port: int) -> str:
    """Read the server's stdout (on a thread, so a silent server cannot hang the test)
    until it prints the URL it serves on."""
    assert proc.stdout is not None
    lines: queue.Queue[str] = queue.Queue()
    stdout = proc.stdout

    def pump() -> None:
        for line in stdout:
            lines.put(line)

    threading.Thread(target=pump, daemon=True).start()
    deadline = time.monotonic() + 30
    seen: list[str] = []
    while (left := deadline - time.monotonic()) > 0:
        try:
            line = lines.get(timeout=min(left, 0.5))
        except queue.Empty:
            if proc.poll() is not None:
                break
            continue
        seen.append(line)
        match = re.search(r"http://[\w.\[\]:-]+:(\d+)", line)
        if match:
            assert int(match.group(1)) == port
            return match.group(0)
    raise AssertionError(f"server printed no URL (exit={proc.poll()}): {''.join(seen)!r}")
