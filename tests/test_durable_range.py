"""Reading a Durable Streams range exactly, each message off the server once (no Spark).

The driver plans an unpaced range to the tail from HEAD; by the time a task reads it more
has been appended, and the reference server answers a catch-up read with everything up
to the tail as it is then. The task must cut exactly at the planned boundary, and a read
of the same range later (a replay, after more appends) must return the same rows. The
same must hold against a server that pages its answers (`--page-messages`, pages of 1, 3
and 7 appends against appends of 1 to 5 messages), and for paced ranges that end inside
an answer (`{offset, skip}`).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from typing import Any

import pyarrow as pa
import pytest
from durable_testbed import DurableServer

from s2_spark.backends.base import ReadSettings
from s2_spark.backends.durable._range import units_between
from s2_spark.backends.durable.backend import DurableBackend
from s2_spark.backends.durable.options import DurableSettings
from s2_spark.durable import DurableStreamsClient
from s2_spark.errors import MalformedResponseError

pytestmark = pytest.mark.backend


class Lost(Exception):
    """What the read reported as data loss (Spark's handler raises DataLossError)."""


def _loss(stream: str, start: Any, end: Any) -> None:
    raise Lost(f"{stream}: [{start}, {end})")


@pytest.fixture(scope="module", params=[None, 1, 3, 7], ids=lambda n: f"page{n or 'none'}")
def server(request: pytest.FixtureRequest) -> Iterator[DurableServer]:
    with DurableServer(page_messages=request.param) as s:
        yield s


class Env:
    def __init__(self, url: str) -> None:
        self.client = DurableStreamsClient(base_url=url)
        self.json = DurableBackend(DurableSettings(base_url=url), "json")
        self.bytes = DurableBackend(DurableSettings(base_url=url), "bytes")
        self.n = 0

    def stream(self, content_type: str = "application/json") -> str:
        self.n += 1
        path = f"/range/{self.n}-{threading.get_ident()}"
        self.client.stream(path).create(content_type)
        return path

    def append(self, path: str, first: int, count: int) -> None:
        """Messages first..first+count-1, in appends of 1 to 5 messages."""
        at = first
        while at < first + count:
            size = min(first + count - at, at % 5 + 1)
            self.client.stream(path).append_json([{"n": i} for i in range(at, at + size)])
            at += size

    def values(self, path: str, start: Any, end: Any) -> list[int]:
        batches = list(self.json.read(path, start, end, ReadSettings(), _loss))
        table = pa.Table.from_batches(batches, schema=batches[0].schema) if batches else None
        if table is None:
            return []
        return [json.loads(v)["n"] for v in table.column("value").to_pylist()]

    def rows(self, path: str, start: Any, end: Any) -> list[tuple[str, int, str]]:
        return [(r["offset"], r["index"], r["value"])
                for b in self.json.read(path, start, end, ReadSettings(), _loss)
                for r in b.to_pylist()]


@pytest.fixture(scope="module")
def env(server: DurableServer) -> Iterator[Env]:
    e = Env(server.url)
    yield e
    e.client.close()


def test_unpaced_range_ends_at_the_planned_tail_while_appends_go_on(env: Env) -> None:
    path = env.stream()
    env.append(path, 0, 23)
    start, end = env.json.origin(), env.json.latest(path)
    assert env.json.distance(start, end) is None  # opaque offsets: known only by reading
    env.append(path, 23, 9)  # after planning: the answer that steps over the end has them
    first = env.rows(path, start, end)
    assert [json.loads(v)["n"] for _, _, v in first] == list(range(23))
    assert [(o, i) for o, i, _ in first] == [("-1", i) for i in range(23)]
    env.append(path, 32, 4)
    assert env.rows(path, start, end) == first  # a replay: same rows
    assert env.values(path, end, env.json.latest(path)) == list(range(23, 36))


def test_range_from_inside_an_answer_to_a_later_tail(env: Env) -> None:
    path = env.stream()
    env.append(path, 0, 12)
    a = env.json.advance(env.json.latest(path), 0)
    env.append(path, 12, 11)
    mid = env.json.advance(a, 4)  # 4 messages after a's offset: n = 16
    assert env.json.distance(a, mid) == 4
    end = env.json.latest(path)
    env.append(path, 23, 3)
    assert env.values(path, a, mid) == list(range(12, 16))
    assert env.values(path, mid, end) == list(range(16, 23))
    # A paced end inside the answer after the boundary: [a, (end.offset, 2)).
    assert env.values(path, a, env.json.advance(end, 2)) == list(range(12, 25))


def test_paced_ranges_count_only_to_their_limit_and_cover_the_stream_once(env: Env) -> None:
    path = env.stream()
    env.append(path, 0, 40)
    tail = env.json.latest(path)
    pos, got = env.json.origin(), []
    while env.json.is_after(tail, pos):
        n, whole = env.json.measure(path, pos, tail, 7)
        end = tail if whole else env.json.advance(pos, n)
        env.append(path, 40 + len(got), 1)  # the stream moves on between plans
        got.append(env.values(path, pos, end))
        pos = end
    assert [len(b) for b in got] == [7, 7, 7, 7, 7, 5]
    assert [n for b in got for n in b] == list(range(40))


def test_byte_ranges_cut_exactly(env: Env) -> None:
    path = env.stream("application/octet-stream")
    s = env.client.stream(path)
    for k in range(6):
        s.append(bytes([65 + k]) * (k + 3))
    start, end = env.bytes.origin(), env.bytes.latest(path)
    s.append(b"zz")
    data = b"".join(r["value"] for b in env.bytes.read(path, start, end, ReadSettings(), _loss)
                    for r in b.to_pylist())
    assert data == b"".join(bytes([65 + k]) * (k + 3) for k in range(6))
    n, whole = env.bytes.measure(path, start, env.bytes.latest(path), 10)
    assert (n, whole) == (10, False)
    part = list(env.bytes.read(path, env.bytes.advance(start, 3), env.bytes.advance(start, 10),
                               ReadSettings(), _loss))
    assert [(r["index"], r["value"]) for b in part for r in b.to_pylist()] == [(3, b"BBBBCCC")]


def test_units_between_two_boundaries_chases_a_growing_tail(env: Env) -> None:
    path = env.stream()
    env.append(path, 0, 5)
    lo = env.json.latest(path)["offset"]
    env.append(path, 5, 8)
    hi = env.json.latest(path)["offset"]
    stop = threading.Event()

    def keep_appending() -> None:
        i = 13
        while not stop.is_set():
            env.client.stream(path).append_json([{"n": i}])
            i += 1

    writer = threading.Thread(target=keep_appending)
    writer.start()
    try:
        def pieces(offset: str) -> Any:
            return env.client.stream(path).read_pieces(offset)

        assert [units_between(pieces, lo, hi) for _ in range(5)] == [8] * 5
    finally:
        stop.set()
        writer.join()


def test_a_recreated_stream_fails_the_read_instead_of_returning_other_rows(env: Env) -> None:
    path = env.stream()
    env.append(path, 0, 10)
    start, end = env.json.origin(), env.json.latest(path)
    later = env.json.advance(end, 0)
    env.append(path, 10, 5)
    end2 = env.json.latest(path)
    env.client.stream(path).delete()
    env.client.stream(path).create("application/json")
    env.append(path, 100, 3)  # fewer messages: the planned offsets lie past its tail
    with pytest.raises((Lost, MalformedResponseError)):
        env.values(path, start, end)
    with pytest.raises((Lost, MalformedResponseError)):
        env.values(path, later, end2)
