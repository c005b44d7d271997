"""DurableTailWatch against the Durable Streams reference server (long-poll timeout 1 s):
quiet while a long-poll waits, across the server's timeouts; not quiet once data arrives,
after a failure, or where no poll can wait (skip > 0); quiet for good, without requests,
at a closed stream's end; `close` ends outstanding polls at once."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from _waiting import wait_for as until
from durable_testbed import DurableServer
from http_proxy import HttpProxy

from s2_spark._long_poll import watch_limit
from s2_spark.durable import DurableConfig, DurableStream, DurableStreamsClient, DurableTailWatch

TOKEN = "Bearer watch-secret-token"


@pytest.fixture
def client(ds_server: Any) -> Iterator[DurableStreamsClient]:
    config = DurableConfig(base_url=ds_server.url, headers={"authorization": TOKEN})
    with DurableStreamsClient(config) as c:
        yield c


@pytest.fixture
def make(
    client: DurableStreamsClient, unique: Callable[[str], str]
) -> Callable[..., tuple[str, DurableStream]]:
    """A new stream: its name (a path under base_url) and a handle on it."""

    def new(content_type: str = "application/json") -> tuple[str, DurableStream]:
        name = "/" + unique("watch")
        s = client.stream(name)
        assert s.create(content_type).created
        return name, s

    return new


@pytest.fixture
def proxy(monkeypatch: pytest.MonkeyPatch) -> Iterator[HttpProxy]:
    """A forwarding proxy from the environment (as the sync client honours it), which
    records every request it was sent."""
    p = HttpProxy()
    for name in ("NO_PROXY", "no_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HTTP_PROXY", p.url)
    yield p
    p.close()


def at_tail(s: DurableStream, **extra: Any) -> dict[str, Any]:
    return {"offset": s.head().next_offset, "skip": 0, **extra}


def polls(proxy: HttpProxy, name: str) -> int:
    """Long-polls of stream `name` that went through the proxy."""
    return sum(1 for line in list(proxy.request_lines)
               if line.startswith("GET ") and f"{name}?" in line and "live=long-poll" in line)


def test_quiet_until_an_append_then_rearmed_from_the_new_tail(
    client: DurableStreamsClient, make: Callable[..., tuple[str, DurableStream]],
    ds_server: Any,
) -> None:
    (a, sa), (b, sb) = make(), make("application/octet-stream")
    c, sc = make()
    sa.append_json([{"n": 1}])
    c = ds_server.url + c  # named by its URL, as `stream` also accepts
    with client.watch_tails() as watch:
        positions = {a: at_tail(sa), b: at_tail(sb), c: at_tail(sc)}
        assert watch.quiet(positions) == set()  # nothing known before watching
        watch.watch(positions)
        until(lambda: watch.quiet(positions) == {a, b, c}, "all three are quiet")
        # The reference server speaks HTTP/1.1 only: one connection per stream, as many
        # as the process may open files for.
        assert watch.connections() == {"h2": 0, "http/1.1": 3}
        assert watch.limit == watch_limit()
        assert watch.quiet({**positions, a: {"offset": "-1", "skip": 0}}) == {b, c}
        sb.append(b"\x00")
        watch.wait({a, b, c}, timeout=60)  # the append ends it, long before the timeout
        assert watch.quiet(positions) == {a, c}
        positions[b] = at_tail(sb)
        watch.watch(positions)
        until(lambda: watch.quiet(positions) == {a, b, c}, "b is quiet at its new tail")
        sc.append_json([{"n": 2}])
        watch.wait({a, b, c}, timeout=60)
        assert watch.quiet(positions) == {a, b}


@pytest.mark.parametrize("content_type", ["application/json", "application/octet-stream"])
def test_watched_from_the_start_an_empty_stream_is_quiet_until_written(
    client: DurableStreamsClient, make: Callable[..., tuple[str, DurableStream]],
    content_type: str,
) -> None:
    """A read from "-1" answers at once, empty: the watch polls on from the offset that
    answer gave, which is the same position."""
    name, s = make(content_type)
    with client.watch_tails() as watch:
        positions = {name: {"offset": "-1", "skip": 0}}
        watch.watch(positions)
        until(lambda: watch.quiet(positions) == {name}, "the empty stream is quiet")
        s.append(b"[1]" if content_type == "application/json" else b"x")
        watch.wait({name}, timeout=60)
        assert watch.quiet(positions) == set()


def test_polls_outlast_server_timeouts_and_closed_or_skipped_positions_send_nothing(
    proxy: HttpProxy, client: DurableStreamsClient,
    make: Callable[..., tuple[str, DurableStream]],
) -> None:
    """Through a proxy from the environment, which counts requests: the idle stream stays
    quiet across several 1 s server timeouts; a position marked closed is quiet with no
    request; one at a closed stream's end not marked so takes one request, then is quiet
    for good; a position inside an answer (skip > 0) is never polled nor quiet."""
    (idle, si), (ended, se), (closing, sc), (skipped, ss) = (make() for _ in range(4))
    se.close()
    positions = {idle: at_tail(si), ended: at_tail(se, closed=True)}
    positions[closing] = at_tail(sc)  # then closed: the watch learns it from the server
    sc.close()
    positions[skipped] = {"offset": ss.append_json([1, 2]).next_offset, "skip": 1}
    quiet = {idle, ended, closing}
    with client.watch_tails() as watch:
        watch.watch(positions)
        until(lambda: watch.quiet(positions) == quiet, "all but the skipped one are quiet")

        def quiet_through_polls() -> bool:
            assert watch.quiet(positions) == quiet
            return polls(proxy, idle) >= 4

        until(quiet_through_polls, "the idle stream was polled again three times")
        assert polls(proxy, ended) == 0
        assert polls(proxy, closing) == 1
        assert polls(proxy, skipped) == 0
        assert "cursor=" in next(line for line in reversed(proxy.request_lines)
                                  if idle in line)


def test_a_deleted_stream_is_not_quiet_and_nothing_logged_holds_the_token(
    client: DurableStreamsClient, make: Callable[..., tuple[str, DurableStream]],
    caplog: pytest.LogCaptureFixture,
) -> None:
    (here, sh), (gone, sg) = make(), make()
    caplog.set_level(logging.DEBUG)
    with client.watch_tails() as watch:
        positions = {here: at_tail(sh), gone: at_tail(sg)}
        watch.watch(positions)
        until(lambda: watch.quiet(positions) == {here, gone}, "both are quiet")
        sg.delete()
        until(lambda: watch.quiet(positions) == {here}, "the deleted stream is not quiet")
        assert "watch-secret-token" not in repr(watch)
    assert "watch-secret-token" not in caplog.text


def test_close_ends_outstanding_polls_at_once(unique: Callable[[str], str]) -> None:
    """Polls that the server would hold for 30 s end when the watch closes: its thread
    is gone when `close` returns (it waits at most 5 s for it)."""
    with DurableServer(long_poll_timeout=30.0) as server, \
            DurableStreamsClient(base_url=server.url) as client:
        names = ["/" + unique("close") for _ in range(5)]
        for name in names:
            client.stream(name).create("application/json")
        watch = client.watch_tails()
        assert isinstance(watch, DurableTailWatch)
        positions = {name: at_tail(client.stream(name)) for name in names}
        watch.watch(positions)
        until(lambda: watch.quiet(positions) == set(names), "all are quiet")
        watch.close()
        assert not watch._thread.is_alive()
        assert watch.quiet(positions) == set()
        watch.close()  # again: nothing to do
