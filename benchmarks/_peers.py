"""Peers the benchmarks measure against, shared so every benchmark runs them the same way."""

from __future__ import annotations

import asyncio
import os
import time


def random_bodies(n: int, size: int) -> list[bytes]:
    """n random record bodies of `size` bytes (incompressible, like real payloads)."""
    blob = os.urandom(n * size)
    return [blob[i * size : (i + 1) * size] for i in range(n)]


def sdk_producer(url: str, basin: str, stream: str, bodies: list[bytes]) -> float:
    """Seconds s2-sdk's producer takes to append `bodies`, every one acknowledged."""
    from s2_sdk import S2, Endpoints, Record

    records = [Record(body=b) for b in bodies]

    async def run() -> float:
        async with S2("unused", endpoints=Endpoints(url, url)) as s2:
            st = s2.basin(basin).stream(stream)
            t0 = time.perf_counter()
            async with st.producer() as producer:
                tickets = [await producer.submit(r) for r in records]
            acks = [await t for t in tickets]
            elapsed = time.perf_counter() - t0
            assert len(acks) == len(records)
            return elapsed

    return asyncio.run(run())
