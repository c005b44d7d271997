"""What a micro-batch costs beyond its rows: the checks a stream writer makes are made once
by each of Spark's planner interpreters, not every micro-batch (and a target lost between
runs still fails the query, naming it); and Spark's reused Python workers get our modules
frozen out of the garbage collection they run after every call (`spark._worker_heap`)."""

from __future__ import annotations

import contextlib
import tempfile
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from _records import data_records
from _s2_target import s2_config
from _waiting import wait_for

from s2_spark.s2 import S2Client
from s2_spark.spark._worker_heap import in_reused_worker

pytestmark = pytest.mark.spark


@contextlib.contextmanager
def _basin(url: str) -> Iterator[tuple[S2Client, str]]:
    """A client and a new basin on the server at `url`."""
    with S2Client(s2_config(url)) as client:
        name = f"overhead-{uuid.uuid4().hex[:10]}"
        client.create_basin(name)
        yield client, name


def _rate_into(spark: Any, url: str, basin: str, stream: str, checkpoint: str,
               **extra: str) -> Any:
    return (spark.readStream.format("rate").options(rowsPerSecond="20", numPartitions="1").load()
            .selectExpr("CAST(CAST(value AS STRING) AS BINARY) AS body")
            .writeStream.format("s2")
            .options(endpoint=url, basin=basin, stream=stream, **extra)
            .option("checkpointLocation", checkpoint)
            .trigger(processingTime="200 milliseconds").start())


def _until_batches(q: Any, batches: int) -> None:
    def ended() -> bool:
        assert q.exception() is None, str(q.exception())
        return bool((q.lastProgress or {"batchId": -1})["batchId"] + 1 >= batches)

    wait_for(ended, f"{batches} micro-batches to end")


def _stop(spark: Any, q: Any) -> None:
    spark.sparkContext.setLogLevel("OFF")  # stopping aborts the micro-batch in flight
    try:
        q.stop()
    finally:
        spark.sparkContext.setLogLevel("ERROR")


@pytest.mark.local_server  # counts the local server's requests
def test_a_stream_writer_checks_its_target_once_per_planner_interpreter(
        spark: Any, s2_server: Any) -> None:
    """Spark asks for a new stream writer twice a micro-batch (to plan the tasks, then to
    commit), each time in one of two long-lived interpreters: the target is looked up at
    most once in each, however many micro-batches run; every row still lands once."""
    with _basin(s2_server.url) as (client, name):
        target = f"checked-{uuid.uuid4().hex[:6]}"
        client.basin(name).create_stream(target)
        before = s2_server.request_counts().get("check_tail", 0)
        q = _rate_into(spark, s2_server.url, name, target, tempfile.mkdtemp())
        try:
            _until_batches(q, 8)
        finally:
            _stop(spark, q)
        assert s2_server.request_counts().get("check_tail", 0) - before <= 2
        values = [int(body) for body, _, _ in data_records(client.basin(name).stream(target))]
    assert len(values) >= 7  # the rate source's first micro-batch has no rows
    assert values == list(range(len(values))), "rows lost, duplicated or reordered"


def test_a_target_deleted_between_runs_fails_the_restarted_query_naming_it(
        spark: Any, target_s2: Any) -> None:
    """A run started again within the time a checked target is trusted does not look it
    up again: a target deleted meanwhile is found by the tasks, whose typed error fails
    the query and names the stream (and nothing is created behind the user's back)."""
    from pyspark.errors import StreamingQueryException

    with _basin(target_s2.url) as (client, name):
        target = f"gone-{uuid.uuid4().hex[:6]}"
        client.basin(name).create_stream(target)
        checkpoint = tempfile.mkdtemp()
        q = _rate_into(spark, target_s2.url, name, target, checkpoint)
        try:
            _until_batches(q, 2)
        finally:
            _stop(spark, q)
        client.basin(name).delete_stream(target)
        again = _rate_into(spark, target_s2.url, name, target, checkpoint)
        with contextlib.suppress(StreamingQueryException):
            again.awaitTermination(120)
        error = again.exception()
        assert error is not None, "the restarted query went on writing to a deleted stream"
        assert f"stream {target!r}" in str(error)
        assert target not in [s.name for s in client.basin(name).list_streams()
                              if s.deleted_at is None]


def test_reused_workers_freeze_what_our_entry_points_imported(spark: Any) -> None:
    """In a reused Python worker, the first call of ours that imports modules leaves the
    heap frozen (Spark's collection after every task then skips it); the driver's own
    interpreter is left alone."""

    def freeze_count(_: Any) -> Iterator[tuple[bool, int, int]]:
        import gc

        from s2_spark.spark import _worker_heap

        before = gc.get_freeze_count()
        import s2_spark.s2  # noqa: F401 - modules to settle

        _worker_heap.settle()
        yield _worker_heap.in_reused_worker(), before, gc.get_freeze_count()

    [(reused, _, after)] = spark.sparkContext.parallelize([0], 1).mapPartitions(
        freeze_count).collect()
    assert reused is True
    assert after > 20_000
    assert in_reused_worker() is False
