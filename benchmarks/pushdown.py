"""Filter pushdown: a batch read of the last 1% of a stream by a `timestamp` predicate.

Fills one stream of a server process (the local server, or another with `--server`) with
`--records` 100 B records, one per millisecond (record i at T0 + i ms), then runs the same
batch query twice per round in one Spark session:

    spark.read.format("s2")...load().where(timestamp >= T0 + 99% of the records)
         .agg(count(*), max(seq_num))

once with spark.sql.python.filterPushdown.enabled=true (the predicate narrows the planned
range through S2's timestamp start: only the last 1% is read) and once with it false
(the same query as every PySpark before 4.1 runs it: the whole stream is read and Spark
drops 99% of the rows). Times are wall-clock of the whole query (planning included), best
of `--repeat` after a warm-up; "records read" is the scan's numOutputRows, from Spark's
SQL metrics.

What bounds the ratio: the same query shape over an in-memory Python data source that
yields just the 1% (pre-built Arrow rows, no I/O) is timed in the same rounds. No
pushdown can beat that floor, so the reachable ratio is `without / in-memory`, printed
before the last line. By default the server runs on a CPU of its own, and each case's CPU
seconds per side over its measured rounds are printed (`_pinning`; `--no-pin` for the old
behaviour). Ends with one line: `pushdown: <ratio>x faster, <n> records read
(<pinned|unpinned>)`.
"""

from __future__ import annotations

import argparse
import time
import uuid
from typing import Any

import pyarrow as pa
from _pinning import CpuMeter, add_pin_option, placed
from _servers import add_server_option, s2_server
from _spark import local_session, stop_session
from _streams import fill  # benchmarks/ is on sys.path
from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition

from s2_spark.spark import read_schema
from s2_spark.wire.records import READ_SCHEMA_NO_HEADERS

RECORD = 100
T0 = 1_700_000_000_000
CONF = "spark.sql.python.filterPushdown.enabled"


class _MemoryReader(DataSourceReader):
    """Rows first..n-1 of the filled stream, built in the worker: no I/O at all."""

    def __init__(self, first: int, n: int) -> None:
        self.first, self.n = first, n

    def read(self, partition: InputPartition) -> Any:
        seqs = pa.array(range(self.first, self.n), pa.int64())
        yield pa.RecordBatch.from_arrays(
            [
                pa.array(["bench"] * len(seqs), pa.string()),
                seqs,
                pa.array([(T0 + i) * 1000 for i in range(self.first, self.n)],
                         pa.timestamp("us", tz="UTC")),
                pa.array([b"x" * RECORD] * len(seqs), pa.binary()),
            ],
            schema=READ_SCHEMA_NO_HEADERS,
        )


class MemoryDataSource(DataSource):
    """The floor: the same schema as `s2` (includeHeaders=false), only the wanted rows."""

    @classmethod
    def name(cls) -> str:
        return "s2_bench_pushdown_memory"

    def schema(self) -> Any:
        return read_schema(include_headers=False)

    def reader(self, schema: Any) -> DataSourceReader:
        return _MemoryReader(int(self.options["first"]), int(self.options["n"]))


def scanned_rows(df: Any) -> int:
    """numOutputRows of the data source scan(s) in `df`'s executed plan (after it ran)."""
    total = 0
    stack = [df._jdf.queryExecution().executedPlan()]
    while stack:
        node = stack.pop()
        if "BatchScan" in node.nodeName():
            total += int(node.metrics().apply("numOutputRows").value())
        children = node.children()
        stack.extend(children.apply(i) for i in range(children.size()))
    return total


def run(spark: Any, make: Any, enabled: bool, expected: tuple[int, int]) -> tuple[float, int]:
    """Seconds of one collect of `make()` with pushdown on or off, and records scanned."""
    spark.conf.set(CONF, "true" if enabled else "false")
    df = make()
    t0 = time.perf_counter()
    got = tuple(df.collect()[0])
    took = time.perf_counter() - t0
    assert got == expected, f"pushdown={enabled}: got {got}, expected {expected}"
    return took, scanned_rows(df)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--records", type=int, default=1_000_000)
    ap.add_argument("--repeat", type=int, default=3, help="rounds (best counts)")
    ap.add_argument("--no-warmup", action="store_true",
                    help="leave out the unmeasured warm-up runs (a smoke run's figures are "
                         "then start-up's)")
    add_pin_option(ap)
    add_server_option(ap)
    args = ap.parse_args(argv)
    n = args.records
    first = n - n // 100  # the last 1%
    placement = placed(args)

    spark = local_session("s2-spark-bench-pushdown", {
        "spark.sql.session.timeZone": "UTC",
        "spark.sql.adaptive.enabled": "false",  # a plain plan: scan metrics readable
    }, sources=[MemoryDataSource])

    basin = f"bench-pushdown-{uuid.uuid4().hex[:8]}"
    where = f"timestamp >= timestamp_millis({T0 + first})"
    with s2_server(args, placement) as server:
        cpu = CpuMeter(server=server.pid)
        took = fill(server.url, basin, "bench", n, RECORD, timestamp_base=T0)
        print(f"filled {n:,} records of {RECORD} B, one per ms, in {took:.1f}s")

        def query() -> Any:
            return (
                spark.read.format("s2").option("endpoint", server.url).option("basin", basin)
                .option("stream", "bench").load().where(where)
                .selectExpr("count(*)", "max(seq_num)")
            )

        def floor() -> Any:
            return (
                spark.read.format(MemoryDataSource.name()).option("first", first)
                .option("n", n).load().where(where).selectExpr("count(*)", "max(seq_num)")
            )

        expected = (n - first, n - 1)
        cases: dict[str, tuple[Any, bool]] = {
            "without pushdown": (query, False),
            "with pushdown": (query, True),
            "in-memory floor": (floor, False),
        }
        for make, enabled in () if args.no_warmup else cases.values():
            run(spark, make, enabled, expected)  # warm-up: JVM, Python workers, connections
        best = dict.fromkeys(cases, float("inf"))
        read = dict.fromkeys(cases, 0)
        spent: dict[str, dict[str, float]] = {label: {} for label in cases}
        for _ in range(args.repeat):
            for label, (make, enabled) in cases.items():
                before = cpu.sample()
                took, rows = run(spark, make, enabled, expected)
                for side, t in cpu.since(before).items():
                    spent[label][side] = spent[label].get(side, 0.0) + t
                best[label] = min(best[label], took)
                read[label] = rows
        for label in cases:
            print(f"{label:16}: {best[label]:.3f}s, {read[label]:,} records read; CPU s over "
                  f"{args.repeat} runs: {cpu.format(spent[label])}")
        spark.conf.unset(CONF)
    stop_session(spark)
    without, pushed = best["without pushdown"], best["with pushdown"]
    print(f"reachable: {without / best['in-memory floor']:.1f}x (without pushdown / in-memory "
          f"floor); with pushdown is {pushed / best['in-memory floor']:.2f}x the floor")
    print(f"pushdown: {without / pushed:.1f}x faster, {read['with pushdown']} records read "
          f"({server.mode})")


if __name__ == "__main__":
    main()
