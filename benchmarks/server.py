"""The local server's CPU per request by kind: its HTTP stack (granian where installed)
against the stack before it (hypercorn), same app, same run.

One server process per stack (`ServerProcess(stack=...)`), each pinned to the server's
CPU where there are two or more (`_pinning`; `--no-pin` shares every CPU), both up for the
whole run. For each kind, the stacks take turns `--repeat` times; a figure is the server's
CPU seconds (user + system, every thread, from /proc) over the requests it answered in
that turn, the best turn counting (the machine may be loaded: CPU time, not wall time):

* append: a unary append of one 100 B record (protobuf, as the connector's writer sends);
* tail: a tail check (GET .../records/tail, JSON);
* read: a unary read of one record (protobuf, as the connector reads small ranges);
  these three from `--connections` HTTP/1.1 connections at once, each sending its next
  request when the last is answered (a light asyncio client, so the load is the server's);
* long-poll h1 / h2: the connector's tail watch over `--streams` empty streams with
  `wait=--wait` (every poll ends empty and is sent again), over HTTP/1.1 (a connection
  per stream) and over HTTP/2 (shared connections), counted by the server's `read_wait`
  counter over `--poll-seconds` s after 2 s of settling;
* s2s read 1M: a catch-up S2S read session of `--records` 100 B records (server CPU per
  session, in ms).

Ends with `server: <stack> append <a> ms, tail <t> ms, read <r> ms, long-poll h1 <p> ms,
long-poll h2 <q> ms, s2s read 1M <s> ms; <x>x-<y>x less CPU than hypercorn
(<pinned|unpinned>)`.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import time
import uuid
from collections.abc import Callable

import httpx
import pyarrow as pa
from _pinning import add_pin_option, cpu_seconds, placed

from s2_spark._long_poll._limits import watch_limit
from s2_spark.s2 import AppendRecord, S2Client, S2Config
from s2_spark.s2._encode import encode_append_records
from s2_spark.testing import ServerProcess
from s2_spark.testing.serving.server import fetch_request_counts
from s2_spark.wire.appends import encode_append_batches

RECORD = 100
STREAM = "s"
BIG = "big"
#: The issue's targets, ms of server CPU per request.
TARGETS = {"append": 0.15, "tail": 0.1, "long-poll h1": 0.25, "long-poll h2": 0.25}


def raw_request(method: str, target: str, headers: dict[str, str], body: bytes = b"") -> bytes:
    lines = [f"{method} {target} HTTP/1.1", "host: bench", f"content-length: {len(body)}"]
    lines += [f"{k}: {v}" for k, v in headers.items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


async def _connection(port: int, request: bytes, n: int) -> None:
    """Send `request` `n` times on one connection, each after the last answer."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        for _ in range(n):
            writer.write(request)
            head = await reader.readuntil(b"\r\n\r\n")
            length = 0
            for line in head.split(b"\r\n"):
                if line[:15].lower() == b"content-length:":
                    length = int(line[15:])
            body = await reader.readexactly(length)
            if not head.startswith(b"HTTP/1.1 200"):
                raise RuntimeError(f"unexpected answer: {head[:200]!r} {body[:200]!r}")
    finally:
        writer.close()


def unary(port: int, pid: int, request: bytes, n: int, connections: int) -> float:
    """Server CPU ms per request over `n` requests from `connections` connections."""
    per = max(1, n // connections)

    async def run(count: int) -> None:
        await asyncio.gather(*(_connection(port, request, count) for _ in range(connections)))

    asyncio.run(run(20))  # warm-up: connections, caches
    before = cpu_seconds(pid)
    asyncio.run(run(per))
    return 1000 * (cpu_seconds(pid) - before) / (per * connections)


def long_polls(url: str, pid: int, basin: str, streams: list[str], args: argparse.Namespace,
               *, h2: bool) -> float:
    """Server CPU ms per long-poll answered, the tail watch polling every stream."""
    # HTTP/2 for every stream (no connection of its own), or HTTP/1.1 for all (as many
    # as the open-files limit allows, more than `--streams`). The watch's default is none
    # of its own now (HTTP/2 wherever the origin speaks it): HTTP/1.1 is asked for.
    own = 0 if h2 else watch_limit()
    with S2Client(S2Config(endpoint=url)) as client, \
            client.basin(basin).watch_tails(wait=args.wait, own_connections=own) as watch:
        watch.watch(dict.fromkeys(streams, 0))
        time.sleep(args.settle)
        used = watch.connections()
        assert (used["http/1.1"] == 0) == h2, used  # the side it claims to measure
        polls0 = fetch_request_counts(url, timeout=60).get("read_wait", 0)
        before = cpu_seconds(pid)
        time.sleep(args.poll_seconds)
        spent = cpu_seconds(pid) - before
        polls = fetch_request_counts(url, timeout=60).get("read_wait", 0) - polls0
    return 1000 * spent / max(1, polls)


def s2s_read(url: str, pid: int, basin: str, n: int) -> float:
    """Server CPU ms for one S2S catch-up read session of `n` records (bytes counted)."""
    headers = {"s2-basin": basin, "accept": "s2s/proto", "accept-encoding": "identity"}
    before = cpu_seconds(pid)
    total = 0
    with httpx.Client(timeout=120, trust_env=False) as http, http.stream(
            "GET", f"{url}/v1/streams/{BIG}/records", params={"seq_num": 0, "count": n},
            headers=headers) as resp:
        for chunk in resp.iter_raw():
            total += len(chunk)
    assert total > n * RECORD, total
    return 1000 * (cpu_seconds(pid) - before)


def fill(client: S2Client, basin: str, n: int) -> None:
    s = client.basin(basin).stream(BIG)
    for start in range(0, n, 100_000):
        k = min(n, start + 100_000) - start
        blob = os.urandom(k * RECORD)
        col = pa.array([blob[i * RECORD:(i + 1) * RECORD] for i in range(k)], pa.binary())
        s.append_batches(encode_append_batches(col))


def set_up(server: ServerProcess, basin: str, args: argparse.Namespace,
           streams: list[str]) -> dict[str, bytes]:
    """The basin, its streams and the unary requests of each kind."""
    with S2Client(S2Config(endpoint=server.url)) as client:
        client.create_basin(basin)
        b = client.basin(basin)
        b.create_stream(STREAM)
        b.create_stream(BIG)
        b.create_streams(streams)
        b.stream(STREAM).append([AppendRecord(b"x" * RECORD)])
        fill(client, basin, args.records)
    batch = encode_append_records([AppendRecord(b"y" * RECORD)])[0]
    proto = "application/protobuf"
    common = {"s2-basin": basin}
    path = f"/v1/streams/{STREAM}/records"
    return {
        "append": raw_request("POST", path, {**common, "content-type": proto, "accept": proto},
                              batch.to_append_input(None, None)),
        "tail": raw_request("GET", path + "/tail", common),
        "read": raw_request("GET", path + "?seq_num=0&count=1", {**common, "accept": proto}),
    }


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--stacks", default="granian,hypercorn",
                    help="the stacks to compare, the first against the others")
    ap.add_argument("--requests", type=int, default=6000, help="unary requests a turn")
    ap.add_argument("--connections", type=int, default=16)
    ap.add_argument("--streams", type=int, default=1000, help="streams the watch polls")
    ap.add_argument("--wait", type=int, default=2, help="seconds each poll waits at most")
    ap.add_argument("--poll-seconds", type=float, default=8.0)
    ap.add_argument("--settle", type=float, default=2.0,
                    help="seconds the watch polls before the long-polls are counted")
    ap.add_argument("--records", type=int, default=1_000_000, help="records the S2S read reads")
    ap.add_argument("--repeat", type=int, default=2, help="turns per stack and kind")
    ap.add_argument("--skip", default="", help="kinds to skip, comma-separated")
    add_pin_option(ap)
    args = ap.parse_args(argv)
    placement = placed(args)
    stacks = args.stacks.split(",")
    skip = set(filter(None, args.skip.split(",")))
    basin = f"bench-server-{uuid.uuid4().hex[:8]}"
    streams = [f"p{k:05d}" for k in range(args.streams)]
    servers = {name: ServerProcess(stack=name, startup_timeout=60).start() for name in stacks}
    try:
        requests: dict[str, dict[str, bytes]] = {}
        for name, server in servers.items():
            placement.pin_server(server.pid)
            requests[name] = set_up(server, basin, args, streams)
        kinds: dict[str, Callable[[str, ServerProcess], float]] = {
            **{op: (lambda name, server, op=op: unary(
                server.port, server.pid or 0, requests[name][op], args.requests,
                args.connections)) for op in ("append", "tail", "read")},
            "long-poll h1": lambda name, server: long_polls(
                server.url, server.pid or 0, basin, streams, args, h2=False),
            "long-poll h2": lambda name, server: long_polls(
                server.url, server.pid or 0, basin, streams, args, h2=True),
            "s2s read 1M": lambda name, server: s2s_read(
                server.url, server.pid or 0, basin, args.records) * 1_000_000 / args.records,
        }
        best: dict[tuple[str, str], float] = {}
        for kind, measure in kinds.items():
            if kind.split()[0] in skip or kind in skip:
                continue
            for _ in range(args.repeat):
                for name, server in servers.items():
                    got = measure(name, server)
                    best[(kind, name)] = min(best.get((kind, name), got), got)
                    print(f"  {kind} on {name}: {got:.3f} ms", flush=True)
    finally:
        for server in servers.values():
            server.stop()
    report(best, stacks, placement.mode, args)


def _ms(value: float) -> str:
    return f"{value:.3f}" if value < 10 else f"{value:.0f}"


def report(best: dict[tuple[str, str], float], stacks: list[str], mode: str,
           args: argparse.Namespace) -> None:
    first, others = stacks[0], stacks[1:]
    kinds = list(dict.fromkeys(kind for kind, _ in best))
    print(f"server CPU per request (ms; s2s read: per session of 1M records), best of "
          f"{args.repeat}; unary from {args.connections} connections, long-polls over "
          f"{args.streams} streams:")
    print(f"{'':14s}" + "".join(f"{s:>11s}" for s in stacks)
          + "".join(f"{o + '/' + first:>20s}" for o in others) + f"{'target':>9s}")
    ratios = []
    for kind in kinds:
        row = f"{kind:14s}" + "".join(f"{_ms(best[(kind, s)]):>11s}" for s in stacks)
        for other in others:
            ratio = best[(kind, other)] / max(best[(kind, first)], 1e-9)
            ratios.append(ratio)
            row += f"{ratio:19.2f}x"
        target = TARGETS.get(kind)
        print(row + (f"{'<= ' + str(target):>9s}" if target else ""))
    figures = ", ".join(f"{kind} {_ms(best[(kind, first)])} ms" for kind in kinds)
    span = f"{min(ratios):.2f}x-{max(ratios):.2f}x" if ratios else "-"
    print(f"server: {first} {figures}; {span} less CPU than {','.join(others) or '-'} ({mode})")


if __name__ == "__main__":
    main()
