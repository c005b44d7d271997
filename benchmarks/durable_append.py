"""Append 200k JSON messages of ~100 B to the reference server.

Compares s2_spark.durable's IdempotentProducer (messages batched into ~1 MiB requests, each
with Producer-Id/Epoch/Seq so retries are exactly-once) with the append path of the
`durable-streams` package from PyPI (`DurableStream.append`, whose batching merges the
appends of concurrent callers into one request; driven by 64 threads, since one caller
gets one request per message), in the same run. The peer sends fewer messages (it is
~100x slower) and the rates are compared. Both results are read back and counted. By
default the server runs on a CPU of its own and each writer's CPU seconds (this process,
the server) are printed (`_pinning`; `--no-pin` for the old behaviour). Ends with one line:
`durable_append: <msgs/s> msgs/s, <ratio>x durable-streams (PyPI) (<pinned|unpinned>)`.
"""

from __future__ import annotations

import argparse
import json
import threading
import time
import uuid

from _durable import DurableServer, messages, require_peer
from _pinning import CpuMeter, add_pin_option, placed

from s2_spark.durable import DurableStreamsClient, IdempotentProducer


def ours(client: DurableStreamsClient, path: str, texts: list[str]) -> float:
    s = client.stream(path)
    s.create("application/json")
    t0 = time.perf_counter()
    producer = IdempotentProducer(s, "bench")
    for text in texts:
        producer.append_raw(text)
    producer.flush()
    return time.perf_counter() - t0


def peer(url: str, values: list[object], threads: int) -> float:
    from durable_streams import DurableStream

    handle = DurableStream.create(url, content_type="application/json")
    share = [values[i::threads] for i in range(threads)]

    def work(part: list[object]) -> None:
        for value in part:
            handle.append(value)

    workers = [threading.Thread(target=work, args=(p,)) for p in share]
    t0 = time.perf_counter()
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    return time.perf_counter() - t0


def count(client: DurableStreamsClient, path: str) -> int:
    return sum(c.batch().num_rows for c in client.stream(path).read("-1"))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--messages", type=int, default=200_000)
    parser.add_argument("--threads", type=int, default=64, help="peer's concurrent callers")
    parser.add_argument(
        "--peer-messages",
        type=int,
        default=20_000,
        help="the peer sends at most this many (it takes ~0.5 ms a message); rates compare",
    )
    parser.add_argument("--rounds", type=int, default=2, help="best of N for each writer")
    add_pin_option(parser)
    args = parser.parse_args(argv)
    require_peer()
    placement = placed(args)
    n = args.messages
    texts = messages(n)
    n_peer = min(n, args.peer_messages)
    values = [json.loads(t) for t in texts[:n_peer]]
    best: dict[str, float] = {}
    with DurableServer(long_poll_timeout=1.0) as server:
        placement.pin_server(server.pid)
        cpu = CpuMeter(server=server.pid)
        client = DurableStreamsClient(base_url=server.url)
        for _ in range(args.rounds):
            path = f"/ours-{uuid.uuid4().hex[:8]}"
            with cpu.printed(f"ours, {n} messages"):
                seconds = ours(client, path, texts)
            assert count(client, path) == n
            best["ours"] = min(best.get("ours", seconds), seconds)
            path = f"/peer-{uuid.uuid4().hex[:8]}"
            with cpu.printed(f"peer, {n_peer} messages"):
                seconds = peer(server.url + path, values, args.threads)
            assert count(client, path) == n_peer
            best["peer"] = min(best.get("peer", seconds), seconds)
        client.close()
    rate = {"ours": n / best["ours"], "peer": n_peer / best["peer"]}
    for name, sent in (("ours", n), ("peer", n_peer)):
        print(f"{name:5s} {sent} messages in {best[name]:.3f}s  {rate[name]:,.0f} msgs/s")
    print(
        f"durable_append: {rate['ours']:,.0f} msgs/s, {rate['ours'] / rate['peer']:.2f}x "
        f"durable-streams (PyPI) ({placement.mode})"
    )


if __name__ == "__main__":
    main()
