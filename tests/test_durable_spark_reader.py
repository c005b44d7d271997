"""`format("durable-streams")` reads end to end: real queries on local[2] against the real
reference server (npm), with real checkpoints.

Messages of the JSON streams here are `{"n": i}` with i counting from 0 in append order, so
the rows a micro-batch must hold follow from its offsets: a position `{offset, skip}` lies
after message n, where n counts the messages before `offset` and adds `skip`
(`Env.message_index`).
"""

from __future__ import annotations

import json
import shutil
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from _versions import needs_admission_control, plan_all_available, progress_offsets
from _waiting import wait_for
from durable_testbed import DurableServer

from s2_spark.durable import DurableStreamsClient
from s2_spark.spark._compat import HAS_ADMISSION_CONTROL

pytestmark = pytest.mark.spark

SECRET = "tok-DS-SECRET-91c2"
HEADER_SECRET = "hdr-DS-SECRET-55aa"


def msg(i: int) -> str:
    return json.dumps({"n": i}, separators=(",", ":"))


class Env:
    """A base URL on a reference server, helpers to fill streams and read them."""

    def __init__(self, url: str, spark: Any) -> None:
        self.url = url
        self.spark = spark
        self.client = DurableStreamsClient(base_url=url)
        self.tmp = Path(tempfile.mkdtemp(prefix="ds-spark-reader-"))

    def new_stream(self, content_type: str = "application/json") -> str:
        path = f"/reader/{uuid.uuid4().hex[:12]}"
        self.client.stream(path).create(content_type)
        return path

    def message_index(self, path: str, pos: dict[str, Any]) -> int:
        """Messages of `path` before position `pos`: all of them, less those from its
        offset on, plus its skip (the stream must not grow meanwhile)."""
        def count(offset: str) -> int:
            with self.client.stream(path).read_pieces(offset) as pieces:
                return sum(p.units for p in pieces)

        return count("-1") - count(pos["offset"]) + int(pos["skip"])

    def append(self, path: str, first: int, count: int) -> None:
        self.client.stream(path).append_json([{"n": i} for i in range(first, first + count)])

    def options(self, **extra: str) -> dict[str, str]:
        return {
            "baseUrl": self.url,
            "bearerToken": SECRET,
            "secretHeaders": json.dumps({"x-api-key": HEADER_SECRET}),
            **extra,
        }

    def read(self, **opts: str) -> Any:
        return self.spark.read.format("durable-streams").options(**self.options(**opts)).load()

    def read_stream(self, **opts: str) -> Any:
        return (
            self.spark.readStream.format("durable-streams").options(**self.options(**opts)).load()
        )

    def checkpoint(self) -> str:
        return str(self.tmp / f"ckpt-{uuid.uuid4().hex[:8]}")


@pytest.fixture(scope="module")
def env(ds_server: Any, spark: Any) -> Iterator[Env]:
    e = Env(ds_server.url, spark)
    yield e
    e.client.close()
    shutil.rmtree(e.tmp, ignore_errors=True)


def rows(df: Any) -> list[tuple[str, str, int, Any]]:
    return [(r["stream"], r["offset"], r["index"], r["value"]) for r in df.collect()]


def values(df: Any) -> list[str]:
    return [r["value"] for r in df.orderBy("offset", "index").collect()]


class BatchLog:
    """foreachBatch sink keeping each micro-batch's (offset, index, value) rows in order;
    optionally failing once, after recording, in micro-batch `fail_at`."""

    def __init__(self, fail_at: int | None = None) -> None:
        self.batches: dict[int, list[tuple[str, int, Any]]] = {}
        self.fail_at = fail_at

    def __call__(self, df: Any, batch_id: int) -> None:
        self.batches[batch_id] = [(r["offset"], r["index"], r["value"]) for r in df.collect()]
        if batch_id == self.fail_at:
            self.fail_at = None
            raise RuntimeError(f"injected failure in micro-batch {batch_id} (test)")


def offsets_log(checkpoint: str) -> dict[int, dict[str, Any]]:
    """The source offsets of every planned micro-batch, from the checkpoint's offset log."""
    out = {}
    for f in (Path(checkpoint) / "offsets").iterdir():
        if f.name.isdigit():
            out[int(f.name)] = json.loads(f.read_text().strip().splitlines()[-1])
    return out


def expected_batches(
    env: Env, log: dict[int, dict[str, Any]], stream: str
) -> dict[int, list[str]]:
    """What each planned micro-batch must hold: the messages between its start and end."""
    ends = {b: env.message_index(stream, log[b][stream]) for b in log}
    return {b: [msg(n) for n in range(ends.get(b - 1, 0), ends[b])] for b in sorted(log)}


class Appender:
    """Appends {"n": i} messages in small batches from a thread until stopped."""

    def __init__(self, url: str, path: str, first: int) -> None:
        self.client = DurableStreamsClient(base_url=url)
        self.path = path
        self.next = first
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self.error: BaseException | None = None

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                s = self.client.stream(self.path, content_type="application/json")
                s.append_json([{"n": i} for i in range(self.next, self.next + 3)])
                self.next += 3
                self._stop.wait(0.02)
        except BaseException as exc:  # surfaced by stop()
            self.error = exc

    def __enter__(self) -> Appender:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(30)
        self.client.close()
        assert self.error is None, self.error


def run_batches(df: Any, sink: BatchLog, checkpoint: str, *, available_now: bool = True) -> Any:
    writer = df.writeStream.foreachBatch(sink).option("checkpointLocation", checkpoint)
    if available_now:
        writer = writer.trigger(availableNow=True)
    return writer.start()


def await_failure(q: Any) -> str:
    with pytest.raises(Exception) as info:
        q.awaitTermination(180)
    return str(info.value)


# -- exact rows --------------------------------------------------------------------------


def test_batch_read_json_exact_rows_and_bounds(env: Env) -> None:
    path = env.new_stream()
    special = [{"s": "ünï \"q\" ,]"}, [1, [2, {"x": None}]], "text", 3.5, True]
    env.client.stream(path).append_json(special)
    mid = env.client.stream(path).head().next_offset
    env.append(path, 0, 3)
    texts = [json.dumps(v, separators=(",", ":"), ensure_ascii=False) for v in special]
    texts += [msg(i) for i in range(3)]

    df = env.read(stream=path)
    assert df.schema.simpleString() == (
        "struct<stream:string,offset:string,index:bigint,value:string>"
    )
    assert rows(df) == [(path, "-1", i, t) for i, t in enumerate(texts)]
    # From a server offset; to a server offset (located by counting, exclusive).
    assert rows(env.read(stream=path, startingPosition=json.dumps({path: mid}))) == [
        (path, mid, i, msg(i)) for i in range(3)
    ]
    assert [r[3] for r in rows(env.read(stream=path, endingPosition=json.dumps({path: mid})))] \
        == texts[:5]
    assert rows(env.read(stream=path, startingPosition="latest")) == []


def test_batch_read_byte_stream_rows_are_pieces_of_its_bytes(env: Env) -> None:
    path = env.new_stream("application/octet-stream")
    s = env.client.stream(path)
    s.append(b"head:")
    big = bytes(range(256)) * 6000  # 1.5 MB: two rows, cut at 1 MiB from the range start
    s.append(big)
    df = env.read(url=env.url + path)
    assert df.schema.simpleString() == (
        "struct<stream:string,offset:string,index:bigint,value:binary>"
    )
    got = [(r["stream"], r["offset"], r["index"], bytes(r["value"])) for r in df.collect()]
    data = b"head:" + big
    assert got == [
        (env.url + path, "-1", 0, data[: 1 << 20]),
        (env.url + path, "-1", 1 << 20, data[1 << 20 :]),
    ]


def test_many_streams_are_packed_into_few_tasks_with_exact_rows(env: Env) -> None:
    """130 small streams named in `streams`: their sizes are unknown until read, so they
    are spread over at most UNSIZED_SPREAD (64) tasks, three streams each (or fewer with
    maxStreamsPerPartition); every message once, each stream's messages in order (the
    shared layer packs and reads them concurrently)."""
    paths = [env.new_stream() for _ in range(130)]
    for k, path in enumerate(paths):
        env.append(path, 0, k % 4 + 1)
    assert env.read(streams=",".join(paths)).rdd.getNumPartitions() == 44  # ceil(130 / 3)
    df = env.read(streams=",".join(paths), maxStreamsPerPartition="2")
    assert df.rdd.getNumPartitions() == 65
    got = df.selectExpr("stream", "index", "value", "spark_partition_id() AS p").collect()
    assert sorted((r["stream"], r["index"], r["value"]) for r in got) == sorted(
        (path, i, msg(i)) for k, path in enumerate(paths) for i in range(k % 4 + 1))
    for path in paths:
        mine = [(r["p"], r["index"]) for r in got if r["stream"] == path]
        assert len({p for p, _ in mine}) == 1 and mine == sorted(mine)


def test_stream_reads_several_streams_micro_batch_by_micro_batch(env: Env) -> None:
    a, b = env.new_stream(), env.new_stream()
    env.append(a, 0, 3)
    env.append(b, 0, 2)
    ckpt = env.checkpoint()
    sink = BatchLog()
    run_batches(env.read_stream(streams=f"{a},{b}"), sink, ckpt).awaitTermination(180)
    env.append(a, 3, 2)
    q = run_batches(env.read_stream(streams=f"{a},{b}"), sink, ckpt)
    q.awaitTermination(180)
    log = offsets_log(ckpt)
    assert sorted(sink.batches) == [0, 1] == sorted(log)
    assert sorted(v for _, _, v in sink.batches[0]) == sorted(
        [msg(0), msg(1), msg(2), msg(0), msg(1)]
    )
    tail_a = log[0][a]["offset"]
    assert sink.batches[1] == [(tail_a, 0, msg(3)), (tail_a, 1, msg(4))]
    assert env.message_index(a, log[1][a]) == 5 and log[1][b] == log[0][b]
    assert progress_offsets(q.lastProgress["sources"][0]["endOffset"]) == log[1]


@needs_admission_control
def test_max_records_per_trigger_paces_exactly(env: Env) -> None:
    path = env.new_stream()
    env.append(path, 0, 7)
    ckpt = env.checkpoint()
    sink = BatchLog()
    df = env.read_stream(stream=path, maxRecordsPerTrigger="3")
    run_batches(df, sink, ckpt).awaitTermination(180)
    assert [[v for _, _, v in sink.batches[b]] for b in sorted(sink.batches)] == [
        [msg(i) for i in range(0, 3)],
        [msg(i) for i in range(3, 6)],
        [msg(6)],
    ]
    log = offsets_log(ckpt)
    assert [env.message_index(path, log[b][path]) for b in sorted(log)] == [3, 6, 7]
    assert log[2][path]["skip"] == 0  # the last micro-batch ends at the tail's offset


@needs_admission_control
def test_max_bytes_per_trigger_paces_byte_streams_exactly(env: Env) -> None:
    path = env.new_stream("application/octet-stream")
    env.client.stream(path).append(b"0123456789")
    sink = BatchLog()
    df = env.read_stream(stream=path, maxBytesPerTrigger="4")
    run_batches(df, sink, env.checkpoint()).awaitTermination(180)
    assert [sink.batches[b] for b in sorted(sink.batches)] == [
        [("-1", 0, b"0123")],
        [("-1", 4, b"4567")],
        [("-1", 8, b"89")],
    ]


# -- exact replay ------------------------------------------------------------------------


def test_replayed_micro_batch_is_identical_while_appends_continue(env: Env) -> None:
    """The query fails after a micro-batch was planned and run, before it committed; more
    messages arrive all the while; the restarted query replays the micro-batch from the
    offset log with exactly the same rows, and every micro-batch matches its offsets."""
    path = env.new_stream()
    env.append(path, 0, 5)
    ckpt = env.checkpoint()
    first = BatchLog(fail_at=2)
    with Appender(env.url, path, 5):
        q = run_batches(env.read_stream(stream=path), first, ckpt, available_now=False)
        assert "injected failure in micro-batch 2" in await_failure(q)
        assert 2 in offsets_log(ckpt) and not (Path(ckpt) / "commits" / "2").exists()
        second = BatchLog()
        q = run_batches(env.read_stream(stream=path), second, ckpt, available_now=False)
        try:
            wait_for(lambda: len(second.batches) >= 3, "three micro-batches after restart")
        finally:
            q.stop()
    assert second.batches[2] == first.batches[2]
    assert len(first.batches[2]) > 0
    expected = expected_batches(env, offsets_log(ckpt), path)
    for sink in (first, second):
        for b, got in sink.batches.items():
            assert [v for _, _, v in got] == expected[b], f"micro-batch {b}"


def test_replay_after_task_failure_and_server_restart_from_its_data(
    env: Env, spark: Any, tmp_path: Path
) -> None:
    """A task fails mid-batch (a UDF after the scan), the file-backed server is killed and
    started again from its data directory with more appends, and the replay still holds
    exactly the planned rows."""
    from pyspark.sql.functions import udf

    marker = str(tmp_path / "failed-once")
    poison = msg(6)  # closed over by value: workers cannot import this test module

    @udf("string")
    def fail_once(value):  # type: ignore[no-untyped-def]  # hints would make a pandas UDF
        import os

        if value == poison and not os.path.exists(marker):
            open(marker, "w").close()
            raise RuntimeError("injected task failure (test)")
        return value

    server = DurableServer(data_dir=tmp_path / "data").start()
    try:
        client = DurableStreamsClient(base_url=server.url)
        path = "/restart/s"
        client.stream(path).create("application/json")
        client.stream(path).append_json([{"n": i} for i in range(4)])
        ckpt = env.checkpoint()
        sink = BatchLog()

        def query() -> Any:
            df = (
                spark.readStream.format("durable-streams")
                .options(baseUrl=server.url, stream=path)
                .load()
                .withColumn("value", fail_once("value"))
            )
            return run_batches(df, sink, ckpt)

        query().awaitTermination(180)
        client.stream(path).append_json([{"n": i} for i in range(4, 8)])
        assert "injected task failure" in await_failure(query())
        planned = offsets_log(ckpt)[1][path]
        server.kill()
        server.start()
        client.stream(path).append_json([{"n": i} for i in range(8, 10)])
        query().awaitTermination(180)
        if not HAS_ADMISSION_CONTROL:
            # Before 4.2 an AvailableNow run that replays a micro-batch ends with it.
            query().awaitTermination(180)
        client.close()
    finally:
        server.stop()
    log = offsets_log(ckpt)
    assert log[1][path] == planned
    assert sorted(log) == sorted(sink.batches) == [0, 1, 2]
    assert [v for _, _, v in sink.batches[1]] == [msg(i) for i in range(4, 8)]
    assert [v for _, _, v in sink.batches[2]] == [msg(8), msg(9)]


# -- data loss, closed streams -----------------------------------------------------------


def _gone(env: Env, path: str, how: str) -> None:
    """Make `path` unreadable: 410 Gone (deleted while a fork keeps it) or 404 (deleted)."""
    if how == "gone":
        env.client.stream(path + "-fork").create(
            "application/json", headers={"stream-forked-from": path}
        )
    env.client.stream(path).delete()


@pytest.mark.parametrize("how", ["gone", "deleted"])
def test_planned_range_that_is_gone_follows_fail_on_data_loss(env: Env, how: str) -> None:
    path = env.new_stream()
    env.append(path, 0, 3)
    ckpt = env.checkpoint()
    sink = BatchLog(fail_at=1)
    run_batches(env.read_stream(stream=path), sink, ckpt).awaitTermination(180)
    env.append(path, 3, 2)
    failed = run_batches(env.read_stream(stream=path), sink, ckpt)
    assert "injected failure" in await_failure(failed)
    _gone(env, path, how)
    spare = env.checkpoint()
    shutil.copytree(ckpt, spare)

    with pytest.raises(Exception, match="set option valueType so that failOnDataLoss"):
        env.read_stream(stream=path)
    strict = env.read_stream(stream=path, valueType="string")
    message = await_failure(run_batches(strict, BatchLog(), ckpt))
    assert "Data loss" in message and repr(path) in message and "failOnDataLoss" in message

    lenient = BatchLog()
    df = env.read_stream(stream=path, valueType="string", failOnDataLoss="false")
    run_batches(df, lenient, spare).awaitTermination(180)
    assert lenient.batches == {1: []}
    assert (Path(spare) / "commits" / "1").exists()


def test_closed_stream_ends_available_now_and_shows_in_progress(env: Env) -> None:
    path = env.new_stream()
    env.append(path, 0, 2)
    env.client.stream(path).close(json.dumps([{"n": 2}]))
    sink = BatchLog()
    ckpt = env.checkpoint()
    q = run_batches(env.read_stream(stream=path), sink, ckpt)
    q.awaitTermination(180)
    assert [v for _, _, v in sink.batches[0]] == [msg(0), msg(1), msg(2)]
    end = progress_offsets(q.lastProgress["sources"][0]["endOffset"])
    assert end[path]["closed"] is True and env.message_index(path, end[path]) == 3


# -- options and secrets -----------------------------------------------------------------


BAD_OPTIONS: list[tuple[dict[str, str | None], str]] = [
    ({"stream": None}, "set exactly one of the options url"),
    ({"url": "http://x/a"}, "set exactly one of the options url"),
    ({"stream": None, "urls": "http://x/a,http://x/a"}, "names a stream more than once"),
    ({"stream": None, "url": "x/a"}, "option url: 'x/a' is not accepted"),
    ({"baseUrl": None}, "need option baseUrl"),
    ({"baseUrl": "localhost:1"}, "option baseUrl='localhost:1' is not accepted"),
    ({"startingPosition": "timestamp:5"}, "option startingPosition='timestamp:5'"),
    ({"startingPosition": '{"S": 5}'}, "the position of stream 'S' is not accepted"),
    ({"startingPosition": '{"/other": "-1"}'}, "names stream(s) ['/other']"),
    ({"endingPosition": "earliest"}, "option endingPosition='earliest' is not accepted"),
    ({"minPartitions": "2"}, "option minPartitions is not supported by format durable-streams"),
    ({"includeHeaders": "true"}, "option includeHeaders is not supported"),
    ({"maxBytesPerTrigger": "10"}, "option maxBytesPerTrigger does not apply to json streams"),
    ({"failOnDataLoss": "no"}, "option failOnDataLoss='no' is not accepted"),
    ({"valueType": "json"}, "option valueType='json' is not accepted"),
    ({"bearerToken": " "}, "option bearerToken is not accepted"),
    ({"secretHeaders": "{nope"}, "option secretHeaders is not valid JSON"),
    ({"secretHeaders": '{"a b": "v"}'}, "'a b' is not a valid HTTP header name"),
    ({"stream": "/missing-stream"}, "Durable Stream '/missing-stream' does not exist"),
]


@pytest.mark.parametrize(("bad", "message"), BAD_OPTIONS, ids=[m for _, m in BAD_OPTIONS])
def test_bad_option_fails_at_load(env: Env, bad: dict[str, str | None], message: str) -> None:
    path = env.new_stream()
    opts = {**env.options(stream=path), **bad}
    opts = {k: v for k, v in opts.items() if v is not None}
    if "S" in (bad.get("startingPosition") or ""):
        opts["startingPosition"] = json.dumps({path: 5})
        message = f"the position of stream {path!r} is not accepted"
    with pytest.raises(Exception, match=None) as info:
        env.spark.read.format("durable-streams").options(**opts).load()
    assert message in str(info.value)
    assert SECRET not in str(info.value) and HEADER_SECRET not in str(info.value)


def test_mixed_content_types_are_rejected(env: Env) -> None:
    a, b = env.new_stream(), env.new_stream("text/plain")
    with pytest.raises(Exception, match="mix JSON and byte streams"):
        env.read(streams=f"{a},{b}")


def test_credentials_stay_out_of_offsets_plans_and_errors(env: Env) -> None:
    path = env.new_stream()
    env.append(path, 0, 2)
    ckpt = env.checkpoint()
    df = env.read_stream(stream=path)
    run_batches(df, BatchLog(), ckpt).awaitTermination(180)
    for f in Path(ckpt).rglob("*"):
        if f.is_file():
            text = f.read_bytes()
            assert SECRET.encode() not in text and HEADER_SECRET.encode() not in text, f
    plan = env.read(stream=path)._jdf.queryExecution().toString()
    assert SECRET not in plan and HEADER_SECRET not in plan


# -- servers that page, idle queries ---------------------------------------------------


@pytest.fixture(scope="module")
def paged(spark: Any) -> Iterator[Env]:
    """A reference server answering catch-up reads 3 appends at a time (the appends here
    hold 3 messages, or 1 to 5 in `Env.append`'s callers): every answer but the last lacks
    Stream-Up-To-Date, so planning, task reads, the crossing answer and endingPosition
    all read on through pages."""
    with DurableServer(page_messages=3) as server:
        e = Env(server.url, spark)
        yield e
        e.client.close()
        shutil.rmtree(e.tmp, ignore_errors=True)


def test_a_paging_server_gives_exact_micro_batches_while_appends_continue(paged: Env) -> None:
    path = paged.new_stream()
    for first in range(0, 20, 4):
        paged.append(path, first, 4)
    sink = BatchLog()
    ckpt = paged.checkpoint()
    with Appender(paged.url, path, 20):
        q = run_batches(paged.read_stream(stream=path), sink, ckpt, available_now=False)
        try:
            wait_for(lambda: len([b for b in sink.batches.values() if b]) >= 3,
                     "three micro-batches with rows")
        finally:
            q.stop()
    expected = expected_batches(paged, offsets_log(ckpt), path)
    assert {b: [v for _, _, v in got] for b, got in sink.batches.items()} == {
        b: expected[b] for b in sink.batches}
    seen = [v for b in sorted(sink.batches) for _, _, v in sink.batches[b]]
    assert seen == [msg(n) for n in range(len(seen))] and len(seen) > 20


def test_a_paging_server_batch_read_ends_at_an_offset(paged: Env) -> None:
    path = paged.new_stream()
    paged.append(path, 0, 5)
    middle = paged.client.stream(path).head().next_offset
    for first in range(5, 17, 4):
        paged.append(path, first, 4)
    df = paged.read(stream=path, endingPosition=json.dumps({path: middle}))
    assert values(df) == [msg(n) for n in range(5)]
    df = paged.read(stream=path, startingPosition=json.dumps({path: middle}))
    assert values(df) == [msg(n) for n in range(5, 17)]


@needs_admission_control
def test_a_paging_server_paces_exactly(paged: Env) -> None:
    path = paged.new_stream()
    for first in range(0, 11, 1):
        paged.append(path, first, 1)
    sink = BatchLog()
    run_batches(paged.read_stream(stream=path, maxRecordsPerTrigger="4"), sink,
                paged.checkpoint()).awaitTermination(180)
    assert [[v for _, _, v in sink.batches[b]] for b in sorted(sink.batches)] == [
        [msg(i) for i in range(0, 4)], [msg(i) for i in range(4, 8)], [msg(i) for i in (8, 9, 10)]]


def test_idle_plans_wait_on_the_watch_and_ask_nothing_about_quiet_streams(
    env: Env, monkeypatch: pytest.MonkeyPatch
) -> None:
    """After the first plan, quiet streams are long-polled, not asked (no HEAD); an append
    to one of them is planned by the next plan that sees it."""
    from http_proxy import HttpProxy

    from s2_spark.spark import DurableStreamsDataSource

    paths = [env.new_stream() for _ in range(3)]
    for path in paths:
        env.append(path, 0, 2)
    proxy = HttpProxy()
    for name in ("NO_PROXY", "no_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HTTP_PROXY", proxy.url)
    reader = DurableStreamsDataSource(env.options(streams=",".join(paths), valueType="string")
                                      ).streamReader(None)  # type: ignore[arg-type]
    try:
        start = reader.initialOffset()
        end = plan_all_available(reader, start)
        wait_for(lambda: reader._watch.quiet(end) == set(paths), "the watch to settle", 30)
        heads = sum(1 for line in list(proxy.request_lines) if line.startswith("HEAD "))
        assert plan_all_available(reader, end) == end
        assert sum(1 for line in list(proxy.request_lines) if line.startswith("HEAD ")) == heads
        env.append(paths[1], 2, 1)
        found = end
        deadline = time.monotonic() + 30
        while found == end:
            assert time.monotonic() < deadline, "the append never showed"
            found = plan_all_available(reader, end)
        assert {p: found[p] for p in paths if found[p] != end[p]} == {
            paths[1]: {"offset": env.client.stream(paths[1]).head().next_offset, "skip": 0}}
    finally:
        reader.stop()
        proxy.close()
