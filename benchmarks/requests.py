"""Client CPU per small request: the connector's own paths against httpx's `Client` and
`http.client` sending the same requests, one connection each, same run.

Three requests the connector makes by the thousand with many streams, against a server
process (`ServerProcess`, or another with `--server`; so its CPU is not counted):

* tail: `StreamClient.check_tail()` (GET .../records/tail, JSON answer);
* read: `StreamClient.read(seq_num=0, count=1)`, one 100 B record (protobuf ReadBatch,
  decoded into an Arrow batch);
* append: `StreamClient.append_chain` of one pre-encoded 100 B record conditioned on the
  stream's fencing token, as the writer appends to a small stream (a unary protobuf
  AppendInput, answered by an AppendAck).

The peers send the same method, path, headers and body, and parse the answer as little
as the operation needs (JSON for the tail, protobuf for the read and the append's ack).
Each is timed by `time.process_time()` over `--requests` requests (after a warm-up),
best of `--repeat` rounds taken in turn. Ratio: connector CPU per request / `http.client`
CPU per request (lower is better; the target is 2x or less). By default the server runs
on a CPU of its own (`_pinning`; `--no-pin` for the old behaviour), and the CPU seconds of
this process and the server over the measured rounds are printed. Ends with:
`requests: tail <t>x http.client, read <r>x, append <a>x (httpx Client <h>x)
(<pinned|unpinned>)`.
"""

from __future__ import annotations

import argparse
import http.client
import json
import time
import uuid
from collections.abc import Callable
from urllib.parse import urlsplit

import httpx
from _pinning import CpuMeter, add_pin_option, placed  # benchmarks/ is on sys.path
from _servers import add_server_option, s2_server

from s2_spark._proto import s2_pb2
from s2_spark.s2 import AppendRecord, S2Client, S2Config
from s2_spark.s2._encode import encode_append_records
from s2_spark.wire.records import decode_read_batch

RECORD = 100
TOKEN = "bench-writer"


def cpu_per_call(fn: Callable[[], object], n: int) -> float:
    """Microseconds of this process's CPU per call of `fn`, over `n` calls."""
    t0 = time.process_time()
    for _ in range(n):
        fn()
    return (time.process_time() - t0) / n * 1e6


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=3000, help="requests per round")
    ap.add_argument("--repeat", type=int, default=5, help="rounds (the best counts)")
    ap.add_argument("--warmup", type=int, default=300,
                    help="unmeasured requests of each kind and client first")
    add_pin_option(ap)
    add_server_option(ap)
    args = ap.parse_args(argv)
    placement = placed(args)
    basin, stream = f"bench-req-{uuid.uuid4().hex[:8]}", "s"
    with s2_server(args, placement) as server, \
            S2Client(S2Config(endpoint=server.url)) as client:
        cpu = CpuMeter(server=server.pid)
        client.create_basin(basin)
        b = client.basin(basin)
        b.create_stream(stream)
        s = b.stream(stream)
        s.append([AppendRecord(b"x" * RECORD)])
        s.fence(TOKEN)
        batch = encode_append_records([AppendRecord(b"y" * RECORD)])[0]
        body = batch.to_append_input(None, TOKEN)

        route = s._t.route(basin)  # what the connector sends: its own headers, once
        headers = {k.decode(): v.decode() for k, v in route.headers}
        proto = {"accept": "application/protobuf", "content-type": "application/protobuf"}
        path = f"/v1/streams/{stream}/records"
        requests = {
            "tail": ("GET", path + "/tail", {}, None, json.loads),
            "read": ("GET", path + "?seq_num=0&count=1", {"accept": proto["accept"]}, None,
                     s2_pb2.ReadBatch.FromString),
            "append": ("POST", path, proto, body, s2_pb2.AppendAck.FromString),
        }
        ours: dict[str, Callable[[], object]] = {
            "tail": s.check_tail,
            "read": lambda: s.read(seq_num=0, count=1),
            "append": lambda: s.append_chain([batch], fencing_tokens=[TOKEN]),
        }
        parts = urlsplit(server.url)
        conn = http.client.HTTPConnection(parts.hostname, parts.port)
        hx = httpx.Client(trust_env=False)

        def via_http_client(op: str) -> Callable[[], object]:
            method, target, extra, content, parse = requests[op]

            def call() -> object:
                conn.request(method, target, body=content, headers={**headers, **extra})
                return parse(conn.getresponse().read())

            return call

        def via_httpx(op: str) -> Callable[[], object]:
            method, target, extra, content, parse = requests[op]
            url = server.url + target

            def call() -> object:
                return parse(hx.request(method, url, content=content,
                                        headers={**headers, **extra}).content)

            return call

        runs = {(op, who): fn for op in ours for who, fn in (
            ("connector", ours[op]), ("httpx Client", via_httpx(op)),
            ("http.client", via_http_client(op)))}
        for fn in runs.values():
            cpu_per_call(fn, args.warmup)  # warm-up: connections, caches
        best = dict.fromkeys(runs, float("inf"))
        with cpu.printed(f"all measured rounds ({args.repeat * len(runs) * args.requests} "
                         "requests)"):
            for _ in range(args.repeat):
                for key, fn in runs.items():
                    best[key] = min(best[key], cpu_per_call(fn, args.requests))
        payload = hx.request("GET", server.url + requests["read"][1],
                             headers={**headers, "accept": proto["accept"]}).content
        decode = min(cpu_per_call(lambda: decode_read_batch(payload, stream), args.requests)
                     for _ in range(args.repeat))
        conn.close()
        hx.close()

    print(f"client CPU per request, best of {args.repeat} x {args.requests} (us):")
    print(f"{'':8s}{'connector':>12s}{'httpx Client':>14s}{'http.client':>13s}"
          f"{'connector/http.client':>23s}")
    ratios = {}
    for op in ours:
        c, h, floor = (best[(op, w)] for w in ("connector", "httpx Client", "http.client"))
        ratios[op] = c / floor
        print(f"{op:8s}{c:12.0f}{h:14.0f}{floor:13.0f}{ratios[op]:22.2f}x")
    print(f"the read's decode into Arrow (the connector's product; the peers parse "
          f"protobuf) is {decode:.0f} us of it: the read's HTTP alone is "
          f"{(best[('read', 'connector')] - decode) / best[('read', 'http.client')]:.2f}x")
    httpx_ratio = max(best[(op, "httpx Client")] / best[(op, "http.client")] for op in ours)
    print(f"requests: tail {ratios['tail']:.2f}x http.client, read {ratios['read']:.2f}x, "
          f"append {ratios['append']:.2f}x (httpx Client {httpx_ratio:.2f}x) ({server.mode})")


if __name__ == "__main__":
    main()
