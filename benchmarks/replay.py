"""What a replay costs the S2 writer: a partition that landed part of its rows, replayed
in the same order and in another order.

One partition's writer (`StreamSink`, no Spark) of `--rows` rows of 100 B against a server
process (the local server, or another with `--server`). A first attempt lands `--landed`
of them (appends of 998) in two streams and stops; a restarted run (a newer generation)
then replays the partition into each: in the same order (it checks the rows against its
marks' digests and skips them), and in another order (it reads its landed records back and
finds them among its rows by content). In the same run, for scale: writing all the rows
afresh. Printed for each: wall seconds, this process's CPU seconds, the records read back.
The server runs on a CPU of its own (`_pinning`; `--no-pin`: all on all). Ends with one
line: `replay: another order <x>x the same order's client CPU, <us> us of client CPU per
landed row read back, <r> records read (<landed> landed) (<pinned|unpinned>)`.
"""

from __future__ import annotations

import argparse
import random
import time
import uuid
from typing import Any

import pyarrow as pa
from _peers import random_bodies  # benchmarks/ is on sys.path
from _pinning import CpuMeter, add_pin_option, placed
from _servers import add_server_option, s2_server

from s2_spark.backends.s2.sink import SinkSettings, StreamSink, WriterId, query_key
from s2_spark.backends.s2.tokens import run_key
from s2_spark.s2 import S2Client, S2Config

RECORD = 100


class _Stop(Exception):
    pass


def writer(run: str, generation: int) -> WriterId:
    return WriterId(query_key("bench"), True, run_key(run), generation, 1, 0, 0)


def write(basin: Any, stream: str, who: WriterId, rows: list[bytes],
          stop_after: int | None = None) -> Any:
    """`rows` through one writer (in chunks of 10,000, as input batches come); with
    `stop_after`, it stops after that many appends."""
    def stop(sink: StreamSink) -> None:
        if sink.appends == stop_after:
            raise _Stop()

    sink = StreamSink(basin, stream, who, SinkSettings(),
                      after_append=stop if stop_after is not None else None)
    try:
        for k in range(0, len(rows), 10_000):
            sink.add(pa.array(rows[k:k + 10_000], pa.binary()))
        return sink.close()
    except _Stop:
        return None


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=200_000)
    ap.add_argument("--landed", type=int, default=100_000,
                    help="rows the first attempt lands (rounded down to appends of 998)")
    add_pin_option(ap)
    add_server_option(ap)
    args = ap.parse_args(argv)
    placement = placed(args)
    rows = random_bodies(args.rows, RECORD)
    shuffled = list(rows)
    random.Random(1).shuffle(shuffled)
    basin_name = f"bench-{uuid.uuid4().hex[:8]}"
    with s2_server(args, placement) as server:
        cpu = CpuMeter(server=server.pid)
        with S2Client(S2Config(endpoint=server.url)) as client:
            client.create_basin(basin_name)
            basin = client.basin(basin_name)
            reads = _count_reads()
            results: dict[str, tuple[float, float, int]] = {}
            for name in ("fresh", "same", "other"):
                basin.create_stream(name)
            for name in ("same", "other"):
                write(basin, name, writer("run-1", 1000), rows, args.landed // 998)
            landed = basin.stream("same").check_tail().seq_num - 2 * (args.landed // 998)
            for name, who, order in [("fresh", writer("run-0", 500), rows),
                                     ("same", writer("run-2", 2000), rows),
                                     ("other", writer("run-2", 2000), shuffled)]:
                before, read_before = cpu.sample(), reads[0]
                t0 = time.perf_counter()
                result = write(basin, name, who, order)
                wall = time.perf_counter() - t0
                spent = cpu.since(before)
                results[name] = (wall, spent["this process"], reads[0] - read_before)
                print(f"  {name}: {wall:.2f}s, CPU s {cpu.format(spent)}, "
                      f"{reads[0] - read_before:,} records read; skipped {result.skipped:,}, "
                      f"appended {result.appended:,}")
            for name in ("same", "other"):
                got = sorted(_bodies(basin, name))
                assert got == sorted(rows), f"{name}: not every row exactly once"
    same, other = results["same"], results["other"]
    print(f"writing {args.rows:,} rows afresh: {results['fresh'][0]:.2f}s; replays after "
          f"{landed:,} landed: same order {same[0]:.2f}s, another order {other[0]:.2f}s")
    per_row = (other[1] - same[1]) / landed * 1e6
    # CPU seconds come in clock ticks (10 ms): a small run's same-order replay may read 0.
    ratio = f"{other[1] / same[1]:.2f}x" if same[1] else "n/a (too little to measure)"
    print(f"replay: another order {ratio} the same order's client CPU, "
          f"{per_row:.2f} us of client CPU per landed row read back, {other[2]:,} records "
          f"read ({landed:,} landed) ({server.mode})")


def _count_reads() -> list[int]:
    """Records returned by `StreamClient.read` from now on (a one-item list)."""
    from s2_spark.s2._stream import StreamClient

    count = [0]
    real = StreamClient.read

    def counted(self: StreamClient, **kw: Any) -> Any:
        decoded = real(self, **kw)
        count[0] += decoded.count
        return decoded

    StreamClient.read = counted  # type: ignore[method-assign]
    return count


def _bodies(basin: Any, name: str) -> list[bytes]:
    stream = basin.stream(name)
    tail, pos, out = stream.check_tail().seq_num, 0, []
    while pos < tail:
        d = stream.read(seq_num=pos, count=1000, include_command_records=False)
        out += d.batch.column("body").to_pylist()
        pos = int(d.last_seq_num) + 1
    return out


if __name__ == "__main__":
    main()
