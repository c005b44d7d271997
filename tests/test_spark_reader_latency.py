"""Low-latency streaming reads: default-trigger queries over streams appended record by
record, and the driver-side state that keeps their many small micro-batches exact."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from _versions import plan_all_available
from test_spark_reader import Env, record, row, rows_of, wait_for

from s2_spark.spark import S2DataSource
from s2_spark.spark.partitions import RangePartition


@pytest.fixture(scope="module")
def envs() -> Iterator[dict[str, Env]]:
    """The module's Envs, one a server (s2-lite's; the local server's for the test marked
    `local_server`, which counts its requests), each made when a test first needs it."""
    made: dict[str, Env] = {}
    yield made
    for e in made.values():
        e.client.close()


@pytest.fixture
def env(s2_server: Any, spark: Any, envs: dict[str, Env]) -> Env:
    """The module's Env on the test's server."""
    if s2_server.url not in envs:
        envs[s2_server.url] = Env(s2_server.url, spark)
    return envs[s2_server.url]


@pytest.mark.local_server  # counts the local server's requests
def test_initial_offset_is_resolved_once(env: Env, s2_server: Any) -> None:
    """Spark asks for the initial offset again when it plans the first batch: `latest`
    must not move between the two calls, or the batch would start after its end. The
    first plan does not ask for the tails `latest` just found (one request per stream
    fewer for a query over many): the watch, waiting from them, tells of the records
    appended since, which the next plans take, exactly."""
    env.fill("initial", 5)
    reader = S2DataSource(env.options(stream="initial", startingPosition="latest")).streamReader(
        None  # type: ignore[arg-type]
    )
    try:
        start = reader.initialOffset()
        assert start == {"initial": 5}
        env.fill("initial", 3, create=False)
        assert reader.initialOffset() == {"initial": 5}
        asked = s2_server.request_counts().get("check_tail", 0)
        end = plan_all_available(reader, reader.initialOffset())
        assert end == {"initial": 5}
        assert s2_server.request_counts().get("check_tail", 0) == asked
        deadline = time.monotonic() + 30
        while end == start:
            assert time.monotonic() < deadline, "the records appended never showed"
            end = plan_all_available(reader, start)
        assert end == {"initial": 8}
        assert list(reader.partitions(reader.initialOffset(), end)) == [
            RangePartition("initial", 5, 8)
        ]
    finally:
        reader.stop()


def test_idle_planner_waits_for_records_and_plans_exactly_them(env: Env) -> None:
    """An idle query's plan waits (S2 read `wait`) for the next record instead of returning
    at once; a record appended meanwhile is planned exactly, and a wait that sees nothing
    plans nothing."""
    env.fill("idle", 2)
    reader = S2DataSource(env.options(stream="idle")).streamReader(None)  # type: ignore[arg-type]
    start = reader.initialOffset()
    end = plan_all_available(reader, start)
    assert (start, end) == ({}, {"idle": 2})  # earliest: every stream from its origin
    assert plan_all_available(reader, end) == end  # nothing new: the next plan waits
    # ... and, with nothing appended, still plans nothing
    assert plan_all_available(reader, end) == end
    appender = threading.Thread(target=env.fill, args=("idle", 1), kwargs={"create": False})
    appender.start()
    deadline = time.monotonic() + 30
    latest = end
    while latest == end and time.monotonic() < deadline:
        latest = plan_all_available(reader, end)
    appender.join()
    assert latest == {"idle": 3}
    assert list(reader.partitions(end, latest)) == [RangePartition("idle", 2, 3)]


def test_a_plan_after_news_plans_every_record_appended_before_it(env: Env) -> None:
    """A busy stream's poll answers at the first record after a plan, telling the tail
    then; records appended after that are planned too (a tail kept from that news once
    left them to the next micro-batch, so every other micro-batch held one record)."""
    env.fill("news", 1)
    reader = S2DataSource(env.options(stream="news")).streamReader(None)  # type: ignore[arg-type]
    end = plan_all_available(reader, reader.initialOffset())
    assert end == {"news": 1}
    watch = reader._watch
    wait_for(lambda: watch.quiet(end) == {"news"}, "the watch waits at 1")
    env.fill("news", 1, create=False)
    wait_for(lambda: watch.quiet(end) == set(), "news of record 1")
    env.fill("news", 2, create=False)
    wait_for(lambda: watch.news_tails({"news"}) == {}, "no tail to plan from without asking")
    assert plan_all_available(reader, end) == {"news": 4}
    reader.stop()


@pytest.mark.spark
def test_default_trigger_from_latest_while_appending(env: Env) -> None:
    """A default-trigger query started at `latest` while records arrive one by one: many
    one-record micro-batches (each task reusing its worker's connections) deliver every
    record after the start exactly once, in order."""
    stream = f"trickle-{uuid.uuid4().hex[:6]}"
    env.fill(stream, 5)
    batches: list[list[Any]] = []

    def sink(df: Any, _batch_id: int) -> None:
        batches.append(rows_of(df))

    def delivered() -> int:
        return sum(len(b) for b in list(batches))

    q = (
        env.read_stream(stream=stream, startingPosition="latest")
        .writeStream.foreachBatch(sink)
        .option("checkpointLocation", env.checkpoint())
        .start()
    )
    try:
        # One record at a time, racing the query's start (some land before `latest` is
        # resolved), until it has delivered some, then 30 more.
        next_seq, more = 5, None
        deadline = time.monotonic() + 120
        while more is None or next_seq < more:
            assert q.exception() is None, str(q.exception())
            assert time.monotonic() < deadline, "no micro-batch delivered records in 120s"
            env.stream(stream).append([record(stream, next_seq)])
            next_seq += 1
            if more is None and delivered() > 0:
                more = next_seq + 30
            time.sleep(0.02)  # pacing only: nothing below depends on timing
        wait_for(
            lambda: q.exception() is not None
            or any(r[1] == next_seq - 1 for b in list(batches) for r in b),
            "the last record",
        )
        assert q.exception() is None, str(q.exception())
    finally:
        q.stop()
    got = [r for b in batches for r in b]
    first = got[0][1]
    assert got == [row(stream, i) for i in range(first, next_seq)]
    assert len([b for b in batches if b]) > 1
