"""Does the tail watch hear of every append, and how soon? The long version of
`tests/test_watch_news.py`, on one stream, as a user would try it.

Each cycle watches the stream from its tail, waits until it is quiet (a long-poll is out),
appends one record at a random moment of the long-poll window (`--at-expiry`: that share of
the appends aimed at the moment the poll expires, where the next poll is not at the server
yet), then waits for the stream to be no longer quiet. Meanwhile `--load` processes spin on
the CPU. Prints, per run: appends, how many came with their exact tail, how many only made
the stream not quiet (the record was at the server before the poll waited there: S2 tells
the tail only with records that came while a read waited), any wrong tail or stream that
stayed quiet past `--bound` s (a lost append: the exit status is 1), the news latency
from the append's start (p50/p99/max), and the polls' answers by kind (empty, news with or
without the tail, errors, failures)::

    python scripts/watch_news.py --server s2-lite --http 1.1 --cycles 300

`--server local` is `LocalS2Server` in this process (as the tests run it), `local-process`
a `ServerProcess`, `s2-lite` the pinned s2-lite (built with cargo on first use).
"""

from __future__ import annotations

import argparse
import contextlib
import random
import statistics
import subprocess
import sys
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from s2_spark._http import Response
from s2_spark._long_poll import Answer, News, Pause
from s2_spark.s2 import AppendRecord, BasinClient, S2Client, S2Config
from s2_spark.s2._watch import TailWatch


class CountingWatch(TailWatch):
    """A `TailWatch` that counts its polls' answers by kind (loop thread only)."""

    answers: Counter[str]

    def _read(self, stream: str, position: int, state: None,
              resp: Response) -> Answer | News[int] | Pause:
        got = super()._read(stream, position, state, resp)
        kind = ("news with its tail" if isinstance(got, News) else "news without a tail"
                if got is Answer.NEWS else "empty" if got is Answer.NOTHING
                else f"{got} ({resp.status_code})")
        self.answers[kind] += 1
        return got

    def _failed(self, stream: str, exc: Exception) -> None:
        self.answers[f"failed ({type(exc).__name__})"] += 1
        super()._failed(stream, exc)


@dataclass
class Tally:
    """What the appends of one run made the watch say."""

    latencies: list[float] = field(default_factory=list)  # ms, append start to news
    exact: int = 0  # news with the exact tail
    untold: int = 0  # not quiet, no tail
    wrong: list[str] = field(default_factory=list)  # a wrong tail, or a stream left quiet
    answers: Counter[str] = field(default_factory=Counter)  # the polls', by kind

    def line(self) -> str:
        lat = sorted(self.latencies)
        q = statistics.quantiles(lat, n=100, method="inclusive") if len(lat) > 1 else lat * 99
        return (f"appends {len(lat)}: {self.exact} with the exact tail, {self.untold} "
                f"not quiet without it, {len(self.wrong)} wrong; news p50 {q[49]:.1f} ms, "
                f"p99 {q[98]:.1f} ms, max {lat[-1]:.1f} ms; polls answered: "
                f"{', '.join(f'{n} {kind}' for kind, n in sorted(self.answers.items()))}")


@contextlib.contextmanager
def cpu_load(processes: int) -> Iterator[None]:
    """`processes` children spinning on the CPU while the block runs."""
    busy = [subprocess.Popen([sys.executable, "-c", "while True: pass"])
            for _ in range(processes)]
    try:
        yield
    finally:
        for proc in busy:
            proc.kill()
            proc.wait()


@contextlib.contextmanager
def server(kind: str, stack: str) -> Iterator[str]:
    """The URL of the server asked for (the local one on HTTP `stack`), running while the
    block runs."""
    if kind.startswith("http"):
        yield kind
        return
    srv: Any
    if kind == "s2-lite":
        from s2_spark.testing.external import S2Lite
        srv = S2Lite()
    elif kind == "local-process":
        from s2_spark.testing import ServerProcess
        srv = ServerProcess(stack=stack)
    else:
        from s2_spark.testing import LocalS2Server
        srv = LocalS2Server(stack=stack)
    with srv:
        yield srv.url


def armed(watch: TailWatch, pos: int, bound: float) -> float:
    """When the stream was seen quiet at `pos` (its poll just went out)."""
    deadline = time.monotonic() + bound
    while watch.quiet({"s": pos}) != {"s"}:
        if time.monotonic() > deadline:
            raise SystemExit(f"the watch never armed at {pos}")
        time.sleep(0.001)
    return time.monotonic()


def cycle(watch: TailWatch, stream: Any, pos: int, args: argparse.Namespace,
          tally: Tally) -> None:
    """Watch from `pos` (the tail), append one record at a random moment, wait for news."""
    watch.watch({"s": pos})
    sent = armed(watch, pos, args.bound)
    if random.random() < args.at_expiry:  # the server lets the poll go about now
        waits = range(max(1, args.wait * 3 // 4), args.wait + 1)  # as `jittered_wait`
        moment = random.choice(waits) + random.uniform(-0.01, 0.02)
    else:
        moment = random.uniform(0, args.wait)
    time.sleep(max(0.0, sent + moment - time.monotonic()))
    start = time.monotonic()
    stream.append([AppendRecord(b"news")])
    watch.wait({"s"}, timeout=args.bound)
    took = time.monotonic() - start
    tails = watch.news_tails(["s"])
    if watch.quiet({"s": pos}):
        tally.wrong.append(f"quiet at {pos} {took:.1f} s after an append there")
    elif tails == {"s": pos + 1}:
        tally.exact += 1
    elif tails:
        tally.wrong.append(f"told tail {tails['s']} after an append at {pos}")
    else:
        tally.untold += 1
    tally.latencies.append(1000 * took)


def counting_watch(basin: BasinClient, tally: Tally, wait: int, own: int) -> CountingWatch:
    watch = CountingWatch(basin._transport, basin.name, wait=wait, own_connections=own)
    watch.answers = tally.answers  # before the first poll: `watch` starts them
    return watch


def run(url: str, args: argparse.Namespace) -> Tally:
    tally = Tally()
    own = 1 if args.http == "1.1" else 0  # 1: the stream's polls on an HTTP/1.1 connection
    with S2Client(S2Config(endpoint=url)) as client:
        name = f"watch-news-{uuid.uuid4().hex[:8]}"
        client.create_basin(name)
        basin = client.basin(name)
        basin.create_stream("s")
        basin.create_stream("warm-up")
        basin.stream("warm-up").append([AppendRecord(b"first")])  # imports, connections
        with counting_watch(basin, tally, args.wait, own) as watch:
            for pos in range(args.cycles):
                cycle(watch, basin.stream("s"), pos, args, tally)
            assert watch.connections()["http/1.1" if own else "h2"] == 1
        client.delete_basin(name)
    return tally


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--server", default="local",
                    help="local, local-process, s2-lite, or the URL of a running S2")
    ap.add_argument("--http", choices=("2", "1.1"), default="2")
    ap.add_argument("--stack", choices=("auto", "granian", "hypercorn"), default="auto",
                    help="the local server's HTTP stack")
    ap.add_argument("--cycles", type=int, default=300)
    ap.add_argument("--wait", type=int, default=2, help="seconds a long-poll waits")
    ap.add_argument("--at-expiry", type=float, default=0.25,
                    help="share of the appends aimed at a poll's expiry")
    ap.add_argument("--load", type=int, default=2, help="processes spinning meanwhile")
    ap.add_argument("--bound", type=float, default=20.0,
                    help="seconds an append has to make its stream not quiet")
    args = ap.parse_args()
    with server(args.server, args.stack) as url, cpu_load(args.load):
        tally = run(url, args)
    print(f"watch_news ({args.server}, HTTP/{args.http}, wait {args.wait} s, load "
          f"{args.load}): {tally.line()}")
    for what in tally.wrong:
        print("  ", what)
    sys.exit(1 if tally.wrong else 0)


if __name__ == "__main__":
    main()
