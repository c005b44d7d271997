"""The `durable-streams` Spark writer end to end: real queries on local[2] against the
Durable Streams reference server (npm), no register() call (the format is auto-registered).

Exact rows for JSON and byte streams (batch and streaming, fixed target and routed rows),
the reader's rows written back unchanged, closeStreamOnFinish, every bad option failing
before any task runs, and exactly-once under faults: a task that fails after part of its
micro-batch was appended, a query process killed (SIGKILL) mid-batch and restarted from
its checkpoint, and a zombie attempt of an older micro-batch fenced out by the server.
"""

from __future__ import annotations

import contextlib
import json
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
from test_durable_sink import data, messages

from s2_spark.durable import DurableStreamsClient
from s2_spark.spark._compat import HAS_STREAM_ARROW_WRITER

pytestmark = pytest.mark.spark

SECRET = "tok-SECRET-d7e2"  # passed as bearerToken; must never show up in errors
HEADER_SECRET = "hdr-SECRET-91af"  # a secretHeaders value; the same


class Env:
    """The shared reference server, read-back helpers, a temp folder for checkpoints."""

    def __init__(self, url: str, spark: Any) -> None:
        self.url = url
        self.spark = spark
        self.client = DurableStreamsClient(base_url=url)
        self.tmp = Path(tempfile.mkdtemp(prefix="ds-spark-writer-"))

    def new_stream(self, prefix: str, content_type: str | None = "application/json") -> str:
        """A fresh stream path (created unless content_type is None)."""
        path = f"/w/{prefix}-{uuid.uuid4().hex[:8]}"
        if content_type is not None:
            self.client.stream(path).create(content_type)
        return path

    def options(self, **extra: str) -> dict[str, str]:
        return {
            "baseUrl": self.url,
            "bearerToken": SECRET,
            "secretHeaders": json.dumps({"x-api-key": HEADER_SECRET}),
            **extra,
        }

    def messages(self, path: str) -> list[str]:
        return messages(self.client, path)

    def data(self, path: str) -> bytes:
        return data(self.client, path)

    def checkpoint(self) -> str:
        return str(self.tmp / f"ckpt-{uuid.uuid4().hex[:8]}")

    def text_files(self, lines: list[list[str]]) -> str:
        """A folder of text files (one per list, modification times in list order)."""
        folder = self.tmp / f"src-{uuid.uuid4().hex[:8]}"
        folder.mkdir()
        t0 = time.time() - 1000
        for i, part in enumerate(lines):
            f = folder / f"part-{i:03d}.txt"
            f.write_text("".join(line + "\n" for line in part))
            os.utime(f, (t0 + i, t0 + i))
        return str(folder)


@pytest.fixture(scope="module")
def env(ds_server: Any, spark: Any) -> Iterator[Env]:
    e = Env(ds_server.url, spark)
    yield e
    e.client.close()


def save(df: Any, options: dict[str, str], mode: str = "append") -> None:
    df.write.format("durable-streams").options(**options).mode(mode).save()


def run_stream(df: Any, options: dict[str, str], checkpoint: str) -> Any:
    """Run a streaming write with trigger(availableNow) to the end; return the query."""
    from pyspark.errors import StreamingQueryException

    q = (
        df.writeStream.format("durable-streams")
        .options(**options)
        .option("checkpointLocation", checkpoint)
        .trigger(availableNow=True)
        .start()
    )
    with contextlib.suppress(StreamingQueryException):  # the caller checks q.exception()
        assert q.awaitTermination(150), "streaming write did not finish"
    return q


def error_text(fn: Callable[[], Any]) -> str:
    with pytest.raises(Exception) as info:
        fn()
    text = str(info.value)
    assert SECRET not in text and HEADER_SECRET not in text
    return text


def jsons(n: int, start: int = 0) -> list[str]:
    return [json.dumps({"i": i, "s": f"v{i}"}, separators=(",", ":")) for i in range(start, n)]


# -- exact rows -------------------------------------------------------------------------------


def test_batch_write_json_stream(env: Env) -> None:
    out = env.new_stream("bj")
    rows = jsons(3000)
    # value: one JSON text per row; one partition, small requests: exact order.
    df = env.spark.createDataFrame([(v,) for v in rows], "value string").coalesce(1)
    save(df, env.options(stream=out, maxMessagesPerAppend="128"))
    assert env.messages(out) == rows
    # body (binary UTF-8 JSON text, nested arrays stay one message), 2 partitions, by url.
    out2 = env.new_stream("bj2")
    values = ['[1,[2]]', '"ünï"', "null", '{"a":[{"b":1}]}', " 7 ", *jsons(500)]
    df2 = env.spark.createDataFrame([(v.encode(),) for v in values], "body binary")
    df2 = df2.repartition(2)
    save(df2, env.options(url=env.url + out2, maxBytesPerAppend="1000"))
    got = env.messages(out2)
    assert sorted(got) == sorted(v.strip() for v in values)


def test_batch_write_byte_streams(env: Env) -> None:
    out = env.new_stream("bb", "application/octet-stream")
    chunks = [bytes([i % 256]) * (i % 50) + b"|" for i in range(2000)]
    df = env.spark.createDataFrame([(c,) for c in chunks], "body binary").coalesce(1)
    save(df, env.options(stream=out, maxBytesPerAppend="4096"))
    assert env.data(out) == b"".join(chunks)
    text = env.new_stream("bt", "text/plain")
    lines = [f"line {i}\n" for i in range(100)]
    save(env.spark.createDataFrame([(s,) for s in lines], "body string").coalesce(1),
         env.options(stream=text))
    assert env.data(text) == "".join(lines).encode()


def test_streaming_write_routes_rows_and_creates_streams(env: Env) -> None:
    """A streaming query (text files, 3 micro-batches) routing each row by a `stream`
    column (paths and URLs) into JSON streams, two of them created by the writer."""
    a, b, c = env.new_stream("ra"), env.new_stream("rb", None), env.new_stream("rc", None)
    targets = [a, b, env.url + c]
    lines = [[json.dumps({"i": i, "to": i % 3}, separators=(",", ":"))
              for i in range(k * 400, (k + 1) * 400)] for k in range(3)]
    folder = env.text_files(lines)
    routes = ", ".join(f"'{t}'" for t in targets)
    df = (
        env.spark.readStream.format("text").option("maxFilesPerTrigger", "1").load(folder)
        .selectExpr("value", f"element_at(array({routes}), "
                    "CAST(get_json_object(value, '$.to') AS INT) + 1) AS stream")
    )
    q = run_stream(df, env.options(createStreams="true", maxMessagesPerAppend="50"),
                   env.checkpoint())
    assert q.exception() is None, str(q.exception())
    every = [line for part in lines for line in part]
    for k, path in enumerate((a, b, c)):
        assert env.messages(path) == [v for v in every if json.loads(v)["to"] == k]
    assert env.client.stream(b).head().content_type == "application/json"


def test_reader_rows_write_back_unchanged(env: Env) -> None:
    """The reader's rows (stream, offset, index, value) written as they are: the `stream`
    column is overridden by option url, offset and index are ignored."""
    src, dst = env.new_stream("cs"), env.new_stream("cd")
    rows = jsons(700)
    env.client.stream(src).append_json([json.loads(v) for v in rows])
    df = env.spark.read.format("durable-streams").options(**env.options(stream=src)).load()
    assert df.columns == ["stream", "offset", "index", "value"]
    save(df.coalesce(1), env.options(url=env.url + dst))
    assert env.messages(dst) == env.messages(src)
    bsrc = env.new_stream("cbs", "application/octet-stream")
    bdst = env.new_stream("cbd", "application/octet-stream")
    blob = bytes(range(256)) * 40
    for i in range(0, len(blob), 1000):
        env.client.stream(bsrc).append(blob[i:i + 1000])
    bdf = env.spark.read.format("durable-streams").options(**env.options(stream=bsrc)).load()
    save(bdf.coalesce(1), env.options(stream=bdst))
    assert env.data(bdst) == blob


def test_close_stream_on_finish(env: Env) -> None:
    out = env.new_stream("close")
    routed = env.new_stream("close-r", "text/plain")
    df = env.spark.createDataFrame([(v,) for v in jsons(10)], "value string").coalesce(1)
    save(df, env.options(stream=out, closeStreamOnFinish="true"))
    assert env.client.stream(out).head().closed
    assert env.messages(out) == jsons(10)
    text = error_text(lambda: save(df, env.options(stream=out)))
    assert f"option stream: stream '{out}' is closed" in text
    rdf = env.spark.createDataFrame([("x", routed), ("y", routed)], "body string, stream string")
    save(rdf.coalesce(1), env.options(closeStreamOnFinish="true"))
    assert env.client.stream(routed).head().closed and env.data(routed) == b"xy"


# -- errors before any task runs -------------------------------------------------------------


def test_bad_options_fail_before_any_task(env: Env) -> None:
    out = env.new_stream("opt")
    df = env.spark.createDataFrame([('{"a":1}',)], "value string")
    bad = {
        "url": ({"url": "/relative"}, "option url: '/relative' is not accepted"),
        "both": ({"url": env.url + out, "stream": out}, "set option url"),
        "urls": ({"urls": env.url + out}, "option urls is not supported by format "
                 "durable-streams (writing): it selects streams to read"),
        "createStreams": ({"stream": out, "createStreams": "yes"},
                          "option createStreams='yes' is not accepted"),
        "contentType": ({"stream": out, "createStreams": "true", "contentType": "json"},
                        "option contentType='json' is not accepted"),
        "contentType alone": ({"stream": out, "contentType": "text/plain"},
                              "option contentType is the content type of streams the writer "
                              "creates: it needs createStreams=true"),
        "maxMessagesPerAppend": ({"stream": out, "maxMessagesPerAppend": "0"},
                                 "option maxMessagesPerAppend='0' is not accepted"),
        "maxBytesPerAppend": ({"stream": out, "maxBytesPerAppend": "1MB"},
                              "option maxBytesPerAppend='1MB' is not accepted"),
        "closeStreamOnFinish": ({"stream": out, "closeStreamOnFinish": "1"},
                                "option closeStreamOnFinish='1' is not accepted"),
        "bearerToken": ({"stream": out, "bearerToken": " "}, "option bearerToken is not "
                        "accepted"),
        "secretHeaders": ({"stream": out, "secretHeaders": "{" + SECRET},
                          "option secretHeaders is not valid JSON"),
        "missing": ({"stream": "/w/none-" + uuid.uuid4().hex[:6]},
                    "does not exist: create it first, or set option createStreams=true"),
    }
    for name, (extra, message) in bad.items():
        opts = env.options(**extra)
        assert message in error_text(lambda o=opts: save(df, o)), name  # type: ignore[misc]
    no_base = {"bearerToken": SECRET, "stream": out}
    assert "which needs option baseUrl" in error_text(lambda: save(df, no_base))
    text = error_text(lambda: save(df, env.options(stream=out), mode="overwrite"))
    assert "save mode overwrite is not supported" in text
    # The content type of the target must fit the message column.
    bdf = env.spark.createDataFrame([(b"x",)], "value binary")
    text = error_text(lambda: save(bdf, env.options(stream=out)))
    assert f"stream '{out}' cannot take these rows" in text and "column value must be" in text
    # Streaming: closeStreamOnFinish and output mode complete fail at start().
    rate = env.spark.readStream.format("rate").load()
    sdf = rate.selectExpr("CAST(value AS STRING) AS value")

    def start(frame: Any, mode: str = "append", **extra: str) -> None:
        (frame.writeStream.format("durable-streams").options(**env.options(stream=out, **extra))
         .outputMode(mode).option("checkpointLocation", env.checkpoint()).start()
         .awaitTermination(60))

    text = error_text(lambda: start(sdf, closeStreamOnFinish="true"))
    assert "option closeStreamOnFinish=true applies to batch writes" in text
    counts = rate.groupBy().count().selectExpr("CAST(count AS STRING) AS value")
    assert "output mode complete is not supported" in error_text(lambda: start(counts, "complete"))
    assert env.messages(out) == []


def test_bad_columns_fail_before_any_task(env: Env) -> None:
    out = env.new_stream("cols")
    opts = env.options(stream=out)
    cases = {
        "other": (env.spark.createDataFrame([("1", 1)], "value string, other int"),
                  "column other is not accepted by format durable-streams"),
        "neither": (env.spark.createDataFrame([("x",)], "stream string"),
                    "the input has no column value or body"),
        "both": (env.spark.createDataFrame([("1", "2")], "value string, body string"),
                 "the input has both columns value and body"),
        "type": (env.spark.createDataFrame([(1,)], "value int"),
                 "column value has type int"),
        "route type": (env.spark.createDataFrame([("1", 1)], "value string, stream int"),
                       "column stream has type int"),
    }
    for name, (df, message) in cases.items():
        text = error_text(lambda d=df: save(d, opts))  # type: ignore[misc]
        assert message in text and "Accepted columns" in text, name
    routes = env.spark.createDataFrame([("1", out, out)], "value string, stream string, url string")
    text = error_text(lambda: save(routes, env.options()))
    assert "both columns stream and url" in text
    text = error_text(lambda: save(env.spark.createDataFrame([("1",)], "value string"),
                                   env.options()))
    assert "no target stream" in text
    assert env.messages(out) == []


def test_bad_rows_fail_the_task_naming_the_row(env: Env) -> None:
    """In a Spark task: a row that is two JSON values, a row routed to a missing stream."""
    out = env.new_stream("rows")
    df = env.spark.createDataFrame([('{"ok":1}',), ("1,2",)], "value string").coalesce(1)
    text = error_text(lambda: save(df, env.options(stream=out)))
    assert f"row 1 of this task's rows for stream '{out}' is not one JSON value ('1,2')" in text
    missing = "/w/gone-" + uuid.uuid4().hex[:6]
    rdf = env.spark.createDataFrame([("1", missing)], "value string, stream string")
    text = error_text(lambda: save(rdf, env.options()))
    assert f"stream '{missing}' does not exist: create it first, or set option createS" in text
    assert env.messages(out) == []


# -- exactly-once under faults ----------------------------------------------------------------


def test_task_failure_then_restart_exactly_once(env: Env) -> None:
    """Micro-batch 1's task fails after 4 acknowledged appends; the query fails; restarted
    from its checkpoint it resends them (the server answers duplicates) and writes the rest:
    every message exactly once, in order."""
    out = env.new_stream("fail")
    every = jsons(3000)
    folder = env.text_files([every[:1000], every[1000:2000], every[2000:]])
    ckpt = env.checkpoint()
    marker = str(env.tmp / f"marker-{uuid.uuid4().hex[:6]}")

    def query(**extra: str) -> Any:
        df = env.spark.readStream.format("text").option("maxFilesPerTrigger", "1").load(folder)
        return run_stream(df, env.options(stream=out, maxMessagesPerAppend="100", **extra),
                          ckpt)

    q = query(_testFaultAfterAppends=f"fail:4:1:{marker}")
    assert q.exception() is not None and "injected failure" in str(q.exception())
    assert env.messages(out) == every[:1400]
    q = query()
    assert q.exception() is None, str(q.exception())
    assert env.messages(out) == every


CHILD = textwrap.dedent("""
    import os, sys
    os.environ["PYSPARK_PYTHON"] = sys.executable
    from pyspark.sql import SparkSession
    url, folder, out, ckpt, fault = sys.argv[1:6]
    spark = (SparkSession.builder.master("local[2]").config("spark.ui.enabled", "false")
             .config("spark.sql.shuffle.partitions", "2").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    df = spark.readStream.format("text").option("maxFilesPerTrigger", "1").load(folder)
    w = (df.writeStream.format("durable-streams").option("baseUrl", url)
         .option("stream", out).option("maxMessagesPerAppend", "100")
         .option("checkpointLocation", ckpt).trigger(availableNow=True))
    if fault != "-":
        w = w.option("_testFaultAfterAppends", fault)
    w.start().awaitTermination()
""")


def test_killed_query_restarts_exactly_once(env: Env) -> None:
    """SIGKILL the query's process (driver, JVM and workers) in the middle of micro-batch 1,
    after 5 of its appends were acknowledged; restart from the checkpoint: every message
    once, in order."""
    out = env.new_stream("kill")
    every = jsons(4500)
    folder = env.text_files([every[:1500], every[1500:3000], every[3000:]])
    ckpt = env.checkpoint()
    script = env.tmp / "child.py"
    script.write_text(CHILD)
    marker = str(env.tmp / f"kill-{uuid.uuid4().hex[:6]}")
    kill_at_marker(
        [sys.executable, str(script), env.url, folder, out, ckpt, f"hang:5:1:{marker}"], marker
    )
    # Batch 0 is complete; batch 1 stopped after 5 acknowledged appends of 100.
    assert env.messages(out) == every[:2000]
    df = env.spark.readStream.format("text").option("maxFilesPerTrigger", "1").load(folder)
    q = run_stream(df, env.options(stream=out, maxMessagesPerAppend="100"), ckpt)
    assert q.exception() is None, str(q.exception())
    assert env.messages(out) == every


def test_zombie_of_an_older_micro_batch_is_fenced(env: Env) -> None:
    """After micro-batches 0-2 of a query wrote, a task still running micro-batch 0 (a
    zombie) is rejected by the server (stale epoch) and stops with a clear error; a late
    attempt at the newest micro-batch only repeats what is there (duplicates)."""
    from pyspark.sql.types import StringType, StructField, StructType

    from s2_spark.spark.durable.source import DURABLE_WRITE_FORMAT
    from s2_spark.spark.writer import WriteCommitMessage as DurableCommitMessage
    from s2_spark.spark.writer import stream_writer

    out = env.new_stream("zombie")
    every = jsons(600)
    folder = env.text_files([every[:200], every[200:400], every[400:]])
    df = env.spark.readStream.format("text").option("maxFilesPerTrigger", "1").load(folder)
    q = run_stream(df, env.options(stream=out), env.checkpoint())
    assert q.exception() is None, str(q.exception())
    assert env.messages(out) == every
    schema = StructType([StructField("value", StringType())])
    writer = stream_writer(DURABLE_WRITE_FORMAT, env.options(stream=out), schema, False)
    for shown in (repr(writer), repr(writer.options)):  # type: ignore[attr-defined]
        assert SECRET not in shown and HEADER_SECRET not in shown and "x-api-key" in shown
    sc = env.spark.sparkContext

    def attempt(batch: int, part: list[str]) -> Any:
        """Run the writer in a real Spark task as an attempt at micro-batch `batch`."""
        import pyarrow as pa

        arrow_input = HAS_STREAM_ARROW_WRITER  # captured by value: workers run `task`

        def task(_: Any) -> Iterator[Any]:
            # What Spark hands this writer: Arrow batches from 4.1, Rows on 4.0.
            if arrow_input:
                data: list[Any] = [pa.RecordBatch.from_pydict({"value": pa.array(part)})]
            else:
                from pyspark.sql import Row

                data = [Row(value=v) for v in part]
            yield writer.write(iter(data))

        sc.setLocalProperty("sql.streaming.queryId", str(q.id))
        sc.setLocalProperty("streaming.sql.batchId", str(batch))
        try:
            return sc.parallelize([0], 1).mapPartitions(task).collect()[0]
        finally:
            sc.setLocalProperty("sql.streaming.queryId", None)  # type: ignore[arg-type]
            sc.setLocalProperty("streaming.sql.batchId", None)  # type: ignore[arg-type]

    text = error_text(lambda: attempt(0, every[:200]))
    assert "WriterFencedError" in text
    assert (f"stream '{out}': this attempt of micro-batch 0 (partition 0, attempt 0) is stale:"
            f" a newer micro-batch (2) owns producer 'spark-{q.id}-p0'") in text
    late = attempt(2, every[400:])
    assert isinstance(late, DurableCommitMessage)
    assert [(r.rows, r.appends, r.duplicates) for r in late.results] == [(200, 1, 1)]
    assert env.messages(out) == every


def test_row_fallback_matches_arrow_input() -> None:
    """Spark 4.0 has no Arrow stream writer: rows are turned into the same Arrow columns."""
    from pyspark.sql import Row

    from s2_spark.backends.durable.sink import Payload
    from s2_spark.spark.durable._writer import rows_to_batches
    from s2_spark.spark.durable._writer_options import DurableInputLayout

    layout = DurableInputLayout(payload=2, kind=Payload("body", False), route=0,
                                route_column="stream", names=("stream", "offset", "body"))
    rows = [Row(stream="/a", offset="x", body=bytearray(b"1")), Row(stream="/b", offset=None,
                                                                    body="[2]")]
    (batch,) = list(rows_to_batches(iter(rows), layout))
    assert batch.column(2).to_pylist() == [b"1", b"[2]"]
    assert batch.column(0).to_pylist() == ["/a", "/b"]
