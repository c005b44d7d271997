"""Client CPU per many-stream request against the server's CPU per request, same run.

The calls a stream per user makes by the thousand, each a request per stream sent
together through the client's fan-out (`s2_spark.s2._many`), over `--streams` streams:

* tail: `check_tails` (GET .../records/tail, JSON answer), what a plan does per stream;
* read: `read_many` of one 100 B record per stream (protobuf ReadBatch to Arrow);
* append: `append_each` of one pre-encoded 100 B record per stream (protobuf AppendInput,
  AppendAck), at most 64 in flight, as the writer sends them;
* create: `create_streams` (once per run: the streams of the round after exist);
* bodies: `append_bodies`, the same appends as whole AppendInput bodies, their acks read
  in one C call into ints (how a writer sends its first appends to many streams; where
  the tree has it).

CPU seconds of this process (the caller and the fan-out's loop thread) and of the server
(`CpuMeter`) over each call, per request; best of `--repeat` rounds by client CPU. Ratio:
client CPU per request / the server's (lower is better; issue 54's goal is at most 20 us a
request, below s2-lite's own cost per append). By default the server runs on a CPU of its
own (`_pinning`). Ends with:
`bulk_requests: tail <c> us, read <c> us, append <c> us[, bodies <c> us] a request; tail
<r>x server, read <r>x server, append <r>x server (<pinned|unpinned>[, s2-lite])`.
"""

from __future__ import annotations

import argparse
import time
import uuid
from collections.abc import Callable

from _pinning import CpuMeter, add_pin_option, placed  # benchmarks/ is on sys.path
from _servers import add_server_option, s2_server

from s2_spark.s2 import AppendRecord, S2Client, S2Config
from s2_spark.s2._encode import encode_append_records
from s2_spark.s2._many import (
    SingleAppend,
    SmallRead,
    append_each,
    check_tails,
    create_streams,
    read_many,
)

try:  # the writer's first appends in bulk, where this tree has them
    from s2_spark.s2._many import append_bodies as bulk_appends
except ImportError:
    bulk_appends = None

RECORD = 100
IN_FLIGHT = 64  # the writer's appends at a time


def measured(cpu: CpuMeter, n: int, fn: Callable[[], object]) -> tuple[float, float, float]:
    """(client us, server us) per request over one call of `fn`, and its wall seconds."""
    before = cpu.sample()
    t0 = time.perf_counter()
    fn()
    wall = time.perf_counter() - t0
    spent = cpu.since(before)
    return (spent.get("this process", 0.0) / n * 1e6, spent.get("server", 0.0) / n * 1e6,
            wall)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--streams", type=int, default=10000, help="streams (requests per call)")
    ap.add_argument("--repeat", type=int, default=3, help="rounds (the best counts)")
    add_pin_option(ap)
    add_server_option(ap)
    args = ap.parse_args(argv)
    placement = placed(args)
    n = args.streams
    names = [f"user-{i:06d}" for i in range(n)]
    with s2_server(args, placement) as server, \
            S2Client(S2Config(endpoint=server.url)) as client:
        cpu = CpuMeter(server=server.pid)
        basin = f"bench-bulk-{uuid.uuid4().hex[:8]}"
        client.create_basin(basin)
        many = client.basin(basin)._basin()
        batch = encode_append_records([AppendRecord(b"y" * RECORD)])[0]
        appends = [SingleAppend(name, batch) for name in names]
        reads = [SmallRead(name, 0, 1) for name in names]
        calls: dict[str, Callable[[], object]] = {
            "tail": lambda: check_tails(many, names),
            "read": lambda: read_many(many, reads, include_command_records=False,
                                      include_headers=True),
            "append": lambda: append_each(many, appends, in_flight=IN_FLIGHT),
        }
        if bulk_appends is not None:  # whole bodies, acks read into ints (not before)
            bodies, sizes = [batch.to_append_input()] * n, [0] * n
            calls["bodies"] = lambda: bulk_appends(many, names, bodies, sizes,
                                                   in_flight=IN_FLIGHT)
        best: dict[str, tuple[float, float, float]] = {}
        best["create"] = measured(cpu, n, lambda: create_streams(many, names))
        append_each(many, appends, in_flight=IN_FLIGHT)  # a record for the reads
        check_tails(many, names)  # warm
        for _ in range(args.repeat):
            for kind, fn in calls.items():
                got = measured(cpu, n, fn)
                if kind not in best or got[0] < best[kind][0]:
                    best[kind] = got
        for kind, (c, s, wall) in best.items():
            ratio = f"{c / s:.2f}x server" if s else "server n/a"
            print(f"  {kind:6s} {n} streams: client {c:6.1f} us/request, server "
                  f"{s:6.1f} us/request ({ratio}), {wall:.2f} s")
    kinds = ("tail", "read", "append")
    client = ", ".join(f"{k} {best[k][0]:.1f} us" for k in (*kinds, "bodies") if k in best)
    ratios = (", ".join(f"{k} {best[k][0] / best[k][1]:.2f}x server" for k in kinds)
              if all(best[k][1] for k in kinds) else "server CPU n/a")
    print(f"bulk_requests: {client} a request; {ratios} ({server.mode})")

if __name__ == "__main__":
    main()
