"""TailWatch against the local S2 server: quiet while a long-poll waits, not quiet once a
record arrives, after a failure, or before it was watched; moving a position re-arms it."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from _s2_target import LITE, s2_config, unique_name
from _waiting import wait_for as until

from s2_spark.s2 import AppendRecord, BasinClient, S2Client, S2Config
from s2_spark.s2._watch import TailWatch


@pytest.fixture
def basin(s2_server: Any) -> Iterator[BasinClient]:
    with S2Client(s2_config(s2_server.url)) as client:
        name = unique_name("watch")
        client.create_basin(name)
        yield client.basin(name)


def test_quiet_until_a_record_arrives_then_rearmed_from_the_new_position(
    basin: BasinClient,
) -> None:
    for name in ("a", "b", "c"):
        basin.create_stream(name)
    basin.stream("b").append([AppendRecord(b"x")])
    watch = basin.watch_tails(wait=5)
    try:
        positions = {"a": 0, "b": 1, "c": 0}
        assert watch.quiet(positions) == set()  # nothing known before watching
        watch.watch(positions)
        until(lambda: watch.quiet(positions) == {"a", "b", "c"}, "all three are quiet")
        assert watch.quiet({"a": 0, "b": 0}) == {"a"}  # quiet only at the watched position
        basin.stream("c").append([AppendRecord(b"y")])
        watch.wait({"a", "b", "c"}, timeout=20)
        assert watch.quiet(positions) == {"a", "b"}
        positions["c"] = 1
        watch.watch(positions)
        until(lambda: watch.quiet(positions) == {"a", "b", "c"}, "c is quiet at its new end")
    finally:
        watch.close()


def test_a_deleted_stream_is_not_quiet_and_the_others_stay_so(
    basin: BasinClient,
) -> None:
    basin.create_stream("here")
    basin.create_stream("gone")
    watch = basin.watch_tails(wait=5)
    try:
        positions = {"here": 0, "gone": 0}
        watch.watch(positions)
        until(lambda: watch.quiet(positions) == {"here", "gone"}, "both are quiet")
        basin.delete_stream("gone")
        until(lambda: watch.quiet(positions) == {"here"}, "the deleted stream is not quiet")
        watch.wait({"here"}, timeout=0.5)  # nothing arrives: it times out
        assert watch.quiet(positions) == {"here"}
    finally:
        watch.close()


def test_streams_past_the_limit_are_not_watched_but_named(basin: BasinClient) -> None:
    for name in ("a", "b"):
        basin.create_stream(name)
    watch = TailWatch(basin._transport, basin.name, wait=5, limit=1)
    try:
        assert watch.watch({"a": 0, "b": 0}) == {"b"}  # left to the caller
        until(lambda: watch.quiet({"a": 0}) == {"a"}, "a is quiet")
        assert watch.quiet({"a": 0, "b": 0}) == {"a"}
    finally:
        watch.close()
    assert watch.quiet({"a": 0}) == set()  # closed: nothing is known any more


def test_many_streams_share_one_http2_connection_and_each_is_seen(
    basin: BasinClient,
) -> None:
    names = [f"m{k:03d}" for k in range(120)]
    for name in names:
        basin.create_stream(name)
    watch = basin.watch_tails(wait=5, own_connections=0)
    try:
        positions = dict.fromkeys(names, 0)
        assert watch.watch(positions) == set()  # no limit over HTTP/2
        assert watch.limit is None
        # Quiet as its poll goes out, perhaps before the connection is up (an origin
        # known to speak HTTP/2 is not asked again): wait for both.
        until(lambda: watch.quiet(positions) == set(names)
              and watch.connections() == {"h2": 1, "http/1.1": 0},
              "all 120 are quiet, on one HTTP/2 connection")
        basin.stream("m077").append([AppendRecord(b"z")])
        until(lambda: watch.quiet(positions) == set(names) - {"m077"}, "m077 has news")
    finally:
        watch.close()


def test_streams_past_their_own_connections_share_http2(basin: BasinClient) -> None:
    """With 3 streams on HTTP/1.1 connections of their own (the share the open-files
    limit gives by default), the other 7 share one HTTP/2 connection; news on either
    kind is seen."""
    names = [f"o{k}" for k in range(10)]
    for name in names:
        basin.create_stream(name)
    with basin.watch_tails(wait=5, own_connections=3) as watch:
        positions = dict.fromkeys(names, 0)
        assert watch.watch(positions) == set()
        until(lambda: watch.quiet(positions) == set(names)
              and watch.connections() == {"h2": 1, "http/1.1": 3},
              "all 10 are quiet, 7 of them on one HTTP/2 connection")
        for name in names:
            basin.stream(name).append([AppendRecord(b"z")])
        until(lambda: watch.quiet(positions) == set(), "every stream has news")


@pytest.mark.local_server
def test_a_dropped_connection_is_polled_again_on_a_new_one_and_no_news_is_lost(
    s2_server: Any, basin: BasinClient,
) -> None:
    from s2_spark.testing import TcpProxy

    names = ["a", "b", "c"]
    for name in names:
        basin.create_stream(name)
    with TcpProxy(s2_server.url) as proxy, \
            S2Client(S2Config(endpoint=proxy.url)) as client:
        watch = client.basin(basin.name).watch_tails(wait=30, own_connections=0)
        try:
            positions = dict.fromkeys(names, 0)
            watch.watch(positions)
            until(lambda: proxy.connections == 1 and watch.quiet(positions) == set(names),
                  "all quiet on one connection")
            proxy.sever()  # mid-wait: every poll on it fails
            basin.stream("b").append([AppendRecord(b"news")])
            until(lambda: proxy.connections == 2, "polled again on a new connection")
            until(lambda: watch.quiet(positions) == {"a", "c"}, "a, c quiet; b has news")
            positions["b"] = 1
            watch.watch(positions)
            until(lambda: watch.quiet(positions) == set(names), "b quiet at its new tail")
            assert watch.connections() == {"h2": 1, "http/1.1": 0}
        finally:
            watch.close()


#: A child process whose open-files limit (soft and hard) is below the streams it
#: watches: each stream's news is still seen, over two HTTP/2 connections (the local
#: server takes 1,000 streams per connection, of which the watch uses 900).
_OVER_THE_FD_LIMIT = """
import os, resource, sys, time
from s2_spark.s2 import AppendRecord, S2Client, S2Config

url, basin_name, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
resource.setrlimit(resource.RLIMIT_NOFILE, (256, 256))
names = [f"f{k:05d}" for k in range(n)]

def until(cond, what):
    deadline = time.monotonic() + 60
    while not cond():
        assert time.monotonic() < deadline, what
        time.sleep(0.05)

token = os.environ.get("S2_TEST_TOKEN") or None
with S2Client(S2Config(endpoint=url, access_token=token)) as client:
    basin = client.basin(basin_name)
    with basin.watch_tails(wait=30) as watch:
        positions = dict.fromkeys(names, 0)
        assert watch.watch(positions) == set(), "streams left unwatched"
        until(lambda: watch.quiet(positions) == set(names), "all quiet")
        for name in (names[0], names[n // 2], names[-1]):
            basin.stream(name).append([AppendRecord(b"news")])
            until(lambda: name not in watch.quiet(positions), f"{name} seen")
            positions[name] = 1
            watch.watch(positions)
            until(lambda: watch.quiet(positions) == set(names), "all quiet again")
        used = watch.connections()
print(used["h2"], used["http/1.1"], "ok")
"""


def test_a_watch_over_more_streams_than_the_process_may_open_files_sees_each(
    s2_server: Any, basin: BasinClient,
) -> None:
    import subprocess
    import sys

    n = 1200
    basin.create_streams([f"f{k:05d}" for k in range(n)])
    out = subprocess.run([sys.executable, "-c", _OVER_THE_FD_LIMIT, s2_server.url,
                          basin.name, str(n)], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    h2, h1, ok = out.stdout.split()
    # As few HTTP/2 connections as the server's SETTINGS_MAX_CONCURRENT_STREAMS allows
    # (`HEADROOM` of it used): the local server's 1,000 a connection make 2; s2-lite's (hyper's
    # default, 200) make 7; no HTTP/1.1.
    assert (int(h2), h1, ok) == (7 if LITE else 2, "0", "ok")


def test_the_watch_raises_the_open_files_limit_and_keeps_a_reserve() -> None:
    """A process whose soft limit is low (often 1024) gets it raised to the hard limit, as
    Go's runtime does; the watch may hold all of that but `FD_RESERVE`."""
    import resource
    import subprocess
    import sys

    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or hard < 2048:
        pytest.skip(f"needs a finite hard limit of 2048 or more (it is {hard})")
    code = (
        "import resource\n"
        "from s2_spark._long_poll import FD_RESERVE, watch_limit\n"
        "_, hard = resource.getrlimit(resource.RLIMIT_NOFILE)\n"
        "resource.setrlimit(resource.RLIMIT_NOFILE, (256, hard))\n"
        "limit = watch_limit()\n"
        "print(limit, resource.getrlimit(resource.RLIMIT_NOFILE)[0], FD_RESERVE)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout.split()
    limit, soft, reserve = (int(x) for x in out)
    assert (soft, limit) == (hard, hard - reserve)


@pytest.mark.local_server
def test_news_with_its_tail_is_followed_while_nothing_comes_after_it(
    s2_server: Any, basin: BasinClient,
) -> None:
    """A poll answered with the tail is followed there at once: while that poll waits the
    tail is exact (`news_tails`), and watching from it keeps that poll (no new request).
    More data before that drops the tail: a plan made from it would miss the rest."""
    basin.create_stream("s")
    stream = basin.stream("s")

    def polls() -> int:
        return int(s2_server.request_counts().get("read_wait", 0))

    before = polls()
    watch = basin.watch_tails(wait=5)
    try:
        watch.watch({"s": 0})
        until(lambda: polls() == before + 1, "a poll waits at 0")  # at the server
        stream.append([AppendRecord(b"1")])
        until(lambda: watch.news_tails({"s"}) == {"s": 1}, "the news tells the tail")
        until(lambda: polls() == before + 2, "the tail is followed")
        assert watch.quiet({"s": 0}) == set()
        watch.watch({"s": 1})  # planned up to the told tail
        assert watch.quiet({"s": 1}) == {"s"}  # the follow-up poll is the watch's now
        assert watch.news_tails({"s"}) == {}
        stream.append([AppendRecord(b"2")])
        until(lambda: watch.news_tails({"s"}) == {"s": 2}, "news at the adopted poll")
        until(lambda: polls() == before + 3, "followed again")
        stream.append([AppendRecord(b"3")])  # a busy stream: the tail it told is stale
        until(lambda: watch.news_tails({"s"}) == {}, "the stale tail is dropped")
        assert watch.quiet({"s": 1}) == set()
        watch.watch({"s": 3})
        until(lambda: watch.quiet({"s": 3}) == {"s"}, "s is quiet at its new end")
        until(lambda: polls() == before + 4, "one new poll, at 3")
    finally:
        watch.close()
