"""Streaming write throughput: `writeStream.format("durable-streams")` of ~100 B JSON messages.

The messages are `_durable.messages()` (JSON objects of ~100 B with poorly compressible
values), written as text files, one line each. A streaming query (source `text`, one file
per micro-batch, which Spark reads as 2 partitions, each appending with its own producer)
writes >= 1M of them exactly-once to one JSON stream on the reference server, after one
warm-up micro-batch; in the same run the
`durable-streams` package from PyPI appends the same messages from one process (its
`DurableStream.append`, driven by 64 threads as in `durable_append.py`; it is much slower,
so it sends the first `--peer-messages` of them and the rates are compared). The Spark
figure is rows / time of the micro-batches after the warm-up (from the query's progress
reports, so JVM start, Python worker start and imports are left out; the all-in figure is
printed too). Both streams are read back and counted. By default the server runs on a
CPU of its own, and the CPU seconds of each side are printed for the query and for the
peer (`_pinning`; `--no-pin` for the old behaviour). Ends with one line:
`durable_spark_write: <rows/s> rows/s, <ratio>x durable-streams (PyPI) (<pinned|unpinned>)`.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
import time
import uuid
from pathlib import Path

from _durable import DurableServer, messages, require_peer  # benchmarks/ is on sys.path
from _pinning import CpuMeter, add_pin_option, placed
from _spark import local_session, stop_session
from durable_append import count, peer

from s2_spark.durable import DurableStreamsClient


def write_files(texts: list[str], per_file: int) -> str:
    """Text files of `per_file` lines each, modification times in order (one per batch)."""
    folder = Path(tempfile.mkdtemp(prefix="ds-write-bench-src-"))
    t0 = time.time() - 10_000
    for k, i in enumerate(range(0, len(texts), per_file)):
        f = folder / f"part-{k:04d}.txt"
        f.write_text("\n".join(texts[i : i + per_file]) + "\n")
        os.utime(f, (t0 + k, t0 + k))
    return str(folder)


def spark_write(url: str, path: str, folder: str, rows: int, per_batch: int, cpu: CpuMeter
                ) -> tuple[float, float, float, int]:
    """Seconds the micro-batches after the first (warm-up) take to write `rows` rows, wall
    seconds of the whole query from start, seconds of the warm-up batch, and partitions
    per micro-batch."""
    spark = local_session("durable-write-bench", {"spark.sql.shuffle.partitions": "2"})
    df = spark.readStream.format("text").option("maxFilesPerTrigger", "1").load(folder)
    ckpt = tempfile.mkdtemp(prefix="ds-write-bench-ckpt-")
    before = cpu.sample()
    t0 = time.perf_counter()
    q = (df.writeStream.format("durable-streams").option("baseUrl", url)
         .option("stream", path).option("checkpointLocation", ckpt)
         .trigger(availableNow=True).start())
    q.awaitTermination(1800)
    wall = time.perf_counter() - t0
    print(f"  CPU s, the whole query: {cpu.format(cpu.since(before))}")
    if q.exception() is not None:
        raise RuntimeError(str(q.exception()))
    progress = q.recentProgress
    batches = [p for p in progress if p["numInputRows"]]
    for p in batches:
        d = p["durationMs"]
        print(f"  batch {p['batchId']}: {p['numInputRows']} rows, "
              f"{d['triggerExecution']} ms (addBatch {d.get('addBatch', 0)} ms)")
    steady = batches[1:]
    written = sum(p["numInputRows"] for p in steady)
    if written < rows:
        raise RuntimeError(f"only {written} rows after the warm-up, wanted {rows}")
    exec_s = sum(p["durationMs"]["triggerExecution"] for p in steady) / 1000.0
    first_s = batches[0]["durationMs"]["triggerExecution"] / 1000.0
    first_file = sorted(Path(folder).iterdir())[0]
    parts = spark.read.format("text").load(str(first_file)).rdd.getNumPartitions()
    stop_session(spark)
    shutil.rmtree(ckpt, ignore_errors=True)
    return exec_s * rows / written, wall, first_s, parts


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--rows", type=int, default=1_000_000, help="rows after the warm-up")
    ap.add_argument("--rows-per-batch", type=int, default=250_000)
    ap.add_argument("--threads", type=int, default=64, help="peer's concurrent callers")
    ap.add_argument("--peer-messages", type=int, default=20_000,
                    help="the peer sends the first N messages (it is much slower)")
    add_pin_option(ap)
    args = ap.parse_args(argv)
    require_peer()
    placement = placed(args)
    n, per_batch = args.rows, args.rows_per_batch
    total = n + per_batch  # the first micro-batch is a warm-up
    texts = messages(total)
    folder = write_files(texts, per_batch)
    with DurableServer(long_poll_timeout=1.0) as server:
        placement.pin_server(server.pid)
        cpu = CpuMeter(server=server.pid, here="this process (driver, peer)")
        client = DurableStreamsClient(base_url=server.url)
        path = f"/spark-{uuid.uuid4().hex[:8]}"
        client.stream(path).create("application/json")
        spark_s, wall, first_s, parts = spark_write(server.url, path, folder, n, per_batch,
                                                     cpu)
        got = count(client, path)
        assert got == total, f"{got} messages in the stream, {total} written"
        print(f"spark writeStream durable-streams: {n / spark_s:,.0f} rows/s over {n} rows "
              f"after a warm-up micro-batch ({spark_s:.2f}s; {parts} partitions per "
              f"micro-batch); warm-up batch {first_s:.1f}s (Python workers start); "
              f"{total / wall:,.0f} rows/s for all {total} rows including query start "
              f"({wall:.1f}s); read back {got} messages")
        n_peer = min(n, args.peer_messages)
        peer_path = f"/peer-{uuid.uuid4().hex[:8]}"
        before = cpu.sample()
        peer_s = peer(server.url + peer_path, [json.loads(t) for t in texts[:n_peer]],
                      args.threads)
        print(f"  CPU s, the peer: {cpu.format(cpu.since(before))}")
        assert count(client, peer_path) == n_peer
        client.close()
    shutil.rmtree(folder, ignore_errors=True)
    ours, theirs = n / spark_s, n_peer / peer_s
    print(f"durable-streams (PyPI) append, {args.threads} threads: {theirs:,.0f} msgs/s "
          f"({n_peer} messages in {peer_s:.2f}s)")
    print(f"durable_spark_write: {ours:.0f} rows/s, {ours / theirs:.2f}x durable-streams (PyPI) "
          f"({placement.mode})")


if __name__ == "__main__":
    main()
