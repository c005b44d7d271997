"""The `s2` Spark reader end to end: real queries on local[2] against the local S2 server.

Every test asserts exact rows (stream, seq_num, timestamp, headers, body) or exact errors.
Streams are unique per test; the server and the SparkSession are shared.
"""

from __future__ import annotations

import os
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from _s2_target import s2_config, token
from _versions import limit, needs_admission_control, progress_offsets
from _waiting import wait_for

from s2_spark.s2 import AppendRecord, S2Client
from s2_spark.spark import S2DataSource
from s2_spark.spark._compat import HAS_ADMISSION_CONTROL
from s2_spark.spark.stream_reader import RangeStreamReader

pytestmark = pytest.mark.spark

SECRET = token("tok-SECRET-7f3a")  # passed as accessToken; must never show up anywhere
T0 = (int(time.time()) - 3600) * 1000  # record timestamps: recent, so no retention trims them

Row = tuple[str, int, int, list[tuple[bytes, bytes]], bytes]


# -- fixtures and helpers -----------------------------------------------------------------


class Env:
    """The shared server, a basin, and helpers to fill streams and read them with Spark."""

    def __init__(self, url: str, spark: Any) -> None:
        self.url = url
        self.spark = spark
        self.client = S2Client(s2_config(url))
        self.basin = f"spark-read-{uuid.uuid4().hex[:10]}"
        self.client.create_basin(self.basin)
        self.tmp = Path(tempfile.mkdtemp(prefix="s2-spark-reader-"))

    def stream(self, name: str) -> Any:
        return self.client.basin(self.basin).stream(name)

    def fill(self, name: str, count: int, *, create: bool = True) -> list[Row]:
        """Append `count` records (creating the stream) and return the rows they become."""
        if create:
            self.client.basin(self.basin).create_stream(name)
        start = self.stream(name).check_tail().seq_num
        records = [record(name, i) for i in range(start, start + count)]
        ack = self.stream(name).append_many(records)
        assert ack.start.seq_num == start
        return [row(name, i) for i in range(start, start + count)]

    def options(self, **extra: str) -> dict[str, str]:
        return {"endpoint": self.url, "basin": self.basin, "accessToken": SECRET, **extra}

    def read(self, fmt: str = "s2", **opts: str) -> Any:
        return self.spark.read.format(fmt).options(**self.options(**opts)).load()

    def read_stream(self, fmt: str = "s2", **opts: str) -> Any:
        return self.spark.readStream.format(fmt).options(**self.options(**opts)).load()

    def checkpoint(self) -> str:
        return str(self.tmp / f"ckpt-{uuid.uuid4().hex[:8]}")


def record(stream: str, i: int) -> AppendRecord:
    return AppendRecord(
        f"{stream}:{i}".encode(),
        headers=[(b"i", str(i).encode()), (b"s", b"x")],
        timestamp=T0 + i,
    )


def row(stream: str, i: int) -> Row:
    return (stream, i, T0 + i, [(b"i", str(i).encode()), (b"s", b"x")], f"{stream}:{i}".encode())


_HEADERS_TYPE = "array<struct<name:binary,value:binary>>"


def _project(df: Any) -> Any:
    """Rows as (stream, seq_num, millis, headers or NULL, body), for any read schema."""
    headers = "headers" if "headers" in df.columns else f"CAST(NULL AS {_HEADERS_TYPE})"
    return df.selectExpr(
        "stream", "seq_num", "unix_millis(timestamp) AS ts", f"{headers} AS headers", "body"
    )


def _to_row(r: Any) -> Any:
    headers = (
        None
        if r["headers"] is None
        else [(bytes(h["name"]), bytes(h["value"])) for h in r["headers"]]
    )
    return (r["stream"], r["seq_num"], r["ts"], headers, bytes(r["body"]))


def rows_of(df: Any) -> list[Row]:
    """Collect a read's rows as plain tuples, ordered by (stream, seq_num)."""
    return sorted((_to_row(r) for r in _project(df).collect()), key=lambda t: (t[0], t[1]))


def tagged(dfs: dict[str, Any]) -> Any:
    """Several reads as one DataFrame with a `case` column: one job instead of many."""
    from functools import reduce

    parts = [_project(df).selectExpr(f"'{case}' AS case", "*") for case, df in dfs.items()]
    return reduce(lambda a, b: a.unionByName(b), parts)


def rows_by_case(df: Any, cases: list[str]) -> dict[str, list[Row]]:
    out: dict[str, list[Row]] = {case: [] for case in cases}
    for r in df.collect():
        out[r["case"]].append(_to_row(r))
    return {case: sorted(rows, key=lambda t: (t[0], t[1])) for case, rows in out.items()}


def no_headers(rows: list[Row]) -> list[Any]:
    return [(s, n, ts, None, b) for s, n, ts, _, b in rows]


@pytest.fixture(scope="module")
def env(target_s2: Any, spark: Any) -> Iterator[Env]:
    # No register(): installing s2-spark registers format s2 (and on PySpark 4.0 a
    # second registration under the same name is an error).
    e = Env(target_s2.url, spark)
    yield e
    e.client.close()


def run_available_now(df: Any, name: str, checkpoint: str | None = None) -> Any:
    q = (
        df.writeStream.format("memory")
        .queryName(name)
        .option("checkpointLocation", checkpoint or tempfile.mkdtemp())
        .trigger(availableNow=True)
        .start()
    )
    try:
        finished = q.awaitTermination(120)
    except Exception as exc:  # StreamingQueryException: the query failed
        raise AssertionError(str(exc)) from None
    assert finished, f"query {name} did not finish"
    return q


def qname() -> str:
    return f"q_{uuid.uuid4().hex[:10]}"


# -- registration and schema ----------------------------------------------------------------


def test_automatic_registration_module() -> None:
    from pyspark.sql.datasource import DataSource

    import pyspark_s2

    assert issubclass(pyspark_s2.DefaultSource, DataSource)
    assert pyspark_s2.DefaultSource.name() == "s2"


def test_schema(env: Env) -> None:
    env.fill("schema", 1)
    assert env.read(stream="schema").schema.simpleString() == (
        "struct<stream:string,seq_num:bigint,timestamp:timestamp,"
        "headers:array<struct<name:binary,value:binary>>,body:binary>"
    )
    assert env.read(stream="schema", includeHeaders="false").schema.simpleString() == (
        "struct<stream:string,seq_num:bigint,timestamp:timestamp,body:binary>"
    )


# -- batch reads ---------------------------------------------------------------------------------


def test_batch_ranges_exact_rows(env: Env) -> None:
    a = env.fill("batch-a", 10)
    b = env.fill("batch-b", 4)
    cases = {
        # JSON bounds: [3, 7); streams left out run from earliest to latest.
        "json": (env.read(streams="batch-a, batch-b", startingPosition='{"batch-a": 3}',
                          endingPosition='{"batch-a": 7}'), a[3:7] + b),
        # Timestamps: the first record at or after; the ending one is exclusive.
        "ts": (env.read(stream="batch-a", startingPosition=f"timestamp:{T0 + 5}",
                        endingPosition=f"timestamp:{T0 + 8}"), a[5:8]),
        "latest": (env.read(stream="batch-a", startingPosition="latest"), []),
        "no-headers": (env.read(stream="batch-a", includeHeaders="false"), no_headers(a)),
    }
    union = tagged({k: df for k, (df, _) in cases.items()})
    assert SECRET not in union._jdf.queryExecution().toString()
    got = rows_by_case(union, list(cases))
    assert got == {k: rows for k, (_, rows) in cases.items()}


def test_batch_partitioning(env: Env) -> None:
    a = env.fill("part-a", 9)
    b = env.fill("part-b", 3)
    df = env.read(streams="part-a,part-b", maxRecordsPerPartition="4")
    assert df.rdd.getNumPartitions() == 4  # a: 3+3+3, b: 3
    assert rows_of(df) == a + b
    df = env.read(streams="part-a,part-b", minPartitions="4")
    assert df.rdd.getNumPartitions() == 4  # a: ceil(4*9/12)=3, b: 1
    assert rows_of(df) == a + b
    df = env.read(stream="part-a", minPartitions="50")
    assert df.rdd.getNumPartitions() == 9  # never more tasks than records
    assert rows_of(df) == a


def test_batch_prefix_and_empty(env: Env) -> None:
    prefix = f"pre-{uuid.uuid4().hex[:6]}-"
    assert rows_of(env.read(streamPrefix=prefix)) == []
    env.client.basin(env.basin).create_stream(prefix + "empty")
    x = env.fill(prefix + "x", 2)
    assert rows_of(env.read(streamPrefix=prefix)) == x


# -- streaming reads -------------------------------------------------------------------------------


def test_stream_start_kinds(env: Env) -> None:
    """JSON and timestamp starts (earliest: most tests; latest: the next test)."""
    a = env.fill("start-a", 10)
    b = env.fill("start-b", 3)
    cases: list[tuple[dict[str, str], list[Row]]] = [
        ({"startingPosition": '{"start-a": 6}'}, a[6:] + b),  # start-b from earliest
        ({"startingPosition": f"timestamp:{T0 + 8}"}, a[8:]),  # start-b: all before it
    ]
    for opts, expected in cases:
        name = qname()
        run_available_now(env.read_stream(streams="start-a,start-b", **opts), name)
        assert rows_of(env.spark.table(name)) == expected, opts


def test_stream_latest_then_new_records(env: Env) -> None:
    env.fill("latest", 5)
    name = qname()
    q = (
        env.read_stream(stream="latest", startingPosition="latest")
        .writeStream.format("memory")
        .queryName(name)
        .option("checkpointLocation", env.checkpoint())
        .start()
    )
    try:
        q.processAllAvailable()
        assert rows_of(env.spark.table(name)) == []
        new = env.fill("latest", 3, create=False)
        q.processAllAvailable()
        assert rows_of(env.spark.table(name)) == new
    finally:
        q.stop()


def test_stream_prefix_discovers_new_streams(env: Env) -> None:
    prefix = f"disc-{uuid.uuid4().hex[:6]}-"
    a = env.fill(prefix + "a", 5)
    b = env.fill(prefix + "b", 3)
    env.fill("other-" + prefix, 2)  # not selected
    name = qname()
    q = (
        env.read_stream(streamPrefix=prefix)
        .writeStream.format("memory")
        .queryName(name)
        .option("checkpointLocation", env.checkpoint())
        .start()
    )
    try:
        q.processAllAvailable()
        assert rows_of(env.spark.table(name)) == a + b
        c = env.fill(prefix + "c", 4)  # created while the query runs
        a2 = env.fill(prefix + "a", 2, create=False)
        q.processAllAvailable()
        assert rows_of(env.spark.table(name)) == a + a2 + b + c
        offsets = q.lastProgress["sources"][0]["endOffset"]
        offsets = progress_offsets(offsets)
        assert offsets == {prefix + "a": 7, prefix + "b": 3, prefix + "c": 4}
    finally:
        q.stop()


@needs_admission_control
def test_max_records_per_trigger_and_available_now(env: Env) -> None:
    a = env.fill("limit-a", 25)
    b = env.fill("limit-b", 5)
    name = qname()
    q = run_available_now(
        env.read_stream(streams="limit-a,limit-b", maxRecordsPerTrigger="10"), name
    )
    assert rows_of(env.spark.table(name)) == a + b
    batches = [p for p in q.recentProgress if p["numInputRows"] > 0]
    # Fair share: batch 0 takes 5 + 5, then limit-a alone takes 10 and 10.
    assert [p["numInputRows"] for p in batches] == [10, 10, 10]
    ends = [p["sources"][0]["endOffset"] for p in batches]
    ends = [progress_offsets(e) for e in ends]
    assert ends == [
        {"limit-a": 5, "limit-b": 5},
        {"limit-a": 15, "limit-b": 5},
        {"limit-a": 25, "limit-b": 5},
    ]
    latest = batches[0]["sources"][0]["latestOffset"]
    latest = progress_offsets(latest)
    assert latest == {"limit-a": 25, "limit-b": 5}  # reportLatestOffset: the tails


@needs_admission_control
def test_available_now_stops_at_tail_of_start(env: Env) -> None:
    """Records appended after the query started are left for the next run."""
    a = env.fill("avnow", 30)
    ckpt = env.checkpoint()
    seen: dict[int, list[Row]] = {}
    df = env.read_stream(stream="avnow", maxRecordsPerTrigger="7")

    def run() -> None:
        q = (
            df.writeStream.foreachBatch(lambda d, i: seen.__setitem__(i, rows_of(d)))
            .option("checkpointLocation", ckpt)
            .trigger(availableNow=True)
            .start()
        )
        assert q.awaitTermination(120) and q.exception() is None

    run()
    assert sorted(seen) == [0, 1, 2, 3, 4] and [r for i in range(5) for r in seen[i]] == a
    more = env.fill("avnow", 4, create=False)
    seen.clear()
    run()
    assert seen == {5: more}


def test_restart_from_checkpoint_while_appending(env: Env) -> None:
    """Stop and restart while another thread appends: every record exactly once."""
    stream = "restart"
    env.client.basin(env.basin).create_stream(stream)
    stop = threading.Event()
    appended: list[int] = [0]

    def appender() -> None:
        s = env.stream(stream)
        while not stop.is_set():
            n = appended[0]
            s.append([record(stream, i) for i in range(n, n + 7)])
            appended[0] = n + 7
            # Pacing: appends span both runs, and the last run catches up in a few dozen
            # micro-batches of 50 (at 0.02 s, in over a hundred).
            time.sleep(0.1)

    batches: dict[int, list[Row]] = {}
    replays: list[tuple[int, list[Row], list[Row]]] = []
    lock = threading.Lock()

    def sink(df: Any, batch_id: int) -> None:
        got = rows_of(df)
        with lock:
            if batch_id in batches:
                replays.append((batch_id, batches[batch_id], got))
            batches[batch_id] = got

    def seen() -> int:
        with lock:
            return sum(len(r) for r in batches.values())

    ckpt = env.checkpoint()
    df = env.read_stream(stream=stream, **limit(50))
    thread = threading.Thread(target=appender, daemon=True)
    thread.start()
    try:
        for _run in range(2):
            before = seen()
            q = (
                df.writeStream.foreachBatch(sink)
                .option("checkpointLocation", ckpt)
                .trigger(processingTime="100 milliseconds")
                .start()
            )
            try:
                wait_for(lambda b=before: seen() >= b + 20, "rows in this run")  # type: ignore[misc]
            finally:
                q.stop()
        stop.set()
        thread.join(10)
        total = appended[0]
        q = df.writeStream.foreachBatch(sink).option("checkpointLocation", ckpt).start()
        try:
            q.processAllAvailable()
            # Nor in the progress reports or the plan (Spark redacts "token" options).
            assert SECRET not in str(q.recentProgress)
            assert SECRET not in q._jsq.explainInternal(True)
        finally:
            q.stop()
    finally:
        stop.set()
        thread.join(10)
    for batch_id, first, again in replays:
        assert first == again, f"batch {batch_id} replayed with different rows"
    every = [r for b in sorted(batches) for r in batches[b]]
    assert sorted(every, key=lambda r: r[1]) == [row(stream, i) for i in range(total)]
    assert sorted(batches) == list(range(len(batches)))
    # The token is in no offset, commit or metadata file of the checkpoint.
    for path in Path(ckpt).rglob("*"):
        if path.is_file():
            assert SECRET.encode() not in path.read_bytes(), path


# -- failure and replay ---------------------------------------------------------------------


if HAS_ADMISSION_CONTROL:
    from s2_spark.spark._admission import AdmittedStreamReader as _StreamReader
else:
    _StreamReader = RangeStreamReader  # type: ignore[misc]


class _FlakyStreamReader(_StreamReader):
    """Test only: fails once, mid-task, after yielding the first Arrow batch of a range."""

    marker = ""
    fail_from = 0

    def read(self, partition: Any) -> Iterator[Any]:
        for i, batch in enumerate(super().read(partition)):
            yield batch
            if i == 0 and partition.start >= self.fail_from and os.path.exists(self.marker):
                os.remove(self.marker)
                raise RuntimeError("injected task failure")


def _flaky_format() -> Any:
    from dataclasses import replace

    from s2_spark._options import Option, OptionSet
    from s2_spark.spark.s2.source import S2_OPTIONS, S2_READ_FORMAT

    test_options = (Option("testMarker", "a path", "Test only.", roles=("read",)),
                    Option("testFailFrom", "a seq_num", "Test only.", roles=("read",)))
    options = OptionSet("s2flaky", S2_OPTIONS.options + test_options)
    return replace(S2_READ_FORMAT, name="s2flaky", options=options)


class FlakyS2DataSource(S2DataSource):
    """Test only: the s2 source with `_FlakyStreamReader` (options testMarker, testFailFrom,
    declared like every option)."""

    read_format = _flaky_format()

    @classmethod
    def name(cls) -> str:
        return "s2flaky"

    def streamReader(self, schema: Any) -> Any:
        base = super().streamReader(schema)
        flaky = _FlakyStreamReader(base._backend, base._options)
        flaky.marker = self.options["testMarker"]
        flaky.fail_from = int(self.options["testFailFrom"])
        return flaky


@needs_admission_control
def test_replay_after_failures_gives_identical_rows(env: Env) -> None:
    from pyspark import cloudpickle

    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    env.spark.dataSource.register(FlakyS2DataSource)
    stream = "flaky"
    all_rows = env.fill(stream, 3000)
    marker = env.tmp / f"marker-{uuid.uuid4().hex[:6]}"
    attempts: list[tuple[int, list[Row]]] = []
    fail_sink_once = [True]

    def sink(df: Any, batch_id: int) -> None:
        got = rows_of(df)
        attempts.append((batch_id, got))
        if batch_id == 1 and fail_sink_once[0]:
            fail_sink_once[0] = False
            raise RuntimeError("injected sink failure")

    ckpt = env.checkpoint()
    df = env.read_stream(
        "s2flaky",
        stream=stream,
        maxRecordsPerTrigger="1500",
        testMarker=str(marker),
        testFailFrom="1500",
    )

    def run() -> Any:
        q = (
            df.writeStream.foreachBatch(sink)
            .option("checkpointLocation", ckpt)
            .trigger(availableNow=True)
            .start()
        )
        try:
            q.awaitTermination(120)
        except Exception as exc:  # StreamingQueryException: the query failed
            return exc
        return None

    err = run()  # batch 0 ok, batch 1 fails in the sink after reading all of it
    assert err is not None and "injected sink failure" in str(err)
    marker.touch()
    err = run()  # batch 1 replayed: a task fails after its first Arrow batch
    assert err is not None and "injected task failure" in str(err)
    assert not marker.exists()
    assert run() is None  # batch 1 replayed again, now to the end
    assert [b for b, _ in attempts] == [0, 1, 1]
    assert attempts[1][1] == attempts[2][1]
    assert attempts[0][1] + attempts[2][1] == all_rows


# -- data loss and command records ---------------------------------------------------------------


def _trimmed_stream(env: Env, stream: str) -> list[Row]:
    rows = env.fill(stream, 20)
    env.stream(stream).trim(10)  # a trim command record at seq_num 20
    wait_for(
        lambda: env.stream(stream).read(seq_num=0, count=1).first_seq_num == 10,
        "the trim to take effect",
    )
    return rows


def test_data_loss_batch(env: Env) -> None:
    rows = _trimmed_stream(env, "loss-batch")
    df = env.read(stream="loss-batch", startingPosition='{"loss-batch": 2}')
    with pytest.raises(Exception, match=r"records \[2, 10\) of stream 'loss-batch'") as info:
        df.collect()
    assert "failOnDataLoss=false" in str(info.value) and SECRET not in str(info.value)
    df = env.read(stream="loss-batch", startingPosition='{"loss-batch": 2}', failOnDataLoss="false")
    assert rows_of(df) == rows[10:]
    # earliest means the first record still there: no loss.
    assert rows_of(env.read(stream="loss-batch")) == rows[10:]


def test_data_loss_streaming(env: Env) -> None:
    rows = _trimmed_stream(env, "loss-stream")
    start = '{"loss-stream": 0}'
    df = env.read_stream(stream="loss-stream", startingPosition=start)
    with pytest.raises(AssertionError, match=r"Data loss: records \[0, 10\) of stream"):
        run_available_now(df, qname())
    name = qname()
    run_available_now(
        env.read_stream(stream="loss-stream", startingPosition=start, failOnDataLoss="false"), name
    )
    assert rows_of(env.spark.table(name)) == rows[10:]


def test_command_records_skipped_or_included(env: Env) -> None:
    stream = "commands"
    env.fill(stream, 2)
    env.stream(stream).trim(0)  # a command record at seq_num 2 (trims nothing)
    env.fill(stream, 1, create=False)
    data = rows_of(env.read(stream=stream))
    assert [r[1] for r in data] == [0, 1, 3]
    full = rows_of(env.read(stream=stream, includeCommandRecords="true"))
    assert [r[1] for r in full] == [0, 1, 2, 3]
    assert full[2][3] == [(b"", b"trim")] and full[2][4] == bytes(8)
    name = qname()
    q = run_available_now(env.read_stream(stream=stream), name)
    assert rows_of(env.spark.table(name)) == data
    end = q.lastProgress["sources"][0]["endOffset"]
    assert progress_offsets(end) == {stream: 4}
    name = qname()
    run_available_now(env.read_stream(stream=stream, includeCommandRecords="true"), name)
    assert rows_of(env.spark.table(name)) == full


# -- bad options ----------------------------------------------------------------------------------


BAD_OPTIONS: list[tuple[dict[str, str | None], str]] = [
    ({"basin": None}, "option basin is required"),
    ({"stream": None}, "set exactly one of the options stream"),
    ({"streamPrefix": "x"}, "set exactly one of the options stream"),
    ({"stream": None, "streams": "a,,b"}, "option streams='a,,b' is not accepted"),
    ({"stream": None, "streams": "a,a"}, "names a stream more than once"),
    ({"startingPosition": "first"}, "option startingPosition='first' is not accepted"),
    ({"startingPosition": "timestamp:soon"}, "startingPosition='timestamp:soon'"),
    ({"startingPosition": '{"s": -1}'}, "startingPosition: the position of stream 's'"),
    ({"startingPosition": '{"s": 1'}, "option startingPosition is not valid JSON"),
    ({"startingPosition": '{"zz": 1}'}, "option startingPosition names stream(s) ['zz']"),
    ({"endingPosition": "earliest"}, "option endingPosition='earliest' is not accepted"),
    ({"maxRecordsPerTrigger": "0"}, "option maxRecordsPerTrigger='0' is not accepted"),
    ({"maxRecordsPerTrigger": "ten"}, "option maxRecordsPerTrigger='ten'"),
    ({"minPartitions": "-2"}, "option minPartitions='-2' is not accepted"),
    ({"maxRecordsPerPartition": "1e3"}, "option maxRecordsPerPartition='1e3'"),
    ({"includeHeaders": "yes"}, "option includeHeaders='yes' is not accepted"),
    ({"includeCommandRecords": "1"}, "option includeCommandRecords='1'"),
    ({"failOnDataLoss": "no"}, "option failOnDataLoss='no' is not accepted"),
    ({"endpoint": "localhost:80"}, "option endpoint='localhost:80' is not accepted"),
    ({"endpoint": None, "accountEndpoint": "ftp://x"}, "option accountEndpoint='ftp://x'"),
    ({"basinEndpoint": "https://b.example"}, "set either option endpoint"),
    ({"accessToken": " "}, "option accessToken is not accepted"),
]


@pytest.mark.parametrize(("bad", "message"), BAD_OPTIONS, ids=[m for _, m in BAD_OPTIONS])
def test_bad_option_fails_at_load(env: Env, bad: dict[str, str | None], message: str) -> None:
    opts: dict[str, str | None] = {**env.options(stream="s"), **bad}
    reader = env.spark.read.format("s2")
    for key, value in opts.items():
        if value is not None:
            reader = reader.option(key, value)
    with pytest.raises(Exception, match="OptionError") as info:
        reader.load()
    assert message in str(info.value)
    assert SECRET not in str(info.value)


def test_bad_options_detected_at_query_start(env: Env) -> None:
    env.fill("exists", 1)
    with pytest.raises(Exception, match="fixed schema"):
        env.spark.read.format("s2").schema("body binary").options(
            **env.options(stream="exists")
        ).load().collect()
    with pytest.raises(Exception, match=r"stream 'missing-stream' in basin .* does not exist"):
        env.read(streams="exists,missing-stream").collect()
    with pytest.raises(Exception, match="option endingPosition puts stream 'exists'"):
        env.read(stream="exists", endingPosition='{"exists": 5}').collect()
    with pytest.raises(AssertionError, match="endingPosition applies to batch reads"):
        run_available_now(env.read_stream(stream="exists", endingPosition="latest"), qname())
    with pytest.raises(AssertionError, match=r"stream .missing-stream. in basin .* does not exist"):
        run_available_now(env.read_stream(stream="missing-stream"), qname())
