"""The S2 sink's client CPU per written row, outside Spark: what a Spark task's write costs.

One `PartitionWriter` (the S2 sink's task-side writer, as `writer.py`'s `write_batches`
drives it) takes `--rows` 100 B rows in Arrow batches of `--batch` rows (Spark's
`spark.sql.execution.arrow.maxRecordsPerBatch`, 10,000 by default) and writes them
exactly-once to a local server process (`--server`), into one stream and, in another run,
routed by a stream column to `--streams` streams. The server runs on a CPU of its own by
default (`_pinning`); this process's CPU (user + system) per row is the figure: the
worker's cost of a written row. Each shape runs `--repeat` times, each time as a new
query run (a takeover of the stream, as a new micro-batch of a new run pays; with
`--same-run`, the next micro-batch of one run: a fan-out's steady state); the median is
printed, beside the server's CPU for the same rows (the named peer: what the service
spends on what the client sends). `--profile FILE` writes a cProfile of one extra run of
the first shape. Ends with one line: `sink_rows: <ns> ns a row into one stream (<r>x the
server's CPU), <ns> ns a row into several (<k>) streams (<r>x the server's), <rows/s>
rows/s into one stream, <rows/s> rows/s into several (<pinned|unpinned>)`.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import time
import uuid

import numpy as np
import pyarrow as pa
from _pinning import CpuMeter, add_pin_option, placed  # benchmarks/ is on sys.path
from _servers import add_server_option, s2_server

from s2_spark.backends.s2.sink import PartitionWriter, SinkSettings, WriterId, query_key
from s2_spark.backends.s2.tokens import run_key
from s2_spark.s2 import BasinClient, S2Client, S2Config

RECORD = 100


def input_batches(rows: int, per_batch: int, streams: int) -> list[pa.RecordBatch]:
    """`rows` random 100 B bodies in batches of `per_batch`, with a stream column that
    deals the rows round-robin to `streams` streams (`s0`, `s1`, ...)."""
    blob = os.urandom(rows * RECORD)
    offsets = pa.array(np.arange(0, (rows + 1) * RECORD, RECORD, dtype=np.int32))
    bodies = pa.BinaryArray.from_buffers(pa.binary(), rows, [None, offsets.buffers()[1],
                                                             pa.py_buffer(blob)])
    names = pa.array([f"s{i}" for i in range(streams)], pa.string()).take(
        pa.array(np.arange(rows) % streams))
    table = pa.table({"body": bodies, "stream": names})
    batches: list[pa.RecordBatch] = table.to_batches(max_chunksize=per_batch)
    return batches


#: `--same-run`: the run every write belongs to (each write its next micro-batch).
_SAME_RUN = run_key(f"run-{uuid.uuid4().hex}")


def write(basin: BasinClient, batches: list[pa.RecordBatch], streams: int, run: int,
          settings: SinkSettings, *, same_run: bool = False) -> None:
    """The batches through one task's writer (a new run of the query each time; with
    `same_run`, micro-batch `run` of one run: a streaming query's steady state)."""
    key = _SAME_RUN if same_run else run_key(f"run-{run}-{uuid.uuid4().hex}")
    who = WriterId(query_key("bench"), True, key, int(time.time() * 1000) + run, run, 0, 0)
    writer = PartitionWriter(basin, who, settings)
    for batch in batches:
        writer.add(batch.column(0), None, None, "s0" if streams == 1 else batch.column(1))
    writer.close()


def _per_row(seconds: list[float], rows: int) -> str:
    """The median of `seconds` per row, in ns (n/a: none measured)."""
    return f"{1e9 * statistics.median(seconds) / rows:.0f} ns" if seconds else "n/a"


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--batch", type=int, default=10_000)
    ap.add_argument("--streams", type=int, default=8)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--profile", metavar="FILE")
    ap.add_argument("--flush-records", type=int,
                    help="the writer's flush_records (rows buffered per stream before a "
                         "flush; default: the package's)")
    ap.add_argument("--same-run", action="store_true",
                    help="every write the next micro-batch of one run (no takeover: the "
                         "steady state of a streaming query, as a fan-out's)")
    add_pin_option(ap)
    add_server_option(ap)
    args = ap.parse_args(argv)
    same = {"same_run": args.same_run}
    placement = placed(args)
    shapes = {1: input_batches(args.rows, args.batch, 1),
              args.streams: input_batches(args.rows, args.batch, args.streams)}
    flush = {} if args.flush_records is None else {"flush_records": args.flush_records}
    settings = SinkSettings(create_streams=True, **flush)
    figures: dict[int, tuple[float, float, float]] = {}
    with s2_server(args, placement) as server:
        cpu = CpuMeter(server=server.pid)
        basin_name = f"bench-{uuid.uuid4().hex[:8]}"
        with S2Client(S2Config(endpoint=server.url)) as client:
            client.create_basin(basin_name)
            basin = client.basin(basin_name)
            run = 0
            # warm-up: imports, connections, streams
            write(basin, shapes[1][:5], 1, run, settings, **same)
            write(basin, shapes[args.streams][:5], args.streams, run + 1, settings, **same)
            for streams, batches in shapes.items():
                here, walls, srv, faults = [], [], [], []
                for _ in range(args.repeat):
                    run += 2
                    before = cpu.sample()
                    minflt = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
                    t0 = time.perf_counter()
                    write(basin, batches, streams, run, settings, **same)
                    walls.append(time.perf_counter() - t0)
                    faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - minflt)
                    spent = cpu.since(before)
                    here.append(spent["this process"])
                    if "server" in spent:  # not for a server running elsewhere (a URL)
                        srv.append(spent["server"])
                ns = 1e9 * statistics.median(here) / args.rows
                wall = statistics.median(walls)
                figures[streams] = (ns, args.rows / wall, statistics.median(here)
                                    / statistics.median(srv) if srv else float("nan"))
                print(f"  {streams} stream(s): this process {ns:.0f} ns a row "
                      f"(runs {', '.join(f'{1e9 * t / args.rows:.0f}' for t in here)}), "
                      f"server {_per_row(srv, args.rows)} a row, "
                      f"{1000 * statistics.median(faults) / args.rows:.1f} page faults "
                      "per 1000 rows, "
                      f"{args.rows / wall:,.0f} rows/s", flush=True)
            if args.profile:
                import cProfile

                prof = cProfile.Profile(time.thread_time)  # CPU, not wall
                prof.runcall(write, basin, shapes[1], 1, run + 2, settings, **same)
                prof.dump_stats(args.profile)
                print(f"  profile of one run (one stream) in {args.profile}")
    one, many = figures[1], figures[args.streams]
    print(f"sink_rows: {one[0]:.0f} ns a row into one stream ({_x(one[2])} the server's "
          f"CPU), {many[0]:.0f} ns a row into several ({args.streams}) streams "
          f"({_x(many[2])} the server's), {one[1]:.0f} rows/s into one stream, "
          f"{many[1]:.0f} rows/s into several ({placement.mode})")


def _x(ratio: float) -> str:
    """A ratio, or n/a where the server's CPU was not measured (a server given by URL)."""
    return "n/a" if ratio != ratio else f"{ratio:.2f}x"


if __name__ == "__main__":
    main()
