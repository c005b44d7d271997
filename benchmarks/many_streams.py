"""Many streams: the reader and writer over N streams against the same work on one stream.

One server process (the local server, `ServerProcess`, or another with `--server`),
`local[2]`, 100 B records; every ratio is against a single stream measured in the same
run:

* read: `readStream.format("s2")` with `streamPrefix` over N streams of R records each,
  `trigger(availableNow=True)` into the `noop` sink, against the same query over one
  stream of N*R records (option `stream`); for each (N, R) of `--streams` / `--records`
  (default (1000, 100) and (10000, 10)). Seconds are the query's wall time from `start()`
  to its end (the seconds of its triggers, without start-up, are printed too); the
  queries alternate and the best of `--repeat` counts. Ratio: single seconds / many
  seconds (higher is better, 1.00x is as fast as one stream).
* write: for each (N, R) too, a batch `df.write.format("s2")` of N*R rows from
  `spark.range` (2 partitions, body 100 B), routed by a `stream` column (row i to stream
  i % N, so every partition writes to every stream) to N streams the write creates
  (`createStreams`; every run writes new ones, and their tails are checked), against
  the same rows all to one new stream (option `stream`, which overrides the column).
  Seconds of `save()`; ratio as for reads. Also printed: the routed write after
  `repartition(2, "stream")` and a sort within partitions (the README's advice for tasks
  that share streams), against the same single stream.
* `--rtt-ms`: the reads' and writes' queries reach the server through
  `s2_spark.testing.DelayProxy`, which adds that round trip (creating, filling and
  checking go straight to it; the idle part too).
* idle: a default-trigger query over `--idle-streams` empty streams (`streamPrefix`) into
  `foreachBatch`. After `--settle` s, for `--window` s (10, or the client's tail-watch
  long-poll wait if longer, so that every idle stream's long-poll is re-armed once in the
  window rather than all or none of them): the median `durationMs.latestOffset` of its
  progress events (every idle trigger reports one here: the session sets
  `spark.sql.streaming.noDataProgressEventInterval=0`; a listener keeps them) and the
  requests that reach the server (its request counter, `GET /_local/stats`; n/a from
  s2-lite, which has none), per second and per stream. Then one record every `--interval`
  ms to a random one of the streams for `--duration` s, each record's body its wall-clock
  time (ns), and `foreachBatch` records `now - stamp` per row as `latency.py` does
  (records stamped in the first `--warmup` s left out): p50 and p99. The same is measured
  for one stream (latency.py's single-stream query: option `stream`, startingPosition
  latest) in the same run; ratio: many p50 / single p50 (lower is better).

Each read and the idle query also print their checkpoint's offset log (`offsets/<batch>`
files: how many, median and largest size; offsets over more than 1000 streams are
compact), and the idle query the memory of each side while idle (`_pinning.resident`:
resident MiB now and at peak of the largest process of each: the JVM, the query's
driver-side reader, this process).

Streams to read are created and filled before any timing, in a basin that creates a
stream on its first append, by requests sent together (100,000 streams take about a
minute); for `--streams 100000 --records 1 --skip write` and `--idle-streams 100000`. By
default the server runs on a CPU of its own, and every read, write and idle window prints
the CPU seconds of each side (`_pinning`; `--no-pin` for the old behaviour). Ends with:
`many_streams: read <r>x single at <N>x<R>, ...; write <w>x single at <N>x<R>, ...; idle
<q> req/s per stream, p50 <x>x single (<pinned|unpinned>)`.
For a smoke run: `--streams 100,200 --records 10,5 --idle-streams 100 --window 5
--duration 5 --repeat 1` (`--no-warmup`: without the warm-up reads); `--skip
read,write,idle` leaves parts out (printed as n/a).
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import os
import random
import resource
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import pyarrow as pa
from _pinning import CpuMeter, add_pin_option, placed, resident
from _servers import S2Server, add_server_option, s2_server
from _spark import local_session, stop_session
from _streams import fill  # benchmarks/ is on sys.path
from latency import Producer, report
from pyspark.sql.streaming import StreamingQueryListener

from s2_spark.s2 import AppendAck, AppendRecord, S2Client, S2Config, SingleAppend
from s2_spark.testing import DelayProxy
from s2_spark.wire.appends import encode_append_batches

try:  # an idle stream's long-poll lasts this long: a window as long sees each re-armed once
    from s2_spark.s2._watch import WATCH_WAIT
except ImportError:  # no tail watch: requests come at least every few seconds
    WATCH_WAIT = 0

RECORD = 100
#: Streams whose set-up requests go out together at a time (see `create_streams`).
SETUP_CHUNK = 5000
STAMP = "CAST(CAST(body AS STRING) AS BIGINT) AS ns"
PARTS = ("read", "write", "idle")
#: Seconds to wait for the server's request counts (a server on one core holding tens of
#: thousands of long-polls may take many to answer).
STATS_TIMEOUT = 120.0
#: Open files Spark's side leaves to the server on the same host (see
#: `leave_open_files_to_the_server`).
SERVER_FILES = 1024


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def names(prefix: str, n: int) -> list[str]:
    width = len(str(max(n - 1, 0)))
    return [f"{prefix}{i:0{width}d}" for i in range(n)]


def create_streams(client: S2Client, basin: str, streams: Sequence[str], records: int,
                   workers: int) -> float:
    """Create `basin` and `streams` in it, each with `records` records of RECORD random
    bytes; return the seconds it took. The basin creates a stream on its first append
    (S2's `create_stream_on_append`), and the appends (creations, for empty streams) go
    out together on the client's fan-out, `SETUP_CHUNK` at a time: about 0.3 ms of the
    server's CPU a stream instead of a creation's 6 ms, so 100,000 streams take a minute.
    Streams of more than 1000 records are filled one by one, `workers` at a time."""
    body = os.urandom(RECORD)
    t0 = time.perf_counter()
    client.ensure_basin(basin, config={"create_stream_on_append": True})
    b = client.basin(basin)
    if records > 1000:
        def one(name: str) -> None:
            b.stream(name).append_many([AppendRecord(body)] * records)

        with ThreadPoolExecutor(workers) as pool:
            list(pool.map(one, streams))
    elif records:
        batch = encode_append_batches(pa.array([body] * records, pa.binary()))[0]
        for i in range(0, len(streams), SETUP_CHUNK):
            acks = b.append_each([SingleAppend(s, batch) for s in streams[i:i + SETUP_CHUNK]])
            failed = [a for a in acks if not isinstance(a, AppendAck)]
            if failed:
                raise failed[0]
    else:
        for i in range(0, len(streams), SETUP_CHUNK):
            b.create_streams(streams[i:i + SETUP_CHUNK])
    return time.perf_counter() - t0


def tails(client: S2Client, basin: str, streams: Sequence[str]) -> int:
    """The sum of the streams' tails (records and command records appended)."""
    found = client.basin(basin).check_tails(streams)
    assert None not in found.values(), "a stream is missing"
    return sum(t.seq_num for t in found.values() if t is not None)


def offset_log(ckpt: str) -> list[int]:
    """Bytes of each entry of a checkpoint's offset log (`offsets/<batch>`), in order."""
    entries = [p for p in Path(ckpt, "offsets").iterdir() if p.name.isdigit()]
    return [p.stat().st_size for p in sorted(entries, key=lambda p: int(p.name))]


def _kb(sizes: Sequence[int]) -> str:
    return "none" if not sizes else (f"{len(sizes)} entries, median "
                                     f"{statistics.median(sizes) / 1024:,.1f} KB, largest "
                                     f"{max(sizes) / 1024:,.1f} KB")


def _mib(sides: dict[str, tuple[float, float]]) -> str:
    return ", ".join(f"{side} {now:,.0f} MiB (peak {peak:,.0f})"
                     for side, (now, peak) in sides.items())


def session() -> Any:
    return local_session("s2-spark-bench-many-streams", {
        "spark.sql.shuffle.partitions": "2",
        # Every idle trigger reports progress (by default one in 10 s); the idle window's
        # (about one a second) are still among the 100 Spark keeps when it ends.
        "spark.sql.streaming.noDataProgressEventInterval": "0",
    })


def source(spark: Any, url: str, basin: str, *, stream: str | None = None,
           prefix: str | None = None, latest: bool = False) -> Any:
    r = (spark.readStream.format("s2").option("endpoint", url).option("basin", basin)
         .option("includeHeaders", "false"))
    r = r.option("streamPrefix", prefix) if prefix is not None else r.option("stream", stream)
    if latest:
        r = r.option("startingPosition", "latest")
    return r.load()


def _durations(progress: list[dict[str, Any]]) -> str:
    """Sums of the main `durationMs` entries over the query's batches."""
    keys = ("latestOffset", "queryPlanning", "addBatch", "triggerExecution")
    sums = {k: sum(p["durationMs"].get(k, 0) for p in progress) for k in keys}
    return ", ".join(f"{k} {v / 1000:.2f}s" for k, v in sums.items())


def read_once(df: Any, label: str, expected: int, cpu: CpuMeter) -> float:
    """Run an AvailableNow query into noop; return its wall time from `start()` to its end
    (what a user waits for, as the issue measured it). The seconds of its triggers
    (`durationMs.triggerExecution` summed: listing, tails, planning, reading, without the
    query's start-up) are printed too."""
    with tempfile.TemporaryDirectory() as ckpt:
        before = cpu.sample()
        t0 = time.perf_counter()
        q = (df.writeStream.format("noop").option("checkpointLocation", ckpt)
             .trigger(availableNow=True).start())
        q.awaitTermination()
        wall = time.perf_counter() - t0
        spent = cpu.since(before)
        progress = q.recentProgress
        log = offset_log(ckpt)
    rows = sum(p["numInputRows"] for p in progress)
    assert rows == expected, f"{label}: read {rows} rows, expected {expected}"
    batches = sum(1 for p in progress if p["numInputRows"])
    busy = sum(p["durationMs"].get("triggerExecution", 0) for p in progress) / 1000
    print(f"  {label}: {rows:,} rows in {busy:.2f}s of triggers, {wall:.2f}s wall incl. "
          f"start-up ({batches} batch(es); {_durations(progress)}); CPU s: {cpu.format(spent)}")
    print(f"    offset log: {_kb(log)}")
    return wall


def best_of(repeat: int, runs: dict[str, Callable[[], float]]) -> dict[str, float]:
    """The least seconds of each run over `repeat` rounds, alternating their order."""
    best = dict.fromkeys(runs, float("inf"))
    order = list(runs)
    for i in range(repeat):
        for label in order if i % 2 == 0 else order[::-1]:
            best[label] = min(best[label], runs[label]())
    return best


def bench_read(spark: Any, client: S2Client, url: str, tag: str, n: int, r: int,
               args: argparse.Namespace, cpu: CpuMeter) -> float:
    """AvailableNow reads of n streams of r records against one stream of n*r, queried
    at `url` (through the delay proxy with --rtt-ms); see the top."""
    basin = f"bench-many-r{n}-{tag}"
    many = names("s-", n)
    took = create_streams(client, basin, many, r, args.workers)
    print(f"read, {n:,} streams x {r:,} records: created and filled in {took:.1f}s "
          f"({n / took:,.0f} streams/s)")
    took = fill(client.config.endpoint, basin, "single", n * r, RECORD)  # not via a proxy
    print(f"  one stream of {n * r:,} records filled in {took:.1f}s")
    best = best_of(args.repeat, {
        "many": lambda: read_once(source(spark, url, basin, prefix="s-"),
                                  f"{n:,} streams (streamPrefix)", n * r, cpu),
        "single": lambda: read_once(source(spark, url, basin, stream="single"),
                                    "one stream", n * r, cpu),
    })
    ratio = best["single"] / best["many"]
    print(f"read at {n:,} streams: {best['many']:.2f}s, one stream {best['single']:.2f}s "
          f"-> {ratio:.2f}x single")
    return ratio


def bench_write(spark: Any, client: S2Client, url: str, tag: str, n: int, r: int,
                args: argparse.Namespace, cpu: CpuMeter) -> float:
    """Routed batch writes that create their streams (`createStreams`), each run to new
    ones, against the same rows to one new stream; see the top."""
    basin = f"bench-many-w{n}-{tag}"
    client.ensure_basin(basin)
    print(f"write, {n * r:,} rows to {n:,} new streams")
    rows = n * r
    runs = itertools.count()

    def frame(total: int, streams: int, prefix: str) -> Any:
        width = len(str(streams - 1))  # as `names` pads them
        return spark.range(total, numPartitions=2).selectExpr(
            f"CAST(lpad(CAST(id AS STRING), {RECORD}, 'x') AS BINARY) AS body",
            f"concat('{prefix}', lpad(CAST(id % {streams} AS STRING), {width}, '0')) AS stream",
        )

    def write(label: str, total: int, streams: int, *, single: bool = False,
              by_stream: bool = False) -> float:
        prefix = f"w{next(runs)}-"
        df = frame(total, streams, prefix)
        if by_stream:  # each stream's rows in one task, in a replayable order
            df = df.repartition(2, "stream").sortWithinPartitions("stream", "body")
        writer = (df.write.format("s2").option("endpoint", url).option("basin", basin)
                  .option("createStreams", "true").mode("append"))
        if single:
            writer = writer.option("stream", f"{prefix}single")
        before = cpu.sample()
        t0 = time.perf_counter()
        writer.save()
        wall = time.perf_counter() - t0
        print(f"  {label}: {total:,} rows in {wall:.2f}s; CPU s: {cpu.format(cpu.since(before))}")
        if not single:
            # Each stream holds its rows and one fence per task that wrote it, at least.
            landed = tails(client, basin, names(prefix, streams))
            assert landed >= total + streams, f"{label}: only {landed} records landed"
        return wall

    # Warm-up (Python workers load the writer): a small write of each kind, not measured.
    write("warm-up, routed", min(rows, 1000), min(n, 10))
    write("warm-up, one stream", min(rows, 1000), 1, single=True)
    best = best_of(args.repeat, {
        "many": lambda: write(f"{n:,} streams (stream column)", rows, n),
        "single": lambda: write("one stream (option stream)", rows, n, single=True),
        "by_stream": lambda: write(f"{n:,} streams, repartition('stream')", rows, n,
                                   by_stream=True),
    })
    ratio = best["single"] / best["many"]
    print(f"write to {n:,} streams: {best['many']:.2f}s, one stream {best['single']:.2f}s "
          f"-> {ratio:.2f}x single; after repartition('stream') {best['by_stream']:.2f}s "
          f"-> {best['single'] / best['by_stream']:.2f}x single")
    return ratio


def random_appender(client: S2Client, basin: str,
                    streams: Sequence[str]) -> Callable[[int], object]:
    """Appends a record whose body is the given stamp to a random one of `streams`."""
    targets = [client.basin(basin).stream(s) for s in streams]
    rng = random.Random(7)
    return lambda ns: rng.choice(targets).append([AppendRecord(str(ns).encode())])


class ProgressLog(StreamingQueryListener):
    """Each progress of one query as it is made: (epoch seconds, input rows, durationMs).
    Polling `recentProgress` instead parses every kept progress again on each call, and
    each holds three offsets of every stream (about 0.5 MB at 10,000 streams)."""

    def __init__(self) -> None:
        self.query_id: str | None = None
        self.events: list[tuple[float, int, dict[str, int]]] = []
        self.idle: list[float] = []  # when idle triggers were reported

    def onQueryStarted(self, event: Any) -> None:
        pass

    def onQueryProgress(self, event: Any) -> None:
        p = event.progress
        if str(p.id) == self.query_id:
            self.events.append((_epoch(p.timestamp), p.numInputRows, dict(p.durationMs)))

    def onQueryIdle(self, event: Any) -> None:
        self.idle.append(time.time())

    def onQueryTerminated(self, event: Any) -> None:
        pass


@dataclass
class Followed:
    latest_offset_ms: float  # median durationMs.latestOffset of idle triggers
    triggers: int  # idle triggers in the window
    requests_per_s: float  # requests reaching the server, per second and per stream (nan:
    # the server has no request counts)
    p50: float
    p99: float
    offset_log: list[int]  # bytes of each offset-log entry
    memory: dict[str, tuple[float, float]]  # side -> MiB resident (now, peak), while idle


def _epoch(timestamp: str) -> float:
    return datetime.fromisoformat(timestamp.replace("Z", "+00:00")).timestamp()


def follow(spark: Any, server: S2Server, basin: str, streams: Sequence[str], df: Any,
           label: str, args: argparse.Namespace, cpu: CpuMeter) -> Followed:
    """Run `df` (column `ns`) into foreachBatch: idle window, then appends; see the top."""
    latencies: list[float] = []
    seen = [0]
    started = [0]  # stamps from this time (ns) on count; 0: none yet

    def sink(batch: Any, _batch_id: int) -> None:
        stamps = [row.ns for row in batch.select("ns").collect()]
        now = time.time_ns()
        seen[0] += len(stamps)
        if started[0]:
            latencies.extend((now - ns) / 1e6 for ns in stamps if ns >= started[0])

    progress = ProgressLog()
    spark.streams.addListener(progress)
    with tempfile.TemporaryDirectory() as ckpt:
        q = df.writeStream.foreachBatch(sink).option("checkpointLocation", ckpt).start()
        progress.query_id = str(q.id)
        try:
            deadline = time.monotonic() + 600
            while not progress.events:
                if q.exception() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"{label}: the query did not start: {q.exception()}")
                time.sleep(0.2)
            time.sleep(args.settle)
            before = server.request_counts(timeout=STATS_TIMEOUT)
            t0, cpu0 = time.time(), cpu.sample()
            time.sleep(args.window)
            after, t1, spent = (server.request_counts(timeout=STATS_TIMEOUT), time.time(),
                                cpu.since(cpu0))
            memory = resident()
            if q.exception() is not None:
                raise RuntimeError(f"{label}: the query failed: {q.exception()}")
            # Idle triggers raise no progress event (Spark tells listeners the query is
            # idle instead), but their progress is kept: read once, at the window's end.
            idle = [p["durationMs"]["latestOffset"] for p in q.recentProgress
                    if t0 <= _epoch(p["timestamp"]) <= t1 and not p["numInputRows"]
                    and "latestOffset" in p["durationMs"]]
            latest = statistics.median(idle) if idle else float("nan")
            if before is None or after is None:
                per_stream, requests = float("nan"), f"requests {server.no_counts}"
            else:
                delta = {k: v - before.get(k, 0) for k, v in after.items()
                         if v != before.get(k, 0)}
                total = sum(delta.values())
                per_stream = total / (t1 - t0) / len(streams)
                requests = f"{total} requests ({per_stream:.3f}/s per stream): {delta}"
            print(f"{label}, idle {t1 - t0:.1f}s: {len(idle)} triggers, latestOffset median "
                  f"{latest:.0f} ms; {requests}; CPU s: {cpu.format(spent)}")
            print(f"  {label}, memory while idle: {_mib(memory)}")

            with S2Client(S2Config(endpoint=server.url)) as client:
                producer = Producer(random_appender(client, basin, streams), None,
                                    args.interval / 1000)
                started[0] = time.time_ns() + int(args.warmup * 1e9)
                producer.start()
                time.sleep(args.warmup + args.duration)
                producer.stop()
            deadline = time.monotonic() + 10
            while seen[0] < producer.sent and time.monotonic() < deadline:
                time.sleep(0.1)  # let the last records arrive, so the tail counts too
            if q.exception() is not None:
                raise RuntimeError(f"{label}: the query failed: {q.exception()}")
        finally:
            q.stop()
            spark.streams.removeListener(progress)
        log = offset_log(ckpt)
    busy = [d for _, rows, d in progress.events if rows]
    stamps = sorted(w for w, rows, _ in progress.events if rows)
    gaps = [b - a for a, b in itertools.pairwise(stamps)]
    print(f"  idle reports {len(progress.idle)}; gaps between batches: median "
          f"{statistics.median(gaps) if gaps else 0:.3f}s max {max(gaps, default=0):.3f}s")
    keys = ("latestOffset", "walCommit", "queryPlanning", "addBatch", "commitOffsets",
            "triggerExecution")
    medians = {k: statistics.median(d.get(k, 0) for d in busy) for k in keys} if busy else {}
    print(f"  {producer.sent} records appended, {seen[0]} seen; {len(busy)} batches, median "
          f"ms: {medians}")
    print(f"  offset log: {_kb(log)}")
    p50, p99 = report(f"{label}, append-to-visible", latencies)
    return Followed(latest, len(idle), per_stream, p50, p99, log, memory)


def bench_idle(spark: Any, client: S2Client, server: S2Server, tag: str, n: int,
               args: argparse.Namespace, cpu: CpuMeter) -> tuple[Followed, Followed]:
    basin = f"bench-many-idle-{tag}"
    many = names("i-", n)
    took = create_streams(client, basin, [*many, "single"], 0, args.workers)
    print(f"idle: {n + 1:,} empty streams created in {took:.1f}s")
    url = server.url
    ours = follow(spark, server, basin, many,
                  source(spark, url, basin, prefix="i-", latest=True).selectExpr(STAMP),
                  f"{n:,} streams", args, cpu)
    single = follow(spark, server, basin, ["single"],
                    source(spark, url, basin, stream="single", latest=True).selectExpr(STAMP),
                    "one stream", args, cpu)
    print(f"idle latestOffset median: {ours.latest_offset_ms:.0f} ms at {n:,} streams, "
          f"{single.latest_offset_ms:.0f} ms at one; requests/s per stream "
          f"{_n(ours.requests_per_s, 3)} vs {_n(single.requests_per_s, 3)}")
    print(f"append-to-visible p50 {ours.p50:.0f} ms vs {single.p50:.0f} ms one stream "
          f"({ours.p50 / single.p50:.2f}x), p99 {ours.p99:.0f} ms vs {single.p99:.0f} ms "
          f"({ours.p99 / single.p99:.2f}x)")
    print(f"offset-log entry at {n:,} streams: median "
          f"{statistics.median(ours.offset_log or [0]) / 1024:,.1f} KB "
          f"(one stream {statistics.median(single.offset_log or [0]) / 1024:,.1f} KB); "
          f"idle at {n:,} streams: {_mib(ours.memory)}")
    return ours, single


def _n(x: float, digits: int = 2) -> str:
    """A figure, or `n/a` for NaN (not measured)."""
    return "n/a" if x != x else f"{x:.{digits}f}"


def leave_open_files_to_the_server() -> None:
    """Lower this process's open-files limits (and so Spark's, started after) by
    `SERVER_FILES`, leaving them to the server started before: on one host with one
    limit, a tail watch keeping a connection of its own per stream up to its hard limit
    less 1024 left the server, which needs a file for each of those and for every other
    client, too few (it failed to accept at 25,000 idle streams). A service elsewhere
    has its own."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard > 2 * SERVER_FILES:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(soft, hard - SERVER_FILES),
                                                    hard - SERVER_FILES))
        print(f"open files: {hard - SERVER_FILES:,} for Spark's side, {hard:,} the server's")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--streams", type=_ints, default=[1000, 10000],
                    help="read cases: streams (comma-separated); the first is also the write's")
    ap.add_argument("--records", type=_ints, default=[100, 10],
                    help="records per stream of each read case (comma-separated)")
    ap.add_argument("--idle-streams", type=int, default=1000)
    ap.add_argument("--repeat", type=int, default=2, help="runs of each read/write (best counts)")
    ap.add_argument("--settle", type=float, default=5.0,
                    help="seconds the idle query runs before its window")
    ap.add_argument("--window", type=float, default=max(10.0, WATCH_WAIT),
                    help="seconds of the idle window (default: 10, or the tail watch's "
                         "long-poll wait if longer, so each stream's poll is counted once)")
    ap.add_argument("--duration", type=float, default=10.0, help="seconds of appends measured")
    ap.add_argument("--warmup", type=float, default=2.0,
                    help="seconds of appends before those measured")
    ap.add_argument("--interval", type=float, default=50.0, help="ms between appends")
    ap.add_argument("--workers", type=int, default=16, help="requests at a time when filling")
    ap.add_argument("--no-warmup", action="store_true",
                    help="leave out the unmeasured warm-up reads (a smoke run's figures are "
                         "then start-up's)")
    ap.add_argument("--skip", type=lambda s: set(s.split(",")), default=set(),
                    help=f"parts to leave out, comma-separated: {','.join(PARTS)}")
    ap.add_argument("--rtt-ms", type=float, default=0.0,
                    help="round trip the reads and writes see: their queries reach the server "
                         "through s2_spark.testing.DelayProxy (filling and checks do not)")
    add_pin_option(ap)
    add_server_option(ap)
    args = ap.parse_args(argv)
    if len(args.streams) != len(args.records):
        ap.error("--streams and --records need as many values each")
    if args.skip - set(PARTS):
        ap.error(f"--skip takes {','.join(PARTS)}")
    sys.stdout.reconfigure(line_buffering=True)  # type: ignore[union-attr]
    placement = placed(args)

    tag = uuid.uuid4().hex[:8]
    reads: list[float] = []
    writes: list[float] = []
    idle: tuple[Followed, Followed] | None = None
    with (s2_server(args, placement) as server,
          S2Client(S2Config(endpoint=server.url)) as client, contextlib.ExitStack() as stack):
        leave_open_files_to_the_server()
        spark = session()
        cpu = CpuMeter(server=server.pid, here="this process (driver, proxy, producer)")
        url = server.url
        if args.rtt_ms:
            url = stack.enter_context(DelayProxy(server.url, rtt_ms=args.rtt_ms)).url
            print(f"reads and writes through a proxy adding {args.rtt_ms:g} ms of round trip")
        if "read" not in args.skip and not args.no_warmup:
            # Warm up Python workers and the JVM on small reads of each kind.
            basin = f"bench-many-warm-{tag}"
            create_streams(client, basin, names("s-", 10), 10, args.workers)
            fill(server.url, basin, "single", 100, RECORD)
            read_once(source(spark, url, basin, prefix="s-"), "warm-up, 10 streams", 100, cpu)
            read_once(source(spark, url, basin, stream="single"), "warm-up, one stream", 100,
                      cpu)
        for n, r in zip(args.streams, args.records, strict=True):
            if "read" not in args.skip:
                reads.append(bench_read(spark, client, url, tag, n, r, args, cpu))
            if "write" not in args.skip:
                writes.append(bench_write(spark, client, url, tag, n, r, args, cpu))
        if "idle" not in args.skip:
            idle = bench_idle(spark, client, server, tag, args.idle_streams, args, cpu)
    stop_session(spark)

    def each(ratios: list[float]) -> str:
        return ", ".join(f"{_n(x)}x single at {n}x{r}" for x, n, r in
                         zip(ratios, args.streams, args.records, strict=False)) or "n/a"

    q = "n/a" if idle is None else _n(idle[0].requests_per_s, 3)
    x = float("nan") if idle is None else idle[0].p50 / idle[1].p50
    rtt = f" ({args.rtt_ms:g} ms round trip)" if args.rtt_ms else ""
    print(f"many_streams{rtt}: read {each(reads)}; write {each(writes)}; idle {q} req/s per "
          f"stream, p50 {_n(x)}x single ({server.mode})")


if __name__ == "__main__":
    main()
