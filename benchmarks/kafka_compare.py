"""Side by side with Kafka: the connector against the Kafka source and sink Spark ships.

One run, one machine, one Spark session (`local[2]`, Spark's Kafka connector at the
PySpark version in use on `spark.jars`), one Kafka broker (KRaft, one node,
`s2_spark.testing.external.Kafka`) and the S2 servers of `--servers` (the local server
and s2-lite by default). Kafka's log and s2-lite's streams (`--local-root`) are on disk
in temporary folders (in memory, s2-lite holds about six times the bytes it is sent: the
1 KiB shapes outgrow 24 GiB); the local server keeps its streams in memory. The servers
start together, each on the CPU kept for servers (`_pinning`; `--no-pin`: all on all),
and the workloads run on each system in turn:

* read: a catch-up read (AvailableNow into `noop`) of `--records` records of each shape
  (`--shapes`: body bytes, `h` for two headers): Kafka a topic of 1 and of 2 partitions;
  S2 one stream at `minPartitions` 1 and 2, and two streams. Rows/s over the micro-batches'
  addBatch time, and the CPU of Spark's JVM and of its Python workers per row.
* latency: one record every `--intervals` ms (a low and a medium rate) into a new topic /
  stream, read by a streaming query (default trigger) into `foreachBatch`: from the
  producer's send (the record's body is the time) to the micro-batch that holds it, p50
  and p99 after `--warmup` s. Kafka's producer is its console producer (a JVM fed on
  stdin, linger 0), S2's one append per record. With each: one micro-batch's profile, the
  median of each phase and each side's CPU a micro-batch (the JVM, Spark's Python
  planners and workers, the servers) over the producer's window.
* write: a copy pipeline, the read's first shape from one topic / stream into a new one,
  `--per-trigger` records a micro-batch, checkpointed; rows/s over the micro-batches' time,
  each side's CPU a row, and one micro-batch's profile as for latency.
* fanout: 200,000 events of `--users` users from one topic / stream: Kafka a key per user
  into one topic of 2 partitions, S2 a stream per user (`createStreams`); rows/s and the
  steady micro-batch p50, 20,000 events a micro-batch.
* eos: the copy pipeline (200,000 records, 2,000 a micro-batch) in a child process,
  SIGKILLed with all its processes `--kills` times, each at a random moment within 2 s
  after a micro-batch committed, then run to its end; the target read back and each
  source record's copies counted (lost: none; duplicated: more than one).

Ends with a table of each figure, its ratio against Kafka's (higher is better for the
connector: rates, and Kafka's latency over ours), a chart of the ratios (`--chart`,
PNG, matplotlib from the `dev` extra) and one line: `kafka_compare: <system> <g>x Kafka
(geometric mean of <k> ratios), ...`. `--parts` runs some of the workloads.

    python benchmarks/kafka_compare.py --servers local,s2-lite --chart docs/img/kafka.png

`--no-kafka` runs the S2 side of every workload without Kafka (no broker, no Spark Kafka
connector, no ratios): what runs where Spark's Kafka connector does not exist for the
PySpark in use. With the sizes made small (`--records`, `--fan-events`, `--eos-records`,
`--latency-seconds`, `--latency-settle`, ...), a smoke run
(tests/test_benchmarks_smoke.py).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from _pinning import CpuMeter, add_pin_option, placed
from _servers import s2_server
from _spark import local_session, phase_medians

from s2_spark.s2 import AppendRecord, S2Client, S2Config
from s2_spark.testing.external import KAFKA, Kafka

PARTS = ("read", "latency", "write", "fanout", "eos")
EOS_RECORDS, EOS_PER_TRIGGER = 200_000, 2_000
FAN_EVENTS, FAN_PER_TRIGGER = 200_000, 20_000


@dataclass(frozen=True)
class Shape:
    size: int
    headers: bool

    @classmethod
    def parse(cls, text: str) -> Shape:
        return cls(int(text.rstrip("h")), text.endswith("h"))

    def __str__(self) -> str:
        return f"{self.size} B{' + 2 headers' if self.headers else ''}"


@dataclass
class System:
    """One side: Kafka (`bootstrap`; `kafka`, the broker, where topics can be made) or an
    S2 server (`url`, `basin`)."""

    name: str
    bootstrap: str = ""
    url: str = ""
    basin: str = ""
    kafka: Kafka | None = None

    @property
    def is_kafka(self) -> bool:
        return bool(self.bootstrap)

    def body(self) -> str:
        return "value" if self.is_kafka else "body"

    def new(self, name: str, partitions: int = 1) -> str:
        """A new topic (of `partitions`) or stream name (streams are made on append)."""
        name = f"{name}-{uuid.uuid4().hex[:6]}"
        if self.kafka is not None:
            self.kafka.create_topic(name, partitions=partitions)
        return name

    def reader(self, spark: Any, name: str, *, parts: int = 1, per_trigger: int = 0,
               headers: bool = False, prefix: bool = False) -> Any:
        if self.is_kafka:
            r = (spark.readStream.format("kafka").option("kafka.bootstrap.servers", self.bootstrap)
                 .option("subscribe", name).option("startingOffsets", "earliest")
                 .option("includeHeaders", str(headers).lower()))
            return (r.option("maxOffsetsPerTrigger", str(per_trigger)) if per_trigger else r).load()
        r = (spark.readStream.format("s2").option("endpoint", self.url).option("basin", self.basin)
             .option("streamPrefix" if prefix else "stream", name)
             .option("includeHeaders", str(headers).lower()).option("minPartitions", str(parts)))
        return (r.option("maxRecordsPerTrigger", str(per_trigger)) if per_trigger else r).load()

    def writer(self, df: Any, name: str | None, ckpt: str, *, basin: str = "") -> Any:
        """`df` (a body column, maybe headers, key / stream) into topic or stream `name`
        (None: S2's `stream` column, a stream per value, in `basin`)."""
        if self.is_kafka:
            return (df.writeStream.format("kafka").option("kafka.bootstrap.servers", self.bootstrap)
                    .option("topic", name).option("checkpointLocation", ckpt))
        w = (df.writeStream.format("s2").option("endpoint", self.url)
             .option("basin", basin or self.basin).option("createStreams", "true")
             .option("checkpointLocation", ckpt))
        return w if name is None else w.option("stream", name)

    def fill(self, spark: Any, name: str, rows: Any) -> None:
        """Batch-write `rows` (body, maybe headers / stream) into `name`."""
        if self.is_kafka:
            w = rows.write.format("kafka").option("kafka.bootstrap.servers", self.bootstrap)
            w.option("topic", name).mode("append").save()
            return
        w = (rows.write.format("s2").option("endpoint", self.url).option("basin", self.basin)
             .option("createStreams", "true"))
        (w if "stream" in rows.columns else w.option("stream", name)).mode("append").save()


def records(spark: Any, system: System, n: int, shape: Shape, *, streams: str = "") -> Any:
    """`n` rows: body "<i>" padded to the shape's size; two headers with the shape's `h`;
    with `streams`, a stream column alternating between `<streams>0` and `<streams>1`."""
    from pyspark.sql import functions as F

    body = F.rpad(F.col("id").cast("string"), shape.size, ".").cast("binary")
    cols = [body.alias(system.body())]
    if shape.headers:
        key = "key" if system.is_kafka else "name"
        kv = [("type", F.lit("click")), ("trace", F.sha1(F.col("id").cast("string")))]
        cols.append(F.array(*[F.struct(F.lit(k).cast("string" if system.is_kafka else "binary")
                                       .alias(key), v.cast("binary").alias("value"))
                              for k, v in kv]).alias("headers"))
    if streams:
        cols.append(F.concat(F.lit(streams), (F.col("id") % 2).cast("string")).alias("stream"))
    return spark.range(n).select(*cols)


def run_available_now(query: Any) -> list[dict[str, Any]]:
    """Wait for an AvailableNow query; its progress entries that had rows."""
    query.awaitTermination()
    if query.exception() is not None:
        raise RuntimeError(str(query.exception()))
    return [p for p in query.recentProgress if p["numInputRows"]]


def micro_batch_profile(progress: list[dict[str, Any]], spent: dict[str, float],
                        batches: int) -> str:
    """One micro-batch: the median ms of each phase (`durationMs`) over `progress`, and
    the CPU ms a micro-batch of each side over `batches` micro-batches."""
    per = ", ".join(f"{side} {1000 * s / max(1, batches):.0f}" for side, s in spent.items())
    return f"a micro-batch's median ms: {phase_medians(progress)}; CPU ms a micro-batch: {per}"


def run_measured(cpu: CpuMeter, writer: Callable[[str], Any]
                 ) -> tuple[list[dict[str, Any]], dict[str, float]]:
    """Run the stream writer `writer(checkpoint)` gives to its end, AvailableNow, in a
    checkpoint of its own: its progress entries that had rows, and each side's CPU."""
    before = cpu.sample()
    with tempfile.TemporaryDirectory() as ckpt:
        progress = run_available_now(writer(ckpt).trigger(availableNow=True).start())
    return progress, cpu.since(before)


# -- read


def read_once(spark: Any, cpu: CpuMeter, df: Any, label: str, n: int) -> Figure:
    progress, spent = run_measured(cpu, lambda ckpt: df.writeStream.format("noop")
                                   .option("checkpointLocation", ckpt))
    rows = sum(p["numInputRows"] for p in progress)
    assert rows == n, f"{label}: read {rows:,} rows, expected {n:,}"
    busy = sum(p["durationMs"].get("addBatch", 0) for p in progress) / 1000
    jvm, workers = (1e9 * spent.get(s, 0.0) / n for s in ("JVM", "Python workers"))
    print(f"  {label}: {n / busy:,.0f} rows/s ({busy:.2f} s of addBatch); CPU ns a row: "
          f"JVM {jvm:.0f}, Python workers {workers:.0f}; CPU s {cpu.format(spent)}")
    return Figure(n / busy, f"JVM {jvm:.0f} + workers {workers:.0f} ns/row")


def bench_read(spark: Any, cpu: CpuMeter, systems: list[System], args: argparse.Namespace,
               table: Table) -> None:
    n = args.records
    for shape in args.shapes:
        print(f"read: {n:,} records of {shape}")
        for system in systems:
            if system.is_kafka:
                for parts in (1, 2):
                    topic = system.new(f"read{parts}", partitions=parts)
                    system.fill(spark, topic, records(spark, system, n, shape))
                    df = system.reader(spark, topic, headers=shape.headers)
                    table.add(f"read {shape}, {parts} partition(s)", system.name,
                              best(args.repeat, read_once, spark, cpu, df,
                                   f"{system.name} {parts}p", n))
                continue
            one, two = system.new("read"), system.new("read2-")
            system.fill(spark, one, records(spark, system, n, shape))
            system.fill(spark, two, records(spark, system, n, shape, streams=two))
            for parts, name, prefix in ((1, one, False), (2, one, False), (2, two, True)):
                df = system.reader(spark, name, parts=parts, headers=shape.headers,
                                   prefix=prefix)
                how = "2 streams" if prefix else f"1 stream, minPartitions {parts}"
                key = f"read {shape}, {parts} partition(s)"
                table.add(key + (" (S2: 2 streams)" if prefix else ""), system.name,
                          best(args.repeat, read_once, spark, cpu, df, f"{system.name} {how}",
                               n), peer=key)


# -- write, fan-out


def copy_once(spark: Any, cpu: CpuMeter, system: System, src: str, n: int,
              per_trigger: int) -> Figure:
    dst = system.new("copy")
    df = system.reader(spark, src, parts=2, per_trigger=per_trigger)
    progress, spent = run_measured(
        cpu, lambda ckpt: system.writer(df.select(system.body()), dst, ckpt))
    busy = sum(p["durationMs"]["triggerExecution"] for p in progress) / 1000
    rows = sum(p["numInputRows"] for p in progress)
    assert rows == n, f"{system.name}: copied {rows:,} rows, expected {n:,}"
    print(f"  {system.name}: {n / busy:,.0f} rows/s ({len(progress)} micro-batches, {busy:.2f} s); "
          f"CPU s {cpu.format(spent)}; CPU ns a row: "
          + ", ".join(f"{side} {1e9 * t / n:.0f}" for side, t in spent.items()))
    print(f"  {system.name}: {micro_batch_profile(progress, spent, len(progress))}")
    return Figure(n / busy)


def bench_write(spark: Any, cpu: CpuMeter, systems: list[System], args: argparse.Namespace,
                table: Table) -> None:
    n, shape = args.records, args.shapes[0]
    print(f"write: a copy of {n:,} records of {shape}, {args.per_trigger:,} a micro-batch")
    for system in systems:
        src = system.new("copysrc", partitions=2)
        system.fill(spark, src, records(spark, system, n, Shape(shape.size, False)))
        table.add("streaming write (copy pipeline)", system.name,
                  best(args.repeat, copy_once, spark, cpu, system, src, n, args.per_trigger))


def fan_once(spark: Any, cpu: CpuMeter, system: System, src: str, users: int, events: int,
             per_trigger: int) -> Figure:
    from pyspark.sql import functions as F

    df = system.reader(spark, src, parts=2, per_trigger=per_trigger)
    basin = ""
    body = F.col(system.body())
    user = F.substring(body.cast("string"), 1, 5)
    if system.is_kafka:
        out, name = df.select(user.alias("key"), body.alias("value")), system.new("fan", 2)
    else:
        out, name = df.select(F.concat(F.lit("u/"), user).alias("stream"), body), None
        basin = f"kc-fan-{uuid.uuid4().hex[:8]}"  # a new basin: every stream made anew
        with S2Client(S2Config(endpoint=system.url)) as client:
            client.create_basin(basin)
    progress, spent = run_measured(
        cpu, lambda ckpt: system.writer(out, name, ckpt, basin=basin))
    times = [p["durationMs"]["triggerExecution"] / 1000 for p in progress]
    steady = statistics.median(times[1:] or times)
    rate = events / sum(times)
    print(f"  {system.name}: {rate:,.0f} rows/s, micro-batch p50 {steady:.2f} s (steady), "
          f"first {times[0]:.2f} s; CPU s {cpu.format(spent)}")
    return Figure(rate, f"{steady:.2f} s a micro-batch")


def bench_fanout(spark: Any, cpu: CpuMeter, systems: list[System], args: argparse.Namespace,
                 table: Table) -> None:
    from pyspark.sql import functions as F

    events = args.fan_events
    for users in args.users:
        print(f"fanout: {events:,} events to {users:,} users")
        for system in systems:
            src = system.new("events", partitions=2)
            user = F.lpad(((F.col("id") * 7919) % users).cast("string"), 5, "0")
            rows = spark.range(events).select(F.rpad(F.concat(
                user, F.lit(":"), F.col("id").cast("string")), 100, ".").cast("binary")
                .alias(system.body()))
            system.fill(spark, src, rows)
            table.add(f"key / stream per user, {users:,} users", system.name,
                      best(args.repeat, fan_once, spark, cpu, system, src, users, events,
                           args.fan_per_trigger))


# -- latency


class Producer:
    """One record every `interval` s into `name`, its body the time of the send."""

    def __init__(self, system: System, name: str, interval: float) -> None:
        self.system, self.name, self.interval = system, name, interval
        self._stop, self._sending = threading.Event(), threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self.error: BaseException | None = None

    def __enter__(self) -> Producer:
        """Once the producer sends (Kafka's console producer takes seconds to start)."""
        self._thread.start()
        while not self._sending.wait(0.1):
            if not self._thread.is_alive():
                raise RuntimeError(f"the producer ended: {self.error!r}")
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        if self.error is not None:
            raise self.error

    def _ticks(self) -> Iterator[None]:
        self._sending.set()
        next_at = time.monotonic()
        while not self._stop.is_set():
            next_at += self.interval
            yield
            self._stop.wait(max(0.0, next_at - time.monotonic()))

    def _run(self) -> None:
        try:
            if self.system.is_kafka:
                self._kafka()
            else:
                self._s2()
        except BaseException as exc:
            self.error = exc

    def _kafka(self) -> None:
        proc = subprocess.Popen(
            ["java", "-cp", f"{KAFKA.folder / 'libs'}/*", "org.apache.kafka.tools.ConsoleProducer",
             "--bootstrap-server", self.system.bootstrap, "--topic", self.name, "--timeout", "0"],
            stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        assert proc.stdin is not None
        try:
            time.sleep(3)  # its JVM's start, before the first stamp
            for _ in self._ticks():
                proc.stdin.write(f"{time.time():.6f}\n".encode())
                proc.stdin.flush()
        finally:
            proc.stdin.close()
            proc.wait(30)

    def _s2(self) -> None:
        with S2Client(S2Config(endpoint=self.system.url)) as client:
            stream = client.basin(self.system.basin).stream(self.name)
            for _ in self._ticks():
                stream.append([AppendRecord(f"{time.time():.6f}".encode())])


def latency_once(spark: Any, cpu: CpuMeter, system: System, interval_ms: float,
                 args: argparse.Namespace) -> Figure:
    name = system.new("lat")
    if not system.is_kafka:
        with S2Client(S2Config(endpoint=system.url)) as client:
            client.basin(system.basin).create_stream(name)
    seen: list[tuple[float, float]] = []  # (stamp, seen)

    def batch(df: Any, _id: int) -> None:
        rows = df.select(system.body()).collect()
        now = time.time()
        seen.extend((float(bytes(r[0]).decode()), now) for r in rows)

    with tempfile.TemporaryDirectory() as ckpt:
        q = (system.reader(spark, name).writeStream.foreachBatch(batch)
             .option("checkpointLocation", ckpt).start())
        try:
            time.sleep(args.latency_settle)  # the query's first micro-batch
            before, first = cpu.sample(), _last_batch(q)
            with Producer(system, name, interval_ms / 1000):
                time.sleep(args.latency_seconds)
            time.sleep(args.latency_drain)
            spent, batches = cpu.since(before), _last_batch(q) - first
            more = time.monotonic() + 120  # a loaded machine: the first records, at least
            while not seen and q.exception() is None and time.monotonic() < more:
                time.sleep(0.1)
            if q.exception() is not None:
                raise RuntimeError(f"{system.name}: {q.exception()}")
            progress = [p for p in q.recentProgress if p["numInputRows"]]
        finally:
            q.stop()
    since = min((s for s, _ in seen), default=0.0) + args.warmup
    lat = sorted(v - s for s, v in seen if s >= since)
    assert lat, f"{system.name}: no record seen"
    p50, p99 = lat[len(lat) // 2], lat[min(len(lat) - 1, int(0.99 * len(lat)))]
    print(f"  {system.name} every {interval_ms:g} ms: p50 {1000 * p50:.0f} ms, "
          f"p99 {1000 * p99:.0f} ms ({len(lat)} records, {batches} micro-batches); "
          + micro_batch_profile(progress, spent, batches))
    return Figure(p50, f"p99 {1000 * p99:.0f} ms", lower_is_better=True)


def bench_latency(spark: Any, cpu: CpuMeter, systems: list[System], args: argparse.Namespace,
                  table: Table) -> None:
    for interval in args.intervals:
        print(f"latency: a record every {interval:g} ms")
        for system in systems:
            table.add(f"append-to-visible p50, a record every {interval:g} ms", system.name,
                      latency_once(spark, cpu, system, interval, args))


def _last_batch(q: Any) -> int:
    """The id of the query's last micro-batch that ended (-1: none yet)."""
    return int((q.lastProgress or {"batchId": -1})["batchId"])


# -- exactly-once under SIGKILL


def bench_eos(spark: Any, cpu: CpuMeter, systems: list[System], args: argparse.Namespace,
              table: Table) -> None:
    from pyspark.sql import functions as F

    n = args.eos_records
    print(f"eos: a copy of {n:,} records, SIGKILLed {args.kills} times at random")
    rng = random.Random(args.seed)
    for system in systems:
        src, dst = system.new("eossrc", 2), system.new("eosdst", 2)
        system.fill(spark, src, records(spark, system, n, Shape(100, False)))
        with tempfile.TemporaryDirectory(prefix="kc-eos-") as ckpt:
            spec = {"name": system.name, "bootstrap": system.bootstrap, "url": system.url,
                    "basin": system.basin, "src": src, "dst": dst, "ckpt": ckpt,
                    "jars": spark.conf.get("spark.jars", ""),
                    "per_trigger": str(args.eos_per_trigger)}
            killed = sum(_run_child(spec, rng.uniform(0.0, 2.0)) for _ in range(args.kills))
            _run_child(spec, None)
        got = (spark.read.format("kafka").option("kafka.bootstrap.servers", system.bootstrap)
               .option("subscribe", dst).load() if system.is_kafka else
               spark.read.format("s2").option("endpoint", system.url)
               .option("basin", system.basin).option("stream", dst).load())
        counts = got.groupBy(system.body()).count()
        distinct = counts.count()
        extra = counts.where(F.col("count") > 1).agg(F.sum(F.col("count") - 1)).first()[0] or 0
        lost = n - distinct
        print(f"  {system.name}: {killed} runs killed mid-way; {lost:,} lost, {extra:,} "
              f"duplicated of {n:,}")
        table.add("exactly-once copy under SIGKILL: duplicates + losses", system.name,
                  Figure(float(lost + extra), f"{lost} lost, {extra} duplicated",
                         lower_is_better=True, ratio=False))


def _run_child(spec: dict[str, str], kill_in: float | None) -> int:
    """The copy in a child process, its whole session SIGKILLed `kill_in` s after its
    next micro-batch commits (a file more in the checkpoint's `commits`), unless it ended
    first (None: run to the end). 1 if it was killed."""
    commits = os.path.join(spec["ckpt"], "commits")
    done = len(os.listdir(commits)) if os.path.isdir(commits) else 0
    with tempfile.TemporaryFile() as log:  # Spark's output, never left to fill a pipe
        child = subprocess.Popen([sys.executable, __file__, "--child", json.dumps(spec)],
                                 start_new_session=True, stdout=log, stderr=log)
        killed = _watch_child(child, commits, done, kill_in)
        if not killed and child.returncode != 0:
            log.seek(0)
            raise RuntimeError(f"the copy failed: {log.read().decode()[-3000:]}")
    return int(killed)


def _watch_child(child: subprocess.Popen[bytes], commits: str, done: int,
                 kill_in: float | None) -> bool:
    """Whether `child` was killed as `_run_child` says, else waited for."""
    deadline = time.monotonic() + 900
    while child.poll() is None and time.monotonic() < deadline:
        if kill_in is not None and os.path.isdir(commits) and len(os.listdir(commits)) > done:
            time.sleep(kill_in)
            if child.poll() is None:
                os.killpg(child.pid, signal.SIGKILL)
                child.wait()
                return True
        time.sleep(0.05)
    if child.poll() is None:
        os.killpg(child.pid, signal.SIGKILL)
        raise RuntimeError("the copy did not end within 900 s")
    return False


def child_copy(spec: dict[str, str]) -> None:
    """The copy of `bench_eos`, run by the child process."""
    jars = {"spark.jars": spec["jars"]} if spec["jars"] else {}  # none: --no-kafka
    spark = local_session("kafka_compare-eos", jars)
    system = System(spec["name"], bootstrap=spec["bootstrap"], url=spec["url"],
                    basin=spec["basin"])
    per_trigger = int(spec.get("per_trigger", EOS_PER_TRIGGER))
    df = system.reader(spark, spec["src"], parts=2, per_trigger=per_trigger)
    run_available_now(system.writer(df.select(system.body()), spec["dst"], spec["ckpt"])
                      .trigger(availableNow=True).start())


# -- the table


@dataclass
class Figure:
    value: float
    note: str = ""
    lower_is_better: bool = False
    ratio: bool = True


def best(repeat: int, measure: Any, *args: Any) -> Figure:
    """The best of `repeat` runs of `measure(*args)`."""
    runs: list[Figure] = [measure(*args) for _ in range(repeat)]
    return (min if runs[0].lower_is_better else max)(runs, key=lambda f: f.value)


@dataclass
class Table:
    """Figures by what they measure and system; a row without Kafka's figure is compared
    with its `peer` row's (S2's two streams with Kafka's two partitions)."""

    rows: dict[str, dict[str, Figure]] = field(default_factory=dict)
    peers: dict[str, str] = field(default_factory=dict)

    def add(self, what: str, system: str, figure: Figure, *, peer: str = "") -> None:
        self.rows.setdefault(what, {})[system] = figure
        if peer:
            self.peers[what] = peer

    def ratio(self, what: str, system: str) -> float | None:
        ours = self.rows[what].get(system)
        kafka = self.rows.get(self.peers.get(what, what), {}).get("kafka")
        if ours is None or kafka is None or not ours.ratio or ours.value == 0:
            return None
        return kafka.value / ours.value if ours.lower_is_better else ours.value / kafka.value

    def summary(self, systems: list[str]) -> str:
        """Each system's geometric mean of its ratios against Kafka (higher is better)."""
        out = []
        for name in systems:
            ratios = [r for w in self.rows if (r := self.ratio(w, name)) is not None and r > 0]
            mean = (f"{math.exp(sum(map(math.log, ratios)) / len(ratios)):.2f}x"
                    if ratios else "n/a")
            out.append(f"{name} {mean} Kafka (geometric mean of {len(ratios)} ratios)")
        return ", ".join(out)

    def print(self, systems: list[str]) -> None:
        print("\n| figure | " + " | ".join(systems) + " |")
        print("|---|" + "---|" * len(systems))
        for what, row in self.rows.items():
            cells = []
            for name in systems:
                f = row.get(name)
                if f is None:
                    cells.append("-")
                    continue
                value = (f"{1000 * f.value:.0f} ms" if f.lower_is_better and f.ratio
                         else f"{f.value:,.0f}")
                r = None if name == "kafka" else self.ratio(what, name)
                cells.append(value + (f" ({r:.2f}x)" if r is not None else "")
                             + (f"; {f.note}" if f.note else ""))
            print(f"| {what} | " + " | ".join(cells) + " |")

    def chart(self, path: str, systems: list[str], title: str) -> None:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        whats = [w for w in self.rows if any(self.ratio(w, s) is not None for s in systems)]
        fig, ax = plt.subplots(figsize=(9, 0.45 * len(whats) * len(systems) + 1.5))
        height = 0.8 / max(1, len(systems))
        for k, name in enumerate(systems):
            ys = [i + k * height for i in range(len(whats))]
            ax.barh(ys, [self.ratio(w, name) or 0 for w in whats], height=height, label=name)
        ax.axvline(1.0, color="black", linewidth=1)
        ax.set_yticks([i + height * (len(systems) - 1) / 2 for i in range(len(whats))])
        ax.set_yticklabels(whats, fontsize=8)
        ax.invert_yaxis()
        ax.set_xlabel("against Kafka (1.0 = Kafka; higher is better for s2-spark)")
        ax.set_title(title, fontsize=9)
        ax.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(path, dpi=110)
        print(f"chart: {path}")


# -- main


def spark_jars() -> list[str]:
    import pyspark

    try:
        return [str(j) for j in Kafka.spark_jars(pyspark.__version__,
                                                 os.path.dirname(pyspark.__file__))]
    except Exception as exc:
        raise SystemExit(f"Spark's Kafka connector at PySpark {pyspark.__version__}: {exc}\n"
                         "spark-sql-kafka-0-10_2.13 must be on Maven Central at the version "
                         "of the PySpark in use; run this with a PySpark that has it "
                         "(e.g. pip install 'pyspark==4.2.0')") from exc


@contextlib.contextmanager
def started(args: argparse.Namespace) -> Iterator[tuple[list[System], CpuMeter, str]]:
    """Kafka and the S2 servers, pinned; the CPU meter over them; the placement's mode."""
    placement = placed(args)
    with contextlib.ExitStack() as stack:
        systems: list[System] = []
        pids: dict[str, int | None] = {}
        if not args.no_kafka:
            kafka = stack.enter_context(Kafka())
            placement.pin_server(kafka.pid)
            print(f"server: kafka {KAFKA.version} at {kafka.bootstrap} (pid {kafka.pid})")
            systems.append(System("kafka", bootstrap=kafka.bootstrap, kafka=kafka))
            pids["kafka"] = kafka.pid
        for choice in args.servers:
            root = stack.enter_context(tempfile.TemporaryDirectory(prefix="kc-s2-lite-"))
            server = stack.enter_context(s2_server(argparse.Namespace(server=choice),
                                                   placement, lite_root=root))
            name = f"s2 ({server.name})"
            basin = f"kc-{uuid.uuid4().hex[:8]}"
            with S2Client(S2Config(endpoint=server.url)) as client:
                client.create_basin(basin)
            systems.append(System(name, url=server.url, basin=basin))
            pids[name] = server.pid
        yield systems, CpuMeter(others=pids), placement.mode


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--servers", type=lambda s: s.split(","), default=["local", "s2-lite"])
    ap.add_argument("--parts", type=lambda s: s.split(","), default=list(PARTS))
    ap.add_argument("--records", type=int, default=1_000_000)
    ap.add_argument("--shapes", type=lambda s: [Shape.parse(x) for x in s.split(",")],
                    default=[Shape(100, False), Shape(100, True), Shape(1024, False),
                             Shape(1024, True)], help="body bytes, h: with 2 headers")
    ap.add_argument("--intervals", type=lambda s: [float(x) for x in s.split(",")],
                    default=[50.0, 5.0], help="ms between records (latency)")
    ap.add_argument("--latency-seconds", type=float, default=30.0)
    ap.add_argument("--latency-settle", type=float, default=5.0,
                    help="seconds a latency query runs before the producer starts")
    ap.add_argument("--latency-drain", type=float, default=3.0,
                    help="seconds a latency query runs after the producer stops (and on, "
                         "up to 120 s, until it has seen a record)")
    ap.add_argument("--warmup", type=float, default=5.0)
    ap.add_argument("--per-trigger", type=int, default=250_000)
    ap.add_argument("--users", type=lambda s: [int(x) for x in s.split(",")],
                    default=[1000, 10000])
    ap.add_argument("--fan-events", type=int, default=FAN_EVENTS)
    ap.add_argument("--fan-per-trigger", type=int, default=FAN_PER_TRIGGER)
    ap.add_argument("--eos-records", type=int, default=EOS_RECORDS)
    ap.add_argument("--eos-per-trigger", type=int, default=EOS_PER_TRIGGER)
    ap.add_argument("--kills", type=int, default=3)
    ap.add_argument("--seed", type=int, default=46)
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--chart", default=None, help="write the ratios' chart here (PNG)")
    ap.add_argument("--no-kafka", action="store_true",
                    help="the S2 side only: no Kafka broker, no Kafka connector, no ratios")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    add_pin_option(ap)
    args = ap.parse_args(argv)
    if args.child is not None:
        return child_copy(json.loads(args.child))
    if unknown := set(args.parts) - set(PARTS):
        ap.error(f"--parts takes {','.join(PARTS)}, not {','.join(sorted(unknown))}")
    jars = [] if args.no_kafka else spark_jars()
    with started(args) as (systems, cpu, mode):
        spark = local_session("kafka_compare", {"spark.jars": ",".join(jars)} if jars else {})
        import pyspark

        kafka = "no Kafka (--no-kafka)" if args.no_kafka else f"Kafka {KAFKA.version}"
        versions = f"PySpark {pyspark.__version__}, {kafka}, {os.cpu_count()} CPUs, {mode}"
        print(f"{versions}, load {os.getloadavg()[0]:.1f}")
        table = Table()
        benches = {"read": bench_read, "latency": bench_latency, "write": bench_write,
                   "fanout": bench_fanout, "eos": bench_eos}
        for part in PARTS:
            if part in args.parts:
                benches[part](spark, cpu, systems, args, table)
        names = [s.name for s in systems]
        table.print(names)
        if args.chart:
            table.chart(args.chart, [n for n in names if n != "kafka"],
                        f"s2-spark against Spark's Kafka source and sink ({versions})")
    print(f"kafka_compare: {table.summary([n for n in names if n != 'kafka'])} ({mode})")


if __name__ == "__main__":
    main()
