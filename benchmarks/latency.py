"""Append-to-visible latency of a streaming reader against Spark's floor for a Python source.

`--service s2` (default) measures `readStream.format("s2")`, `--service durable`
`readStream.format("durable-streams")`. A producer thread appends one small record every
`--interval` ms to a stream of a local server process (S2: the local S2 server, or another
with `--server`, the record's body the stamp; durable: the Durable Streams reference
server, one JSON message `{"ts_us": <stamp>}` to a JSON stream) and, right after, writes a
line to an append-only local file; each stamp is the wall-clock time taken just before it
was written. Two default-trigger queries run one after the other (fairer than side by side
on 2 cores), each for `--duration` seconds in all, split over `--rounds` rounds of
alternating order (so JVM warm-up and drifting load fall on both alike), into
`foreachBatch`, which collects the stamps on the driver and records `now - stamp` per row:

* floor: a Python streaming data source over the local file (latestOffset = file size,
  read = the new lines as one Arrow batch), i.e. Spark's own per-trigger cost for a Python
  source with near-free I/O;
* s2 / durable-streams: the real reader (planning against the server, one task reading the
  new range; `foreachBatch` parses the stamp back out of the record or message);
* with `--streams 1,1000,10000` (S2 only): the s2 reader over N streams (`streamPrefix`,
  N >= 2), each tick's record appended to a random one of them too (every set gets one
  record per tick, each stamped just before its own append), measured in the same rounds;
* with `--rate`, for reference: Spark's JVM `rate` source, i.e. what a micro-batch costs
  without Python workers (compare its durationMs only: it makes new rows once a second).

Records stamped in the first `--warmup` seconds of each run (`--streams-warmup` for N > 1
streams) are left out. For the s2 queries, each micro-batch's end offsets are checked
against the appends acknowledged before its trigger began: any record left to a later
micro-batch is counted ("left behind"),
which is how a planner that plans short of the tail shows (a stale tail made every other
micro-batch hold one record). By default the server runs on a CPU of its own and each
query's CPU seconds per side are printed (`_pinning`; `--no-pin` for the old behaviour).
Ends with: `latency: p50 <ms> ms, p99 <ms> ms, <ratio>x floor p50, <ratio>x floor p99
(<pinned|unpinned>)` (S2, one stream), or the same as `latency durable: ...`, after one
`latency at N streams: ...` line per `--streams` count.
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import json
import os
import random
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import pyarrow as pa
from _durable import DurableServer  # benchmarks/ is on sys.path
from _pinning import CpuMeter, Placement, add_pin_option, placed
from _servers import add_server_option, s2_server
from _spark import local_session, stop_session
from pyspark.sql import SparkSession
from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition

from s2_spark.durable import DurableStreamsClient
from s2_spark.s2 import AppendRecord, S2Client, S2Config
from s2_spark.spark import DurableStreamsDataSource, S2DataSource, read_schema

FLOOR = "floor (file source)"
RATE = "rate (JVM source, reference)"
FLOOR_STAMP = "CAST(CAST(body AS STRING) AS BIGINT) AS ns"  # the floor's and S2's records


class _Span(InputPartition):
    def __init__(self, path: str, start: int, end: int) -> None:
        self.path, self.start, self.end = path, start, end


class _FileReader(DataSourceStreamReader):
    """Offsets {"pos": bytes}; each line of the file is one row, its body the line."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.initial: dict[str, int] | None = None

    def initialOffset(self) -> dict[str, int]:
        # Spark may ask more than once before the first batch: answer the same each time.
        if self.initial is None:
            self.initial = {"pos": os.path.getsize(self.path)}
        return self.initial

    def latestOffset(self, start: dict[str, int], limit: Any) -> dict[str, int]:
        return {"pos": os.path.getsize(self.path)}

    def partitions(self, start: dict[str, int], end: dict[str, int]) -> list[InputPartition]:
        if start["pos"] == end["pos"]:
            return []
        return [_Span(self.path, start["pos"], end["pos"])]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, _Span)
        with open(partition.path, "rb") as f:
            f.seek(partition.start)
            lines = f.read(partition.end - partition.start).splitlines()
        n = len(lines)
        from s2_spark.wire.records import READ_SCHEMA_NO_HEADERS

        yield pa.RecordBatch.from_arrays(
            [
                pa.array(["floor"] * n, pa.string()),
                pa.array(range(n), pa.int64()),
                pa.array([0] * n, pa.timestamp("us", tz="UTC")),
                pa.array(lines, pa.binary()),
            ],
            schema=READ_SCHEMA_NO_HEADERS,
        )


class FileDataSource(DataSource):
    """The floor: a Python streaming source whose I/O is a local file read."""

    @classmethod
    def name(cls) -> str:
        return "s2_bench_file"

    def schema(self) -> Any:
        return read_schema(include_headers=False)

    def streamReader(self, schema: Any) -> DataSourceStreamReader:
        return _FileReader(self.options["path"])


class Acks:
    """Appends acknowledged per query label: (ack time ns, stream, position after it)."""

    def __init__(self, labels: Sequence[str]) -> None:
        self.by_label: dict[str, list[tuple[int, str, int]]] = {label: [] for label in labels}
        self._lock = threading.Lock()

    def add(self, label: str, stream: str, end: int) -> None:
        now = time.time_ns()
        with self._lock:
            self.by_label[label].append((now, stream, end))

    def of(self, label: str) -> list[tuple[int, str, int]]:
        with self._lock:
            return list(self.by_label[label])


@dataclass
class Service:
    """The service under test: how to append one stamp, and the queries that read them."""

    word: str  # in the last line: "latency: ..." for S2, "latency durable: ..."
    append: Callable[[int], object]  # append one record stamped with this time (ns)
    queries: dict[str, Callable[[], Any]]  # label -> a new streaming DataFrame, column `ns`
    server_pid: int | None
    mode: str  # for the last line: `pinned`, ... (`_servers.S2Server.mode`)
    acks: Acks | None = None  # where the service has positions to check plans against


def streams_label(n: int) -> str:
    return "s2" if n == 1 else f"s2, {n:,} streams"


@contextlib.contextmanager
def s2_service(spark: SparkSession, counts: Sequence[int], placement: Placement,
               args: argparse.Namespace) -> Iterator[Service]:
    """An S2 server (`--server`: the local one by default) and a new stream (and, for each
    count N > 1 in `counts`, N streams under their own prefix, a random one of which gets
    each tick's record); each record's body is its stamp's decimal text, taken just before
    its own append."""
    basin = f"bench-lat-{uuid.uuid4().hex[:8]}"
    with s2_server(args, placement) as server, \
            S2Client(S2Config(endpoint=server.url)) as client:
        client.create_basin(basin)
        b = client.basin(basin)
        sets: dict[str, list[str]] = {}
        for n in counts:
            names = ["lat"] if n == 1 else [f"m{n}/{i:05d}" for i in range(n)]
            t0 = time.perf_counter()
            b.create_streams(names)
            sets[streams_label(n)] = names
            print(f"{streams_label(n)}: {n:,} stream(s) created in {time.perf_counter() - t0:.1f}s")
        acks = Acks(list(sets))
        rng = random.Random(7)

        def append(_ns: int) -> None:
            for label, names in sets.items():
                name = rng.choice(names)
                ack = b.stream(name).append([AppendRecord(str(time.time_ns()).encode())])
                acks.add(label, name, ack.end.seq_num)

        def query(n: int) -> Callable[[], Any]:
            where = {"stream": "lat"} if n == 1 else {"streamPrefix": f"m{n}/"}
            return lambda: (
                spark.readStream.format("s2")
                .option("endpoint", server.url)
                .option("basin", basin)
                .options(**where)
                .option("startingPosition", "latest")
                .load()
            ).selectExpr(FLOOR_STAMP)

        yield Service(word="", append=append, server_pid=server.pid, mode=server.mode,
                      acks=acks, queries={streams_label(n): query(n) for n in counts})


@contextlib.contextmanager
def durable_service(spark: SparkSession, counts: Sequence[int], placement: Placement,
                    args: argparse.Namespace) -> Iterator[Service]:
    """The Durable Streams reference server (its default 30 s long-poll timeout, as served)
    and a JSON stream of messages `{"ts_us": n}` (microseconds: exact in JavaScript)."""
    if list(counts) != [1]:
        sys.exit("--streams is for --service s2 only")
    with (
        DurableServer(long_poll_timeout=30.0) as server,
        DurableStreamsClient(base_url=server.url) as client,
    ):
        placement.pin_server(server.pid)
        url = f"{server.url}/bench/lat-{uuid.uuid4().hex[:8]}"
        stream = client.stream(url)
        stream.create("application/json")
        yield Service(
            word=" durable",
            append=lambda ns: stream.append(json.dumps({"ts_us": ns // 1000})),
            queries={"durable-streams": lambda: (
                spark.readStream.format("durable-streams")
                .option("url", url)
                .option("startingPosition", "latest")
                .load()
            ).selectExpr("CAST(get_json_object(value, '$.ts_us') AS BIGINT) * 1000 AS ns")},
            server_pid=server.pid,
            mode=placement.mode,
        )


Setup = Callable[[SparkSession, Sequence[int], Placement, argparse.Namespace],
                 contextlib.AbstractContextManager[Service]]
SERVICES: dict[str, tuple[type[DataSource], Setup]] = {
    "s2": (S2DataSource, s2_service),
    "durable": (DurableStreamsDataSource, durable_service),
}


class Producer(threading.Thread):
    """One record every `interval` s: `append(stamp)` with the wall-clock time (ns) taken
    just before it, then, with a `path`, the same kind of line written to that file."""

    def __init__(
        self, append: Callable[[int], object], path: str | None, interval: float
    ) -> None:
        super().__init__(daemon=True)
        self.append = append
        self.fd = None if path is None else os.open(
            path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        self.interval = interval
        self.stopping = threading.Event()
        self.sent = 0

    def run(self) -> None:
        tick = time.monotonic()
        while not self.stopping.is_set():
            self.append(time.time_ns())
            if self.fd is not None:  # one write: never a torn line
                os.write(self.fd, f"{time.time_ns()}\n".encode())
            self.sent += 1
            tick += self.interval
            self.stopping.wait(max(0.0, tick - time.monotonic()))

    def stop(self) -> None:
        self.stopping.set()
        self.join()
        if self.fd is not None:
            os.close(self.fd)


@dataclass
class Run:
    """What the runs of one query measured."""

    latencies: list[float] = field(default_factory=list)  # ms, one per record
    cpu: dict[str, float] = field(default_factory=dict)  # CPU s per side, all runs
    plans: int = 0  # micro-batches that read records
    behind: int = 0  # of those, the ones that left acknowledged records behind
    left: int = 0  # records they left behind

    def add_cpu(self, spent: dict[str, float]) -> None:
        for side, t in spent.items():
            self.cpu[side] = self.cpu.get(side, 0.0) + t


def measure(df: Any, duration: float, warmup: float, run: Run, cpu: CpuMeter,
            acks: list[tuple[int, str, int]] | None = None,
            acked: Callable[[], list[tuple[int, str, int]]] | None = None,
            at_least: int = 0) -> None:
    """Run `df` (default trigger; column `ns`: each row's stamp) into foreachBatch for
    `duration` s; add to `run` the latencies (ms) of the rows stamped after `warmup` s,
    the CPU spent, and (with `acked`: the appends acknowledged so far) the micro-batches
    that left acknowledged records behind. `at_least`: go on past `duration` (up to
    `MORE_S`) until that many latencies are in (a short run on a loaded machine)."""
    started = time.time_ns() + int(warmup * 1e9)

    def sink(batch: Any, _batch_id: int) -> None:
        stamps = [row.ns for row in batch.select("ns").collect()]
        now = time.time_ns()
        run.latencies.extend((now - ns) / 1e6 for ns in stamps if ns >= started)

    before = cpu.sample()
    with tempfile.TemporaryDirectory() as ckpt:
        wanted = len(run.latencies) + at_least
        q = df.writeStream.foreachBatch(sink).option("checkpointLocation", ckpt).start()
        try:
            stopped = q.awaitTermination(warmup + duration)
            more = time.monotonic() + MORE_S
            while not stopped and len(run.latencies) < wanted and time.monotonic() < more:
                stopped = q.awaitTermination(0.1)
            if stopped or q.exception() is not None:
                raise RuntimeError(f"the query stopped early: {q.exception()}")
        finally:
            q.stop()
        progress = [p for p in q.recentProgress if p["numInputRows"] > 0]
    run.add_cpu(cpu.since(before))
    if progress:
        _print_durations(progress)
    if acked is not None:
        _check_plans(progress, acked(), started, run)


def _epoch_ns(timestamp: str) -> int:
    return int(datetime.fromisoformat(timestamp.replace("Z", "+00:00")).timestamp() * 1e9)


#: Seconds a query may run past its duration for `--min-records`.
MORE_S = 120.0

#: An append acknowledged this long before a trigger began must be in its plan (the
#: progress timestamp has millisecond precision; a long-poll's answer takes a moment).
_SLACK_NS = 5_000_000


def _offsets(value: Any) -> dict[str, int]:
    """A progress's source offset: JSON text (PySpark 4.0 shows the repr of a dict)."""
    if not isinstance(value, str):
        return dict(value)
    try:
        return dict(json.loads(value))
    except json.JSONDecodeError:
        return dict(ast.literal_eval(value))


def _check_plans(progress: list[dict[str, Any]], acks: list[tuple[int, str, int]],
                 started: int, run: Run) -> None:
    """Count the micro-batches (trigger begun after `started`) whose end offsets leave out
    records acknowledged before their trigger began, and those records."""
    for p in progress:
        began = _epoch_ns(p["timestamp"])
        if began < started:
            continue
        end = _offsets(p["sources"][0]["endOffset"])
        left = sum(1 for t, stream, pos in acks
                   if t < began - _SLACK_NS and pos > end.get(stream, 0))
        run.plans += 1
        if left:
            run.behind += 1
            run.left += left


def _print_durations(progress: list[dict[str, Any]]) -> None:
    """Median and max of each `durationMs` entry over the batches that read rows."""
    keys = sorted({k for p in progress for k in p["durationMs"]})
    parts = []
    for k in keys:
        values = sorted(p["durationMs"].get(k, 0) for p in progress)
        parts.append(f"{k} {values[len(values) // 2]}/{values[-1]}")
    print(f"  durationMs median/max over {len(progress)} batches: " + ", ".join(parts))


def pct(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, int(q * len(s)))]


def report(label: str, lat: list[float], *, required: bool = True) -> tuple[float, float]:
    """Print the percentiles of `lat`; with none, exit (or, not `required`, say so and
    give NaNs)."""
    if not lat:
        what = f"{label}: no record was read after the warm-up; run longer (--duration)"
        if required:
            sys.exit(what)
        print(what)
        return float("nan"), float("nan")
    p50, p99 = pct(lat, 0.5), pct(lat, 0.99)
    print(f"{label}: {len(lat)} records, p50 {p50:.0f} ms, p90 {pct(lat, 0.9):.0f} ms, "
          f"p99 {p99:.0f} ms, max {max(lat):.0f} ms")
    return p50, p99


def run_rounds(queries: dict[str, Callable[[], Any]], args: Any, cpu: CpuMeter,
               acks: Acks | None) -> dict[str, tuple[float, float]]:
    """Each query for `--duration` s in all, split over `--rounds` rounds whose order
    alternates, so drifting load falls on all alike; first each runs once unmeasured (a
    cold JVM and new Python workers stall the first query for seconds), unless
    `--warmup` is 0."""
    for label, make in queries.items() if args.warmup > 0 else ():
        print(f"warm-up: {label} for {2 * args.warmup:.0f}s, not measured")
        measure(make(), 0, 2 * args.warmup, Run(), cpu)
    runs = {label: Run() for label in queries}
    order = list(queries)
    for i in range(args.rounds):
        for label in order if i % 2 == 0 else order[::-1]:
            part = args.duration / args.rounds
            warmup = args.streams_warmup if label.startswith("s2, ") else args.warmup
            print(f"round {i + 1}: {label} for {part:.0f}s (+{warmup:.0f}s warm-up)")
            checked = acks is not None and label in acks.by_label
            measure(queries[label](), part, warmup, runs[label], cpu,
                    acked=(lambda label=label: acks.of(label)) if checked else None,
                    at_least=args.min_records)
    results = {}
    for label, run in runs.items():
        if label == RATE:  # it makes new rows once a second: only its durationMs compare
            continue
        results[label] = report(label, run.latencies, required=not label.startswith("s2, "))
        print(f"  CPU s over its rounds: {CpuMeter.format(run.cpu)}")
        if run.plans:
            print(f"  micro-batches that left acknowledged records behind: {run.behind} of "
                  f"{run.plans} ({run.left} records)")
    return results


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--duration", type=float, default=60.0, help="seconds per query, all rounds")
    ap.add_argument("--interval", type=float, default=50.0, help="ms between records")
    ap.add_argument("--warmup", type=float, default=5.0,
                    help="seconds left out per query (0: none, and no unmeasured run of each "
                         "query first)")
    ap.add_argument("--rounds", type=int, default=2, help="alternating runs of each query")
    ap.add_argument("--rate", action="store_true", help="also Spark's JVM rate source")
    ap.add_argument("--min-records", type=int, default=0,
                    help="a measured run goes on past its share of --duration (up to "
                         f"{MORE_S:.0f} s more) until it has read this many records stamped "
                         "after its warm-up (a smoke run: 1)")
    ap.add_argument("--service", choices=sorted(SERVICES), default="s2",
                    help="the reader measured: format s2 or durable-streams")
    ap.add_argument("--streams", type=_ints, default=[1],
                    help="stream counts read by the s2 queries, e.g. 1,1000,10000 (S2 only)")
    ap.add_argument("--streams-warmup", type=float, default=30.0,
                    help="seconds left out per run of a query over N > 1 streams (its start "
                         "resolves and watches every stream)")
    add_pin_option(ap)
    add_server_option(ap)
    args = ap.parse_args(argv)
    if args.service != "s2" and args.server != "local":
        ap.error(f"--server is the S2 server's: --service {args.service} runs its own")
    sys.stdout.reconfigure(line_buffering=True)  # type: ignore[union-attr]
    counts = sorted(set(args.streams) | {1})
    placement = placed(args)

    source, setup = SERVICES[args.service]
    spark = local_session("s2-spark-bench-latency", sources=[FileDataSource, source])

    with setup(spark, counts, placement, args) as service, tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "floor.log")
        producer = Producer(service.append, path, args.interval / 1000)
        producer.start()
        try:
            queries: dict[str, Callable[[], Any]] = {
                FLOOR: lambda: (
                    spark.readStream.format("s2_bench_file").option("path", path).load()
                ).selectExpr(FLOOR_STAMP),
                **service.queries,
            }
            if args.rate:
                # Spark's JVM rate source, for reference: rows stamped when generated.
                rps = str(round(1000 / args.interval))
                queries[RATE] = lambda: (
                    spark.readStream.format("rate").option("rowsPerSecond", rps).load()
                ).selectExpr("unix_micros(timestamp) * 1000 AS ns")
            cpu = CpuMeter(server=service.server_pid, here="this process (driver, producer)")
            results = run_rounds(queries, args, cpu, service.acks)
        finally:
            producer.stop()
    stop_session(spark)
    f50, f99 = results[FLOOR]
    mode = service.mode
    for label, (p50, p99) in results.items():
        if label.startswith("s2, "):
            print(f"latency at {label.removeprefix('s2, ')}: p50 {p50:.0f} ms, p99 {p99:.0f} "
                  f"ms, {p50 / f50:.2f}x floor p50, {p99 / f99:.2f}x floor p99 ({mode})")
    p50, p99 = results[next(iter(service.queries))]
    print(f"latency{service.word}: p50 {p50:.0f} ms, p99 {p99:.0f} ms, {p50 / f50:.2f}x "
          f"floor p50, {p99 / f99:.2f}x floor p99 ({mode})")


if __name__ == "__main__":
    main()
