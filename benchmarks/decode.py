"""Read decode throughput: S2S frames -> Arrow, against s2-sdk's own decoding of the same bytes.

Ours: `FrameDecoder.feed` over 64 KiB network-sized chunks, then `decode_read_batch` per
message (one Arrow record batch each). s2-sdk: the path its read sessions run per message
(`read_messages` deframing and decompression, `ReadBatch.ParseFromString`,
`read_batch_from_proto` into `SequencedRecord` objects), on exactly the same bytes.
Best of several runs, one core. MB/s counts decompressed protobuf payload bytes.

Run: python benchmarks/decode.py [--records N --big-records M --budget S]
(last line: `decode: N records/s, Rx s2-sdk`)
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
from collections.abc import AsyncIterator, Callable

import s2_sdk._generated.s2.v1.s2_pb2 as sdk_pb
from s2_sdk._mappers import read_batch_from_proto
from s2_sdk._s2s._protocol import read_messages

from s2_spark._proto import s2_pb2
from s2_spark.wire import records
from s2_spark.wire.frames import Compression, FrameDecoder, Message, encode_message
from s2_spark.wire.records import decode_read_batch

CHUNK = 64 * 1024
MAX_BATCH_BYTES = 1024 * 1024
BUDGET_S = 1.5  # per measurement, roughly


def make_body(i: int, size: int) -> bytes:
    """Half-compressible bodies: a JSON-ish prefix plus pseudo-random bytes."""
    head = b'{"id":%d,"kind":"event","payload":"' % i
    rand = os.urandom(size // 2)
    filler = b"abcdefgh" * size
    return (head + rand + filler)[:size]


def make_frames(body_size: int, n_records: int, compression: Compression) -> tuple[bytes, int]:
    """S2S frames of ReadBatch messages (<= 1000 records, <= 1 MiB metered each)."""
    per_batch = min(1000, MAX_BATCH_BYTES // (body_size + 8))
    out = bytearray()
    payload_bytes = 0
    seq = 1_000_000
    ts = 1_700_000_000_000
    while seq - 1_000_000 < n_records:
        n = min(per_batch, n_records - (seq - 1_000_000))
        msg = s2_pb2.ReadBatch(
            records=[
                s2_pb2.SequencedRecord(
                    seq_num=seq + k, timestamp=ts + k, body=make_body(seq + k, body_size)
                )
                for k in range(n)
            ]
        )
        data = msg.SerializeToString()
        payload_bytes += len(data)
        out += encode_message(data, compression)
        seq += n
        ts += n
    return bytes(out), payload_bytes


def chunks(data: bytes) -> list[bytes]:
    return [data[i : i + CHUNK] for i in range(0, len(data), CHUNK)]


def ours(parts: list[bytes]) -> int:
    decoder = FrameDecoder()
    n = 0
    for part in parts:
        for frame in decoder.feed(part):
            assert isinstance(frame, Message)
            n += decode_read_batch(frame.body, "bench-stream").batch.num_rows
    decoder.finish()
    return n


def sdk(parts: list[bytes]) -> int:
    async def stream() -> AsyncIterator[bytes]:
        for part in parts:
            yield part

    async def run() -> int:
        n = 0
        async for message in read_messages(stream()):
            proto = sdk_pb.ReadBatch()
            proto.ParseFromString(message.body)
            n += len(read_batch_from_proto(proto).records)
        return n

    return asyncio.run(run())


def best_rate(fn: Callable[[list[bytes]], int], parts: list[bytes], expect: int,
              budget: float = BUDGET_S) -> float:
    """Best records/s over repeated runs within the time budget (at least 2 runs)."""
    best = float("inf")
    runs = 0
    start = time.perf_counter()
    while runs < 2 or (time.perf_counter() - start < budget and runs < 20):
        t0 = time.perf_counter()
        got = fn(parts)
        best = min(best, time.perf_counter() - t0)
        assert got == expect, (got, expect)
        runs += 1
    return expect / best


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--records", type=int, default=200_000, help="records of 100 B a case")
    ap.add_argument("--big-records", type=int, default=4_000, help="records of 16 KiB a case")
    ap.add_argument("--budget", type=float, default=BUDGET_S,
                    help="seconds of runs a measurement, about (at least 2 runs)")
    args = ap.parse_args(argv)
    cases = [
        (100, args.records, Compression.NONE),
        (100, args.records, Compression.ZSTD),
        (16 * 1024, args.big_records, Compression.NONE),
        (16 * 1024, args.big_records, Compression.ZSTD),
    ]
    print(f"decoder implementation: {records.IMPLEMENTATION}; python {sys.version.split()[0]}")
    header = (
        f"{'body':>6} {'compr':>5} {'records':>8} | {'ours rec/s':>12} {'ours MB/s':>10} | "
        f"{'s2-sdk rec/s':>12} {'s2-sdk MB/s':>11} | {'ratio':>6}"
    )
    print(header)
    print("-" * len(header))
    headline: tuple[float, float] | None = None
    for body_size, n, compression in cases:
        frames, payload_bytes = make_frames(body_size, n, compression)
        parts = chunks(frames)
        mine = best_rate(ours, parts, n, args.budget)
        theirs = best_rate(sdk, parts, n, args.budget)
        mb = payload_bytes / n / 1e6
        ratio = mine / theirs
        print(
            f"{body_size:>6} {compression.name.lower():>5} {n:>8} | {mine:>12,.0f} "
            f"{mine * mb:>10,.1f} | {theirs:>12,.0f} {theirs * mb:>11,.1f} | {ratio:>5.1f}x"
        )
        if body_size == 100 and compression is Compression.NONE:
            headline = (mine, ratio)
    assert headline is not None
    print(f"decode: {headline[0]:.0f} records/s, {headline[1]:.1f}x s2-sdk")


if __name__ == "__main__":
    main()
