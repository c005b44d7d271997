"""Catch-up read of 1M records of 100 B from a server process into Arrow (`--server`).

Compares s2_spark's S2S read session (httpx, frames -> Arrow) with s2-sdk's read_session
on the same stream in the same run, and measures the server's ceiling with a client that
only counts the response bytes. By default the server runs on a CPU of its own and each
reader's CPU seconds (this process, the server) are printed (`_pinning`; `--no-pin` for the
old behaviour). Ends with one line:
`read_session: <records/s> records/s, <ratio>x s2-sdk (<pinned|unpinned>)`.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import time
import uuid

import httpx
import pyarrow as pa
from _pinning import CpuMeter, add_pin_option, placed
from _servers import add_server_option, s2_server

from s2_spark.s2 import S2Client, S2Config
from s2_spark.wire.appends import encode_append_batches

RECORD = 100


def fill(client: S2Client, basin: str, stream: str, n: int) -> float:
    """Append n records of RECORD random (incompressible) bytes, from Arrow columns."""
    s = client.basin(basin).stream(stream)
    t0 = time.perf_counter()
    step = 100_000
    for start in range(0, n, step):
        k = min(n, start + step) - start
        blob = os.urandom(k * RECORD)
        col = pa.array([blob[i * RECORD : (i + 1) * RECORD] for i in range(k)], pa.binary())
        s.append_batches(encode_append_batches(col))
    return time.perf_counter() - t0


def ceiling(url: str, basin: str, stream: str, n: int, encoding: str) -> tuple[float, int]:
    """Raw S2S bytes per second: no frame parsing, no decoding."""
    headers = {"s2-basin": basin, "content-type": "s2s/proto", "accept": "s2s/proto"}
    headers["accept-encoding"] = encoding or "identity"
    total = 0
    t0 = time.perf_counter()
    with (
        httpx.Client(timeout=60) as http,
        http.stream(
            "GET",
            f"{url}/v1/streams/{stream}/records",
            params={"seq_num": 0, "count": n},
            headers=headers,
        ) as resp,
    ):
        for chunk in resp.iter_raw():
            total += len(chunk)
    return time.perf_counter() - t0, total


def ours(client: S2Client, basin: str, stream: str, n: int) -> float:
    s = client.basin(basin).stream(stream)
    t0 = time.perf_counter()
    rows = 0
    last = -1
    for batch in s.read_session(seq_num=0, count=n):
        rows += batch.batch.num_rows
        last = batch.last_seq_num if batch.last_seq_num is not None else last
    elapsed = time.perf_counter() - t0
    assert rows == n and last == n - 1, (rows, last)
    return elapsed


def sdk(url: str, basin: str, stream: str, n: int) -> float:
    from s2_sdk import S2, Endpoints, ReadLimit, SeqNum

    async def run() -> float:
        async with S2("unused", endpoints=Endpoints(url, url)) as s2:
            st = s2.basin(basin).stream(stream)
            t0 = time.perf_counter()
            rows = 0
            async for batch in st.read_session(start=SeqNum(0), limit=ReadLimit(count=n)):
                rows += len(batch.records)
            elapsed = time.perf_counter() - t0
            assert rows == n, rows
            return elapsed

    return asyncio.run(run())


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--records", type=int, default=1_000_000)
    add_pin_option(ap)
    add_server_option(ap)
    args = ap.parse_args(argv)
    n = args.records
    placement = placed(args)
    basin, stream = f"bench-{uuid.uuid4().hex[:8]}", "catchup"
    with s2_server(args, placement, heartbeat_interval=5.0) as server:
        cpu = CpuMeter(server=server.pid)
        zstd = S2Config(endpoint=server.url, request_timeout=120, compression="zstd")
        with S2Client(zstd) as client:
            client.create_basin(basin)
            client.basin(basin).create_stream(stream)
            fill_s = fill(client, basin, stream, n)
            print(f"filled {n} records of {RECORD} B in {fill_s:.1f}s")
            for enc in ("", "zstd"):
                secs, total = ceiling(server.url, basin, stream, n, enc)
                print(
                    f"server ceiling ({enc or 'uncompressed'}): {n / secs:,.0f} records/s, "
                    f"{total / secs / 1e6:.1f} MB/s on the wire ({secs:.2f}s)"
                )
            with cpu.printed("s2_spark read_session, zstd, 2 reads"):
                zstd_s = min(ours(client, basin, stream, n) for _ in range(2))
            print(
                f"s2_spark read_session -> Arrow, zstd: {n / zstd_s:,.0f} records/s ({zstd_s:.2f}s)"
            )
        plain = S2Config(endpoint=server.url, request_timeout=120, compression="none")
        with S2Client(plain) as client:
            with cpu.printed("s2_spark read_session, uncompressed, 2 reads"):
                ours_s = min(ours(client, basin, stream, n) for _ in range(2))
            print(
                f"s2_spark read_session -> Arrow, uncompressed: {n / ours_s:,.0f} records/s "
                f"({ours_s:.2f}s)"
            )
        with cpu.printed("s2-sdk read_session"):
            sdk_s = sdk(server.url, basin, stream, n)
        print(f"s2-sdk read_session: {n / sdk_s:,.0f} records/s ({sdk_s:.2f}s)")
    print(f"read_session: {n / ours_s:.0f} records/s, {sdk_s / ours_s:.2f}x s2-sdk "
          f"({server.mode})")


if __name__ == "__main__":
    main()
