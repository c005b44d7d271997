"""The `s2` Spark writer end to end: real queries on local[2] against the local S2 server.

Batch and streaming writes with every input column combination, routing, copying a stream
with the `s2` reader, size and existence errors, and exactly-once under faults: a task that
fails after part of its batch was appended, and a query process killed (SIGKILL) mid-batch
and restarted from its checkpoint. Reading back always asserts exact records.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import itertools
import os
import sys
import tempfile
import textwrap
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from _child import kill_at_marker
from _records import Rec, data_records
from _s2_target import s2_config, token
from _versions import limit, needs_admission_control

from s2_spark.s2 import AppendRecord, S2Client

pytestmark = pytest.mark.spark

SECRET = token("tok-SECRET-w41d")  # passed as accessToken; must never show up in errors
T0 = (int(time.time()) - 3600) * 1000
UTC = dt.UTC


class Env:
    """The shared server, a fresh basin per module, and read-back helpers."""

    def __init__(self, url: str, spark: Any) -> None:
        self.url = url
        self.spark = spark
        self.client = S2Client(s2_config(url))
        self.basin = f"spark-write-{uuid.uuid4().hex[:10]}"
        self.client.create_basin(self.basin)
        self.tmp = Path(tempfile.mkdtemp(prefix="s2-spark-writer-"))

    def b(self, basin: str | None = None) -> Any:
        return self.client.basin(basin or self.basin)

    def new_stream(self, prefix: str, *, create: bool = True, basin: str | None = None) -> str:
        name = f"{prefix}-{uuid.uuid4().hex[:8]}"
        if create:
            self.b(basin).create_stream(name)
        return name

    def options(self, **extra: str) -> dict[str, str]:
        return {"endpoint": self.url, "basin": self.basin, "accessToken": SECRET, **extra}

    def records(self, stream: str, basin: str | None = None) -> list[Rec]:
        """Every data record of `stream` (command records left out), in order."""
        return data_records(self.b(basin).stream(stream))

    def bodies(self, stream: str, basin: str | None = None) -> list[bytes]:
        return [b for b, _, _ in self.records(stream, basin)]

    def fill(self, stream: str, count: int, prefix: str = "src") -> list[Rec]:
        recs = [
            AppendRecord(f"{prefix}{i}".encode(), [(b"i", str(i).encode())], T0 + i)
            for i in range(count)
        ]
        self.b().stream(stream).append_many(recs)
        return [(r.body, list(r.headers), r.timestamp or 0) for r in recs]

    def checkpoint(self) -> str:
        return str(self.tmp / f"ckpt-{uuid.uuid4().hex[:8]}")


@pytest.fixture(scope="module")
def env(target_s2: Any, spark: Any) -> Iterator[Env]:
    # No register(): installing s2-spark registers format s2 (and on PySpark 4.0 a
    # second registration under the same name is an error).
    e = Env(target_s2.url, spark)
    yield e
    e.client.close()


def save(df: Any, options: dict[str, str]) -> None:
    """A batch write (Python data sources take save modes append and overwrite only)."""
    df.write.format("s2").options(**options).mode("append").save()


def run_stream(df: Any, options: dict[str, str], checkpoint: str, **extra: str) -> Any:
    """Run a streaming write with trigger(availableNow) to the end; return the query."""
    q = (
        df.writeStream.format("s2")
        .options(**options, **extra)
        .option("checkpointLocation", checkpoint)
        .trigger(availableNow=True)
        .start()
    )
    from pyspark.errors import StreamingQueryException

    with contextlib.suppress(StreamingQueryException):  # the caller checks q.exception()
        assert q.awaitTermination(150), "streaming write did not finish"
    return q


# -- input columns ------------------------------------------------------------------------

HEADER_KINDS = ("none", "array", "map")


def _frame(
    spark: Any, n: int, body_string: bool, headers: str, with_ts: bool, streams: list[str] | None
) -> tuple[Any, list[tuple[str | None, Rec]]]:
    """A DataFrame with the chosen columns, and the (stream, record) each row must become."""
    from pyspark.sql.types import (
        ArrayType,
        BinaryType,
        MapType,
        StringType,
        StructField,
        StructType,
        TimestampType,
    )

    fields = [StructField("body", StringType() if body_string else BinaryType())]
    if headers == "array":
        fields.append(
            StructField(
                "headers",
                ArrayType(
                    StructType(
                        [StructField("name", BinaryType()), StructField("value", BinaryType())]
                    )
                ),
            )
        )
    elif headers == "map":
        fields.append(StructField("headers", MapType(StringType(), StringType())))
    if with_ts:
        fields.append(StructField("timestamp", TimestampType()))
    if streams:
        fields.append(StructField("stream", StringType()))
    rows = []
    expected: list[tuple[str | None, Rec]] = []
    for i in range(n):
        body = f"row{i}"
        row: list[Any] = [body if body_string else body.encode()]
        hdrs: list[tuple[bytes, bytes]] = []
        if headers == "array":
            row.append([(b"k", str(i).encode()), (b"e", b"")])
            hdrs = [(b"k", str(i).encode()), (b"e", b"")]
        elif headers == "map":
            row.append({"a": str(i), "b": "x"})
            hdrs = [(b"a", str(i).encode()), (b"b", b"x")]
        ts = T0 + 10 * i
        if with_ts:
            row.append(dt.datetime.fromtimestamp(ts / 1000, UTC))
        target = streams[i % len(streams)] if streams else None
        if streams:
            row.append(target)
        rows.append(tuple(row))
        expected.append((target, (body.encode(), hdrs, ts if with_ts else -1)))
    return spark.createDataFrame(rows, StructType(fields)).coalesce(1), expected


def _check(env: Env, expected: list[tuple[str | None, Rec]], default: str) -> None:
    by_stream: dict[str, list[Rec]] = {}
    for target, rec in expected:
        by_stream.setdefault(target or default, []).append(rec)
    for stream, want in by_stream.items():
        got = env.records(stream)
        assert [(b, h) for b, h, _ in got] == [(b, h) for b, h, _ in want], stream
        for (_, _, gts), (_, _, wts) in zip(got, want, strict=True):
            assert wts == -1 or gts == wts


COMBOS = list(itertools.product(HEADER_KINDS, (False, True), ("option", "column")))


@pytest.mark.parametrize(("headers", "with_ts", "routing"), COMBOS)
def test_batch_write_columns(env: Env, headers: str, with_ts: bool, routing: str) -> None:
    body_string = COMBOS.index((headers, with_ts, routing)) % 2 == 1
    fixed = env.new_stream("fixed")
    routed = [env.new_stream("ra"), env.new_stream("rb")] if routing == "column" else None
    df, expected = _frame(env.spark, 12, body_string, headers, with_ts, routed)
    opts = env.options() if routing == "column" else env.options(stream=fixed)
    save(df, opts)
    _check(env, expected, fixed)


# Streaming: the same writer code path as batch (Arrow batches per task); each kind of every
# column is covered, through the s2 reader as a replayable source.
STREAM_COMBOS = [
    ("array", True, "column"),
    ("map", False, "option"),
    ("none", True, "option"),
    ("none", False, "column"),
]


@pytest.mark.parametrize(("headers", "with_ts", "routing"), STREAM_COMBOS)
def test_streaming_write_columns(env: Env, headers: str, with_ts: bool, routing: str) -> None:
    src = env.new_stream("src")
    source = env.fill(src, 30)
    out = env.new_stream("out")
    routed = [env.new_stream("sa"), env.new_stream("sb")] if routing == "column" else None
    cols = ["CAST(body AS STRING) AS body" if headers == "map" else "body"]
    if headers == "array":
        cols.append("headers")
    elif headers == "map":
        cols.append(
            "map_from_entries(transform(headers, h -> struct(CAST(h.name AS STRING), "
            "CAST(h.value AS STRING)))) AS headers"
        )
    if with_ts:
        cols.append("timestamp")
    if routed:
        cols.append(f"IF(seq_num % 2 = 0, '{routed[0]}', '{routed[1]}') AS stream")
    df = (
        env.spark.readStream.format("s2")
        .options(**env.options(stream=src))
        .load()
        .selectExpr(*cols)
    )
    opts = env.options() if routed else env.options(stream=out)
    q = run_stream(df, opts, env.checkpoint())
    assert q.exception() is None, str(q.exception())
    expected = []
    for i, (body, hdrs, ts) in enumerate(source):
        h = hdrs if headers != "none" else []
        target = (routed[i % 2]) if routed else None
        expected.append((target, (body, h, ts if with_ts else -1)))
    _check(env, expected, out)


def test_copy_streams_between_basins(env: Env) -> None:
    """readStream s2 -> writeStream s2 unchanged: the `stream` column routes each record to
    the stream of the same name in another basin; seq_num is ignored."""
    a, b = env.new_stream("copy-a"), env.new_stream("copy-b")
    ra, rb = env.fill(a, 1500, "a"), env.fill(b, 700, "b")
    target = f"spark-copy-{uuid.uuid4().hex[:10]}"
    env.client.create_basin(target)
    src = (
        env.spark.readStream.format("s2")
        .options(**env.options(streams=f"{a},{b}", **limit(800)))
        .load()
    )
    q = run_stream(
        src, {**env.options(), "basin": target, "createStreams": "true"}, env.checkpoint()
    )
    assert q.exception() is None, str(q.exception())
    assert env.records(a, target) == ra
    assert env.records(b, target) == rb


def test_routing_two_partitions_many_streams(env: Env) -> None:
    """Two tasks both route rows to three streams at once: every row once, each task's rows
    in their input order."""
    from pyspark.sql.types import BinaryType, StringType, StructField, StructType

    names = [env.new_stream(f"m{k}") for k in range(3)]
    n = 3000
    rows = [(f"{i}".encode(), names[(i // 7) % 3]) for i in range(n)]
    schema = StructType([StructField("body", BinaryType()), StructField("stream", StringType())])
    df = env.spark.createDataFrame(env.spark.sparkContext.parallelize(rows, 2), schema)
    save(df, env.options(maxRecordsPerAppend="50"))
    part_of = {int(r["body"]): r["p"]
               for r in df.selectExpr("body", "spark_partition_id() AS p").collect()}
    assert set(part_of.values()) == {0, 1}
    for k, name in enumerate(names):
        got = [int(b) for b in env.bodies(name)]
        assert sorted(got) == [i for i in range(n) if (i // 7) % 3 == k]
        for p in (0, 1):
            mine = [i for i in got if part_of[i] == p]
            assert mine == sorted(mine)


# -- errors before any task runs ------------------------------------------------------------


def _error_text(fn: Callable[[], Any]) -> str:
    with pytest.raises(Exception) as info:
        fn()
    text = str(info.value)
    assert SECRET not in text
    return text


def test_bad_columns(env: Env) -> None:
    out = env.new_stream("bad")
    opts = env.options(stream=out)
    extra = env.spark.createDataFrame([(b"x", 1)], "body binary, other int")
    text = _error_text(lambda: save(extra, opts))
    assert "column other is not accepted" in text and "Accepted columns: body" in text
    nobody = env.spark.createDataFrame([("x",)], "stream string")
    text = _error_text(lambda: save(nobody, opts))
    assert "no column body" in text and "Accepted columns" in text
    badtype = env.spark.createDataFrame([(1,)], "body int")
    text = _error_text(lambda: save(badtype, opts))
    assert "column body has type int" in text
    stream_df = (
        env.spark.readStream.format("rate")
        .load()
        .selectExpr("CAST(value AS STRING) AS body", "value")
    )
    text = _error_text(
        lambda: (
            stream_df.writeStream.format("s2")
            .options(**opts)
            .option("checkpointLocation", env.checkpoint())
            .start()
            .awaitTermination(60)
        )
    )
    assert "column value is not accepted" in text
    assert env.bodies(out) == []


def test_missing_stream(env: Env) -> None:
    df = env.spark.createDataFrame([(b"a",), (b"b",)], "body binary").coalesce(1)
    missing = env.new_stream("missing", create=False)
    text = _error_text(lambda: save(df, env.options(stream=missing)))
    assert f"stream '{missing}' does not exist" in text and "createStreams=true" in text
    save(df, env.options(stream=missing, createStreams="true"))
    assert env.bodies(missing) == [b"a", b"b"]
    # Routed by column: the stream is found missing in the task.
    routed = env.new_stream("missing-r", create=False)
    rdf = env.spark.createDataFrame([(b"c", routed)], "body binary, stream string")
    text = _error_text(lambda: save(rdf, env.options()))
    assert f"stream {routed!r}" in text and "createStreams=true" in text
    save(rdf, env.options(createStreams="true"))
    assert env.bodies(routed) == [b"c"]


def test_record_too_large(env: Env) -> None:
    out = env.new_stream("big")
    big = b"x" * (1024 * 1024)
    rows = [(b"before",), (big,), (b"after",)]
    df = env.spark.createDataFrame(rows, "body binary").coalesce(1)
    text = _error_text(lambda: save(df, env.options(stream=out)))
    assert str(len(big) + 8) in text and "1048576" in text
    assert b"after" not in env.bodies(out)
    assert len(env.bodies(out)) <= 1


# -- exactly-once under faults ----------------------------------------------------------------


def _descents(values: list[int]) -> int:
    return sum(1 for x, y in itertools.pairwise(values) if y < x)


def test_task_failure_then_restart_exactly_once(env: Env) -> None:
    """Batch 0's first task fails after 3 appends (2 tasks write one stream); the query
    fails; restarted from its checkpoint it writes each record exactly once."""
    src, out = env.new_stream("fsrc"), env.new_stream("fout")
    source = env.fill(src, 2400)
    marker = str(env.tmp / f"marker-{uuid.uuid4().hex[:6]}")
    ckpt = env.checkpoint()
    read_opts = env.options(stream=src, minPartitions="2", **limit(1200))

    def query(**extra: str) -> Any:
        df = env.spark.readStream.format("s2").options(**read_opts).load()
        return run_stream(df, env.options(stream=out, maxRecordsPerAppend="100", **extra), ckpt)

    q = query(_testFaultAfterAppends=f"fail:3:*:{marker}")
    assert q.exception() is not None and "injected failure" in str(q.exception())
    assert os.path.exists(marker)
    partial = env.bodies(out)
    assert 300 <= len(partial) < 2400
    q = query()
    assert q.exception() is None, str(q.exception())
    got = [int(b[3:]) for b in env.bodies(out)]
    assert sorted(got) == list(range(2400))
    # Each task's rows stay in order: at most one step back per micro-batch, plus one for
    # the replayed batch whose first attempt stopped half way.
    assert _descents(got) <= 3
    # Headers survive; timestamps may be raised where a later task's block came first
    # (S2 keeps a stream's timestamps monotonic).
    assert [r[:2] for r in env.records(out) if r[0] == b"src0"] == [source[0][:2]]


CHILD = textwrap.dedent("""
    import os, sys
    os.environ["PYSPARK_PYTHON"] = sys.executable
    from pyspark.sql import SparkSession
    url, basin, src, out, ckpt, fault = sys.argv[1:7]
    spark = (SparkSession.builder.master("local[2]").config("spark.ui.enabled", "false")
             .config("spark.sql.shuffle.partitions", "2").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    df = (spark.readStream.format("s2").option("endpoint", url).option("basin", basin)
          .option("stream", src).option("maxRecordsPerTrigger", "1500").load())
    w = (df.writeStream.format("s2").option("endpoint", url).option("basin", basin)
         .option("stream", out).option("maxRecordsPerAppend", "100")
         .option("checkpointLocation", ckpt).trigger(availableNow=True))
    if fault != "-":
        w = w.option("_testFaultAfterAppends", fault)
    q = w.start()
    q.awaitTermination()
""")


@needs_admission_control
def test_killed_query_restarts_exactly_once(env: Env) -> None:
    """SIGKILL the query's process (driver, JVM and workers) in the middle of micro-batch 1,
    after part of it was appended; restart from the checkpoint; every record once, in
    order."""
    src, out = env.new_stream("ksrc"), env.new_stream("kout")
    source = env.fill(src, 4500)
    ckpt = env.checkpoint()
    script = env.tmp / "child.py"
    script.write_text(CHILD)
    marker = str(env.tmp / f"kill-{uuid.uuid4().hex[:6]}")
    args = [sys.executable, str(script), env.url, env.basin, src, out, ckpt]
    kill_at_marker([*args, f"hang:5:1:{marker}"], marker)
    partial = env.bodies(out)
    # Batch 0 (15 appends) is complete, batch 1 stopped after 5 of its appends.
    assert len(partial) == 2000
    # Restart from the same checkpoint (in this test process's SparkSession).
    df = (env.spark.readStream.format("s2")
          .options(**env.options(stream=src, maxRecordsPerTrigger="1500")).load())
    q = run_stream(df, env.options(stream=out, maxRecordsPerAppend="100"), ckpt)
    assert q.exception() is None, str(q.exception())
    assert env.records(out) == source


def test_row_fallback_matches_arrow_input() -> None:
    """Spark 4.0 has no Arrow stream writer: rows are turned into the same Arrow columns."""
    from pyspark.sql import Row

    from s2_spark.backends.s2.sink import SinkSettings
    from s2_spark.spark.s2._writer import rows_to_batches
    from s2_spark.spark.s2._writer_options import InputLayout

    layout = InputLayout(body=0, headers=1, timestamp=2, stream=3,
                         names=("body", "headers", "timestamp", "stream"))
    when = dt.datetime.fromtimestamp(T0 / 1000, UTC)
    rows = [Row(body=bytearray(b"a"), headers=[Row(name=b"k", value=b"v")], timestamp=when,
                stream="s1"),
            Row(body="b", headers=None, timestamp=None, stream="s2")]
    (batch,) = list(rows_to_batches(iter(rows), layout))
    assert batch.column(0).to_pylist() == [b"a", b"b"]
    assert batch.column(1).to_pylist() == [[{"name": b"k", "value": b"v"}], None]
    assert batch.column(2).to_pylist() == [T0, None]
    assert batch.column(3).to_pylist() == ["s1", "s2"]
    assert SinkSettings().max_records == 998
