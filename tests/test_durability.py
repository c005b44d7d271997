"""Durability: what the server acknowledged survives SIGKILL and a restart on the same data dir.

The server runs as a real subprocess (`ServerProcess`); all traffic goes through S2's own
client, `s2-sdk`. After `kill()` (SIGKILL, no shutdown hooks) the server restarts on the same
port and data dir and must return every acknowledged record (exact seq_num, timestamp,
headers, body), the stream configs, the fencing token and the trim point.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Coroutine, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest
from s2_sdk import (
    S2,
    AppendAck,
    AppendInput,
    Batching,
    CommandRecord,
    Endpoints,
    FencingTokenMismatchError,
    ReadLimit,
    Record,
    Retry,
    S2Stream,
    SeqNum,
    StreamConfig,
    Timestamping,
    TimestampingMode,
)

T = TypeVar("T")
Unique = Callable[[str], str]
Row = tuple[int, int, list[tuple[bytes, bytes]], bytes]
DEADLINE = 15.0
# Client timestamps start an hour ago, so they are kept exactly as given.
BASE_MS = (time.time_ns() // 1_000_000 - 3_600_000) // 1000 * 1000


def run(coro: Coroutine[Any, Any, T], timeout: float = 60.0) -> T:
    return asyncio.run(asyncio.wait_for(coro, timeout))


def sdk(url: str) -> S2:
    return S2("durability-token", endpoints=Endpoints(url, url), retry=Retry(max_attempts=1))


@pytest.fixture
def server(tmp_path: Path) -> Iterator[Any]:
    from s2_spark.testing import ServerProcess

    process = ServerProcess(data_dir=tmp_path / "data", heartbeat_interval=0.5)
    process.start()
    try:
        yield process
    finally:
        process.kill()


def acked_rows(ack: AppendAck, records: list[Record]) -> list[Row]:
    """The rows an ack promises: consecutive seq_nums from ack.start, with the given records'
    (explicit, increasing) timestamps, which a client-prefer stream keeps as is."""
    assert ack.end.seq_num - ack.start.seq_num == len(records)
    rows = []
    for i, record in enumerate(records):
        assert record.timestamp is not None
        rows.append((ack.start.seq_num + i, record.timestamp, record.headers, record.body))
    return rows


async def read_all(stream: S2Stream, start: int = 0) -> list[Row]:
    rows: list[Row] = []
    tail = (await stream.check_tail()).seq_num
    while start < tail:
        batch = await stream.read(start=SeqNum(start))
        assert batch.records, f"no records from {start} below tail {tail}"
        rows.extend((r.seq_num, r.timestamp, r.headers, r.body) for r in batch.records)
        start = batch.records[-1].seq_num + 1
    return rows


def test_acknowledged_writes_survive_sigkill(server: Any, unique: Unique) -> None:
    basin_name = unique("dur")
    clock = iter(range(BASE_MS, BASE_MS + 1_000_000, 10))

    def record(body: bytes, headers: list[tuple[bytes, bytes]] | None = None) -> Record:
        return Record(body=body, headers=headers or [], timestamp=next(clock))

    async def write() -> tuple[list[Row], list[Row], tuple[int, int]]:
        async with sdk(server.url) as s2:
            await s2.create_basin(basin_name)
            basin = s2.basin(basin_name)
            await basin.create_stream(
                "configured",
                config=StreamConfig(
                    retention_policy=86_400,
                    timestamping=Timestamping(mode=TimestampingMode.CLIENT_REQUIRE),
                ),
            )
            await basin.ensure_stream("forever", config=StreamConfig(retention_policy="infinite"))
            await basin.reconfigure_stream(
                "configured", config=StreamConfig(retention_policy=43_200)
            )
            # Old client timestamps: retention counts from the append, also after restart.
            await basin.create_stream("backfill", config=StreamConfig(retention_policy=3600))
            old = [Record(body=b"1970", timestamp=1000), Record(body=b"2001", timestamp=10**12)]
            await basin.stream("backfill").append(AppendInput(records=old))
            await basin.create_stream("doomed")
            await basin.stream("doomed").append(AppendInput(records=[record(b"bye")]))
            await basin.delete_stream("doomed")
            await s2.create_basin(f"{basin_name}-gone")
            await s2.delete_basin(f"{basin_name}-gone")
            await basin.create_stream("data")
            data = basin.stream("data")
            expected: list[Row] = []

            unary = [record(b"u0", [(b"h", b"1")]), record(b""), record(b"\x00\xff" * 700)]
            expected += acked_rows(await data.append(AppendInput(records=unary)), unary)

            async with data.append_session() as session:
                batches = [
                    [record(f"s{i}-{j}".encode() * (1 + 300 * (j % 2))) for j in range(4)]
                    for i in range(5)
                ]
                tickets = [await session.submit(AppendInput(records=b)) for b in batches]
                for ticket, batch in zip(tickets, batches, strict=True):
                    expected += acked_rows(await ticket, batch)

            async with data.producer(batching=Batching(max_records=3)) as producer:
                produced = [record(f"p{i}".encode(), [(b"n", str(i).encode())]) for i in range(8)]
                tickets = [await producer.submit(r) for r in produced]
                acks = [await ticket for ticket in tickets]
            expected += [
                (ack.seq_num, r.timestamp or 0, r.headers, r.body)
                for ack, r in zip(acks, produced, strict=True)
            ]

            fence = record(b"owner-1", [(b"", b"fence")])
            expected += acked_rows(await data.append(AppendInput(records=[fence])), [fence])
            last = record(b"last")
            ack = await data.append(AppendInput(records=[last], fencing_token="owner-1"))
            expected += acked_rows(ack, [last])
            assert [row[0] for row in expected] == list(range(len(expected)))

            # A trimmed stream: wait (deadline) until the trim shows, so it must persist.
            await basin.create_stream("trimmed")
            trimmed = basin.stream("trimmed")
            five = [record(f"t{i}".encode()) for i in range(5)]
            trimmed_rows = acked_rows(await trimmed.append(AppendInput(records=five)), five)
            trim = CommandRecord.trim(3)
            trim.timestamp = next(clock)
            trimmed_rows += acked_rows(await trimmed.append(AppendInput(records=[trim])), [trim])
            async with asyncio.timeout(DEADLINE):
                while (await read_all(trimmed))[0][0] != 3:
                    await asyncio.sleep(0.05)
            assert await read_all(data) == expected
            tail = await data.check_tail()
            return expected, trimmed_rows[3:], (tail.seq_num, tail.timestamp)

    expected, trimmed_expected, tail = run(write())
    url = server.url
    server.kill()
    server.start()
    assert server.url == url

    async def verify() -> None:
        async with sdk(server.url) as s2:
            assert [b.name async for b in s2.list_all_basins(prefix=basin_name)] == [basin_name]
            basin = s2.basin(basin_name)
            assert [s.name async for s in basin.list_all_streams()] == [
                "backfill",
                "configured",
                "data",
                "forever",
                "trimmed",
            ]
            configured = await basin.get_stream_config("configured")
            assert configured.retention_policy == 43_200
            assert configured.timestamping is not None
            assert configured.timestamping.mode == TimestampingMode.CLIENT_REQUIRE
            assert (await basin.get_stream_config("forever")).retention_policy == "infinite"

            data = basin.stream("data")
            check = await data.check_tail()
            assert (check.seq_num, check.timestamp) == tail
            assert await read_all(data) == expected
            assert await read_all(basin.stream("trimmed")) == trimmed_expected
            assert await read_all(basin.stream("backfill")) == [
                (0, 1000, [], b"1970"),
                (1, 10**12, [], b"2001"),
            ]

            # The fence survived; appends continue at the next seq_num.
            with pytest.raises(FencingTokenMismatchError) as stale:
                await data.append(
                    AppendInput(records=[Record(body=b"zombie")], fencing_token="owner-0")
                )
            assert stale.value.expected_fencing_token == "owner-1"
            ack = await data.append(
                AppendInput(
                    records=[Record(body=b"after", timestamp=tail[1] + 1)],
                    match_seq_num=tail[0],
                    fencing_token="owner-1",
                )
            )
            assert (ack.start.seq_num, ack.start.timestamp) == (tail[0], tail[1] + 1)

            # A read session over the restarted server sees the same history.
            seen: list[int] = []
            async with data.read_session(
                start=SeqNum(0), limit=ReadLimit(count=tail[0] + 1)
            ) as session:
                async for batch in session:
                    seen.extend(r.seq_num for r in batch.records)
            assert seen == list(range(tail[0] + 1))

    run(verify())


def test_every_acked_batch_survives_kill_mid_session(server: Any, unique: Unique) -> None:
    """SIGKILL while an append session is streaming: all acked batches must be there after
    restart; anything beyond them must be a whole-batch prefix of what was submitted next."""
    basin_name = unique("durk")
    submitted: list[list[Record]] = []
    acked: list[Row] = []

    async def write_until_killed() -> None:
        async with sdk(server.url) as s2:
            await s2.create_basin(basin_name)
            await s2.basin(basin_name).create_stream("s")
            stream = s2.basin(basin_name).stream("s")
            session = stream.append_session()
            enough = asyncio.Event()

            async def collect(ticket: Any, batch: list[Record]) -> None:
                acked.extend(acked_rows(await ticket, batch))
                if len(acked) >= 60:
                    enough.set()

            collectors = []
            for i in range(400):
                batch = [
                    Record(body=f"b{i}-r{j}".encode() * 20, timestamp=BASE_MS + 10 * i + j + 1)
                    for j in range(3)
                ]
                submitted.append(batch)
                ticket = await session.submit(AppendInput(records=batch))
                collectors.append(asyncio.create_task(collect(ticket, batch)))
                if i == 40:
                    await asyncio.wait_for(enough.wait(), DEADLINE)
                    server.kill()  # mid-session: later batches may be in flight or unsent
                    break
            # Unacked tickets fail with a transport error; which ones is up to timing.
            await asyncio.wait_for(asyncio.gather(*collectors, return_exceptions=True), DEADLINE)
            with contextlib.suppress(Exception):
                await asyncio.wait_for(session.close(), DEADLINE)

    run(write_until_killed())
    assert len(acked) >= 60
    server.start()

    async def verify() -> None:
        async with sdk(server.url) as s2:
            stored = await read_all(s2.basin(basin_name).stream("s"))
        assert stored[: len(acked)] == sorted(acked)
        extra = stored[len(acked) :]
        next_batches = submitted[len(acked) // 3 :]
        flat = [r for batch in next_batches for r in batch]
        assert len(extra) % 3 == 0
        assert [(row[3], row[1]) for row in extra] == [
            (r.body, r.timestamp) for r in flat[: len(extra)]
        ]

    run(verify())


def test_torn_write_at_the_tail_is_discarded(server: Any, unique: Unique, tmp_path: Path) -> None:
    """A write cut short by the kill (simulated: junk appended to every data file) must not
    hide acknowledged records or block later appends."""
    basin_name = unique("durt")
    first = [Record(body=f"r{i}".encode(), timestamp=BASE_MS + i) for i in range(3)]

    async def write_first() -> None:
        async with sdk(server.url) as s2:
            await s2.create_basin(basin_name)
            await s2.basin(basin_name).create_stream("s")
            stream = s2.basin(basin_name).stream("s")
            ack = await stream.append(AppendInput(records=first))
            assert (ack.start.seq_num, ack.end.seq_num) == (0, 3)

    run(write_first())
    server.kill()
    files = [p for p in (tmp_path / "data").rglob("*") if p.is_file()]
    assert files, "the server wrote nothing to its data dir"
    for path in files:
        with path.open("ab") as f:
            f.write(b"\x02\x00\x00\x00\xff\xff\x7f")
    server.start()

    async def append_more() -> list[Row]:
        async with sdk(server.url) as s2:
            stream = s2.basin(basin_name).stream("s")
            assert await read_all(stream) == [
                (i, r.timestamp, [], r.body) for i, r in enumerate(first)
            ]
            ack = await stream.append(
                AppendInput(records=[Record(body=b"r3", timestamp=BASE_MS + 3)], match_seq_num=3)
            )
            assert ack.start.seq_num == 3
            return await read_all(stream)

    after_restart = run(append_more())
    server.kill()
    server.start()

    async def verify() -> None:
        async with sdk(server.url) as s2:
            assert await read_all(s2.basin(basin_name).stream("s")) == after_restart
            assert [row[0] for row in after_restart] == [0, 1, 2, 3]

    run(verify())
