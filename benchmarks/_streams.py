"""Filling an S2 stream with benchmark records, shared by the Spark read benchmarks."""

from __future__ import annotations

import os
import time

from s2_spark.s2 import AppendRecord, S2Client, S2Config


def fill(url: str, basin: str, stream: str, n: int, size: int,
         timestamp_base: int | None = None) -> float:
    """Create `stream` (and `basin` if new) and append `n` records of `size` random bytes (record i
    stamped `timestamp_base + i` ms when given); return the seconds the appends took."""
    body = os.urandom(size)
    with S2Client(S2Config(endpoint=url)) as client:
        client.ensure_basin(basin)
        client.basin(basin).create_stream(stream)
        s = client.basin(basin).stream(stream)
        t0 = time.perf_counter()
        chunk = 100_000
        for start in range(0, n, chunk):
            stamps = range(start, min(n, start + chunk))
            s.append_many([
                AppendRecord(body, timestamp=None if timestamp_base is None else timestamp_base + i)
                for i in stamps
            ])
        elapsed = time.perf_counter() - t0
        assert s.check_tail().seq_num == n
    return elapsed
