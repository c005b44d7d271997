"""What one micro-batch costs around a low-rate pipeline: our source and sink against the
floor of Spark's Python Data Source API, in one process.

Queries of `--batches` micro-batches of `processingTime` `--trigger-ms` (after
`--warm-up` micro-batches, which pay for starting Python workers and imports), each at
`--rate` rows a second, each in a session of its own (so that no query meets Python
workers another one left: Spark's daemons are the session's), after a query that warms
the JVM up; the compared ones `--rounds` times each, in ABC CBA order (the JVM goes on
warming up over the first few), their means compared:

* sinks: `rate` -> `format("s2")` (one stream); `rate` -> `trivial-sink`, a Python Arrow
  stream writer that discards its input (`_trivial.py`, which imports only pyspark's
  own); the same with `freezeHeap` (it freezes its workers' heaps once, as ours do:
  `s2_spark.spark._worker_heap`); `rate` -> `noop` (no Python at all);
* sources: `format("s2")` over a stream a producer thread appends to at the same rate ->
  `noop`; `trivial-source` (rows by the clock) -> `noop`, and the same with `freezeHeap`.

Most of what Spark's Python machinery costs a micro-batch is the `gc.collect()` its
daemon runs after every call of a reused worker (a full walk of the worker's heap), so
the trivial source and sink with `freezeHeap` are the floor of a connector that keeps its
heap out of that walk, as ours does.

For each: CPU seconds a micro-batch of each side (the JVM, Spark's Python planners: the
data source lookups, `write_into_data_source`, the sink's commit runner and the streaming
source's runner; the Python workers that run tasks; the server), and the median of each
phase of `durationMs` in the progress reports; with `--py-spy`, the Python planners' and
workers' CPU split by sampling (shares of their samples) into s2-spark's code, the
daemon's `gc.collect()`, imports and the rest of Spark's machinery (`_py_spy.py`). Ends
with one line:
`microbatch_cost: sink Python CPU <r>x trivial-sink (<r>x frozen), JVM <r>x; source Python
CPU <r>x trivial-source (<r>x frozen), JVM <r>x (<pinned|unpinned>)`, where a ratio of
1.00x means our format costs a micro-batch what Spark's own Python machinery does.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import tempfile
import threading
import time
import uuid
from typing import Any

# Python workers unpickle the trivial source and sink, which live in benchmarks/_trivial.py.
os.environ["PYTHONPATH"] = os.pathsep.join(
    filter(None, [os.path.dirname(os.path.abspath(__file__)), os.environ.get("PYTHONPATH")])
)

from _pinning import CpuMeter, add_pin_option, placed  # benchmarks/ is on sys.path
from _py_spy import PARTS, Sampler
from _servers import add_server_option, s2_server
from _spark import local_session, phase_medians, stop_session
from _trivial import TrivialSink, TrivialSource

from s2_spark.s2 import AppendRecord, S2Client, S2Config

PYTHON = ("Python planners", "Python workers")


def measure(spark: Any, cpu: CpuMeter, args: argparse.Namespace, label: str,
            start: Any) -> dict[str, float]:
    """Run the query `start(checkpoint)` starts for the warm-up and measured micro-batches;
    print and return CPU seconds a measured micro-batch by side, and its phases."""
    q = start(tempfile.mkdtemp(prefix="s2-microbatch-"))
    sampler = Sampler() if args.py_spy else contextlib.nullcontext()
    try:
        first = _until(q, args.warm_up)
        with sampler:
            before = cpu.sample()
            last = _until(q, first + 1 + args.batches)
            spent = cpu.since(before)
        progress = [p for p in q.recentProgress if first < p["batchId"] <= last]
        batches = last - first
    finally:
        spark.sparkContext.setLogLevel("OFF")  # stopping aborts the micro-batch in flight
        q.stop()
        spark.sparkContext.setLogLevel("ERROR")
    per = {side: s / batches for side, s in spent.items()}
    per["Python"] = sum(per.get(side, 0.0) for side in PYTHON)
    print(f"  {label}: CPU ms a micro-batch: "
          + ", ".join(f"{side} {1000 * s:.1f}" for side, s in per.items())
          + f"; median ms: {phase_medians(progress)}", flush=True)
    if isinstance(sampler, Sampler):
        for side, parts in sorted(sampler.split().items()):
            total = sum(parts.values()) or 1.0
            print(f"    {side}: of its {1000 * per.get(side, 0.0):.1f} ms, by py-spy: "
                  + ", ".join(f"{part} {100 * parts[part] / total:.0f}%" for part in PARTS),
                  flush=True)
    return per


def _until(q: Any, batches: int) -> int:
    """Wait until `batches` micro-batches ended; the last one's id."""
    deadline = time.monotonic() + 600
    while True:
        last = q.lastProgress
        if last is not None and last["batchId"] + 1 >= batches:
            return int(last["batchId"])
        if q.exception() is not None:
            raise RuntimeError(str(q.exception()))
        if time.monotonic() > deadline:
            raise RuntimeError(f"{batches} micro-batches did not end within 10 minutes")
        time.sleep(0.05)


def rate_rows(spark: Any, rate: float) -> Any:
    return (spark.readStream.format("rate").option("rowsPerSecond", max(1, round(rate)))
            .load().selectExpr("CAST(lpad(CAST(value AS STRING), 100, 'x') AS BINARY) AS body"))


class Producer(threading.Thread):
    """Appends one 100 B record `rate` times a second to a stream until stopped."""

    def __init__(self, url: str, basin: str, stream: str, rate: float) -> None:
        super().__init__(daemon=True)
        self.client = S2Client(S2Config(endpoint=url))
        self.stream = self.client.basin(basin).stream(stream)
        self.pause = 1.0 / rate
        self.done = threading.Event()

    def run(self) -> None:
        n = 0
        while not self.done.wait(self.pause):
            self.stream.append_many([AppendRecord(b"%100d" % n)])
            n += 1

    def stop(self) -> None:
        self.done.set()
        self.join()
        self.client.close()


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batches", type=int, default=30, help="micro-batches measured")
    ap.add_argument("--warm-up", type=int, default=3, help="micro-batches before measuring")
    ap.add_argument("--trigger-ms", type=int, default=500)
    ap.add_argument("--rate", type=float, default=5.0, help="rows a second")
    ap.add_argument("--rounds", type=int, default=2,
                    help="runs of each compared query, in ABC CBA order")
    ap.add_argument("--py-spy", action="store_true",
                    help="also sample Spark's Python processes over the measured micro-batches "
                         "with py-spy: their CPU in s2-spark's code, in the daemon's "
                         "gc.collect(), in imports, and in the rest of Spark's (_py_spy.py)")
    add_pin_option(ap)
    add_server_option(ap)
    args = ap.parse_args(argv)
    placement = placed(args)
    basin = f"bench-{uuid.uuid4().hex[:8]}"
    trigger = f"{args.trigger_ms} milliseconds"
    with s2_server(args, placement) as server:
        cpu = CpuMeter(server=server.pid, here="this process (driver, producer)")
        with S2Client(S2Config(endpoint=server.url)) as client:
            client.create_basin(basin)
            for name in ("sink", "source"):
                client.basin(basin).create_stream(name)
        s2 = {"endpoint": server.url, "basin": basin}
        frozen = {"freezeHeap": "true"}
        rate = {"rows_per_second": str(args.rate)}

        def run(label: str, start: Any) -> dict[str, float]:
            spark = local_session("s2-microbatch-cost", sources=[TrivialSink, TrivialSource])
            try:
                return measure(spark, cpu, args, label, lambda ckpt: start(spark, ckpt))
            finally:
                stop_session(spark)

        def sink(fmt: str, **options: str) -> Any:
            return lambda spark, ckpt: (
                rate_rows(spark, args.rate).writeStream.format(fmt).options(**options)
                .option("checkpointLocation", ckpt).trigger(processingTime=trigger).start())

        def source(fmt: str, **options: str) -> Any:
            return lambda spark, ckpt: (
                spark.readStream.format(fmt).options(**options).load()
                .writeStream.format("noop").option("checkpointLocation", ckpt)
                .trigger(processingTime=trigger).start())

        def rounds(queries: list[tuple[str, Any]]) -> list[dict[str, float]]:
            """Each query's mean over `--rounds`, in ABC CBA order (the JVM goes on
            warming up over the first queries: each side meets it early and late)."""
            spent: dict[str, list[dict[str, float]]] = {label: [] for label, _ in queries}
            for r in range(args.rounds):
                for label, start in queries if r % 2 == 0 else queries[::-1]:
                    spent[label].append(run(label, start))
            return [{side: statistics.mean(s.get(side, 0.0) for s in runs) for side in runs[0]}
                    for runs in spent.values()]

        run("JVM warm-up (not counted)", sink("noop"))
        print("sinks:", flush=True)
        ours_sink, floor_sink, frozen_sink = rounds([
            ("s2 sink", sink("s2", **s2, stream="sink")),
            ("trivial-sink", sink("trivial-sink")),
            ("trivial-sink, freezeHeap", sink("trivial-sink", **frozen))])
        run("noop", sink("noop"))
        print("sources:", flush=True)
        producer = Producer(server.url, basin, "source", args.rate)
        producer.start()
        try:
            ours_source, floor_source, frozen_source = rounds([
                ("s2 source", source("s2", **s2, stream="source")),
                ("trivial-source", source("trivial-source", **rate)),
                ("trivial-source, freezeHeap", source("trivial-source", **rate, **frozen))])
        finally:
            producer.stop()

    def ratio(ours: dict[str, float], floor: dict[str, float], side: str) -> str:
        return f"{ours.get(side, 0.0) / max(floor.get(side, 0.0), 1e-9):.2f}x"

    print(f"microbatch_cost: sink Python CPU {ratio(ours_sink, floor_sink, 'Python')} "
          f"trivial-sink ({ratio(ours_sink, frozen_sink, 'Python')} frozen), JVM "
          f"{ratio(ours_sink, floor_sink, 'JVM')}; source Python CPU "
          f"{ratio(ours_source, floor_source, 'Python')} trivial-source "
          f"({ratio(ours_source, frozen_source, 'Python')} frozen), JVM "
          f"{ratio(ours_source, floor_source, 'JVM')} ({server.mode})")


if __name__ == "__main__":
    main()
