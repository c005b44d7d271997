"""The exactly-once S2 sink protocol (s2_spark.backends.s2.sink), without Spark.

Real appends against the local server: resume after a partial write, restarts (newer
generation), zombies of older attempts, partitions taking turns, the lease token format.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import pyarrow as pa
import pytest

from s2_spark.backends.s2.sink import (
    DATA_MAX_BYTES,
    ForeignFenceError,
    LeaseToken,
    SinkSettings,
    StreamSink,
    WriterId,
    query_key,
)
from s2_spark.errors import NotFoundError, RecordTooLargeError, WriterFencedError

pytestmark = pytest.mark.backend


class Boom(Exception):
    pass


def data_rows(basin: Any, stream: str) -> list[tuple[bytes, list[tuple[bytes, bytes]]]]:
    """Every non-command record of `stream`, in order."""
    out: list[tuple[bytes, list[tuple[bytes, bytes]]]] = []
    s = basin.stream(stream)
    tail = s.check_tail().seq_num
    pos = 0
    while pos < tail:
        decoded = s.read(seq_num=pos, count=min(1000, tail - pos), include_command_records=False)
        if decoded.count == 0:
            break
        for rec in decoded.batch.to_pylist():
            out.append((rec["body"], [(h["name"], h["value"]) for h in rec["headers"]]))
        pos = int(decoded.last_seq_num) + 1
    return out


def bodies(n: int, prefix: str = "r", start: int = 0) -> pa.Array:
    return pa.array([f"{prefix}{i}".encode() for i in range(start, start + n)], pa.binary())


def wid(**kw: Any) -> WriterId:
    base: dict[str, Any] = dict(
        query=query_key("q1"), streaming=True, generation=1000, batch=3, partition=0, attempt=0
    )
    base.update(kw)
    return WriterId(**base)


SMALL = SinkSettings(flush_records=999, lease_timeout=30.0)


def test_token_round_trip_and_size() -> None:
    t = LeaseToken(True, True, True, "abc", 2**41, 10**6, 4000, 3, 2**40)
    raw = t.encode()
    assert len(raw) <= 36
    assert LeaseToken.parse(raw) == t
    assert LeaseToken.parse("") is None
    assert LeaseToken.parse("someone-else") is None


def test_plain_write_in_order(basin: Any, unique: Callable[[str], str]) -> None:
    name = unique("s")
    basin.create_stream(name)
    sink = StreamSink(basin, name, wid(), SMALL)
    sink.add(
        bodies(1500),
        pa.array(
            [[{"name": b"k", "value": b"v"}]] * 1500,
            pa.list_(pa.struct([("name", pa.binary()), ("value", pa.binary())])),
        ),
    )
    sink.add(bodies(1000, start=1500))
    result = sink.close()
    assert result.appended == 2500 and result.skipped == 0
    rows = data_rows(basin, name)
    assert [b for b, _ in rows] == [f"r{i}".encode() for i in range(2500)]
    assert rows[0][1] == [(b"k", b"v")] and rows[-1][1] == []


def test_missing_stream(basin: Any, unique: Callable[[str], str]) -> None:
    name = unique("s")
    sink = StreamSink(basin, name, wid(), SMALL)
    sink.add(bodies(3))
    with pytest.raises(NotFoundError, match="createStreams=true"):
        sink.close()
    sink = StreamSink(basin, name, wid(), SinkSettings(create_streams=True))
    sink.add(bodies(3))
    sink.close()
    assert len(data_rows(basin, name)) == 3


def test_retry_after_partial_write_resumes(basin: Any, unique: Callable[[str], str]) -> None:
    """Attempt 0 dies after 2 appends (holding the lease); attempt 1 writes the rest."""
    name = unique("s")
    basin.create_stream(name)

    def die(sink: StreamSink) -> None:
        if sink.appends == 2:
            raise Boom()

    first = StreamSink(basin, name, wid(), SMALL, after_append=die)
    with pytest.raises(Boom):
        first.add(bodies(5000))
    assert len(data_rows(basin, name)) == 2 * 999
    retry = StreamSink(basin, name, wid(attempt=1), SMALL)
    retry.add(bodies(5000))
    result = retry.close()
    assert result.skipped == 2 * 999 and result.appended == 5000 - 2 * 999
    assert [b for b, _ in data_rows(basin, name)] == [f"r{i}".encode() for i in range(5000)]
    # The zombie (attempt 0) is fenced out when it tries to go on.
    with pytest.raises(WriterFencedError):
        first.add(bodies(5000, start=5000))
        first.close()
    assert len(data_rows(basin, name)) == 5000


def test_restart_with_other_partitions_in_between(basin: Any, unique: Callable[[str], str]) -> None:
    """Old run: p0 wrote part, p1 wrote all. New run (newer generation) replays both."""
    name = unique("s")
    basin.create_stream(name)

    def die(sink: StreamSink) -> None:
        if sink.appends == 1:
            raise Boom()

    p0 = StreamSink(basin, name, wid(), SMALL, after_append=die)
    with pytest.raises(Boom):
        p0.add(bodies(2500, "a"))
    # p1 of the old run takes the abandoned lease only after the timeout: use a short one.
    p1 = StreamSink(
        basin, name, wid(partition=1), SinkSettings(flush_records=999, lease_timeout=0.3)
    )
    p1.add(bodies(1200, "b"))
    p1.close()
    # Restart: generation 2000 replays batch 3; both partitions resume exactly.
    n0 = StreamSink(basin, name, wid(generation=2000), SMALL)
    n0.add(bodies(2500, "a"))
    r0 = n0.close()
    n1 = StreamSink(basin, name, wid(generation=2000, partition=1), SMALL)
    n1.add(bodies(1200, "b"))
    r1 = n1.close()
    assert (r0.skipped, r0.appended, r1.skipped, r1.appended) == (999, 1501, 1200, 0)
    got = [b for b, _ in data_rows(basin, name)]
    a = [f"a{i}".encode() for i in range(2500)]
    b = [f"b{i}".encode() for i in range(1200)]
    assert got == a[:999] + b + a[999:]
    # A writer of the killed run (older generation) is stale now.
    old = StreamSink(basin, name, wid(partition=1, attempt=1), SMALL)
    with pytest.raises(WriterFencedError):
        old.add(bodies(1200, "b"))
        old.close()
    # So is a writer of an earlier micro-batch, once batch 4 has written.
    b4 = StreamSink(basin, name, wid(generation=3000, batch=4), SMALL)
    b4.add(bodies(10, "c"))
    b4.close()
    late = StreamSink(basin, name, wid(generation=2000, partition=2), SMALL)
    late.add(bodies(10, "x"))
    with pytest.raises(WriterFencedError):
        late.close()
    assert len(data_rows(basin, name)) == 2500 + 1200 + 10


def test_zombie_that_never_held_is_rejected(basin: Any, unique: Callable[[str], str]) -> None:
    """Attempt 1 wrote and released; attempt 0 (still running) then asks for the lease."""
    name = unique("s")
    basin.create_stream(name)
    StreamSink(basin, name, wid(partition=1), SMALL).close()  # nothing: no lease
    other = StreamSink(basin, name, wid(partition=1), SMALL)
    other.add(bodies(5, "o"))
    other.close()
    newer = StreamSink(basin, name, wid(attempt=1), SMALL)
    newer.add(bodies(7))
    newer.close()
    third = StreamSink(basin, name, wid(partition=2), SMALL)
    third.add(bodies(4, "t"))
    third.close()
    zombie = StreamSink(basin, name, wid(attempt=0), SMALL)
    zombie.add(bodies(7))
    with pytest.raises(WriterFencedError):
        zombie.close()
    assert len(data_rows(basin, name)) == 5 + 7 + 4


def test_partitions_take_turns(basin: Any, unique: Callable[[str], str]) -> None:
    """Two partitions writing one stream at once: each lands whole, in order, once."""
    name = unique("s")
    basin.create_stream(name)
    errors: list[BaseException] = []

    def run(p: int) -> None:
        try:
            sink = StreamSink(basin, name, wid(partition=p), SMALL)
            for k in range(4):
                sink.add(bodies(600, f"p{p}-", start=600 * k))
            sink.close()
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(p,)) for p in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors
    got = [b for b, _ in data_rows(basin, name)]
    for p in (0, 1):
        mine = [b for b in got if b.startswith(f"p{p}-".encode())]
        assert mine == [f"p{p}-{i}".encode() for i in range(2400)]
    assert len(got) == 4800


def test_record_too_large(basin: Any, unique: Callable[[str], str]) -> None:
    name = unique("s")
    basin.create_stream(name)
    sink = StreamSink(basin, name, wid(), SMALL)
    big = b"x" * (1024 * 1024)
    sink.add(pa.array([b"ok", big, b"after"], pa.binary()))
    with pytest.raises(RecordTooLargeError) as info:
        sink.close()
    assert info.value.metered_bytes == 1024 * 1024 + 8
    assert info.value.limit in (1024 * 1024, DATA_MAX_BYTES)
    assert str(1024 * 1024 + 8) in str(info.value)
    assert [b for b, _ in data_rows(basin, name)] in ([], [b"ok"])


def test_foreign_token(basin: Any, unique: Callable[[str], str]) -> None:
    name = unique("s")
    basin.create_stream(name)
    basin.stream(name).fence("someone-else")
    sink = StreamSink(basin, name, wid(), SMALL)
    sink.add(bodies(1))
    with pytest.raises(ForeignFenceError):
        sink.close()


def test_fence_records_keep_client_timestamps(basin: Any, unique: Callable[[str], str]) -> None:
    """Fence records carry timestamp 0, so S2's monotonic clamp never moves user times."""
    name = unique("s")
    basin.create_stream(name)
    t0 = 1_600_000_000_000
    sink = StreamSink(basin, name, wid(), SMALL)
    sink.add(bodies(1500), None, pa.array([t0 + i for i in range(1500)], pa.int64()))
    sink.close()
    s = basin.stream(name)
    got = []
    pos, tail = 0, s.check_tail().seq_num
    while pos < tail:
        d = s.read(seq_num=pos, count=1000, include_command_records=False)
        got += [int(t.timestamp() * 1000) for t in d.batch.column("timestamp").to_pylist()]
        pos = int(d.last_seq_num) + 1
    assert got == [t0 + i for i in range(1500)]
