"""Lag from streaming progress: `s2_spark.lag_of` on hand-written progresses (every form
PySpark 4.0-4.3 hands them out in), and on real queries on local[2] against the local S2
server and the Durable Streams reference server, with `LagListener` keeping and logging it.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from _versions import needs_admission_control

from s2_spark import QueryLag, SourceLag, StreamLag, lag_of

PYTHON_STREAM = "org.apache.spark.sql.execution.datasources.v2.python.PythonMicroBatchStream@5c1d"
QID = "49282e86-a57c-46a6-a60f-6f4e3ac94a8d"


def source(end: Any, latest: Any, *, start: Any = None,
           description: str = PYTHON_STREAM) -> dict[str, Any]:
    """One entry of a progress's `sources`, offsets as PySpark 4.1+ gives them (JSON)."""
    def text(value: Any) -> Any:
        return value if value is None or isinstance(value, str) else json.dumps(value)

    return {"description": description, "startOffset": text(start), "endOffset": text(end),
            "latestOffset": text(latest), "numInputRows": 0}


def progress(*sources: dict[str, Any], name: str | None = "orders",
             batch: int = 3) -> dict[str, Any]:
    return {"id": QID, "runId": str(uuid.uuid4()), "name": name, "batchId": batch,
            "timestamp": "2026-11-25T06:36:41.483Z", "sources": list(sources)}


def lags(lag: SourceLag) -> dict[str, tuple[int | None, bool | None]]:
    return {s: (x.records, x.behind) for s, x in lag.streams.items()}


# -- lag_of on hand-written progresses ----------------------------------------------------


def test_s2_lag_is_tail_minus_next_seq_num() -> None:
    lag = lag_of(progress(source({"a": 5, "b": 5}, {"a": 25, "b": 5, "new": 3},
                                 start={"a": 0, "b": 0})))
    assert isinstance(lag, QueryLag)
    assert (lag.query_id, lag.name, lag.batch_id) == (QID, "orders", 3)
    [s2] = lag.sources
    assert (s2.index, s2.format, s2.description) == (0, "s2", PYTHON_STREAM)
    # A stream absent from the end (not read yet) counts from seq_num 0.
    assert lags(s2) == {"a": (20, True), "b": (0, False), "new": (3, True)}
    assert (s2.total, s2.behind, lag.total, lag.behind) == (23, 2, 23, 2)
    assert [str(s) for s in s2.worst()] == ["a=20", "new=3"]
    assert str(s2) == "s2[0]: lag 23, 2/3 streams behind, worst a=20, new=3"
    assert str(lag) == (
        f"query orders (id {QID}) batch 3: lag 23, 2/3 streams behind, worst a=20, new=3")


def test_caught_up_is_zero_and_worst_is_bounded() -> None:
    tails = {f"s{i}": 10 * i for i in range(6)}
    ends = {s: 0 for s in tails}
    lag = lag_of(progress(source(ends, tails), name=None))
    assert lag.describe(worst=2) == (
        f"query {QID} batch 3: lag 150, 5/6 streams behind, worst s5=50, s4=40")
    caught_up = lag_of(progress(source(tails, tails)))
    assert (caught_up.total, caught_up.behind) == (0, 0)
    assert str(caught_up) == f"query orders (id {QID}) batch 3: lag 0, 0/6 streams behind"


def test_a_tail_before_the_end_counts_as_zero() -> None:
    """A stream recreated or trimmed below what was read: no negative lag."""
    [s2] = lag_of(progress(source({"a": 9}, {"a": 4}))).sources
    assert lags(s2) == {"a": (0, False)}


@pytest.mark.parametrize("form", ["json text", "parsed", "python repr"])
def test_every_offset_form_reads_alike(form: str) -> None:
    """4.1+: JSON text; a progress's own JSON parsed: dicts; 4.0's lastProgress: reprs."""
    as_form: Callable[[Any], Any] = {"json text": json.dumps, "parsed": lambda v: v,
                                     "python repr": repr}[form]
    ds_end = {"/d": {"offset": "-1", "skip": 2}}
    ds_tail = {"/d": {"offset": "-1", "skip": 7, "closed": True}}
    p = progress(
        {"description": PYTHON_STREAM, "startOffset": None,
         "endOffset": as_form({"a": 2}), "latestOffset": as_form({"a": 9})},
        {"description": PYTHON_STREAM, "startOffset": None,
         "endOffset": as_form(ds_end), "latestOffset": as_form(ds_tail)},
    )
    s2, ds = lag_of(p).sources
    assert (s2.format, lags(s2)) == ("s2", {"a": (7, True)})
    assert (ds.format, lags(ds)) == ("durable-streams", {"/d": (5, True)})
    assert (s2.index, ds.index) == (0, 1)


def test_compact_offsets_over_many_streams_read_alike() -> None:
    """Offsets over more than COMPACT_ABOVE streams are compact; lag decodes them."""
    from s2_spark._offset_codec import COMPACT_ABOVE, encode_offset

    n = COMPACT_ABOVE + 5
    ends = {f"u/{i:05d}": i for i in range(n)}
    tails = {**ends, "u/00003": 10, "u/00007": 9}
    ds_end = {f"/d/{i}": {"offset": "-1", "skip": 2} for i in range(n)}
    ds_tail = {**ds_end, "/d/4": {"offset": "-1", "skip": 6}}
    lag = lag_of(progress(source(encode_offset(ends), encode_offset(tails)),
                          source(encode_offset(ds_end), encode_offset(ds_tail))))
    s2, ds = lag.sources
    assert (s2.format, s2.total, s2.behind, len(s2.streams)) == ("s2", 9, 2, n)
    assert [str(x) for x in s2.worst()] == ["u/00003=7", "u/00007=2"]
    assert (ds.format, ds.total, ds.behind, len(ds.streams)) == ("durable-streams", 4, 1, n)


def test_progress_as_json_text_and_as_an_object() -> None:
    p = progress(source({"a": 1}, {"a": 4}))
    assert lag_of(json.dumps(p)) == lag_of(p)

    class Obj:  # attribute access, as a progress object without dict behaviour
        def __init__(self, d: dict[str, Any]) -> None:
            self.__dict__.update(d)

    obj = Obj({**p, "sources": [Obj(s) for s in p["sources"]]})
    assert lag_of(obj) == lag_of(p)


@pytest.mark.parametrize("missing", [None, "None", "null"])
def test_no_latest_offset_is_unknown_not_zero(missing: str | None) -> None:
    """PySpark 4.0/4.1: Python sources report no latestOffset (JSON null; "None" from a
    listener's str() of the JVM's null)."""
    lag = lag_of(progress(source({"a": 5, "b": 1}, missing, start={"a": 2, "c": 0})))
    [s2] = lag.sources
    assert s2.format == "s2"
    assert lags(s2) == {"a": (None, None), "b": (None, None), "c": (None, None)}
    assert (s2.total, s2.behind, lag.total, lag.behind) == (None, None, None, None)
    assert str(s2) == (
        "s2[0]: lag unknown: the progress has no latestOffset for this source "
        "(PySpark 4.2+ reports it for Python data sources); 3 streams")


def test_durable_lag_counts_only_within_one_server_offset() -> None:
    end = {
        "same": {"offset": "0000_0010", "skip": 2},
        "crossed": {"offset": "-1", "skip": 3},
        "done": {"offset": "0000_0061", "skip": 0},
        "closed": {"offset": "0000_0070", "skip": 0},
    }
    tail = {
        "same": {"offset": "0000_0010", "skip": 9},
        "crossed": {"offset": "0000_0061", "skip": 0},
        "done": {"offset": "0000_0061", "skip": 0},
        "closed": {"offset": "0000_0070", "skip": 0, "closed": True},
        "unread": {"offset": "-1", "skip": 4},  # absent from the end: from the start
        "unread2": {"offset": "0000_0005", "skip": 0},
    }
    [ds] = lag_of(progress(source(end, tail))).sources
    assert ds.format == "durable-streams"
    assert lags(ds) == {
        "closed": (0, False),
        "crossed": (None, True),
        "done": (0, False),
        "same": (7, True),
        "unread": (4, True),
        "unread2": (None, True),
    }
    assert (ds.total, ds.behind) == (None, 4)
    assert str(ds) == (
        "durable-streams[0]: lag unknown, 4/6 streams behind, worst same=7, unread=4, "
        "crossed=behind")


def test_sources_that_are_not_ours_are_left_out() -> None:
    lag = lag_of(progress(
        source({"t": {"0": 5}}, {"t": {"0": 9}}, description="KafkaV2[Subscribe[t]]"),
        source({"logOffset": 3}, {"logOffset": 4}, description="FileStreamSource[file:/in]"),
        source(7, 9, description="RateStreamV2[rowsPerSecond=1]"),
        source({"x": "abc"}, {"x": "abd"}),  # a Python source, not our shape
        source({"x": {"pos": 1}}, {"x": {"pos": 2}}),
        source({"a": 1}, {"a": {"offset": "-1", "skip": 0}}),  # shapes disagree
        source("not json", "{nor this"),
        source({}, {}),  # no stream yet: the format cannot be told
        source({"a": 1}, {"a": 2}),  # ours
    ))
    assert [(s.index, s.format, lags(s)) for s in lag.sources] == [(8, "s2", {"a": (1, True)})]
    assert str(lag_of(progress(source({}, {})))) == (
        f"query orders (id {QID}) batch 3: no s2 or durable-streams sources")


@pytest.mark.parametrize("bad", [42, "not json", {"id": QID}, {"sources": "x"}])
def test_not_a_progress_is_refused(bad: Any) -> None:
    with pytest.raises(ValueError, match=r"lag_of"):
        lag_of(bad)


def test_no_progress_yet_is_an_unknown_lag() -> None:
    """`query.lastProgress` is None until the first progress: a polling loop written from
    the docs must not fail at its first line."""
    assert lag_of(None) is None


def test_stream_lag_text() -> None:
    assert [str(StreamLag("a", 3, True)), str(StreamLag("b", None, True)),
            str(StreamLag("c", None, None))] == ["a=3", "b=behind", "c=?"]


def test_import_s2_spark_does_not_import_pyspark() -> None:
    code = (
        "import sys, s2_spark\n"
        "p = {'id': 'q', 'sources': [{'description': 'PythonMicroBatchStream@1',"
        " 'endOffset': '{\"a\": 1}', 'latestOffset': '{\"a\": 3}'}]}\n"
        "print(s2_spark.lag_of(p).total, 'pyspark' in sys.modules)\n"
        "s2_spark.LagListener\n"
        "print('pyspark' in sys.modules)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120, env={**os.environ})
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["2", "False", "True"]


# -- real queries ---------------------------------------------------------------------------


@pytest.fixture
def listener(spark: Any, caplog: pytest.LogCaptureFixture) -> Iterator[Any]:
    """A LagListener on the shared session, its lines captured, removed afterwards."""
    from s2_spark import LagListener

    caplog.set_level(logging.INFO, logger="s2_spark.lag")
    added = LagListener()
    spark.streams.addListener(added)
    try:
        yield added
    finally:
        spark.streams.removeListener(added)


def wait_for(what: str, check: Callable[[], bool], query: Any, seconds: float = 60) -> None:
    """Poll `check` until it holds; fail at the deadline or when the query failed."""
    deadline = time.monotonic() + seconds
    while not check():
        if query.exception() is not None:
            raise AssertionError(f"the query failed: {query.exception()}")
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {seconds}s")
        time.sleep(0.05)


def data_lags(query: Any) -> list[QueryLag]:
    """lag_of each progress of a micro-batch that read something, in order."""
    return [lag_of(p) for p in query.recentProgress if p["numInputRows"] > 0]


def start(df: Any, name: str, checkpoint: Path, **trigger: Any) -> Any:
    writer = (df.writeStream.format("memory").queryName(name)
              .option("checkpointLocation", str(checkpoint)))
    return (writer.trigger(**trigger) if trigger else writer).start()


@pytest.mark.spark
@needs_admission_control
def test_s2_lag_per_trigger_with_a_backlog(
    spark: Any, s2_server: Any, basin: Any, listener: Any,
    caplog: pytest.LogCaptureFixture, tmp_path: Path,
) -> None:
    from s2_spark.s2 import AppendRecord

    for name, count in (("a", 25), ("b", 5)):
        basin.create_stream(name)
        basin.stream(name).append([AppendRecord(b"x%d" % i) for i in range(count)])
    df = (spark.readStream.format("s2")
          .options(endpoint=s2_server.url, basin=basin.name, streams="a,b",
                   maxRecordsPerTrigger="10").load())
    name = f"lag_{uuid.uuid4().hex[:8]}"
    q = start(df, name, tmp_path / "ckpt")
    try:
        q.processAllAvailable()
        # One append of 30: the next plan sees all of them at once.
        basin.stream("b").append([AppendRecord(b"y%d" % i) for i in range(30)])
        q.processAllAvailable()
        batches = data_lags(q)
        assert [lag.batch_id for lag in batches] == list(range(6))
        # Each trigger: tail minus the next seq_num the batch read up to; 0 once caught up.
        assert [lags(lag.sources[0]) for lag in batches] == [
            {"a": (20, True), "b": (0, False)},   # ends a=5, b=5 of tails 25, 5
            {"a": (10, True), "b": (0, False)},   # a=15
            {"a": (0, False), "b": (0, False)},   # a=25: caught up
            {"a": (0, False), "b": (20, True)},   # b=15 of 35
            {"a": (0, False), "b": (10, True)},   # b=25
            {"a": (0, False), "b": (0, False)},   # b=35
        ]
        lines = [str(lag) for lag in batches]
        head = f"query {name} (id {q.id})"
        assert lines == [
            f"{head} batch 0: lag 20, 1/2 streams behind, worst a=20",
            f"{head} batch 1: lag 10, 1/2 streams behind, worst a=10",
            f"{head} batch 2: lag 0, 0/2 streams behind",
            f"{head} batch 3: lag 20, 1/2 streams behind, worst b=20",
            f"{head} batch 4: lag 10, 1/2 streams behind, worst b=10",
            f"{head} batch 5: lag 0, 0/2 streams behind",
        ]

        # The listener logged a line per trigger (idle triggers too: lag 0) and keeps the
        # latest lag of the query.
        def logged() -> list[str]:
            return [r.getMessage() for r in caplog.records
                    if r.name == "s2_spark.lag" and r.getMessage().startswith(head)]

        wait_for("the listener's line for batch 5", lambda: lines[-1] in logged(), q)
        assert list(dict.fromkeys(line for line in logged() if line in lines)) == lines
        assert all(r.levelno == logging.INFO for r in caplog.records if r.name == "s2_spark.lag")
        kept = listener.latest(q.id)
        assert kept is not None and kept == listener.lag[str(q.id)]
        assert (kept.query_id, kept.name, kept.total, kept.behind) == (str(q.id), name, 0, 0)
        assert kept.batch_id is not None and kept.batch_id >= 5
        listener.forget(q.id)
        assert listener.latest(q.id) is None
    finally:
        q.stop()


@pytest.mark.spark
@needs_admission_control
def test_durable_lag_says_behind_then_not(
    spark: Any, ds_server: Any, tmp_path: Path,
) -> None:
    from s2_spark.durable import DurableStreamsClient

    path = f"/lag/{uuid.uuid4().hex[:12]}"
    client = DurableStreamsClient(base_url=ds_server.url)
    try:
        client.stream(path).create("application/json")
        client.stream(path).append_json([{"n": i} for i in range(7)])
    finally:
        client.close()
    df = (spark.readStream.format("durable-streams")
          .options(baseUrl=ds_server.url, streams=path, maxRecordsPerTrigger="3").load())
    q = start(df, f"lag_{uuid.uuid4().hex[:8]}", tmp_path / "ckpt", availableNow=True)
    assert q.awaitTermination(120) and q.exception() is None
    batches = [lag.sources[0] for lag in data_lags(q)]
    assert [s.format for s in batches] == ["durable-streams"] * 3
    # Batches end 3 and 6 messages after the start ("-1"), then at the tail: the first two
    # are behind by an unknown count (other server offset), the last is caught up.
    assert [lags(s) for s in batches] == [
        {path: (None, True)}, {path: (None, True)}, {path: (0, False)}]
    assert [str(s) for s in batches] == [
        f"durable-streams[0]: lag unknown, 1/1 streams behind, worst {path}=behind",
        f"durable-streams[0]: lag unknown, 1/1 streams behind, worst {path}=behind",
        "durable-streams[0]: lag 0, 0/1 streams behind",
    ]


@pytest.mark.spark
def test_lag_without_a_limit_on_this_pyspark(
    spark: Any, s2_server: Any, basin: Any, tmp_path: Path,
) -> None:
    """Caught up is 0. Before 4.2 Spark reports the planned end as latestOffset (a Python
    source cannot be paced there), so it is 0 too."""
    from s2_spark.s2 import AppendRecord

    basin.create_stream("only")
    basin.stream("only").append([AppendRecord(b"x"), AppendRecord(b"y")])
    df = (spark.readStream.format("s2")
          .options(endpoint=s2_server.url, basin=basin.name, stream="only").load())
    q = start(df, f"lag_{uuid.uuid4().hex[:8]}", tmp_path / "ckpt")
    try:
        q.processAllAvailable()
        [lag] = data_lags(q)
    finally:
        q.stop()
    [s2] = lag.sources
    assert (lags(s2), s2.total, s2.behind) == ({"only": (0, False)}, 0, 0)


EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "lag_metrics.py"


def _scrape(query: str, a: int, b: int) -> list[str]:
    """The example's /metrics text for lag a (events-a) and b (events-b)."""
    labels = f'query="{query}",format="s2"'
    return [
        "# HELP s2_spark_lag_records Records (S2; Durable Streams: messages or bytes) a "
        "stream is behind the latest tail its query planned with.",
        "# TYPE s2_spark_lag_records gauge",
        f's2_spark_lag_records{{{labels},stream="events-a"}} {a}',
        f's2_spark_lag_records{{{labels},stream="events-b"}} {b}',
        "# HELP s2_spark_lag_behind 1 if a stream is behind its latest planned tail, else 0.",
        "# TYPE s2_spark_lag_behind gauge",
        f's2_spark_lag_behind{{{labels},stream="events-a"}} {int(a > 0)}',
        f's2_spark_lag_behind{{{labels},stream="events-b"}} {int(b > 0)}',
        "# HELP s2_spark_query_lag_records Records behind over all streams of a query.",
        "# TYPE s2_spark_query_lag_records gauge",
        f's2_spark_query_lag_records{{query="{query}"}} {a + b}',
        "# HELP s2_spark_query_streams_behind Streams of a query behind their tails.",
        "# TYPE s2_spark_query_streams_behind gauge",
        f's2_spark_query_streams_behind{{query="{query}"}} {int(a > 0) + int(b > 0)}',
    ]


@pytest.mark.spark
@needs_admission_control
def test_lag_metrics_example_serves_prometheus_text(tmp_path: Path) -> None:
    """Backlog 250 + 50 at 100 a trigger: 50 + 50, then 100 and 100 of events-a."""
    done = subprocess.run(
        [sys.executable, str(EXAMPLE), "--serve-seconds", "0"],
        cwd=tmp_path, env={**os.environ, "PYSPARK_PYTHON": sys.executable},
        capture_output=True, text=True, timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    out = done.stdout.splitlines()
    [url] = [line.removeprefix("serving ") for line in out if line.startswith("serving ")]
    [qid] = {line.split("(id ")[1].split(")")[0] for line in out if "(id " in line}
    head = f"s2_spark.lag: query lag-demo (id {qid})"
    # An idle trigger's progress (after 10 s without data) may add a line: lag 0.
    out = [line for line in out if line != f"{head} batch 3: lag 0, 0/2 streams behind"]
    assert out[out.index(f"serving {url}") + 1:] == [
        f"{head} batch 0: lag 200, 1/2 streams behind, worst events-a=200",
        f"scrape of {url} after the first micro-batch:",
        *_scrape("lag-demo", 200, 0),
        f"{head} batch 1: lag 100, 1/2 streams behind, worst events-a=100",
        f"{head} batch 2: lag 0, 0/2 streams behind",
        f"scrape of {url} once caught up:",
        *_scrape("lag-demo", 0, 0),
    ]
