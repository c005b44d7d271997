"""What compressed answers cost and save: `read_many` over many small streams with
`compression` none, zstd and gzip, same run.

One server process (`--server`: the local server by default, or s2-lite; on a CPU of
its own where there are two or more: `_pinning`), which compresses answers of 1 KiB or
more (as s2-lite does); a basin of
`--streams` streams of `--records` JSON events each (about `--body` bytes, text that
compresses as real events do: ids, names, timestamps). For each coding, an `S2Client`
with that `compression` reads every stream whole with `BasinClient.read_many` (the
fan-out a Spark task's packed partition uses), `--rounds` times; CPU seconds of this
process (the client: the fan-out's loop and the Arrow decoding) and of the server, per
`read_many`; the codings alternate `--repeat` times and the best counts. The bytes of
the answers' bodies as they travel (one GET per stream, `Accept-Encoding` as the client
sends it). On loopback the wire costs nothing, so this is what compression costs in CPU
and saves in bytes; across a real network the bytes are what takes time.
Ends with `compression: zstd <c>x client CPU, <s>x server CPU, <b>x bytes; gzip ...
(vs none, <pinned|unpinned>)`.
"""

from __future__ import annotations

import argparse
import hashlib
import http.client
import json
import time
import uuid
from urllib.parse import urlsplit

from _pinning import CpuMeter, add_pin_option, cpu_seconds, placed  # benchmarks/ on sys.path
from _servers import add_server_option, s2_server

from s2_spark.s2 import AppendRecord, S2Client, S2Config, SmallRead
from s2_spark.s2._stream import records_path

CODINGS = ("none", "zstd", "gzip")
ACCEPT = {"none": "identity", "zstd": "zstd, gzip", "gzip": "gzip"}
PAGES = ("/", "/products", "/products/item", "/cart", "/checkout", "/search", "/account")
EVENTS = ("view", "click", "scroll", "add_to_cart", "purchase", "search")
AGENTS = ("Mozilla/5.0 (X11; Linux x86_64) Firefox/131.0", "Mozilla/5.0 (Macintosh) Safari/18",
          "okhttp/4.12.0")


def event(stream: int, i: int, size: int) -> bytes:
    """A JSON event of about `size` bytes, as a tracking pipeline writes them: repeated
    keys and values, ids and a request hash that do not repeat."""
    seed = hashlib.blake2b(f"{stream}/{i}".encode(), digest_size=32).hexdigest()
    doc = {"user": f"user-{stream:05d}", "session": seed[:12],
           "event": EVENTS[(stream + i) % len(EVENTS)], "page": PAGES[(i * 3) % len(PAGES)],
           "ts": 1_760_000_000_000 + stream * 1000 + i * 37, "n": i,
           "agent": AGENTS[stream % len(AGENTS)], "request": seed[12:]}
    text = json.dumps(doc)
    while len(text) < size:  # more of the same kind: an id list
        doc.setdefault("items", []).append(f"sku-{(stream * 31 + len(text)) % 9973:04d}")
        text = json.dumps(doc)
    return text.encode()


def wire_bytes(url: str, basin: str, streams: list[str], records: int, coding: str) -> int:
    """The answers' bodies as they travel, over all the streams."""
    parts = urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname or "127.0.0.1", parts.port)
    total = 0
    try:
        for name in streams:
            conn.request("GET", f"/v1{records_path(name)}?seq_num=0&count={records}",
                         headers={"s2-basin": basin, "accept": "application/protobuf",
                                  "accept-encoding": ACCEPT[coding]})
            total += len(conn.getresponse().read())
    finally:
        conn.close()
    return total


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--streams", type=int, default=300)
    ap.add_argument("--records", type=int, default=10, help="records per stream")
    ap.add_argument("--body", type=int, default=200, help="bytes per record, about")
    ap.add_argument("--rounds", type=int, default=20, help="read_many calls per measurement")
    ap.add_argument("--repeat", type=int, default=3, help="measurements per coding (best)")
    add_pin_option(ap)
    add_server_option(ap)
    args = ap.parse_args(argv)
    placement = placed(args)
    basin = f"bench-cz-{uuid.uuid4().hex[:8]}"
    names = [f"s{k:05d}" for k in range(args.streams)]
    with s2_server(args, placement) as server:
        cpu = CpuMeter(server=server.pid)
        with S2Client(S2Config(endpoint=server.url)) as filler:
            filler.create_basin(basin)
            b = filler.basin(basin)
            b.create_streams(names)
            for k, name in enumerate(names):
                b.stream(name).append([AppendRecord(event(k, i, args.body))
                                       for i in range(args.records)])
        reads = [SmallRead(name, 0, args.records) for name in names]
        clients = {c: S2Client(S2Config(endpoint=server.url, compression=c))  # type: ignore[arg-type]
                   for c in CODINGS}
        best = {c: (float("inf"), float("inf")) for c in CODINGS}
        try:
            for c in CODINGS:  # warm-up: connections, caches
                got = clients[c].basin(basin).read_many(reads, include_headers=False)
                assert all(not isinstance(g, Exception) and g.batch.num_rows == args.records
                           for g in got), c
            with cpu.printed(f"all measured rounds ({args.repeat * len(CODINGS)} x "
                             f"{args.rounds} read_many of {args.streams} streams)"):
                for _ in range(args.repeat):
                    for c in CODINGS:
                        mine, theirs = time.process_time(), cpu_seconds(server.pid)
                        for _ in range(args.rounds):
                            clients[c].basin(basin).read_many(reads, include_headers=False)
                        spent = ((time.process_time() - mine) / args.rounds,
                                 (cpu_seconds(server.pid) - theirs) / args.rounds)
                        best[c] = (min(best[c][0], spent[0]), min(best[c][1], spent[1]))
        finally:
            for client in clients.values():
                client.close()
        sizes = {c: wire_bytes(server.url, basin, names, args.records, c) for c in CODINGS}

    print(f"read_many of {args.streams} streams x {args.records} records of ~{args.body} B, "
          f"best of {args.repeat} x {args.rounds}:")
    print(f"{'':6s}{'client CPU ms':>15s}{'server CPU ms':>15s}{'answer bytes':>14s}"
          f"{'client':>9s}{'server':>9s}{'bytes':>8s}")
    ratios = {}
    for c in CODINGS:
        cl, sv = best[c]
        ratios[c] = (cl / best["none"][0], _ratio(sv, best["none"][1]), sizes[c] / sizes["none"])
        print(f"{c:6s}{cl * 1000:15.1f}{sv * 1000:15.1f}{sizes[c]:14d}"
              f"{ratios[c][0]:8.2f}x{_x(ratios[c][1]):>9s}{ratios[c][2]:7.2f}x")
    why = "not started here" if server.pid is None else "too little to measure"

    def theirs(ratio: float) -> str:
        return f"server CPU n/a ({why})" if ratio != ratio else f"{ratio:.2f}x server CPU"

    summary = "; ".join(f"{c} {r[0]:.2f}x client CPU, {theirs(r[1])}, {r[2]:.2f}x bytes"
                        for c, r in ratios.items() if c != "none")
    print(f"compression: {summary} (vs none, {server.mode})")


def _ratio(a: float, b: float) -> float:
    return a / b if b else float("nan")


def _x(ratio: float) -> str:
    return "n/a" if ratio != ratio else f"{ratio:.2f}x"


if __name__ == "__main__":
    main()
