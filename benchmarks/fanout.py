"""A streaming fan-out: a stream per user, written from every task of every micro-batch.

The query a user runs to split one stream of events into a stream per user, against the
same query into one stream, measured in the same run (one server process, the local
server or another, `--server`; `local[2]`):

* source: one stream of `--events` events of 100 B; event i belongs to user
  (i * 7919) % users, so each micro-batch holds events of nearly every user;
* query: `readStream.format("s2")` with `minPartitions=--partitions` and
  `maxRecordsPerTrigger=--rows-per-batch`, `trigger(availableNow=True)`, routed by a
  `stream` column `u/<user>` into `writeStream.format("s2")` with `createStreams=true`
  (a new target basin per run, so micro-batch 0 creates the streams; the rest is the
  steady state); with `--repartition`, `repartition(partitions, "stream")` first (each
  user's events in one task);
* peer: the same query into one stream (option `stream`, which overrides the column);
* `--restart`: each query, from a source of its own, is then started again from its
  checkpoint for one micro-batch more, as after a deploy or a driver's failure: a new run
  of the query, whose tasks take every stream over (read its marks back, then append
  conditioned on its tail).

Printed per `--users` value: rows/s of each and the ratio (fan-out / one stream, higher is
better), micro-batch seconds (`durationMs.triggerExecution`) p50/p99 of the steady state
(micro-batches after the first) and of the first, and from the local server's counters
(`GET /_local/stats`; n/a with s2-lite, which has none) the appends that landed and were
refused (412) per stream and micro-batch, the create requests per stream, and appends per
(task, stream) that had events: the (micro-batch, partition, user) triples of the source
layout, or (micro-batch, user) pairs after --repartition.
The queries alternate over `--repeat` rounds; the best run counts. `--rtt-ms`: the
queries reach the server through `s2_spark.testing.DelayProxy`. The server runs on a CPU
of its own and everything else on the others (`_pinning`; `--no-pin`: all on all), and
each run prints the CPU seconds of each side (JVM, Python workers, server, driver), and
each users value the server's CPU a micro-batch and an append in the steady state, and its
share of the micro-batch p50 (near 100%: the server bounds the query). Ends with
`fanout (<shape>): <r>x one stream at <U> users (<s> s a micro-batch, <a> appends per task
and stream[, <s> s a restart's micro-batch]), ...`.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass
from typing import Any

from _pinning import CpuMeter, add_pin_option, placed  # benchmarks/ is on sys.path
from _servers import S2Server, add_server_option, s2_server
from _spark import local_session, stop_session
from pyspark.sql import functions as F

from s2_spark.s2 import AppendRecord, S2Client, S2Config
from s2_spark.testing import DelayProxy

RECORD = 100
PRIME = 7919


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def user_of(i: int, users: int) -> int:
    return (i * PRIME) % users


def fill_events(client: S2Client, basin: str, events: int, users: int, first: int = 0
                ) -> None:
    """One stream `events` of `events` records: "<user>:<i>" padded to RECORD bytes (from
    event `first` on: appended to the stream made before)."""
    if not first:
        client.ensure_basin(basin)
        client.basin(basin).create_stream("events")
    stream = client.basin(basin).stream("events")
    chunk = 50_000
    for start in range(first, first + events, chunk):
        stream.append_many([
            AppendRecord(f"{user_of(i, users):05d}:{i}".encode().ljust(RECORD, b"."))
            for i in range(start, min(first + events, start + chunk))])


def task_stream_pairs(events: int, users: int, per_batch: int, partitions: int,
                      by_stream: bool) -> int:
    """(micro-batch, task, stream) triples with events: the reader splits each micro-batch
    range into `partitions` contiguous parts; after --repartition each user is one task's."""
    pairs = set()
    for i in range(events):
        batch, at = divmod(i, per_batch)
        size = min(per_batch, events - batch * per_batch)
        part = 0 if by_stream else at * partitions // size
        pairs.add((batch, part, user_of(i, users)))
    return len(pairs)


@dataclass
class Run:
    """One query run: wall seconds, micro-batch seconds, the server's append counts, and
    the CPU seconds of each side (`CpuMeter`)."""

    seconds: float
    batches: list[float]
    landed: int | None  # None: the server has no such counts
    refused: int | None
    creates: int | None
    cpu: dict[str, float]
    # The server's CPU seconds after the first micro-batch, and the micro-batches they
    # served (None: the query ended before the first was seen).
    steady_server: tuple[float, int] | None = None
    # --restart: the restarted query's one micro-batch (seconds) and its CPU seconds.
    restart: tuple[float, dict[str, float]] | None = None

    def rows_per_s(self, rows: int) -> float:
        return rows / self.seconds


def run_query(spark: Any, server: S2Server, cpu: CpuMeter, url: str, src: str | None,
              args: argparse.Namespace, users: int, *, single: bool) -> Run:
    """The fan-out (or, `single`, the same into one stream) from basin `src` (None: one of
    its own, filled here) into a new basin, to the end; with --restart, then once more
    from its checkpoint (after more events: `src` is then None)."""
    dst = f"fan-dst-{uuid.uuid4().hex[:10]}"
    with S2Client(S2Config(endpoint=server.url)) as client:
        client.create_basin(dst)
        if src is None:
            src = f"fan-src-{users}-{uuid.uuid4().hex[:8]}"
            fill_events(client, src, args.events, users)
    df = (spark.readStream.format("s2").option("endpoint", url).option("basin", src)
          .option("stream", "events").option("includeHeaders", "false")
          .option("minPartitions", str(args.partitions))
          .option("maxRecordsPerTrigger", str(args.rows_per_batch)).load())
    routed = df.select(
        F.concat(F.lit("u/"), F.substring(F.col("body").cast("string"), 1, 5)).alias("stream"),
        "body")
    if args.repartition and not single:
        routed = routed.repartition(args.partitions, "stream")
    before, requests_before = server.append_counts(), server.request_counts()
    cpu_before = cpu.sample()
    with tempfile.TemporaryDirectory() as ckpt:
        w = (routed.writeStream.format("s2").option("endpoint", url).option("basin", dst)
             .option("createStreams", "true").option("checkpointLocation", ckpt)
             .trigger(availableNow=True))
        if single:
            w = w.option("stream", "one")
        seconds, progress, after_first = _ran(w, cpu)
        spent = cpu.since(cpu_before)
        after, requests_after = server.append_counts(), server.request_counts()
        steady = None
        if after_first is not None and len(progress) > 1:
            steady = (cpu.since(after_first).get("server", 0.0), len(progress) - 1)
        restart = _restarted(w, server, cpu, src, args, users) if args.restart else None
    rows = sum(p["numInputRows"] for p in progress)
    assert rows == args.events, f"read {rows} rows, expected {args.events}"
    return Run(seconds, [p["durationMs"]["triggerExecution"] / 1000 for p in progress],
               _grew(before, after, "landed"), _grew(before, after, "refused"),
               _grew(requests_before, requests_after, "create_stream"), spent, steady, restart)


def _restarted(w: Any, server: S2Server, cpu: CpuMeter, src: str, args: argparse.Namespace,
               users: int) -> tuple[float, dict[str, float]]:
    """A micro-batch more of events, read by the query started again from its checkpoint
    (a new run of it, which takes every stream over): that micro-batch's seconds, and the
    CPU of each side over the restart."""
    with S2Client(S2Config(endpoint=server.url)) as client:
        fill_events(client, src, args.rows_per_batch, users, first=args.events)
    before = cpu.sample()
    _, progress, _ = _ran(w, cpu)
    assert [p["numInputRows"] for p in progress] == [args.rows_per_batch], progress
    return progress[0]["durationMs"]["triggerExecution"] / 1000, cpu.since(before)


def _ran(w: Any, cpu: CpuMeter) -> tuple[float, list[dict[str, Any]], Any]:
    """The query of writer `w` started and run to its end: its seconds, the progress of
    its micro-batches that had rows, and a CPU sample from its first micro-batch's end
    (`_after_first_batch`)."""
    t0 = time.perf_counter()
    q = w.start()
    after_first = _after_first_batch(q, cpu)
    q.awaitTermination()
    seconds = time.perf_counter() - t0
    if q.exception() is not None:
        raise RuntimeError(str(q.exception()))
    return seconds, [p for p in q.recentProgress if p["numInputRows"]], after_first


def _after_first_batch(q: Any, cpu: CpuMeter) -> Any:
    """A CPU sample taken as soon as the query reports its first micro-batch (polled every
    50 ms), so the steady state's server CPU can be told apart from micro-batch 0's stream
    creations; None if the query ended first."""
    while q.isActive:
        if q.lastProgress is not None:
            return cpu.sample()
        time.sleep(0.05)
    return None


def _grew(before: dict[str, int] | None, after: dict[str, int] | None, key: str) -> int | None:
    """How much a counter of the server grew (None: the server has no such counts, as
    s2-lite, or a local server of a release without append counts)."""
    if before is None or after is None:
        return None
    return after.get(key, 0) - before.get(key, 0)


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


def bench(spark: Any, server: S2Server, cpu: CpuMeter, url: str, users: int,
          args: argparse.Namespace) -> tuple[float, float, float | None, float | None]:
    """(ratio, steady micro-batch p50 s, appends per task and stream, the restarted
    query's micro-batch s) for `users`."""
    src = None  # with --restart, each run fills a source of its own
    if not args.restart:
        src = f"fan-src-{users}-{uuid.uuid4().hex[:8]}"
        with S2Client(S2Config(endpoint=server.url)) as client:
            fill_events(client, src, args.events, users)
    best: dict[str, Run] = {}
    for k in range(args.repeat):
        for single in ((False, True) if k % 2 == 0 else (True, False)):
            label = "one stream" if single else f"{users:,} user streams"
            r = run_query(spark, server, cpu, url, src, args, users, single=single)
            steady = r.batches[1:] or r.batches
            print(f"  {label}: {args.events:,} rows in {r.seconds:.2f}s "
                  f"({r.rows_per_s(args.events):,.0f} rows/s); micro-batch p50 "
                  f"{statistics.median(steady):.2f}s p99 {pct(steady, 0.99):.2f}s (steady), "
                  f"first {r.batches[0]:.2f}s; {_counted(r, server)}\n"
                  f"    CPU s: {cpu.format(r.cpu)}")
            key = "single" if single else "many"
            if key not in best or r.seconds < best[key].seconds:
                best[key] = r
    many, single = best["many"], best["single"]
    ratio = single.seconds / many.seconds
    batches = len(many.batches)
    pairs = task_stream_pairs(args.events, users, args.rows_per_batch, args.partitions,
                              args.repartition)
    steady = statistics.median(many.batches[1:] or many.batches)
    per_pair: float | None = None
    if many.landed is None or many.refused is None or many.creates is None:
        counted = f"appends and create requests per stream {server.no_counts}"
    else:
        per_pair = (many.landed + many.refused) / pairs
        counted = (f"per stream and micro-batch {many.landed / (users * batches):.2f} appends "
                   f"landed, {many.refused / (users * batches):.3f} refused; "
                   f"{many.creates / users:.2f} create requests per stream; per (task, stream) "
                   f"with events {per_pair:.3f} appends ({pairs:,} such)")
    print(f"fan-out to {users:,} users: {many.seconds:.2f}s against {single.seconds:.2f}s into "
          f"one stream -> {ratio:.2f}x; micro-batch p50 {steady:.2f}s p99 "
          f"{pct(many.batches[1:] or many.batches, 0.99):.2f}s; {counted}")
    print(f"  server in the steady state: {_server_share(many, pairs, batches)}; one stream: "
          f"{_server_share(single, None, 0)}")
    if many.restart is not None and single.restart is not None:
        print(f"  restarted from the checkpoint, a micro-batch taking every stream over: "
              f"{many.restart[0]:.2f}s ({many.restart[0] / steady:.2f}x the steady p50; "
              f"CPU s: {cpu.format(many.restart[1])}); into one stream {single.restart[0]:.2f}s"
              f" -> {single.restart[0] / many.restart[0]:.2f}x")
    return ratio, steady, per_pair, many.restart[0] if many.restart is not None else None


def _server_share(r: Run, appends: int | None, batches: int) -> str:
    """The server's CPU a steady micro-batch and (given) an append (of `appends` over
    `batches` micro-batches, the first's included, one per (task, stream) with events),
    and its share of the steady micro-batch p50: near 100%, the server is the bound."""
    if r.steady_server is None or not r.steady_server[1]:
        return "n/a (one micro-batch)"
    spent, steady_batches = r.steady_server
    per_batch = spent / steady_batches
    each = "" if appends is None else f" ({per_batch / (appends / batches) * 1e6:.0f} us an append)"
    p50 = statistics.median(r.batches[1:])
    return (f"{per_batch:.2f}s of CPU a micro-batch{each}, {per_batch / p50:.0%} of the "
            "micro-batch p50")


def _counted(r: Run, server: S2Server) -> str:
    if r.landed is None or r.refused is None or r.creates is None:
        return f"appends and create requests {server.no_counts}"
    return (f"appends {r.landed:,} landed, {r.refused:,} refused; {r.creates:,} create "
            "requests")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--users", type=_ints, default=[1000, 10000],
                    help="streams to fan out to (comma-separated cases)")
    ap.add_argument("--events", type=int, default=200_000)
    ap.add_argument("--rows-per-batch", type=int, default=20_000)
    ap.add_argument("--partitions", type=int, default=2,
                    help="minPartitions of the read (and partitions after --repartition)")
    ap.add_argument("--repartition", action="store_true",
                    help="repartition by stream before writing")
    ap.add_argument("--restart", action="store_true",
                    help="each query then started again from its checkpoint, a micro-batch "
                         "more (every stream taken over by the new run)")
    ap.add_argument("--rtt-ms", type=float, default=0.0,
                    help="round trip the queries see (s2_spark.testing.DelayProxy)")
    ap.add_argument("--repeat", type=int, default=1, help="runs of each query (best counts)")
    ap.add_argument("--warmup-events", type=int, default=2000,
                    help="events of the unmeasured warm-up fan-out (0: none)")
    ap.add_argument("--http-stack", default="auto", choices=["auto", "granian", "hypercorn"],
                    help="the local server's HTTP stack (see docs/local-server.md; "
                         "--server local only)")
    add_pin_option(ap)
    add_server_option(ap)
    args = ap.parse_args(argv)
    if args.http_stack != "auto" and args.server != "local":
        ap.error(f"--http-stack is the local server's: it does not apply to --server "
                 f"{args.server}")
    sys.stdout.reconfigure(line_buffering=True)  # type: ignore[union-attr]
    placement = placed(args)  # before Spark starts
    spark = local_session("s2-spark-bench-fanout", {"spark.sql.shuffle.partitions": "2"})
    out = []
    with s2_server(args, placement, stack=args.http_stack) as server, \
            contextlib.ExitStack() as stack:
        cpu = CpuMeter(server=server.pid, here="this process (driver)")
        url = server.url
        if args.rtt_ms:
            url = stack.enter_context(DelayProxy(server.url, rtt_ms=args.rtt_ms)).url
            print(f"queries through a proxy adding {args.rtt_ms:g} ms of round trip")
        # Warm-up (JVM, Python workers): a small fan-out, not measured.
        if args.warmup_events:
            warm = argparse.Namespace(**{**vars(args), "events": args.warmup_events,
                                         "restart": False,
                                         "rows_per_batch": max(1, args.warmup_events // 2)})
            src = f"fan-warm-{uuid.uuid4().hex[:8]}"
            with S2Client(S2Config(endpoint=server.url)) as client:
                fill_events(client, src, warm.events, 50)
            run_query(spark, server, cpu, url, src, warm, 50, single=False)
        for users in args.users:
            ratio, steady, per_pair, restart = bench(spark, server, cpu, url, users, args)
            appends = "n/a" if per_pair is None else f"{per_pair:.2f}"
            restarted = "" if restart is None else f", {restart:.2f}s a restart's micro-batch"
            out.append(f"{ratio:.2f}x one stream at {users:,} users ({steady:.2f}s a "
                       f"micro-batch, {appends} appends per task and stream{restarted})")
    stop_session(spark)
    shape = (f"{args.events:,} events, {args.rows_per_batch:,} a micro-batch, "
             f"{args.partitions} partitions{', repartitioned' if args.repartition else ''}"
             f"{f', {args.rtt_ms:g} ms round trip' if args.rtt_ms else ''}")
    print(f"fanout ({shape}): {'; '.join(out)} ({server.mode})")


if __name__ == "__main__":
    main()
