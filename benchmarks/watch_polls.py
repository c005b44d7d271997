"""The tail watch's long-polls: client CPU per poll over HTTP/2 (shared connections) against
HTTP/1.1 (a connection per stream), measured in the same run.

One server process (`ServerProcess`, or another with `--server`; on a CPU of its own where
there are two or more: `_pinning`); a `TailWatch` over `--streams` empty streams with
`wait=--wait` s, so every stream's poll ends empty and is sent again every 0.5-1x `--wait`
s. For `--seconds` s after `--settle` s, the polls the server answered (its `read_wait`
counter; from a server without one, s2-lite, the polls this process sent) and the CPU
seconds of this process (the watch's thread; nothing else runs) and of the server. The
HTTP/1.1 side is the fallback the watch takes for an origin that does not speak HTTP/2
(forced here by telling the watch so). Sides alternate `--repeat` times; the best counts.
Ratio: HTTP/1.1 CPU per poll / HTTP/2 CPU per poll (higher: HTTP/2 is cheaper). Ends with
`watch_polls: h2 <a> ms/poll, http/1.1 <b> ms/poll (<r>x), server <s>x`.
"""

from __future__ import annotations

import argparse
import time
import uuid

from _pinning import add_pin_option, cpu_seconds, placed
from _sent import Sent
from _servers import S2Server, add_server_option, s2_server

from s2_spark._http import _h2_origin
from s2_spark.s2 import S2Client, S2Config
from s2_spark.s2._watch import TailWatch


def polls(server: S2Server, sent: Sent | None) -> int:
    """Polls so far: those the server answered (its `read_wait` counter), or, from a server
    without counters, those sent."""
    if sent is not None:
        return sent.count
    counts = server.request_counts()
    assert counts is not None
    return counts.get("read_wait", 0)


def run(server: S2Server, basin: str, streams: list[str], args: argparse.Namespace,
        sent: Sent | None, *, h2: bool) -> tuple[float, float, int]:
    """(client ms per poll, server ms per poll, polls) of one side."""
    url = server.url
    key = f"{url} via None".replace("localhost", "127.0.0.1")
    with _h2_origin._SPEAKS_LOCK:
        _h2_origin._SPEAKS.clear()
        if not h2:
            _h2_origin._SPEAKS[key] = False
    # HTTP/2 for every stream: none gets a connection of its own (by default the first
    # streams up to the open-files limit do).
    own = 0 if h2 else None
    with S2Client(S2Config(endpoint=url)) as client, \
            client.basin(basin).watch_tails(wait=args.wait, own_connections=own) as watch:
        watch.watch(dict.fromkeys(streams, 0))
        time.sleep(args.settle)
        used = watch.connections()
        assert (used["http/1.1"] == 0) == h2, used  # the side it claims to measure
        polls0 = polls(server, sent)
        mine0, theirs0 = time.process_time(), cpu_seconds(server.pid)
        time.sleep(args.seconds)
        n = polls(server, sent) - polls0
        mine, theirs = time.process_time() - mine0, cpu_seconds(server.pid) - theirs0
    return 1000 * mine / max(1, n), 1000 * theirs / max(1, n), n


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--streams", type=int, default=2000)
    ap.add_argument("--wait", type=int, default=2, help="seconds each poll waits at most")
    ap.add_argument("--settle", type=float, default=5.0)
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--repeat", type=int, default=2)
    add_pin_option(ap)
    add_server_option(ap)
    args = ap.parse_args(argv)
    placement = placed(args)
    with s2_server(args, placement) as server:
        sent = None if server.has_counts else Sent([(TailWatch, "_request")])
        if sent is not None:
            print(f"polls: those this process sent ({server.name} has no request counts)")
        with S2Client(S2Config(endpoint=server.url)) as client:
            basin = f"polls-{uuid.uuid4().hex[:8]}"
            client.create_basin(basin)
            streams = [f"s{k:05d}" for k in range(args.streams)]
            client.basin(basin).create_streams(streams)
        best: dict[bool, tuple[float, float, int]] = {}
        for _ in range(args.repeat):
            for h2 in (True, False):
                got = run(server, basin, streams, args, sent, h2=h2)
                name = "h2" if h2 else "http/1.1"
                print(f"  {name}: {got[2]} polls, client {got[0]:.3f} ms/poll, "
                      f"server {got[1]:.3f} ms/poll")
                if h2 not in best or got[0] < best[h2][0]:
                    best[h2] = got
        if sent is not None:
            sent.stop()
    h2c, h2s, _ = best[True]
    h1c, h1s, _ = best[False]
    theirs = "n/a (not started here)" if server.pid is None else (
        f"{h1s / h2s:.2f}x" if h2s else "n/a (no server CPU measured)")
    print(f"watch_polls: h2 {h2c:.3f} ms/poll, http/1.1 {h1c:.3f} ms/poll "
          f"({h1c / h2c:.2f}x), server {theirs} ({server.mode})")


if __name__ == "__main__":
    main()
