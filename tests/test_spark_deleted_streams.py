"""Streams deleted under Spark, as S2 answers: real queries on local[2] against a local
server that keeps deleted streams *deletion pending* (for an hour here, to see the state;
s2-lite for milliseconds, and the queries meet it too) the way s2-lite does (repository
s2-streamstore/s2: `lite/src/backend/streams.rs` `delete_stream`, `core.rs`
`start_streamer`, `streamer.rs` `append_terminal_trim`, `read.rs`; the codes in
`api/src/v1/error.rs`): a follower gets the terminal trim and 503 `unavailable`, every new
request 409 `stream_deletion_pending`, until the stream is removed (404).

A stream deleted under a streaming query is data loss, per failOnDataLoss (as Spark's
Kafka source treats a deleted topic); a writer to a stream being deleted gets an error
naming it and saying what to do.
"""

from __future__ import annotations

import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from _waiting import wait_for

from s2_spark.s2 import AppendRecord, S2Client, S2Config
from s2_spark.testing import LocalS2Server

pytestmark = pytest.mark.spark

SECRET = "tok-SECRET-d31e"  # passed as accessToken; must never show up in errors


class Env:
    def __init__(self, url: str, spark: Any) -> None:
        self.url = url
        self.spark = spark
        self.client = S2Client(S2Config(endpoint=url))
        self.basin = f"spark-deleted-{uuid.uuid4().hex[:10]}"
        self.client.create_basin(self.basin)
        self.tmp = Path(tempfile.mkdtemp(prefix="s2-spark-deleted-"))

    def fill(self, stream: str, bodies: list[bytes], *, create: bool = False) -> None:
        if create:
            self.client.basin(self.basin).create_stream(stream)
        self.client.basin(self.basin).stream(stream).append(
            [AppendRecord(b) for b in bodies])

    def delete(self, stream: str) -> None:
        self.client.basin(self.basin).delete_stream(stream)

    def options(self, **extra: str) -> dict[str, str]:
        return {"endpoint": self.url, "basin": self.basin, "accessToken": SECRET, **extra}

    def start(self, name: str, **opts: str) -> Any:
        df = self.spark.readStream.format("s2").options(**self.options(**opts)).load()
        return (df.selectExpr("stream", "body").writeStream.format("memory").queryName(name)
                .option("checkpointLocation", str(self.tmp / name)).start())

    def rows(self, name: str) -> set[tuple[str, bytes]]:
        return {(r["stream"], bytes(r["body"])) for r in self.spark.table(name).collect()}


@pytest.fixture(scope="module")
def env(spark: Any) -> Iterator[Env]:
    """Deleted streams stay deletion pending for the whole module (s2-lite: milliseconds)."""
    with LocalS2Server(heartbeat_interval=0.5, deletion_delay=3600) as server:
        e = Env(server.url, spark)
        yield e
        e.client.close()


@pytest.fixture(scope="module", params=[
    "pending", pytest.param("s2-lite", marks=pytest.mark.s2_lite)])
def any_env(request: pytest.FixtureRequest, env: Env, spark: Any) -> Iterator[Env]:
    """The module's server (deletion pending for an hour), or s2-lite, which removes a
    deleted stream as soon as its terminal trim is durable: a query may meet it pending
    or already gone, and either is the same data loss."""
    if request.param == "pending":
        yield env
        return
    from s2_spark.testing.external import S2Lite

    with S2Lite() as lite:
        e = Env(lite.url, spark)
        yield e
        e.client.close()


def qname() -> str:
    return f"q_{uuid.uuid4().hex[:10]}"


def failure_of(q: Any) -> str:
    """The text of the failure that ended `q` (waits for it)."""
    from pyspark.errors import StreamingQueryException

    with pytest.raises(StreamingQueryException) as info:
        q.awaitTermination(120)
    text = str(info.value)
    assert SECRET not in text
    return text


def test_a_stream_deleted_under_a_query_fails_it_as_data_loss(any_env: Env) -> None:
    """failOnDataLoss=true (the default): the query fails with DataLossError naming the
    stream, not with a conflict."""
    a, b = f"a-{uuid.uuid4().hex[:6]}", f"b-{uuid.uuid4().hex[:6]}"
    any_env.fill(a, [b"a0", b"a1"], create=True)
    any_env.fill(b, [b"b0"], create=True)
    name = qname()
    q = any_env.start(name, streams=f"{a},{b}")
    try:
        q.processAllAvailable()
        assert any_env.rows(name) == {(a, b"a0"), (a, b"a1"), (b, b"b0")}
        any_env.delete(a)
        any_env.fill(b, [b"b1"])
        text = failure_of(q)
        assert "DataLossError" in text and "Data loss" in text and f"stream {a!r}" in text
        assert "conflict" not in text.lower() and "failOnDataLoss=false" in text
    finally:
        q.stop()


def test_with_fail_on_data_loss_false_the_query_goes_on(any_env: Env) -> None:
    """failOnDataLoss=false: the deleted stream is logged and left; the others go on."""
    prefix = f"p-{uuid.uuid4().hex[:6]}/"
    a, b = prefix + "a", prefix + "b"
    any_env.fill(a, [b"a0"], create=True)
    any_env.fill(b, [b"b0"], create=True)
    name = qname()
    q = any_env.start(name, streamPrefix=prefix, failOnDataLoss="false")
    try:
        q.processAllAvailable()
        assert any_env.rows(name) == {(a, b"a0"), (b, b"b0")}
        any_env.delete(a)
        any_env.fill(b, [b"b1"])
        wait_for(lambda: (b, b"b1") in any_env.rows(name), "b's record after a's deletion")
        any_env.fill(b, [b"b2"])
        q.processAllAvailable()
        assert q.isActive and q.exception() is None
        assert any_env.rows(name) == {(a, b"a0"), (b, b"b0"), (b, b"b1"), (b, b"b2")}
    finally:
        q.stop()


def test_a_batch_read_of_a_stream_being_deleted_says_so(env: Env) -> None:
    gone = f"gone-{uuid.uuid4().hex[:6]}"
    env.fill(gone, [b"x"], create=True)
    env.delete(gone)
    df = env.spark.read.format("s2").options(**env.options(stream=gone)).load()
    with pytest.raises(Exception) as info:
        df.collect()
    text = str(info.value)
    assert f"stream {gone!r} in basin {env.basin!r} is being deleted" in text
    assert SECRET not in text
    # Under a prefix it is not listed any more: nothing to read, no failure.
    listed = env.spark.read.format("s2").options(**env.options(streamPrefix=gone)).load()
    assert listed.count() == 0


@pytest.mark.parametrize("create", ["false", "true"])
def test_a_writer_to_a_stream_being_deleted_names_it(env: Env, create: str) -> None:
    target = f"out-{uuid.uuid4().hex[:6]}"
    env.fill(target, [b"old"], create=True)
    env.delete(target)
    df = env.spark.createDataFrame([(b"new",)], "body binary")
    with pytest.raises(Exception) as fixed:
        df.write.format("s2").options(**env.options(stream=target, createStreams=create)) \
            .mode("append").save()
    routed = env.spark.createDataFrame([(b"new", target)], "body binary, stream string")
    with pytest.raises(Exception) as by_column:  # found in the task, by its append
        routed.write.format("s2").options(**env.options(createStreams=create)) \
            .mode("append").save()
    for info in (fixed, by_column):
        text = str(info.value)
        assert f"cannot write to stream {target!r} in basin {env.basin!r}" in text
        assert "it is being deleted" in text and "stream_deletion_pending" in text
        assert "Write to another stream, or wait until the deletion is done" in text
        assert ("createStreams=true creates it anew" in text) is (create == "true")
        assert SECRET not in text
