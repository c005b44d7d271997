"""Streaming write throughput: `writeStream.format("s2")` of 100 B rows to a local server.

A streaming query (source `rate-micro-batch`, body = 100 bytes per row, 2 partitions per
micro-batch writing one stream) writes >= 1M rows exactly-once to a local server process
(`ServerProcess`, or another server with `--server`), after one warm-up micro-batch. In
the same run, the ceiling: the same query into a Python Arrow stream writer that discards
its input (Spark's own cost); and s2-sdk's producer appending the same number of 100 B
records from one process. The Spark figures are rows / time of the micro-batches after the
warm-up (from the query's progress reports, so JVM start, Python worker start and imports
are left out; the all-in figure is printed too). By default the server runs on a CPU of
its own, and the CPU seconds of each side are printed for each query (whole, and per row
after the warm-up micro-batch: what a written row costs once the workers run) and for the
producer (`_pinning`; `--no-pin` for the old behaviour). Ends with one line:
`spark_write: <rows/s> rows/s, <r1>x discard writer, <r2>x s2-sdk producer
(<pinned|unpinned>)`.
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time
import uuid
from typing import Any

# Python workers unpickle the discarding sink, which lives in benchmarks/_trivial.py.
os.environ["PYTHONPATH"] = os.pathsep.join(
    filter(None, [os.path.dirname(os.path.abspath(__file__)), os.environ.get("PYTHONPATH")])
)

from _peers import random_bodies, sdk_producer  # benchmarks/ is on sys.path
from _pinning import CpuMeter, add_pin_option, placed
from _servers import add_server_option, s2_server
from _spark import local_session, stop_session
from _trivial import TrivialSink

from s2_spark.s2 import S2Client, S2Config

RECORD = 100


def session() -> Any:
    return local_session("s2-spark-write-bench", {"spark.sql.shuffle.partitions": "2"},
                         sources=[TrivialSink])


def run_query(spark: Any, cpu: CpuMeter, fmt: str, options: dict[str, str], rows: int,
              per_batch: int, partitions: int) -> tuple[float, float, float]:
    """Seconds the micro-batches after the first (warm-up) take to write `rows` rows, wall
    seconds of the whole query from start, seconds of the warm-up batch."""
    df = (spark.readStream.format("rate-micro-batch").option("rowsPerBatch", per_batch)
          .option("numPartitions", partitions).load()
          .selectExpr(f"CAST(lpad(CAST(value AS STRING), {RECORD}, 'x') AS BINARY) AS body"))
    ckpt = tempfile.mkdtemp(prefix="s2-write-bench-")
    before = cpu.sample()
    t0 = time.perf_counter()
    q = (df.writeStream.format(fmt).options(**options).option("checkpointLocation", ckpt)
         .start())
    warm: tuple[Any, int] | None = None  # CPU sampled, and rows done, after the warm-up
    try:
        deadline = time.monotonic() + 1800
        while True:
            progress = q.recentProgress
            done = sum(p["numInputRows"] for p in progress)
            if warm is None and done >= per_batch:
                warm = cpu.sample(), done
            if done >= rows + per_batch:  # the first micro-batch is a warm-up
                break
            if q.exception() is not None:
                raise RuntimeError(str(q.exception()))
            if time.monotonic() > deadline:
                raise RuntimeError(f"only {done} of {rows} rows written in time")
            time.sleep(0.2)
        wall = time.perf_counter() - t0
        print(f"  {fmt} CPU s, the whole query: {cpu.format(cpu.since(before))}")
        if warm is not None and done > warm[1]:
            after = cpu.since(warm[0])
            print(f"  {fmt} CPU ns a row after the warm-up micro-batch: " + ", ".join(
                f"{side} {1e9 * t / (done - warm[1]):.0f}" for side, t in after.items()))
    finally:
        # Stopping interrupts the micro-batch in flight; Spark logs that abort as an error.
        spark.sparkContext.setLogLevel("OFF")
        q.stop()
        spark.sparkContext.setLogLevel("ERROR")
        shutil.rmtree(ckpt, ignore_errors=True)
    batches = [p for p in progress if p["numInputRows"]]
    for p in batches:
        d = p["durationMs"]
        print(f"  {fmt} batch {p['batchId']}: {p['numInputRows']} rows, "
              f"{d['triggerExecution']} ms (addBatch {d.get('addBatch', 0)} ms)")
    steady = batches[1:]
    exec_s = sum(p["durationMs"]["triggerExecution"] for p in steady) / 1000.0
    written = sum(p["numInputRows"] for p in steady)
    first_s = batches[0]["durationMs"]["triggerExecution"] / 1000.0
    return exec_s * rows / written, wall, first_s


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--rows-per-batch", type=int, default=250_000)
    ap.add_argument("--partitions", type=int, default=2)
    add_pin_option(ap)
    add_server_option(ap)
    args = ap.parse_args(argv)
    n = args.rows
    placement = placed(args)
    basin = f"bench-{uuid.uuid4().hex[:8]}"
    with s2_server(args, placement) as server:
        cpu = CpuMeter(server=server.pid, here="this process (driver, producer)")
        with S2Client(S2Config(endpoint=server.url)) as client:
            client.create_basin(basin)
            client.basin(basin).create_stream("spark")
            client.basin(basin).create_stream("sdk")
            spark = session()
            shape = (n, args.rows_per_batch, args.partitions)
            discard_s, _, _ = run_query(spark, cpu, "trivial-sink", {}, *shape)
            s2_opts = {"endpoint": server.url, "basin": basin, "stream": "spark"}
            spark_s, wall, first_s = run_query(spark, cpu, "s2", s2_opts, *shape)
            stop_session(spark)
            tail = client.basin(basin).stream("spark").check_tail().seq_num
        total = n + args.rows_per_batch
        print(f"spark writeStream s2: {n / spark_s:,.0f} rows/s over {n} rows after a warm-up "
              f"micro-batch ({spark_s:.2f}s); warm-up batch {first_s:.1f}s (Python workers "
              f"start); {total / wall:,.0f} rows/s for all {total} rows including query start "
              f"({wall:.1f}s); stream tail {tail} (data + fence records)")
        bodies = random_bodies(n, RECORD)
        before = cpu.sample()
        sdk = sdk_producer(server.url, basin, "sdk", bodies)
        print(f"s2-sdk producer CPU s: {cpu.format(cpu.since(before))}")
        print(f"discard writer (Python Arrow stream writer): {n / discard_s:,.0f} rows/s "
              f"({discard_s:.2f}s)")
        print(f"s2-sdk producer: {n / sdk:,.0f} records/s ({sdk:.2f}s)")
    print(f"spark_write: {n / spark_s:.0f} rows/s, {discard_s / spark_s:.2f}x discard writer, "
          f"{sdk / spark_s:.2f}x s2-sdk producer ({server.mode})")


if __name__ == "__main__":
    main()
