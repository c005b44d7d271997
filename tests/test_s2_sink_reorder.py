"""Replays in another order (s2_spark.backends.s2.sink), without Spark.

A replayed micro-batch may give a partition the same rows in another order (a shuffle's
fetch order). The writer skips its first rows where their digest is the one its
partition's marks hold, and otherwise reads back what its partition landed and skips
exactly those rows, by content. Real appends against the local server; every test reads
back exact records.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import pyarrow as pa
import pytest
from test_s2_sink import all_records, data_rows, wid

from s2_spark.backends.s2 import stream_sink
from s2_spark.backends.s2._replay import LandedRows, _entries, _split_entry
from s2_spark.backends.s2.sink import SinkSettings, StreamSink
from s2_spark.backends.s2.tokens import run_key
from s2_spark.errors import ReplayMismatchError
from s2_spark.wire.appends import EncodedRecords, encode_entries
from s2_spark.wire.records import HEADER_TYPE

pytestmark = pytest.mark.backend

#: Appends of 50 rows (a flush every 200): a few hundred rows make several appends.
SMALL = SinkSettings(max_records=50, flush_records=200)
RUN2: dict[str, Any] = dict(run=run_key("run-2"), generation=2000)
RUN3: dict[str, Any] = dict(run=run_key("run-3"), generation=3000)

Row = tuple[bytes, list[tuple[bytes, bytes]], int | None]


class Boom(Exception):
    pass


def die_after(n: int) -> Callable[[StreamSink], None]:
    def hook(sink: StreamSink) -> None:
        if sink.appends == n:
            raise Boom()

    return hook


def rows(n: int, prefix: str = "r") -> list[Row]:
    return [(f"{prefix}{i}".encode(), [], None) for i in range(n)]


def shuffled(items: list[Row], seed: int) -> list[Row]:
    out = list(items)
    random.Random(seed).shuffle(out)
    return out


def feed(sink: StreamSink, items: list[Row], chunk: int = 70) -> None:
    """Add `items` in chunks (as a task's input batches come)."""
    for k in range(0, len(items), chunk):
        part = items[k:k + chunk]
        headers = pa.array([[{"name": n, "value": v} for n, v in h] for _, h, _ in part],
                           HEADER_TYPE)
        stamps = pa.array([t for _, _, t in part], pa.int64())
        sink.add(pa.array([b for b, _, _ in part], pa.binary()), headers, stamps)


def write(basin: Any, name: str, items: list[Row], settings: SinkSettings = SMALL,
          *, dies_after: int | None = None, **who: Any) -> Any:
    """One writer's rows for `name`: its result, or None when it died (Boom) after
    `dies_after` appends."""
    hook = die_after(dies_after) if dies_after is not None else None
    sink = StreamSink(basin, name, wid(**who), settings, after_append=hook)
    try:
        feed(sink, items)
        return sink.close()
    except Boom:
        return None


def contents(basin: Any, name: str) -> list[tuple[bytes, tuple[tuple[bytes, bytes], ...]]]:
    return [(b, tuple(h)) for b, h in data_rows(basin, name)]


def as_rows(items: list[Row]) -> list[tuple[bytes, tuple[tuple[bytes, bytes], ...]]]:
    return [(b, tuple(h)) for b, h, _ in items]


@pytest.fixture
def read_backs(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[int]]:
    """The data records each read-back of landed rows asked for, in order."""
    calls: list[int] = []
    real = stream_sink.read_landed

    def spy(stream: Any, landed: Any, what: str) -> Any:
        calls.append(sum(a.end - a.first for a in landed))
        return real(stream, landed, what)

    monkeypatch.setattr(stream_sink, "read_landed", spy)
    yield calls


@pytest.fixture
def stream(basin: Any, unique: Callable[[str], str]) -> str:
    name = unique("s")
    basin.create_stream(name)
    return name


def test_same_order_skips_by_digest_without_reading_back(
    basin: Any, stream: str, read_backs: list[int]
) -> None:
    """A restarted run replays the micro-batch in the same order: its rows' digests are
    the marks', so it skips them as landed and reads nothing back."""
    items = rows(500)
    assert write(basin, stream, items, dies_after=3) is None
    result = write(basin, stream, items, **RUN2)
    assert (result.skipped, result.appended) == (150, 350)
    assert contents(basin, stream) == as_rows(items)
    assert read_backs == []


def test_another_order_skips_exactly_what_landed(
    basin: Any, stream: str, read_backs: list[int]
) -> None:
    """3 appends of 50 landed; the replay's order differs from its first row on: it reads
    those 150 records back and appends the other 350 in its own order."""
    items = rows(500)
    assert write(basin, stream, items, dies_after=3) is None
    again = shuffled(items, 1)
    result = write(basin, stream, again, **RUN2)
    assert (result.skipped, result.appended) == (150, 350)
    got = contents(basin, stream)
    landed = as_rows(items[:150])
    assert got[:150] == landed
    assert got[150:] == [r for r in as_rows(again) if r not in landed]
    assert read_backs == [150]


def test_digest_checks_each_append(basin: Any, stream: str, read_backs: list[int]) -> None:
    """The replay's first two appends' rows come in the same order, the rest not: those
    two are skipped by their digests, only the next two appends are read back."""
    items = rows(400)
    assert write(basin, stream, items, dies_after=4) is None
    again = items[:100] + shuffled(items[100:], 2)
    result = write(basin, stream, again, **RUN2)
    assert (result.skipped, result.appended) == (200, 200)
    assert Counter(contents(basin, stream)) == Counter(as_rows(items))
    assert read_backs == [100]


def test_restarts_in_other_orders_each_row_once(
    basin: Any, stream: str, read_backs: list[int]
) -> None:
    """Run 1 lands 2 appends; run 2 (another order) finds them, appends 3 more and dies;
    run 3 (a third order) finds all 5 appends of both runs: each row once."""
    items = rows(600)
    assert write(basin, stream, items, dies_after=2) is None
    assert write(basin, stream, shuffled(items, 3), dies_after=3, **RUN2) is None
    assert len(data_rows(basin, stream)) == 250
    result = write(basin, stream, shuffled(items, 4), **RUN3)
    assert (result.skipped, result.appended) == (250, 350)
    assert Counter(contents(basin, stream)) == Counter(as_rows(items))
    assert read_backs == [100, 250]


def test_retried_attempt_in_another_order(basin: Any, stream: str) -> None:
    """A retried attempt of the task (bump, then read back) gets its rows in another
    order: each row once."""
    items = rows(450)
    assert write(basin, stream, items, dies_after=5) is None
    result = write(basin, stream, shuffled(items, 5), attempt=1)
    assert (result.skipped, result.appended) == (250, 200)
    assert Counter(contents(basin, stream)) == Counter(as_rows(items))


def test_identical_rows_are_counted(basin: Any, stream: str) -> None:
    """Rows that are all alike but for their headers, many times over: the replay skips
    as many of each as landed."""
    items: list[Row] = [(b"same", [(b"h", str(i % 3).encode())], None) for i in range(300)]
    items += [(b"same", [], None)] * 100
    items = shuffled(items, 6)
    assert write(basin, stream, items, dies_after=3) is None
    result = write(basin, stream, shuffled(items, 7), **RUN2)
    assert (result.skipped, result.appended) == (150, 250)
    assert Counter(contents(basin, stream)) == Counter(as_rows(items))


def test_timestamps_s2_raised_are_matched_once_the_input_ends(
    basin: Any, stream: str
) -> None:
    """Partition 1 wrote later timestamps first, so S2 raised those of partition 0's
    appends (timestamps stay monotonic); rows alike but for their timestamp are matched
    to the landed ones by the timestamps given. Each row once."""
    t0 = 1_600_000_000_000
    late: list[Row] = [(f"late{i}".encode(), [], t0 + 10_000 + i) for i in range(10)]
    assert write(basin, stream, late, partition=1).appended == 10
    items: list[Row] = [(b"tick", [], t0 + i) for i in range(200)]
    items += [(f"e{i}".encode(), [], t0 + i) for i in range(200)]
    items = shuffled(items, 8)
    assert write(basin, stream, items, dies_after=4) is None
    stamps = [int(r["timestamp"].timestamp() * 1000)
              for r in all_records(basin, stream, commands=False)]
    assert min(stamps[10:]) >= t0 + 10_009  # every landed row's was raised
    result = write(basin, stream, shuffled(items, 9), **RUN2)
    assert (result.skipped, result.appended) == (200, 200)
    assert Counter(contents(basin, stream)) == Counter(as_rows(late + items))


def test_two_partitions_interleaved(basin: Any, stream: str) -> None:
    """Two partitions append to one stream in turns; partition 0 dies part way,
    partition 1 finishes. The restarted run replays both in other orders: partition 1
    finds all its rows between partition 0's, partition 0 the ones it landed."""
    a, b = rows(400, "a"), rows(300, "b")
    s0 = StreamSink(basin, stream, wid(), SMALL, after_append=die_after(5))
    s1 = StreamSink(basin, stream, wid(partition=1), SMALL)
    with pytest.raises(Boom):
        for k in range(0, 400, 100):
            feed(s0, a[k:k + 100])
            feed(s1, b[k:k + 100])
    s1.close()
    r1 = write(basin, stream, shuffled(b, 10), partition=1, **RUN2)
    r0 = write(basin, stream, shuffled(a, 11), **RUN2)
    assert (r1.skipped, r1.appended) == (300, 0)
    assert (r0.skipped, r0.appended) == (250, 150)
    assert Counter(contents(basin, stream)) == Counter(as_rows(a + b))


def test_other_rows_fail_naming_the_stream(basin: Any, stream: str) -> None:
    """A replay whose rows are not the ones that landed (one body differs, or rows are
    missing) fails with an error naming the stream, and writes nothing."""
    items = rows(300)
    assert write(basin, stream, items, dies_after=2) is None
    before = all_records(basin, stream)
    other = shuffled(items, 12)
    other[other.index(items[10])] = (b"changed", [], None)
    with pytest.raises(ReplayMismatchError, match=f"stream '{stream}'") as info:
        write(basin, stream, other, **RUN2)
    assert info.value.stream == stream
    assert "1 of them are not among this attempt's 300 rows" in str(info.value)
    assert "not the rows that attempt wrote" in str(info.value)
    with pytest.raises(ReplayMismatchError, match="this attempt has only 60 rows"):
        write(basin, stream, items[:60], **RUN2)
    assert all_records(basin, stream) == before


def test_marks_without_digests_are_trusted_by_count(basin: Any, stream: str) -> None:
    """Marks written before digests (no digest field) replay as they did: the first rows
    are skipped by count."""
    items = rows(120)
    s = basin.stream(stream)
    from s2_spark.s2 import AppendRecord

    for k in (0, 50):
        s.append([AppendRecord(b) for b, _, _ in items[k:k + 50]]
                 + [AppendRecord.fence(wid().mark(k + 50).encode()),
                    AppendRecord.fence(wid().run_token())])
    result = write(basin, stream, items, **RUN2)
    assert (result.skipped, result.appended) == (100, 20)
    assert contents(basin, stream) == as_rows(items)


def _encoded(items: list[Row]) -> EncodedRecords:
    return encode_entries(pa.array([b for b, _, _ in items], pa.binary()), None,
                          pa.array([t for _, _, t in items], pa.int64()))


def test_landed_rows_are_found_exactly_then_by_body_and_headers() -> None:
    """The matching itself: a landed row is found at once by an input row with its
    timestamp, or with none given; the rest once the input has ended, each by the row
    of the same body and headers with the latest timestamp not after the stored one."""
    landed: list[Row] = [(b"x", [], 105), (b"x", [], 200), (b"y", [], 50), (b"z", [], 77)]
    keys = [_split_entry(e)[0] for e in _entries(_encoded([(b, h, None) for b, h, _ in landed]))]
    rows = LandedRows(keys, [t for _, _, t in landed if t is not None])
    rows.offer(_encoded([(b"x", [], 300), (b"y", [], 40), (b"y", [], 50), (b"z", [], None)]))
    assert rows.remaining == 2  # y at 50 and z found; both x wait for the input's end
    held = rows.held()
    assert held is not None
    assert _entries(held) == _entries(_encoded([(b"x", [], 300), (b"y", [], 40)]))
    rows.offer(_encoded([(b"x", [], 150), (b"x", [], 100), (b"w", [], 1)]))
    assert rows.remaining == 2
    rows.finish()
    assert rows.remaining == 0
    held = rows.held()
    assert held is not None
    assert _entries(held) == _entries(_encoded([(b"x", [], 300), (b"y", [], 40), (b"w", [], 1)]))
    # The input rows found, in the landed rows' order: x at 100 (stored 105), x at 150
    # (stored 200), y at 50, z.
    assert rows.entries() == b"".join(_entries(_encoded(
        [(b"x", [], 100), (b"x", [], 150), (b"y", [], 50), (b"z", [], None)])))
