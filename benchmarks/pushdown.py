"""Filter pushdown: a batch read of the last 1% of a stream by a `timestamp` predicate.

Fills one stream of a local server process with `--records` 100 B records, one per
millisecond (record i at T0 + i ms), then runs the same batch query twice per round in one
Spark session:

    spark.read.format("s2")...load().where(timestamp >= T0 + 99% of the records)
         .agg(count(*), max(seq_num))

once with spark.sql.python.filterPushdown.enabled=true (the predicate narrows the planned
range through S2's timestamp start: only the last 1% is read) and once with it false
(the same query as every PySpark before 4.1 runs it: the whole stream is read and Spark
drops 99% of the rows). Times are wall-clock of the whole query (planning included), best
of `--repeat` after a warm-up; "records read" is the scan's numOutputRows, from Spark's
SQL metrics. Ends with one line: `pushdown: <ratio>x faster, <n> records read`.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import uuid
from typing import Any

os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)

from _streams import fill  # benchmarks/ is on sys.path
from pyspark.sql import SparkSession

from s2_spark.testing import ServerProcess

RECORD = 100
T0 = 1_700_000_000_000
CONF = "spark.sql.python.filterPushdown.enabled"


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
    spark.conf.set(CONF, "true" if enabled else "false")
    df = make()
    t0 = time.perf_counter()
    got = tuple(df.collect()[0])
    took = time.perf_counter() - t0
    assert got == expected, f"pushdown={enabled}: got {got}, expected {expected}"
    return took, scanned_rows(df)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--records", type=int, default=1_000_000)
    ap.add_argument("--repeat", type=int, default=3, help="rounds (best counts)")
    args = ap.parse_args()
    n = args.records
    first = n - n // 100  # the last 1%

    spark = (
        SparkSession.builder.master("local[2]")
        .appName("s2-spark-bench-pushdown")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.python.worker.reuse", "true")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.sql.adaptive.enabled", "false")  # plain plan: scan metrics readable
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")

    basin = f"bench-pushdown-{uuid.uuid4().hex[:8]}"
    with ServerProcess() as server:
        took = fill(server.url, basin, "bench", n, RECORD, timestamp_base=T0)
        print(f"filled {n:,} records of {RECORD} B, one per ms, in {took:.1f}s")

        def query() -> Any:
            return (
                spark.read.format("s2").option("endpoint", server.url).option("basin", basin)
                .option("stream", "bench").load()
                .where(f"timestamp >= timestamp_millis({T0 + first})")
                .selectExpr("count(*)", "max(seq_num)")
            )

        expected = (n - first, n - 1)
        run(spark, query, True, expected)  # warm-up: JVM, Python workers, connections
        run(spark, query, False, expected)
        best = {True: float("inf"), False: float("inf")}
        read = {True: 0, False: 0}
        for _ in range(args.repeat):
            for enabled in (False, True):
                took, rows = run(spark, query, enabled, expected)
                best[enabled] = min(best[enabled], took)
                read[enabled] = rows
        for enabled in (False, True):
            label = "with pushdown   " if enabled else "without pushdown"
            print(f"{label}: {best[enabled]:.3f}s, {read[enabled]:,} records read")
        spark.conf.unset(CONF)
    spark.stop()
    print(f"pushdown: {best[False] / best[True]:.1f}x faster, {read[True]} records read")


if __name__ == "__main__":
    main()
