"""Spark read throughput of `format("durable-streams")` against Spark's ceiling.

Fills one JSON stream of the Durable Streams reference server (npm, in memory) with 100 B
messages, then runs two streaming queries in one Spark session, each
`trigger(availableNow=True)` into the `noop` sink, one task per micro-batch (a Durable
Streams stream is read by one task):

* durable-streams: the real reader (the driver plans from HEAD; the executor reads each
  message once, unpaced, in one catch-up read split straight into an Arrow string column);
* in-memory: a Python data source yielding the same rows (stream, offset, index, value)
  from Arrow batches built once per worker: what Spark's Python Data Source API can take.

Rates use `durationMs.triggerExecution` of the micro-batches with rows, so planning
(`latestOffset`) is included and query start-up is not; the queries alternate and the best
of `--repeat` runs counts. Each durable-streams run also prints the reference server's CPU
seconds (utime + stime of its `node` process) per million messages read, beside the same
for a plain catch-up read of the stream by `s2_spark.durable`'s client (no Spark), the
lowest of each counting: the same figure means every message left the server once. By
default the server runs on a CPU of its own, and each run prints the CPU seconds of each
side (`_pinning`; `--no-pin` for the old behaviour). Ends with one line:
`durable_spark_read: <rows/s> rows/s, <ratio>x in-memory Arrow source, server <s> CPU s
per 1M messages (<pinned|unpinned>)`.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Iterator
from typing import Any

os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
# Python workers unpickle the in-memory source, which refers to benchmarks/_durable.py.
os.environ["PYTHONPATH"] = os.pathsep.join(
    filter(None, [os.path.dirname(os.path.abspath(__file__)), os.environ.get("PYTHONPATH")])
)

import pyarrow as pa
from _durable import DurableServer, messages  # benchmarks/ is on sys.path
from _pinning import CpuMeter, add_pin_option, cpu_seconds, placed
from _spark import local_session, stop_session
from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import SupportsTriggerAvailableNow
from spark_read import run

from s2_spark.backends.durable.backend import read_schema_for
from s2_spark.durable import DurableStreamsClient
from s2_spark.spark.durable.source import durable_read_schema

STREAM = "/bench/events"
BATCH = 1 << 16


class _Rows(InputPartition):
    def __init__(self, rows: int) -> None:
        self.rows = rows


class _MemoryReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    def __init__(self, total: int) -> None:
        self.total = total

    def initialOffset(self) -> dict[str, int]:
        return {"n": 0}

    def latestOffset(self, start: dict[str, int], limit: Any) -> dict[str, int]:
        return {"n": self.total}

    def prepareForTriggerAvailableNow(self) -> None:
        pass

    def partitions(self, start: dict[str, int], end: dict[str, int]) -> list[InputPartition]:
        n = end["n"] - start["n"]
        return [_Rows(n)] if n else []

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, _Rows)
        batch = _prebuilt()
        left = partition.rows
        while left > 0:
            take = min(left, batch.num_rows)
            yield batch if take == batch.num_rows else batch.slice(0, take)
            left -= take


_CACHE: list[pa.RecordBatch] = []


def _prebuilt() -> pa.RecordBatch:
    """One batch of the reader's rows (the benchmark's messages), built once per worker."""
    if not _CACHE:
        texts = messages(BATCH)
        _CACHE.append(pa.RecordBatch.from_arrays(
            [
                pa.array([STREAM] * BATCH, pa.string()),
                pa.array(["-1"] * BATCH, pa.string()),
                pa.array(range(BATCH), pa.int64()),
                pa.array(texts, pa.string()),
            ],
            schema=read_schema_for("json"),
        ))
    return _CACHE[0]


class MemoryDataSource(DataSource):
    @classmethod
    def name(cls) -> str:
        return "durable_bench_memory"

    def schema(self) -> Any:
        return durable_read_schema("json")

    def streamReader(self, schema: Any) -> DataSourceStreamReader:
        return _MemoryReader(int(self.options["rows"]))


def fill(url: str, n: int) -> float:
    texts = messages(n)
    with DurableStreamsClient(base_url=url) as client:
        s = client.stream(STREAM)
        s.create("application/json")
        t0 = time.perf_counter()
        for at in range(0, n, 20_000):
            s.append(("[" + ",".join(texts[at : at + 20_000]) + "]").encode())
        return time.perf_counter() - t0


def plain_read_cpu(url: str, pid: int | None, n: int) -> float:
    """The server's CPU s per 1M messages for one catch-up read of the stream (no Spark)."""
    with DurableStreamsClient(base_url=url) as client:
        cpu0 = cpu_seconds(pid)
        got = sum(c.batch().num_rows for c in client.stream(STREAM).read("-1"))
        cpu = cpu_seconds(pid) - cpu0
    assert got == n, f"the plain read got {got} messages, expected {n}"
    return cpu * 1e6 / n


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--messages", type=int, default=1_000_000)
    ap.add_argument("--repeat", type=int, default=2, help="runs of each query (best counts)")
    ap.add_argument("--no-warmup", action="store_true",
                    help="leave out the unmeasured warm-up runs (a smoke run's figures are "
                         "then start-up's)")
    add_pin_option(ap)
    args = ap.parse_args(argv)
    n = args.messages
    placement = placed(args)

    spark = local_session("durable-spark-bench-read", sources=[MemoryDataSource])
    with DurableServer(long_poll_timeout=1.0) as server:
        took = fill(server.url, n)
        print(f"filled {n:,} JSON messages of ~100 B in {took:.1f}s")
        pid = server.pid  # the `node` process itself
        placement.pin_server(pid)
        meter = CpuMeter(server=pid)
        ours_df = spark.readStream.format("durable-streams").option(
            "url", server.url + STREAM).load()
        memory = spark.readStream.format("durable_bench_memory").option("rows", str(n)).load()
        if not args.no_warmup:
            run(spark.readStream.format("durable_bench_memory").option("rows", "10000").load(),
                "warm-up in-memory", 10_000, "triggerExecution")
        ceiling = ours = 0.0
        server_cpu = plain = float("inf")  # CPU s per 1M messages, the lowest of the runs
        for _ in range(args.repeat):
            before = meter.sample()
            ceiling = max(ceiling, run(memory, "in-memory Arrow source", n, "triggerExecution"))
            print(f"  CPU s: {meter.format(meter.since(before))}")
            plain_now = plain_read_cpu(server.url, pid, n)
            before = meter.sample()
            ours = max(ours, run(ours_df, "durable-streams reader", n, "triggerExecution"))
            spent = meter.since(before)
            print(f"  CPU s: {meter.format(spent)}")
            per_million = spent["server"] * 1e6 / n
            print(f"  reference server CPU s per 1M messages: {per_million:.2f} for the query, "
                  f"{plain_now:.2f} for a plain catch-up read")
            server_cpu, plain = min(server_cpu, per_million), min(plain, plain_now)
        print(f"reference server: {server_cpu:.2f} CPU s per 1M messages read by the query, "
              f"{server_cpu / plain if plain else float('nan'):.2f}x a plain catch-up read")
    stop_session(spark)
    print(f"durable_spark_read: {ours:.0f} rows/s, {ours / ceiling:.2f}x in-memory Arrow source, "
          f"server {server_cpu:.2f} CPU s per 1M messages ({placement.mode})")


if __name__ == "__main__":
    main()
