"""Catch-up read of 1M JSON messages of ~100 B from the reference server into Arrow.

Compares s2_spark.durable (catch-up read, JSON body split into an Arrow string column with
no per-message Python objects) with the `durable-streams` package from PyPI reading the
same stream with `iter_json` (uncompressed like ours, and with its gzip default), in the
same run, and measures the server's ceiling with a client that only counts response bytes.
By default the server runs on a CPU of its own and each reader's CPU seconds (this process,
the server) are printed (`_pinning`; `--no-pin` for the old behaviour). Ends with one line:
`durable_read: <msgs/s> msgs/s, <ratio>x durable-streams (PyPI) (<pinned|unpinned>)`.
"""

from __future__ import annotations

import argparse
import time
import uuid

import httpx
from _durable import DurableServer, messages, require_peer
from _pinning import CpuMeter, add_pin_option, placed

from s2_spark.durable import DurableStreamsClient, IdempotentProducer


def fill(client: DurableStreamsClient, path: str, n: int) -> None:
    s = client.stream(path)
    s.create("application/json")
    producer = IdempotentProducer(s, "bench-fill", max_batch_bytes=4 << 20)
    for text in messages(n):
        producer.append_raw(text)
    producer.flush()


def ceiling(url: str) -> tuple[float, int]:
    """Seconds to receive the whole stream, counting bytes only (no parsing)."""
    total = 0
    offset = "-1"
    t0 = time.perf_counter()
    with httpx.Client(timeout=120, headers={"accept-encoding": "identity"}) as http:
        while True:
            with http.stream("GET", url, params={"offset": offset}) as resp:
                for chunk in resp.iter_raw():
                    total += len(chunk)
            offset = resp.headers["stream-next-offset"]
            if resp.headers.get("stream-up-to-date") == "true":
                break
    return time.perf_counter() - t0, total


def ours(client: DurableStreamsClient, path: str) -> tuple[float, int]:
    rows = 0
    t0 = time.perf_counter()
    for chunk in client.stream(path, content_type="application/json").read("-1"):
        rows += chunk.batch().num_rows
    return time.perf_counter() - t0, rows


def peer(url: str, identity: bool = True) -> tuple[float, int]:
    from durable_streams import stream

    count = 0
    t0 = time.perf_counter()
    # By default the same wire as ours, uncompressed; with its own defaults httpx asks for
    # gzip and the server spends CPU compressing (reported as "peer-gzip").
    headers = {"accept-encoding": "identity"} if identity else None
    with stream(url, offset="-1", live=False, headers=headers) as resp:
        for _ in resp.iter_json():
            count += 1
    return time.perf_counter() - t0, count


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--messages", type=int, default=1_000_000)
    parser.add_argument("--rounds", type=int, default=3, help="best of N for each reader")
    add_pin_option(parser)
    args = parser.parse_args(argv)
    require_peer()
    placement = placed(args)
    n = args.messages
    with DurableServer(long_poll_timeout=1.0) as server:
        placement.pin_server(server.pid)
        cpu = CpuMeter(server=server.pid)
        client = DurableStreamsClient(base_url=server.url)
        path = f"/bench-{uuid.uuid4().hex[:8]}"
        t0 = time.perf_counter()
        fill(client, path, n)
        print(f"filled {n} messages in {time.perf_counter() - t0:.2f}s")
        url = server.url + path
        best: dict[str, float] = {}
        for _ in range(args.rounds):
            for name, run in (
                ("ceiling", lambda: ceiling(url)),
                ("ours", lambda: ours(client, path)),
                ("peer", lambda: peer(url)),
                ("peer-gzip", lambda: peer(url, identity=False)),
            ):
                with cpu.printed(name):
                    seconds, count = run()
                if name != "ceiling":
                    assert count == n, f"{name} read {count} of {n} messages"
                best[name] = min(best.get(name, seconds), seconds)
        client.close()
    for name in ("ceiling", "ours", "peer", "peer-gzip"):
        print(f"{name:9s} {best[name]:.3f}s  {n / best[name]:,.0f} msgs/s")
    print(f"ours vs server ceiling: {best['ceiling'] / best['ours']:.0%}")
    print(f"ours vs peer with its default (gzip): {best['peer-gzip'] / best['ours']:.2f}x")
    print(f"bound on any client vs peer (ceiling/peer): {best['peer'] / best['ceiling']:.2f}x")
    print(
        f"durable_read: {n / best['ours']:,.0f} msgs/s, {best['peer'] / best['ours']:.2f}x "
        f"durable-streams (PyPI) ({placement.mode})"
    )


if __name__ == "__main__":
    main()
