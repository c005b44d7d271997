"""Append throughput of 100 B records to an S2 server process (`--server`; the local one).

s2_spark's `append_many` (S2S append sessions over httpx, half-duplex) against s2-sdk's
producer on the same server in the same run; also prints one-unary-request-per-batch
and the Arrow path the Spark writer uses. By default the server runs on a CPU of its own
and each writer's CPU seconds (this process, the server) are printed (`_pinning`;
`--no-pin` for the old behaviour; `--server`: which server, `_servers`). Ends with one line:
`append: <records/s> records/s, <ratio>x s2-sdk (<pinned|unpinned>)`.
"""

from __future__ import annotations

import argparse
import time
import uuid

import pyarrow as pa
from _peers import random_bodies, sdk_producer  # benchmarks/ is on sys.path
from _pinning import CpuMeter, add_pin_option, placed
from _servers import add_server_option, s2_server

from s2_spark.s2 import AppendRecord, S2Client, S2Config
from s2_spark.wire.appends import encode_append_batches

RECORD = 100


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--records", type=int, default=500_000)
    add_pin_option(ap)
    add_server_option(ap)
    args = ap.parse_args(argv)
    n = args.records
    placement = placed(args)
    data = random_bodies(n, RECORD)
    basin = f"bench-{uuid.uuid4().hex[:8]}"
    with s2_server(args, placement) as server:
        cpu = CpuMeter(server=server.pid)
        with S2Client(S2Config(endpoint=server.url, compression="none")) as client:
            client.create_basin(basin)
            b = client.basin(basin)
            for name in ("many", "unary", "arrow", "sdk"):
                b.create_stream(name)

            records = [AppendRecord(x) for x in data]
            with cpu.printed("append_many"):
                t0 = time.perf_counter()
                ack = b.stream("many").append_many(records)
                ours = time.perf_counter() - t0
            assert ack.end.seq_num == n and b.stream("many").check_tail().seq_num == n
            print(f"s2_spark append_many (S2S sessions): {n / ours:,.0f} records/s ({ours:.2f}s)")

            unary_n = min(n, 200_000)
            from s2_spark.s2._encode import encode_append_records

            t0 = time.perf_counter()
            s = b.stream("unary")
            for batch in encode_append_records(records[:unary_n]):
                s.append_payload(batch)
            unary = time.perf_counter() - t0
            print(
                f"s2_spark unary append per batch, sequential: {unary_n / unary:,.0f} "
                f"records/s ({unary:.2f}s for {unary_n})"
            )

            t0 = time.perf_counter()
            batches = encode_append_batches(pa.array(data, pa.binary()))
            b.stream("arrow").append_batches(batches)
            arrow = time.perf_counter() - t0
            print(
                f"s2_spark Arrow column -> append_batches: {n / arrow:,.0f} records/s "
                f"({arrow:.2f}s)"
            )

        with cpu.printed("s2-sdk producer"):
            sdk = sdk_producer(server.url, basin, "sdk", data)
        print(f"s2-sdk producer: {n / sdk:,.0f} records/s ({sdk:.2f}s)")
    print(f"append: {n / ours:.0f} records/s, {sdk / ours:.2f}x s2-sdk ({server.mode})")


if __name__ == "__main__":
    main()
