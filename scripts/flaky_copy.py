"""A copy query over a network that cuts connections: how many runs does it take?

Runs `readStream.format("s2")` -> `writeStream.format("s2")` (`maxRecordsPerTrigger`,
`trigger(availableNow=True)`, `local[2]`) with every connection, the driver's and the
executors', going through a TCP proxy (`s2_spark.testing.TcpProxy`) that cuts each
connection after a random number of bytes. Whenever the query fails it is started again
from its checkpoint, as an operator would. At the end the target is read directly (not
through the proxy) and checked: every source record exactly once, in order.

    python scripts/flaky_copy.py --records 20000 --cut-kb 2 120

Prints the runs (query restarts + 1), the proxy's cuts, the failures and the check.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
import uuid

os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)

from s2_spark.s2 import AppendRecord, S2Client, S2Config
from s2_spark.testing import ServerProcess, TcpProxy


def body(i: int) -> bytes:
    return f"{i:08d}".encode().ljust(100, b".")


def run_copy(spark: object, url: str, basin: str, checkpoint: str, args: argparse.Namespace,
             runs: list[str]) -> None:
    common = {"endpoint": url, "basin": basin}
    if args.retry_timeout_ms is not None:
        common["retryTimeoutMs"] = str(args.retry_timeout_ms)
    df = (spark.readStream.format("s2").options(**common)  # type: ignore[attr-defined]
          .option("stream", "src").option("maxRecordsPerTrigger", str(args.per_trigger)).load())
    q = (df.writeStream.format("s2").options(**common).option("stream", "dst")
         .option("checkpointLocation", checkpoint).trigger(availableNow=True).start())
    runs.append(str(q.runId))  # the job group of the query's Spark jobs
    q.awaitTermination()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=20_000)
    parser.add_argument("--cut-kb", type=int, nargs=2, default=(2, 120), metavar=("LO", "HI"))
    parser.add_argument("--per-trigger", type=int, default=700)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--max-runs", type=int, default=40)
    parser.add_argument("--retry-timeout-ms", type=int, default=None)
    args = parser.parse_args()

    from pyspark.sql import SparkSession

    basin = f"flaky-{uuid.uuid4().hex[:8]}"
    with ServerProcess() as server, TcpProxy(
        server.url, cut_after=(args.cut_kb[0] * 1024, args.cut_kb[1] * 1024), seed=args.seed
    ) as proxy, S2Client(S2Config(endpoint=server.url)) as direct:
        direct.create_basin(basin)
        b = direct.basin(basin)
        b.create_stream("src")
        b.create_stream("dst")
        b.stream("src").append_many(AppendRecord(body(i)) for i in range(args.records))

        spark = (SparkSession.builder.master("local[2]").appName("flaky-copy")
                 .config("spark.ui.enabled", "false")
                 .config("spark.ui.showConsoleProgress", "false")
                 .config("spark.sql.shuffle.partitions", "2").getOrCreate())
        spark.sparkContext.setLogLevel("OFF")
        failures: list[str] = []
        runs: list[str] = []
        started = time.monotonic()
        with tempfile.TemporaryDirectory() as tmp:
            checkpoint = os.path.join(tmp, "ckpt")
            for _ in range(args.max_runs):
                try:
                    run_copy(spark, proxy.url, basin, checkpoint, args, runs)
                    break
                except Exception as exc:  # the query failed: restart it from its checkpoint
                    lines = [ln.strip() for ln in str(exc).splitlines()]
                    errors = [ln for ln in lines if "Error:" in ln] or lines or ["?"]
                    failures.append(errors[-1][:300])
            elapsed = time.monotonic() - started
        tracker = spark.sparkContext.statusTracker()
        failed_tasks = sum(
            info.numFailedTasks
            for run in runs
            for job in tracker.getJobIdsForGroup(run)
            for stage in (tracker.getJobInfo(job).stageIds if tracker.getJobInfo(job) else [])
            if (info := tracker.getStageInfo(stage)) is not None
        )
        spark.stop()

        got: list[bytes] = []
        tail = b.stream("dst").check_tail().seq_num
        for batch in b.stream("dst").read_session(seq_num=0, count=tail,
                                                  include_command_records=False):
            got.extend(batch.batch.column("body").to_pylist())
        expected = [body(i) for i in range(args.records)]
        duplicated = len(got) - len(set(got))
        print(f"runs: {len(failures) + 1} (query restarts: {len(failures)}), failed tasks: "
              f"{failed_tasks}, connections: {proxy.connections}, cuts: {proxy.cuts}, "
              f"{elapsed:.1f}s")
        for f in failures:
            print(f"  failure: {f}")
        print(f"copied {len(set(got))} of {args.records} distinct records, {duplicated} "
              f"duplicated, in order and exactly once: {got == expected}")


if __name__ == "__main__":
    main()
