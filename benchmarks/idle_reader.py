"""The streaming reader alone (no Spark) over many idle streams: its memory, its CPU a plan,
the requests it makes and how soon it plans a record appended to any stream.

What Spark's driver-side runner does with the `s2` streaming reader, without Spark: a
reader over `--streams` empty streams (`streamPrefix`, `startingPosition=latest`, one
server process: the local server, or another with `--server`), planned again and again
(`latestOffset` from the last end, 10 ms apart when a plan found nothing: Spark's polling
delay). After `--settle` s, for `--window` s: the plans made, the reader's CPU seconds a
plan (this process: the plans and the tail watch's thread; nothing else runs here), the
server's, the requests that reach the server per stream and second (the local server's
counters; from s2-lite, those the reader sent), and this process's resident memory
against before the reader started (per stream). Then one record every `--interval` ms
to a random stream for `--duration` s: from each append's acknowledgement to the end of
the plan that took it (p50, p99, max).

The server runs on a CPU of its own and this process on the others (`_pinning`;
`--no-pin`: all on all), with 1,024 open files left to the server (as in
`many_streams.py`). `--tracemalloc` adds the 15 places that hold most of what the
reader allocated (slow: take it apart from the CPU figures). Ends with
`idle_reader: <N> streams, <m> MiB (<k> KB a stream), <c> ms of CPU a plan, <q> req/s per
stream, planned p99 <p> s (<pinned|unpinned>)`.
"""

from __future__ import annotations

import argparse
import gc
import random
import sys
import threading
import time
import tracemalloc
import uuid
from typing import Any

from _pinning import add_pin_option, cpu_seconds, placed
from _sent import Sent
from _servers import add_server_option, s2_server
from many_streams import create_streams, leave_open_files_to_the_server, names

from s2_spark.s2 import AppendRecord, S2Client, S2Config
from s2_spark.spark._compat import HAS_ADMISSION_CONTROL
from s2_spark.spark.s2.source import S2DataSource

#: Spark's `spark.sql.streaming.pollingDelay`: how long it waits after a trigger that
#: found no data before the next.
POLLING_DELAY = 0.01


def _rss_mib() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def _plan(reader: Any, start: dict[str, Any]) -> dict[str, Any]:
    if HAS_ADMISSION_CONTROL:
        from pyspark.sql.streaming.datasource import ReadAllAvailable

        return reader.latestOffset(start, ReadAllAvailable())  # type: ignore[no-any-return]
    return reader.latestOffset()  # type: ignore[no-any-return]


class Planning:
    """Plans in a thread of its own, as Spark's runner would: each end noted with when
    the plan that made it returned."""

    def __init__(self, reader: Any, start: dict[str, Any]) -> None:
        self.reader = reader
        self.start = start
        self.plans = 0
        self.seconds: list[float] = []  # each plan's duration
        self.planned: dict[str, float] = {}  # stream -> when a plan first moved it
        self.error: BaseException | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        from s2_spark._offset_codec import decode_offset

        try:
            while not self._stop.is_set():
                t0 = time.monotonic()
                end = _plan(self.reader, self.start)
                now = time.monotonic()
                self.plans += 1
                self.seconds.append(now - t0)
                if end == self.start:
                    time.sleep(POLLING_DELAY)
                    continue
                before, after = decode_offset(self.start), decode_offset(end)
                for stream, pos in after.items():
                    if before.get(stream) != pos:
                        self.planned.setdefault(stream, now)
                self.reader.partitions(self.start, end)  # what Spark asks next
                self.start = end
        except BaseException as exc:
            self.error = exc

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()
        if self.error is not None:
            raise self.error


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--streams", type=int, default=100_000)
    ap.add_argument("--settle", type=float, default=90.0,
                    help="seconds of plans before the window (the watch's polls go out)")
    ap.add_argument("--window", type=float, default=60.0)
    ap.add_argument("--duration", type=float, default=20.0, help="seconds of appends")
    ap.add_argument("--interval", type=float, default=200.0, help="ms between appends")
    ap.add_argument("--tracemalloc", action="store_true")
    add_pin_option(ap)
    add_server_option(ap)
    args = ap.parse_args(argv)
    sys.stdout.reconfigure(line_buffering=True)  # type: ignore[union-attr]
    placement = placed(args)
    with s2_server(args, placement) as server, \
            S2Client(S2Config(endpoint=server.url)) as client:
        leave_open_files_to_the_server()
        basin = f"idle-reader-{uuid.uuid4().hex[:8]}"
        streams = names("i-", args.streams)
        took = create_streams(client, basin, streams, 0, 16)
        print(f"{args.streams:,} empty streams created in {took:.1f}s")
        options = {"endpoint": server.url, "basin": basin, "streamPrefix": "i-",
                   "startingPosition": "latest"}
        sent = Sent.requests()  # for a server without request counts
        gc.collect()
        rss0 = _rss_mib()
        if args.tracemalloc:
            tracemalloc.start(8)
        reader = S2DataSource(options).streamReader(None)  # type: ignore[arg-type]
        cpu0 = time.process_time()
        start = reader.initialOffset()
        print(f"initialOffset: {time.process_time() - cpu0:.2f}s of CPU, {_rss_mib():,.0f} MiB")
        planning = Planning(reader, start)
        try:
            time.sleep(args.settle)
            counts0, plans0 = server.request_counts(timeout=120), planning.plans
            sent0 = sent.count
            mine0, srv0, t0 = time.process_time(), cpu_seconds(server.pid), time.monotonic()
            first = len(planning.seconds)
            time.sleep(args.window)
            counts1, plans1 = server.request_counts(timeout=120), planning.plans
            sent1 = sent.count
            mine, srv = time.process_time() - mine0, cpu_seconds(server.pid) - srv0
            span = time.monotonic() - t0
            rss = _rss_mib()
            plans = plans1 - plans0
            took_s = planning.seconds[first:]
            if counts0 is None or counts1 is None:
                n = sent1 - sent0
                per_stream = f"{n / span / args.streams:.4f}"
                requests = (f"{n:,} sent by the reader ({per_stream}/s per stream; "
                            f"{server.name} has no request counts)")
            else:
                delta = {k: v - counts0.get(k, 0) for k, v in counts1.items()
                         if v != counts0.get(k, 0)}
                per_stream = f"{sum(delta.values()) / span / args.streams:.4f}"
                requests = f"{delta} ({per_stream}/s per stream)"
            server_cpu = "n/a (not started here)" if server.pid is None else f"{srv:.2f}"
            print(f"idle {span:.0f}s: {plans} plans (median {pct(took_s, 0.5):.2f}s, "
                  f"max {max(took_s, default=float('nan')):.2f}s); CPU s: reader {mine:.2f} "
                  f"({1000 * mine / max(plans, 1):.1f} ms a plan), server {server_cpu}; "
                  f"requests {requests}")
            print(f"memory: {rss:,.0f} MiB resident, {rss - rss0:,.0f} MiB over the "
                  f"{rss0:,.0f} before the reader "
                  f"({1024 * (rss - rss0) / args.streams:.2f} KB a stream)")
            if args.tracemalloc:
                snap = tracemalloc.take_snapshot()
                tracemalloc.stop()
                for stat in snap.statistics("lineno")[:15]:
                    print(f"  {stat.size / 2**20:8.1f} MiB {stat.count:9,}  {stat.traceback[0]}")
            # Appends to random streams: acknowledged -> planned.
            rng = random.Random(7)
            acked: dict[str, float] = {}
            basin_client = client.basin(basin)
            t_end = time.monotonic() + args.duration
            while time.monotonic() < t_end:
                stream = rng.choice(streams)
                if stream not in acked:
                    basin_client.stream(stream).append([AppendRecord(b"x")])
                    acked[stream] = time.monotonic()
                time.sleep(args.interval / 1000)
            deadline = time.monotonic() + 30
            while (not set(acked) <= planning.planned.keys()
                   and time.monotonic() < deadline):
                time.sleep(0.05)
        finally:
            planning.stop()
            reader.stop()
            sent.stop()
        lat = [planning.planned[s] - t for s, t in acked.items() if s in planning.planned]
        missed = len(acked) - len(lat)
        print(f"{len(acked)} records appended, {len(lat)} planned ({missed} not in 30 s): "
              f"append-to-planned p50 {pct(lat, 0.5):.3f}s p99 {pct(lat, 0.99):.3f}s "
              f"max {max(lat, default=float('nan')):.3f}s")
    print(f"idle_reader: {args.streams:,} streams, {rss:,.0f} MiB "
          f"({1024 * (rss - rss0) / args.streams:.2f} KB a stream), "
          f"{1000 * mine / max(plans, 1):.1f} ms of CPU a plan, {per_stream} req/s per "
          f"stream, planned p99 {pct(lat, 0.99):.2f}s ({server.mode})")


if __name__ == "__main__":
    main()
