"""Spark read throughput: `readStream.format("s2")` against Spark's ceiling for a Python source.

Fills one stream of a server process (the local server, or another with `--server`) with
100 B records, then runs two streaming queries in the same Spark session, each
`trigger(availableNow=True)` into the `noop` sink with the same partitioning:

* s2: the real reader (S2S read sessions, frames decoded straight to Arrow);
* in-memory: a Python data source yielding the same number of rows from Arrow batches
  built once per worker, as big as the reader's (`--ceiling-batch`, default the reader's
  coalescing target), i.e. what Spark's Python Data Source API can take at best.

Both run at 1 and at 2 partitions (`minPartitions`); the scaling figure is our gain from
1 to 2 partitions over the in-memory source's own gain in the same run. Rates use the
micro-batches' execution time (`durationMs.addBatch`), so query start-up is left out;
the queries alternate and the best of `--repeat` runs counts. With `--rss`, the peak RSS
(VmHWM) of the Python workers is taken over the s2 runs and over one read of a stream
4x as long, to show that a task's memory does not grow with its range. Each run prints
the CPU seconds of each side (the JVM, the Python workers, the server, this process;
`_pinning.CpuMeter`), and the summary the Python workers' CPU per row against the
in-memory source's. By default the server runs on a CPU of its own (`_pinning`;
`--no-pin` for the old behaviour). Ends with one line:
`spark_read: <rows/s> rows/s, <ratio>x in-memory ceiling, <r1>x at 1 partition, scaling
<r>x of ceiling's gain, worker CPU per row <c>x (<pinned|unpinned>)` (rows/s, ratio and
CPU at 2 partitions).
"""

from __future__ import annotations

import argparse
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
from _pinning import CpuMeter, add_pin_option, placed, python_workers
from _servers import add_server_option, s2_server
from _spark import local_session, stop_session
from _streams import fill  # benchmarks/ is on sys.path
from pyspark.sql.datasource import (
    DataSource,
    DataSourceStreamReader,
    InputPartition,
)
from pyspark.sql.streaming.datasource import SupportsTriggerAvailableNow

from s2_spark.backends._batches import COALESCE_ROWS
from s2_spark.spark import read_schema

RECORD = 100
PARTITIONS = (1, 2)


class _Slice(InputPartition):
    def __init__(self, rows: int) -> None:
        self.rows = rows


class _MemoryReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Offsets {"n": rows}; every partition yields pre-built batches of the read schema."""

    def __init__(self, total: int, parts: int, batch: int) -> None:
        self.total = total
        self.parts = parts
        self.batch = batch

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
        batch = _prebuilt(self.batch)
        left = partition.rows
        while left > 0:
            take = min(left, batch.num_rows)
            yield batch if take == batch.num_rows else batch.slice(0, take)
            left -= take


_CACHE: dict[int, pa.RecordBatch] = {}


def _prebuilt(n: int) -> pa.RecordBatch:
    """An Arrow batch of `n` rows like the decoder's (100 B bodies, no headers), built
    once per worker."""
    if n not in _CACHE:
        from s2_spark.wire.records import READ_SCHEMA_NO_HEADERS

        _CACHE[n] = pa.RecordBatch.from_arrays(
            [
                pa.array(["bench"] * n, pa.string()),
                pa.array(range(n), pa.int64()),
                pa.array([1_700_000_000_000_000] * n, pa.timestamp("us", tz="UTC")),
                pa.array([b"x" * RECORD] * n, pa.binary()),
            ],
            schema=READ_SCHEMA_NO_HEADERS,
        )
    return _CACHE[n]


class MemoryDataSource(DataSource):
    """The in-memory ceiling: same schema as `s2` with includeHeaders=false."""

    @classmethod
    def name(cls) -> str:
        return "s2_bench_memory"

    def schema(self) -> Any:
        return read_schema(include_headers=False)

    def streamReader(self, schema: Any) -> DataSourceStreamReader:
        opts = self.options
        return _MemoryReader(int(opts["rows"]), int(opts["parts"]),
                             int(opts.get("batch", COALESCE_ROWS)))


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


def _status_kib(pid: int, field: str) -> int:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


class PeakRss:
    """Peak RSS of any one Python worker between `reset()` and `peak_mib()`: each worker's
    high-water mark (VmHWM) is reset through /proc/<pid>/clear_refs (Linux 4.0+)."""

    def reset(self) -> None:
        for pid in python_workers():
            try:
                with open(f"/proc/{pid}/clear_refs", "w") as f:
                    f.write("5")
            except OSError:
                pass

    def peak_mib(self) -> float:
        return max((_status_kib(p, "VmHWM") for p in python_workers()), default=0) / 1024


def s2_query(spark: Any, url: str, basin: str, stream: str, parts: int) -> Any:
    # includeHeaders=false: the ceiling source has no headers column either.
    return (spark.readStream.format("s2").option("endpoint", url)
            .option("basin", basin).option("stream", stream)
            .option("includeHeaders", "false").option("minPartitions", str(parts)).load())


def memory_query(spark: Any, rows: int, parts: int, batch: int) -> Any:
    return (spark.readStream.format("s2_bench_memory").option("rows", str(rows))
            .option("parts", str(parts)).option("batch", str(batch)).load())


@dataclass
class Best:
    """Per source and width: the best rate of the runs, the least CPU per side."""

    rate: float = 0.0
    cpu: dict[str, float] = field(default_factory=dict)

    def add(self, rate: float, cpu: dict[str, float]) -> None:
        self.rate = max(self.rate, rate)
        self.cpu = {k: min(v, self.cpu.get(k, v)) for k, v in cpu.items()}


def measured(df: Any, label: str, rows: int, cpu: CpuMeter, rss: PeakRss,
             best: Best) -> float:
    """`run` plus its CPU split, kept in `best`; returns the peak worker RSS (MiB)."""
    rss.reset()
    before = cpu.sample()
    rate = run(df, label, rows)
    spent = cpu.since(before)
    print(f"  CPU s: {cpu.format(spent)}")
    best.add(rate, spent)
    return rss.peak_mib()


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--records", type=int, default=2_000_000)
    ap.add_argument("--repeat", type=int, default=2, help="runs of each query (best counts)")
    ap.add_argument("--ceiling-batch", type=int, default=COALESCE_ROWS,
                    help="rows per batch of the in-memory source (default: the reader's)")
    ap.add_argument("--rss", action="store_true",
                    help="also read a stream of 4x the records, to compare worker peak RSS")
    ap.add_argument("--no-warmup", action="store_true",
                    help="leave out the unmeasured warm-up runs (a smoke run's figures are "
                         "then start-up's)")
    add_pin_option(ap)
    add_server_option(ap)
    args = ap.parse_args(argv)
    n = args.records
    placement = placed(args)

    spark = local_session("s2-spark-bench-read", sources=[MemoryDataSource])

    basin = f"bench-read-{uuid.uuid4().hex[:8]}"
    rss = PeakRss()
    with s2_server(args, placement) as server:
        took = fill(server.url, basin, "bench", n, RECORD)
        print(f"filled {n:,} records of {RECORD} B in {took:.1f}s")
        if args.rss:
            fill(server.url, basin, "bench-4x", 4 * n, RECORD)
        warm = 0 if args.no_warmup else n // 10
        if warm:
            fill(server.url, basin, "warm", warm, RECORD)
        # Warm up Python workers and the JVM's JIT on a run of each, at both widths.
        for parts in PARTITIONS if warm else ():
            run(memory_query(spark, warm, parts, args.ceiling_batch), "warm-up", warm)
            run(s2_query(spark, server.url, basin, "warm", parts), "warm-up", warm)
        cpu = CpuMeter(server=server.pid)
        # Alternate the two, best of `--repeat` each: the machine's load varies run to run.
        ceiling = {parts: Best() for parts in PARTITIONS}
        ours = {parts: Best() for parts in PARTITIONS}
        peak = 0.0
        for _ in range(args.repeat):
            for parts in PARTITIONS:
                measured(memory_query(spark, n, parts, args.ceiling_batch),
                         f"in-memory Arrow source (ceiling), {parts} partition(s)",
                         n, cpu, rss, ceiling[parts])
                mib = measured(s2_query(spark, server.url, basin, "bench", parts),
                               f"s2 reader, {parts} partition(s)", n, cpu, rss, ours[parts])
                peak = max(peak, mib)
        if args.rss:
            peak4 = measured(s2_query(spark, server.url, basin, "bench-4x", PARTITIONS[-1]),
                             "s2 reader, 4x records", 4 * n, cpu, rss, Best())
    stop_session(spark)
    if args.rss:
        print(f"peak Python worker RSS in the s2 runs: {peak:.0f} MiB reading {n:,} records, "
              f"{peak4:.0f} MiB reading {4 * n:,} ({peak4 / peak:.2f}x)")
    report(ours, ceiling, n, server.mode)


def report(ours: dict[int, Best], ceiling: dict[int, Best], rows: int, mode: str) -> None:
    for parts in PARTITIONS:
        o, c = ours[parts], ceiling[parts]
        print(f"{parts} partition(s): s2 {o.rate:,.0f} rows/s, in-memory "
              f"{c.rate:,.0f} rows/s ({o.rate / c.rate:.2f}x); least CPU s per run, s2: "
              f"{CpuMeter.format(o.cpu)}; in-memory: {CpuMeter.format(c.cpu)}")
    worker = "Python workers"
    for parts in PARTITIONS:
        o, c = ours[parts].cpu[worker], ceiling[parts].cpu[worker]
        print(f"Python worker CPU per row, {parts} partition(s): s2 {o / rows * 1e9:.0f} ns, "
              f"in-memory {c / rows * 1e9:.0f} ns ({o / c if c else float('nan'):.2f}x)")
    ours_gain = ours[2].rate / ours[1].rate
    ceiling_gain = ceiling[2].rate / ceiling[1].rate
    print(f"1 -> 2 partitions: s2 gains {ours_gain:.2f}x, in-memory {ceiling_gain:.2f}x")
    w2 = ours[2].cpu[worker] / ceiling[2].cpu[worker] if ceiling[2].cpu[worker] else float("nan")
    print(f"spark_read: {ours[2].rate:.0f} rows/s, {ours[2].rate / ceiling[2].rate:.2f}x "
          f"in-memory ceiling, {ours[1].rate / ceiling[1].rate:.2f}x at 1 partition, "
          f"scaling {ours_gain / ceiling_gain:.2f}x of ceiling's gain, worker CPU per row "
          f"{w2:.2f}x ({mode})")


if __name__ == "__main__":
    main()
