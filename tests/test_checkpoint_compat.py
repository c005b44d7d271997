"""Checkpoints written by an earlier version of the connector are read by this one.

`tests/data/checkpoints/` holds the checkpoints of two streaming queries (format s2 over
streams a and b; format durable-streams over one JSON stream) written before the package
was rearranged into one folder per service, after each read the first ten records of its
streams. A test fills fresh servers with the same records, appends more, and restarts each
query from a copy of its old checkpoint: it must read exactly the new records, from the
offsets the old version committed.

`python tests/test_checkpoint_compat.py` writes the checkpoints again (only ever needed
when the offsets' format deliberately changes, which would break users' checkpoints).
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from _versions import progress_offsets

pytestmark = pytest.mark.spark

CHECKPOINTS = Path(__file__).resolve().parent / "data" / "checkpoints"
BASIN = "compat-basin"
S2_STREAMS = ("a", "b")
DURABLE_PATH = "/compat/events"
T0 = 1_700_000_000_000


def _fill_s2(url: str, start: int, count: int, *, create: bool) -> None:
    from s2_spark.s2 import AppendRecord, S2Client, S2Config

    with S2Client(S2Config(endpoint=url)) as client:
        if create:
            client.create_basin(BASIN)
        basin = client.basin(BASIN)
        for name in S2_STREAMS:
            if create:
                basin.create_stream(name)
            records = [AppendRecord(f"{name}:{i}".encode(), timestamp=T0 + i)
                       for i in range(start, start + count)]
            basin.stream(name).append_many(records)


def _fill_durable(url: str, start: int, count: int, *, create: bool) -> None:
    from s2_spark.durable import DurableStreamsClient

    with DurableStreamsClient(base_url=url) as client:
        stream = client.stream(DURABLE_PATH)
        if create:
            stream.create(content_type="application/json")
        for i in range(start, start + count):
            stream.append_json([{"i": i}])


def _run(spark: Any, reader: Any, checkpoint: Path) -> tuple[list[tuple[Any, ...]], Any]:
    """One AvailableNow run; the rows it read, sorted, and its last end offset."""
    rows: list[tuple[Any, ...]] = []

    def collect(df: Any, _batch: int) -> None:
        rows.extend(tuple(r) for r in df.collect())

    query = (reader.writeStream.foreachBatch(collect).trigger(availableNow=True)
             .option("checkpointLocation", str(checkpoint)).start())
    query.awaitTermination(180)
    assert query.exception() is None, str(query.exception())
    progress = query.lastProgress
    return sorted(rows), progress["sources"][0]["endOffset"] if progress else None


def _s2_reader(spark: Any, url: str) -> Any:
    return (spark.readStream.format("s2").option("endpoint", url).option("basin", BASIN)
            .option("streams", ",".join(S2_STREAMS)).load().select("stream", "seq_num", "body"))


def _durable_reader(spark: Any, url: str) -> Any:
    return (spark.readStream.format("durable-streams").option("baseUrl", url)
            .option("stream", DURABLE_PATH).load().select("stream", "index", "value"))


def _restored(name: str) -> Path:
    copy = Path(tempfile.mkdtemp(prefix="s2-compat-")) / name
    shutil.copytree(CHECKPOINTS / name, copy)
    return copy


def test_an_s2_checkpoint_from_before_the_move_reads_on(spark: Any) -> None:
    from s2_spark.testing import LocalS2Server

    with LocalS2Server() as server:
        _fill_s2(server.url, 0, 10, create=True)
        _fill_s2(server.url, 10, 3, create=False)
        rows, end = _run(spark, _s2_reader(spark, server.url), _restored("s2"))
    assert rows == [(s, i, f"{s}:{i}".encode()) for s in S2_STREAMS for i in (10, 11, 12)]
    assert progress_offsets(end) == {"a": 13, "b": 13}


def test_a_durable_checkpoint_from_before_the_move_reads_on(spark: Any) -> None:
    from durable_testbed import DurableServer

    with DurableServer() as server:
        _fill_durable(server.url, 0, 10, create=True)
        _fill_durable(server.url, 10, 3, create=False)
        rows, _end = _run(spark, _durable_reader(spark, server.url), _restored("durable"))
    assert [(s, v) for s, _i, v in rows] == [(DURABLE_PATH, f'{{"i":{i}}}') for i in (10, 11, 12)]


def _make(name: str, fill: Callable[[str, int, int], None], reader: Callable[[Any, str], Any],
          server: Any, spark: Any) -> None:
    fill(server.url, 0, 10)
    target = CHECKPOINTS / name
    shutil.rmtree(target, ignore_errors=True)
    rows, end = _run(spark, reader(spark, server.url), target)
    print(f"{name}: {len(rows)} rows, end {end}")


def main() -> None:
    """Write the checkpoints of tests/data/checkpoints with the code checked out now."""
    os.environ["PYSPARK_PYTHON"] = sys.executable
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from durable_testbed import DurableServer
    from pyspark.sql import SparkSession

    from s2_spark.testing import LocalS2Server

    spark = SparkSession.builder.master("local[2]").getOrCreate()
    with LocalS2Server() as s2, DurableServer() as durable:
        _make("s2", lambda url, a, n: _fill_s2(url, a, n, create=True), _s2_reader, s2, spark)
        _make("durable", lambda url, a, n: _fill_durable(url, a, n, create=True),
              _durable_reader, durable, spark)
    spark.stop()


if __name__ == "__main__":
    main()
