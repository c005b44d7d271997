"""Spark read throughput: `readStream.format("s2")` against Spark's ceiling for a Python source.

Fills one stream of a local server process with 100 B records, then runs two streaming
queries in the same Spark session, each `trigger(availableNow=True)` into the `noop` sink
with the same partitioning:

* s2: the real reader (S2S read sessions, frames decoded straight to Arrow);
* in-memory: a Python data source yielding the same number of rows from Arrow batches
  built once per worker, i.e. what Spark's Python Data Source API can take at best.

Rates use the micro-batches' execution time (`durationMs.addBatch`), so query start-up
is left out of both; the queries alternate and the best of `--repeat` runs counts.
Ends with one line:
`spark_read: <rows/s> rows/s, <ratio>x in-memory ceiling`.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from typing import Any

os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)

import pyarrow as pa
from _streams import fill  # benchmarks/ is on sys.path
from pyspark.sql import SparkSession
from pyspark.sql.datasource import (
    DataSource,
    DataSourceStreamReader,
    InputPartition,
)
from pyspark.sql.streaming.datasource import SupportsTriggerAvailableNow

from s2_spark.spark import read_schema
from s2_spark.testing import ServerProcess

RECORD = 100
BATCH = 1000  # rows per Arrow batch: what one S2 ReadBatch holds at most


class _Slice(InputPartition):
    def __init__(self, rows: int) -> None:
        self.rows = rows


class _MemoryReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Offsets {"n": rows}; every partition yields pre-built batches of the read schema."""

    def __init__(self, total: int, parts: int) -> None:
        self.total = total
        self.parts = parts

    def initialOffset(self) -> dict[str, int]:
        return {"n": 0}

    def latestOffset(self, start: dict[str, int], limit: Any) -> dict[str, int]:
        return {"n": self.total}

    def prepareForTriggerAvailableNow(self) -> None:
        pass

    def partitions(self, start: dict[str, int], end: dict[str, int]) -> list[InputPartition]:
        n = end["n"] - start["n"]
        return [_Slice(n // self.parts + (1 if i < n % self.parts else 0))
                for i in range(self.parts)] if n else []

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, _Slice)
        batch = _prebuilt()
        left = partition.rows
        while left > 0:
            take = min(left, batch.num_rows)
            yield batch if take == batch.num_rows else batch.slice(0, take)
            left -= take


_CACHE: list[pa.RecordBatch] = []


def _prebuilt() -> pa.RecordBatch:
    """One Arrow batch like the decoder's (100 B bodies, no headers), built once per worker."""
    if not _CACHE:
        from s2_spark.wire.records import READ_SCHEMA_NO_HEADERS

        n = BATCH
        _CACHE.append(pa.RecordBatch.from_arrays(
            [
                pa.array(["bench"] * n, pa.string()),
                pa.array(range(n), pa.int64()),
                pa.array([1_700_000_000_000_000] * n, pa.timestamp("us", tz="UTC")),
                pa.array([b"x" * RECORD] * n, pa.binary()),
            ],
            schema=READ_SCHEMA_NO_HEADERS,
        ))
    return _CACHE[0]


class MemoryDataSource(DataSource):
    """The in-memory ceiling: same schema as `s2` with includeHeaders=false."""

    @classmethod
    def name(cls) -> str:
        return "s2_bench_memory"

    def schema(self) -> Any:
        return read_schema(include_headers=False)

    def streamReader(self, schema: Any) -> DataSourceStreamReader:
        return _MemoryReader(int(self.options["rows"]), int(self.options["parts"]))


def cpu_seconds(pid: int | None) -> float:
    """User + system CPU time of a process (Linux /proc), 0 where unavailable."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return 0.0


def run(df: Any, label: str, expected: int, timer: str = "addBatch") -> float:
    """Run an AvailableNow query into noop; return the rows/s over its batches' `timer`
    (a `durationMs` entry: addBatch, or triggerExecution to include planning)."""
    with tempfile.TemporaryDirectory() as ckpt:
        t0 = time.perf_counter()
        q = (df.writeStream.format("noop").option("checkpointLocation", ckpt)
             .trigger(availableNow=True).start())
        q.awaitTermination()
        wall = time.perf_counter() - t0
        progress = [p for p in q.recentProgress if p["numInputRows"] > 0]
    rows = sum(p["numInputRows"] for p in progress)
    assert rows == expected, f"{label}: read {rows} rows, expected {expected}"
    busy = sum(p["durationMs"].get(timer, 0) for p in progress) / 1000
    rate = rows / busy
    print(f"{label}: {rows:,} rows in {busy:.2f}s of {timer} ({wall:.2f}s wall incl. start-up)"
          f" -> {rate:,.0f} rows/s")
    return rate


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--records", type=int, default=2_000_000)
    ap.add_argument("--partitions", type=int, default=2, help="tasks per micro-batch")
    ap.add_argument("--repeat", type=int, default=2, help="runs of each query (best counts)")
    args = ap.parse_args()
    n, parts = args.records, args.partitions

    spark = (
        SparkSession.builder.master("local[2]")
        .appName("s2-spark-bench-read")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.python.worker.reuse", "true")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    spark.dataSource.register(MemoryDataSource)

    basin = f"bench-read-{uuid.uuid4().hex[:8]}"
    with ServerProcess() as server:
        took = fill(server.url, basin, "bench", n, RECORD)
        print(f"filled {n:,} records of {RECORD} B in {took:.1f}s")
        # includeHeaders=false: the ceiling source has no headers column either.
        s2 = (spark.readStream.format("s2").option("endpoint", server.url)
              .option("basin", basin).option("stream", "bench")
              .option("includeHeaders", "false").option("minPartitions", str(parts)).load())
        memory = (spark.readStream.format("s2_bench_memory").option("rows", str(n))
                  .option("parts", str(parts)).load())
        # Warm up Python workers and the JVM on a small run of each.
        run(spark.readStream.format("s2_bench_memory").option("rows", "10000")
            .option("parts", str(parts)).load(), "warm-up in-memory", 10_000)
        # Alternate the two, best of `--repeat` each: the machine's load varies run to run.
        ceiling = ours = 0.0
        server_cpu = 0.0
        for _ in range(args.repeat):
            ceiling = max(ceiling, run(memory, "in-memory Arrow source (ceiling)", n))
            cpu0 = cpu_seconds(server.pid)
            ours = max(ours, run(s2, "s2 reader", n))
            server_cpu = cpu_seconds(server.pid) - cpu0
        # The rest: the local server shares the 2 cores with Spark, and each task spends
        # CPU on HTTP + S2S framing + decoding (measure with benchmarks/read_session.py).
        print(f"local server CPU during the s2 run: {server_cpu:.2f}s "
              f"(it shares this machine's cores with Spark)")
    spark.stop()
    print(f"spark_read: {ours:.0f} rows/s, {ours / ceiling:.2f}x in-memory ceiling")


if __name__ == "__main__":
    main()
