"""The S2 backend of the Spark reader against the local server: positions, ranges, loss."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from _s2_target import s2_config, unique_name

from s2_spark.backends._batches import COALESCE_ROWS
from s2_spark.backends.base import ReadSettings
from s2_spark.backends.s2 import S2Backend, S2Settings
from s2_spark.errors import DataLossError, NotFoundError
from s2_spark.s2 import AppendRecord, S2Client
from s2_spark.spark.partitions import split_ranges

pytestmark = pytest.mark.backend

T0 = (int(time.time()) - 3600) * 1000


@pytest.fixture(scope="module")
def basin(target_s2: Any) -> Iterator[tuple[S2Client, str, S2Backend]]:
    client = S2Client(s2_config(target_s2.url))
    name = unique_name("backend")
    client.create_basin(name)
    yield client, name, S2Backend(S2Settings(basin=name, endpoint=target_s2.url))
    client.close()


def fill(client: S2Client, basin: str, stream: str, n: int) -> None:
    client.basin(basin).create_stream(stream)
    client.basin(basin).stream(stream).append(
        [AppendRecord(f"r{i}".encode(), timestamp=T0 + i) for i in range(n)])


def seq_nums(backend: S2Backend, stream: str, start: int, end: int,
             losses: list[tuple[str, int, int]], **kw: Any) -> list[int]:
    def lost(s: str, a: int, b: int) -> None:
        losses.append((s, a, b))

    batches = backend.read(stream, start, end, ReadSettings(), lost, **kw)
    return [n for b in batches for n in b.column("seq_num").to_pylist()]


def test_positions(basin: tuple[S2Client, str, S2Backend]) -> None:
    client, name, backend = basin
    fill(client, name, "pos", 10)
    client.basin(name).create_stream("pos-empty")
    assert backend.list_streams("pos") == ["pos", "pos-empty"]
    assert (backend.earliest("pos"), backend.latest("pos")) == (0, 10)
    assert (backend.earliest("pos-empty"), backend.latest("pos-empty")) == (0, 0)
    assert backend.at_timestamp("pos", T0 + 4) == 4
    assert backend.at_timestamp("pos", T0 + 100) == 10
    with pytest.raises(NotFoundError):
        backend.latest("pos-missing")
    with pytest.raises(ValueError, match="seq_num must be an integer >= 0"):
        backend.parse_position(-1)


def test_exact_ranges_and_gaps(basin: tuple[S2Client, str, S2Backend]) -> None:
    client, name, backend = basin
    fill(client, name, "gaps", 20)
    losses: list[tuple[str, int, int]] = []
    assert seq_nums(backend, "gaps", 3, 7, losses) == [3, 4, 5, 6]
    assert seq_nums(backend, "gaps", 5, 5, losses) == []
    client.basin(name).stream("gaps").trim(8)
    deadline = time.monotonic() + 30
    while backend.earliest("gaps") != 8:
        assert time.monotonic() < deadline, "trim did not take effect"
        time.sleep(0.05)
    assert seq_nums(backend, "gaps", 2, 12, losses) == [8, 9, 10, 11]
    assert losses == [("gaps", 2, 8)]
    losses.clear()
    # A range wholly trimmed: loss up to its end, no rows past it.
    assert seq_nums(backend, "gaps", 0, 5, losses) == []
    assert losses == [("gaps", 0, 5)]
    losses.clear()
    # Read from the origin (a newly discovered stream): the trimmed prefix is not loss.
    assert seq_nums(backend, "gaps", 0, 10, losses, leading_gap_ok=True) == [8, 9]
    assert losses == []


def test_deleted_stream_is_loss(basin: tuple[S2Client, str, S2Backend]) -> None:
    client, name, backend = basin
    fill(client, name, "doomed", 5)
    client.basin(name).delete_stream("doomed")
    losses: list[tuple[str, int, int]] = []
    assert seq_nums(backend, "doomed", 1, 5, losses) == []
    assert losses == [("doomed", 1, 5)]


def fill_many(client: S2Client, basin: str, stream: str, n: int) -> None:
    client.basin(basin).create_stream(stream)
    client.basin(basin).stream(stream).append_many(
        [AppendRecord(f"r{i}".encode(), timestamp=T0 + i) for i in range(n)])


def test_long_range_in_coalesced_batches(basin: tuple[S2Client, str, S2Backend]) -> None:
    """Many 1000-record ReadBatches come out as fewer, bigger batches: same rows, in order
    (small records: frames up to `BATCH_BYTES` are decoded together, more rows than
    `COALESCE_ROWS` in one batch)."""
    client, name, backend = basin
    fill_many(client, name, "long", 3 * COALESCE_ROWS + 500)
    start, end = 7, 3 * COALESCE_ROWS + 123
    batches = list(backend.read("long", start, end, ReadSettings(), _no_loss))
    assert [n for b in batches for n in b.column("seq_num").to_pylist()] == list(range(start, end))
    assert batches[0].column("body")[0].as_py() == b"r7"
    assert all(b.num_rows >= COALESCE_ROWS for b in batches[:-1])
    assert len(batches) <= 3


def test_split_ranges_read_each_record_once(basin: tuple[S2Client, str, S2Backend]) -> None:
    """minPartitions: each split is its own session over exactly [start, end)."""
    client, name, backend = basin
    fill_many(client, name, "split", 5000)
    parts = split_ranges(backend, {"split": (10, 4990, False)},
                         min_partitions=3, max_records_per_partition=None)
    assert [(p.start, p.end) for p in parts] == [(10, 1670), (1670, 3330), (3330, 4990)]
    read = [
        [n for b in backend.read("split", p.start, p.end, ReadSettings(), _no_loss)
         for n in b.column("seq_num").to_pylist()]
        for p in parts
    ]
    assert [r[0] for r in read] == [10, 1670, 3330]
    assert [n for r in read for n in r] == list(range(10, 4990))


def test_loss_raised_in_the_read_ahead_thread_reaches_the_caller(
    basin: tuple[S2Client, str, S2Backend],
) -> None:
    client, name, backend = basin
    fill(client, name, "lossy", 10)
    client.basin(name).delete_stream("lossy")

    def fail(stream: str, start: int, end: int) -> None:
        raise DataLossError("lost", stream=stream, start=start, end=end)

    with pytest.raises(DataLossError, match="lost"):
        list(backend.read("lossy", 2, 9, ReadSettings(), fail))


def test_closing_a_read_early_ends_its_session(basin: tuple[S2Client, str, S2Backend]) -> None:
    client, name, backend = basin
    fill_many(client, name, "early", 4 * COALESCE_ROWS)
    batches = backend.read("early", 0, 4 * COALESCE_ROWS, ReadSettings(), _no_loss)
    first = next(batches)
    batches.close()  # type: ignore[attr-defined]
    assert first.column("seq_num")[0].as_py() == 0
    assert not [t for t in threading.enumerate() if t.name == "s2-spark-read-ahead"]


def _no_loss(stream: str, start: int, end: int) -> None:
    raise AssertionError(f"unexpected loss in {stream} [{start}, {end})")
