"""The tail watch hears of every append: streams armed, then appended to at random moments
of the long-poll window and as a poll expires (where the next poll is not at the server
yet), under CPU load, over HTTP/2 and HTTP/1.1, on the local server and on s2-lite.

What the watch promises (`s2_spark._long_poll._watch`): an append makes its stream not
quiet within a bound, and a tail told with that news (`news_tails`) is the exact one. A
record at the server before a poll waits there comes without a tail (S2 tells the tail
only with records that came while the read waited): that is allowed, not asserted
against. The long version, with news latencies: `scripts/watch_news.py`."""

from __future__ import annotations

import random
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from _waiting import wait_for

from s2_spark.s2 import AppendRecord, BasinClient, S2Client, S2Config
from s2_spark.s2._watch import TailWatch
from s2_spark.testing import LocalS2Server
from s2_spark.testing.external import S2Lite

STREAMS = 6
APPENDS = 5  # to each stream
#: Seconds a poll waits: `jittered_wait(1)` is 1, so a poll's expiry can be aimed at.
WAIT = 1
#: Seconds an append has to make its stream not quiet (news takes milliseconds).
BOUND = 15.0


@pytest.fixture(scope="module", params=["local", "s2-lite"])
def server_url(request: pytest.FixtureRequest) -> Iterator[str]:
    server: Any = LocalS2Server() if request.param == "local" else S2Lite()
    with server:
        yield server.url


@pytest.fixture(scope="module")
def cpu_load() -> Iterator[None]:
    """Two processes spinning on the CPU while the module's tests run."""
    busy = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(2)]
    try:
        yield
    finally:
        for proc in busy:
            proc.kill()
            proc.wait()


@pytest.fixture
def basin(server_url: str) -> Iterator[BasinClient]:
    with S2Client(S2Config(endpoint=server_url)) as client:
        name = f"watch-news-{random.getrandbits(40):010x}"
        client.create_basin(name)
        basin = client.basin(name)
        for i in range(STREAMS):
            basin.create_stream(f"s{i}")
        basin.create_stream("warm-up")
        basin.stream("warm-up").append([AppendRecord(b"first")])  # connections, imports
        yield basin
        client.delete_basin(name)


@dataclass
class _Stream:
    """One stream's cycle: armed at its tail, appended to once at `due`, then news."""

    name: str
    tail: int = 0  # where it is watched from
    armed: float | None = None  # when it was seen quiet there
    due: float = 0.0  # when to append
    appended: float | None = None  # when the append was acknowledged
    left: int = APPENDS


def _moment(rng: random.Random) -> float:
    """Seconds after a poll went out to append: anywhere in its window, or (a third of
    the time) as it expires."""
    if rng.random() < 1 / 3:
        return WAIT + rng.uniform(-0.01, 0.02)
    return rng.uniform(0, WAIT)


def _step(s: _Stream, quiet: set[str], watch: TailWatch, basin: BasinClient,
          rng: random.Random) -> bool:
    """Move `s` on by what the watch says now; True when it is to be watched again."""
    now = time.monotonic()
    if s.appended is not None:  # waiting for the news of its append
        if s.name in quiet:
            assert now - s.appended < BOUND, f"{s.name} quiet at {s.tail} after an append"
            return False
        told = watch.news_tails([s.name])
        assert told in ({}, {s.name: s.tail + 1}), f"{s.name}: {told} after {s.tail + 1}"
        s.tail, s.appended, s.armed = s.tail + 1, None, None
        return True
    if s.armed is None:
        if s.name in quiet:
            s.armed, s.due = now, now + _moment(rng)
        return False
    if s.name not in quiet:  # no news without a record; a failed poll: watch it again
        s.armed = None
        return True
    if s.left and now >= s.due:
        basin.stream(s.name).append([AppendRecord(b"news")])
        s.appended, s.left = time.monotonic(), s.left - 1
    return False


@pytest.mark.parametrize("http", ["2", "1.1"])
def test_every_append_makes_its_stream_not_quiet(
    basin: BasinClient, http: str, cpu_load: None
) -> None:
    rng = random.Random()
    streams = [_Stream(f"s{i}") for i in range(STREAMS)]
    own = STREAMS if http == "1.1" else 0  # each on an HTTP/1.1 connection of its own
    with basin.watch_tails(wait=WAIT, own_connections=own) as watch:
        positions = {s.name: s.tail for s in streams}
        watch.watch(positions)
        deadline = time.monotonic() + BOUND + APPENDS * 3 * WAIT
        while any(s.left or s.appended is not None for s in streams):
            assert time.monotonic() < deadline, [s for s in streams if s.left or s.appended]
            quiet = watch.quiet(positions)
            if any([_step(s, quiet, watch, basin, rng) for s in streams]):
                positions = {s.name: s.tail for s in streams}
                watch.watch(positions)
            time.sleep(0.001)
        wait_for(lambda: watch.quiet(positions) == set(positions), "every stream armed",
                 timeout=BOUND)
        used = watch.connections()  # the protocol the test claims to run over
        assert used["http/1.1"] == (0 if http == "2" else STREAMS) and used["h2"] >= (http == "2")
