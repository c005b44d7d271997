"""minRecordsPerTrigger / minBytesPerTrigger with maxTriggerDelay: a trigger that finds too
few new records waits, up to the delay after the last micro-batch. Real queries on local[2]
against the local S2 server and the Durable Streams reference server, real checkpoints.

Spark runs a new query's first micro-batch even when the source ends it where it starts:
every query here starts with fewer records than its minimum, so its micro-batch 0 is empty
(the first plan holds). A held trigger shows in the query's idle progress: the source's
`latestOffset` (the tails the plan saw) is past its `endOffset`, and no rows were read.
"""

from __future__ import annotations

import json
import shutil
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from _s2_target import s2_config, token
from _versions import needs_admission_control, progress_offsets
from _waiting import wait_for

from s2_spark.durable import DurableStreamsClient
from s2_spark.errors import OptionError
from s2_spark.s2 import AppendRecord, S2Client
from s2_spark.spark._compat import HAS_ADMISSION_CONTROL, SPARK_VERSION
from s2_spark.spark.options import MAX_TRIGGER_DELAY

pytestmark = pytest.mark.spark

SECRET = token("tok-TRIGGER-SECRET-3c1d")


# -- helpers ------------------------------------------------------------------------------


class BatchLog:
    """foreachBatch sink: each micro-batch's rows, made plain by `row`, in order."""

    def __init__(self, row: Callable[[Any], Any]) -> None:
        self.row = row
        self.batches: dict[int, list[Any]] = {}

    def __call__(self, df: Any, batch_id: int) -> None:
        self.batches[batch_id] = sorted(self.row(r) for r in df.collect())


def offsets_log(checkpoint: str) -> dict[int, dict[str, Any]]:
    """The source offsets of every planned micro-batch, from the checkpoint's offset log."""
    out = {}
    for f in (Path(checkpoint) / "offsets").iterdir():
        if f.name.isdigit():
            out[int(f.name)] = json.loads(f.read_text().strip().splitlines()[-1])
    return out


def held(q: Any, latest: dict[str, Any], end: dict[str, Any], times: int = 3) -> bool:
    """Whether at least `times` idle progresses saw the tails `latest` and ended at `end`:
    the trigger waits with those records seen."""
    def is_held(p: Any) -> bool:
        source = p["sources"][0]
        return (p["numInputRows"] == 0
                and progress_offsets(source["latestOffset"]) == latest
                and progress_offsets(source["endOffset"]) == end)

    return sum(1 for p in q.recentProgress if is_held(p)) >= times


def start_query(df: Any, sink: BatchLog, checkpoint: str, *, available_now: bool = False) -> Any:
    writer = df.writeStream.foreachBatch(sink).option("checkpointLocation", checkpoint)
    if available_now:
        writer = writer.trigger(availableNow=True)
    return writer.start()


def finish(q: Any) -> None:
    """Wait for an AvailableNow query to end, and fail with its error if it failed."""
    assert q.awaitTermination(180), "the query did not finish"
    assert q.exception() is None, q.exception()


@pytest.fixture
def idle_progress(spark: Any) -> Iterator[None]:
    """Idle progress every 100 ms (default 10 s) for queries started in the test, so a held
    trigger shows soon; put back afterwards."""
    key = "spark.sql.streaming.noDataProgressEventInterval"
    before = spark.conf.get(key, None)
    spark.conf.set(key, "100")
    try:
        yield
    finally:
        if before is None:
            spark.conf.unset(key)
        else:
            spark.conf.set(key, before)


class S2Env:
    """A basin on the local S2 server; records are `<stream>:<i>` with i = seq_num."""

    def __init__(self, url: str, spark: Any) -> None:
        self.url = url
        self.spark = spark
        self.client = S2Client(s2_config(url))
        self.basin = f"trigger-{uuid.uuid4().hex[:10]}"
        self.client.create_basin(self.basin)
        self.tmp = Path(tempfile.mkdtemp(prefix="s2-spark-trigger-"))

    def create(self, *streams: str) -> None:
        for stream in streams:
            self.client.basin(self.basin).create_stream(stream)

    def append(self, stream: str, first: int, count: int) -> None:
        """Records first..first+count-1 of `stream`, in one append."""
        records = [AppendRecord(f"{stream}:{i}".encode()) for i in range(first, first + count)]
        ack = self.client.basin(self.basin).stream(stream).append_many(records)
        assert ack.start.seq_num == first

    def options(self, **extra: str) -> dict[str, str]:
        return {"endpoint": self.url, "basin": self.basin, "accessToken": SECRET, **extra}

    def read_stream(self, **opts: str) -> Any:
        return self.spark.readStream.format("s2").options(**self.options(**opts)).load()

    def checkpoint(self) -> str:
        return str(self.tmp / f"ckpt-{uuid.uuid4().hex[:8]}")


def s2_row(r: Any) -> tuple[str, int]:
    return (r["stream"], r["seq_num"])


def s2_rows(stream: str, first: int, end: int) -> list[tuple[str, int]]:
    return [(stream, i) for i in range(first, end)]


@pytest.fixture(scope="module")
def s2(target_s2: Any, spark: Any) -> Iterator[S2Env]:
    e = S2Env(target_s2.url, spark)
    yield e
    e.client.close()
    shutil.rmtree(e.tmp, ignore_errors=True)


class DurableEnv:
    """A base URL on the reference server; JSON messages are `{"n": i}`."""

    def __init__(self, url: str, spark: Any) -> None:
        self.url = url
        self.spark = spark
        self.client = DurableStreamsClient(base_url=url)
        self.tmp = Path(tempfile.mkdtemp(prefix="ds-spark-trigger-"))

    def new_stream(self, content_type: str = "application/json") -> str:
        path = f"/trigger/{uuid.uuid4().hex[:12]}"
        self.client.stream(path).create(content_type)
        return path

    def append(self, path: str, first: int, count: int) -> None:
        self.client.stream(path).append_json([{"n": i} for i in range(first, first + count)])

    def tail(self, path: str) -> dict[str, Any]:
        """The position of `path`'s tail, as offsets show it."""
        return {"offset": self.client.stream(path).head().next_offset, "skip": 0}

    def options(self, **extra: str) -> dict[str, str]:
        return {"baseUrl": self.url, "bearerToken": SECRET, **extra}

    def read_stream(self, **opts: str) -> Any:
        return (self.spark.readStream.format("durable-streams")
                .options(**self.options(**opts)).load())

    def checkpoint(self) -> str:
        return str(self.tmp / f"ckpt-{uuid.uuid4().hex[:8]}")


def msgs(first: int, end: int) -> list[str]:
    return [json.dumps({"n": i}, separators=(",", ":")) for i in range(first, end)]


def ds_value(r: Any) -> Any:
    return r["value"]


@pytest.fixture(scope="module")
def ds(ds_server: Any, spark: Any) -> Iterator[DurableEnv]:
    e = DurableEnv(ds_server.url, spark)
    yield e
    e.client.close()
    shutil.rmtree(e.tmp, ignore_errors=True)


# -- option values (every PySpark) --------------------------------------------------------


@pytest.mark.parametrize(("raw", "ms"), [
    ("15m", 900_000), ("30s", 30_000), ("500ms", 500), ("60000", 60_000), ("2min", 120_000),
    ("1h", 3_600_000), ("1d", 86_400_000), (" 10 S ", 10_000),
])
def test_durations_in_kafkas_style(raw: str, ms: int) -> None:
    assert MAX_TRIGGER_DELAY.duration_ms({"maxTriggerDelay": raw}) == ms


@pytest.mark.parametrize("raw", ["0", "0s", "-5s", "1.5s", "15 minutes", "s", "", "10us"])
def test_bad_durations(raw: str) -> None:
    with pytest.raises(OptionError) as info:
        MAX_TRIGGER_DELAY.duration_ms({"maxTriggerDelay": raw})
    assert str(info.value) == (
        f"option maxTriggerDelay={raw!r} is not accepted: use a positive duration such as "
        "'15m', '30s' or '500ms' (units ms, s, m or min, h, d; a number alone is milliseconds)"
    )


def _load_s2(s2: S2Env, **opts: str) -> Any:
    return s2.read_stream(stream="any", **opts)


S2_BAD: list[tuple[dict[str, str], str]] = [
    ({"maxTriggerDelay": "30s"},
     "option maxTriggerDelay applies only with option minRecordsPerTrigger: it bounds how "
     "long a trigger waits for that minimum; set both, or neither"),
    ({"minRecordsPerTrigger": "10", "maxTriggerDelay": "soon"},
     "option maxTriggerDelay='soon' is not accepted: use a positive duration"),
    ({"minRecordsPerTrigger": "0"},
     "option minRecordsPerTrigger='0' is not accepted: use a positive integer"),
    ({"minBytesPerTrigger": "100"},
     "option minBytesPerTrigger is not supported by format s2 (reading): S2 micro-batches "
     "are sized in records: use minRecordsPerTrigger / maxRecordsPerTrigger"),
    ({"maxBytesPerTrigger": "100"},
     "option maxBytesPerTrigger is not supported by format s2 (reading): S2 micro-batches "
     "are sized in records: use minRecordsPerTrigger / maxRecordsPerTrigger"),
]


@pytest.mark.parametrize(("bad", "message"), S2_BAD, ids=[m[:40] for _, m in S2_BAD])
def test_s2_bad_trigger_sizes_fail_at_load(s2: S2Env, bad: dict[str, str], message: str) -> None:
    with pytest.raises(Exception, match="OptionError") as info:
        _load_s2(s2, **bad)
    assert message in str(info.value)
    assert SECRET not in str(info.value)


@needs_admission_control
def test_s2_minimum_above_maximum_fails_at_load(s2: S2Env) -> None:
    with pytest.raises(Exception, match="OptionError") as info:
        _load_s2(s2, minRecordsPerTrigger="10", maxRecordsPerTrigger="5")
    assert ("option minRecordsPerTrigger=10 is more than option maxRecordsPerTrigger=5: the "
            "minimum must not exceed the maximum") in str(info.value)
    assert _load_s2(s2, minRecordsPerTrigger="5", maxRecordsPerTrigger="5",
                    maxTriggerDelay="1m").isStreaming


@pytest.mark.skipif(HAS_ADMISSION_CONTROL, reason="admission control exists from PySpark 4.2")
def test_minimum_fails_at_load_before_4_2(s2: S2Env) -> None:
    with pytest.raises(Exception, match="OptionError") as info:
        _load_s2(s2, minRecordsPerTrigger="10", maxTriggerDelay="30s")
    assert (f"option minRecordsPerTrigger needs PySpark 4.2 or newer (admission control for "
            f"Python streaming sources); this is PySpark {SPARK_VERSION}") in str(info.value)


def test_minimum_error_where_admission_control_is_missing(
    monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same check, on every PySpark, through the flag `_compat` sets."""
    from s2_spark.spark import options as options_module
    from s2_spark.spark.s2.source import S2_READ_FORMAT

    monkeypatch.setattr(options_module, "HAS_ADMISSION_CONTROL", False)
    for given, name in (({"minRecordsPerTrigger": "10"}, "minRecordsPerTrigger"),
                        ({"minRecordsPerTrigger": "5", "maxRecordsPerTrigger": "9"},
                         "maxRecordsPerTrigger")):
        with pytest.raises(OptionError) as info:
            options_module.parse_read_options({"basin": "b", "stream": "s", **given},
                                              streaming=True, fmt=S2_READ_FORMAT)
        assert str(info.value) == (
            f"option {name} needs PySpark 4.2 or newer (admission control for Python "
            f"streaming sources); this is PySpark {SPARK_VERSION}: remove the option or "
            "upgrade Spark")


def test_defaults_and_values_reach_the_read_options() -> None:
    from s2_spark.spark.options import parse_read_options
    from s2_spark.spark.s2.source import S2_READ_FORMAT

    def parse(**opts: str) -> Any:
        return parse_read_options({"basin": "b", "stream": "s", **opts}, streaming=True,
                                  fmt=S2_READ_FORMAT)

    plain = parse()
    assert (plain.min_units_per_trigger, plain.max_trigger_delay_ms) == (None, 900_000)
    if HAS_ADMISSION_CONTROL:
        given = parse(minRecordsPerTrigger="100", maxTriggerDelay="30s")
        assert (given.min_units_per_trigger, given.max_trigger_delay_ms) == (100, 30_000)


class ManualClock:
    """Seconds that move only when the test moves them."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_hold_counts_across_streams_and_times_from_the_last_micro_batch() -> None:
    """`TriggerHold` on S2 positions (seq_nums, counted without a service)."""
    from s2_spark.backends.s2 import S2Backend, S2Settings
    from s2_spark.spark._trigger_hold import TriggerHold

    backend = S2Backend(S2Settings("b"))
    counts: list[tuple[dict[str, tuple[int, int]], int]] = []

    def count(ranges: Any, limit: int) -> dict[str, int]:
        counts.append((dict(ranges), limit))
        return {s: backend.measure(s, a, b, limit)[0] for s, (a, b) in ranges.items()}

    clock = ManualClock()
    hold = TriggerHold(10, 5000, backend, count, clock)
    start = {"a": 0, "b": 0}
    assert hold.holds(start, start, {"a": 4, "b": 3})  # 7 new; the delay starts now
    assert hold.tails(start) == {"a": 4, "b": 3} and hold.remaining() == 5.0
    clock.now += 1
    assert hold.holds(start, start, {"a": 6, "b": 3})  # 9: only a's 2 new ones counted
    assert counts == [({"a": (0, 4), "b": (0, 3)}, 10), ({"a": (4, 6)}, 3)]
    assert hold.holds(start, start, {"a": 6, "b": 3}) and len(counts) == 2  # nothing new
    clock.now += 4  # 5 s after the first plan: taken as is
    assert not hold.holds(start, start, {"a": 6, "b": 3}) and hold.tails(start) == {}
    batch = {"a": 6, "b": 3}
    hold.planned(start, batch)  # a micro-batch: the delay counts from now
    clock.now += 4.5
    assert hold.holds(batch, batch, {"a": 7, "b": 3}) and hold.tails(batch) == {"a": 7}
    clock.now += 0.5
    assert not hold.holds(batch, batch, {"a": 7, "b": 3})
    assert hold.tails(start) == {}  # a start not planned from shows nothing held


def test_hold_counts_no_further_than_the_minimum_needs() -> None:
    from s2_spark.backends.s2 import S2Backend, S2Settings
    from s2_spark.spark._trigger_hold import TriggerHold

    backend = S2Backend(S2Settings("b"))
    limits: list[int] = []

    def count(ranges: Any, limit: int) -> dict[str, int]:
        limits.append(limit)
        return {s: backend.measure(s, a, b, limit)[0] for s, (a, b) in ranges.items()}

    clock = ManualClock()
    hold = TriggerHold(10, 60_000, backend, count, clock)
    start = {"a": 100, "b": 0}
    assert not hold.holds(start, {"a": 100, "b": 0}, {"a": 1_000_100, "b": 5})
    assert limits == [10]
    # After a quiet spell longer than the delay, nothing is held: the delay has passed.
    hold.planned(start, {"a": 1_000_100, "b": 5})
    clock.now += 61
    after = {"a": 1_000_100, "b": 5}
    assert not hold.holds(after, after, after)
    hold.planned(after, after)  # nothing new: no micro-batch, the delay stays passed
    assert not hold.holds(after, after, {"a": 1_000_101, "b": 5})


DS_BAD: list[tuple[str, dict[str, str], str]] = [
    ("application/json", {"minBytesPerTrigger": "10"},
     "option minBytesPerTrigger does not apply to json streams: use minRecordsPerTrigger"),
    ("application/octet-stream", {"minRecordsPerTrigger": "10"},
     "option minRecordsPerTrigger does not apply to bytes streams: use minBytesPerTrigger"),
    ("application/octet-stream", {"maxTriggerDelay": "5s"},
     "option maxTriggerDelay applies only with option minBytesPerTrigger"),
    ("application/octet-stream", {"minBytesPerTrigger": "-1"},
     "option minBytesPerTrigger='-1' is not accepted: use a positive integer"),
]


@pytest.mark.parametrize(("content_type", "bad", "message"), DS_BAD,
                         ids=[m[:40] for _, _, m in DS_BAD])
def test_durable_bad_trigger_sizes_fail_at_load(
    ds: DurableEnv, content_type: str, bad: dict[str, str], message: str
) -> None:
    path = ds.new_stream(content_type)
    with pytest.raises(Exception, match="OptionError") as info:
        ds.read_stream(stream=path, **bad)
    assert message in str(info.value)
    assert SECRET not in str(info.value)


@needs_admission_control
def test_durable_byte_minimum_above_maximum_fails_at_load(ds: DurableEnv) -> None:
    path = ds.new_stream("application/octet-stream")
    with pytest.raises(Exception, match="OptionError") as info:
        ds.read_stream(stream=path, minBytesPerTrigger="10", maxBytesPerTrigger="4")
    assert ("option minBytesPerTrigger=10 is more than option maxBytesPerTrigger=4: the "
            "minimum must not exceed the maximum") in str(info.value)
    assert ds.read_stream(stream=path, minBytesPerTrigger="4", maxTriggerDelay="2s").isStreaming


# -- S2 queries (PySpark 4.2+) ------------------------------------------------------------


@needs_admission_control
def test_s2_minimum_holds_the_trigger_until_enough_across_streams(
    s2: S2Env, idle_progress: None
) -> None:
    s2.create("hold-a", "hold-b")
    sink, ckpt = BatchLog(s2_row), s2.checkpoint()
    q = start_query(s2.read_stream(streams="hold-a,hold-b", minRecordsPerTrigger="10"),
                    sink, ckpt)
    try:
        wait_for(lambda: 0 in sink.batches, "the first (empty) micro-batch")
        s2.append("hold-a", 0, 4)
        s2.append("hold-b", 0, 3)
        wait_for(lambda: held(q, {"hold-a": 4, "hold-b": 3}, {"hold-a": 0, "hold-b": 0}),
                 "plans that see 7 new records and hold the trigger")
        assert sink.batches == {0: []}
        s2.append("hold-a", 4, 3)
        wait_for(lambda: 1 in sink.batches, "the micro-batch of 10 records")
        q.processAllAvailable()
    finally:
        q.stop()
    assert sink.batches == {0: [], 1: s2_rows("hold-a", 0, 7) + s2_rows("hold-b", 0, 3)}
    assert offsets_log(ckpt) == {0: {"hold-a": 0, "hold-b": 0}, 1: {"hold-a": 7, "hold-b": 3}}


@needs_admission_control
def test_s2_delay_releases_fewer_records_than_the_minimum(s2: S2Env) -> None:
    s2.create("delay")
    s2.append("delay", 0, 3)
    sink, ckpt = BatchLog(s2_row), s2.checkpoint()
    df = s2.read_stream(stream="delay", minRecordsPerTrigger="1000", maxTriggerDelay="1500ms")
    q = start_query(df, sink, ckpt)
    try:
        wait_for(lambda: 1 in sink.batches, "the records held past the delay")
        s2.append("delay", 3, 2)  # the delay counts again from micro-batch 1
        wait_for(lambda: 2 in sink.batches, "the next records, once the delay passed again")
        q.processAllAvailable()
    finally:
        q.stop()
    assert sink.batches == {0: [], 1: s2_rows("delay", 0, 3), 2: s2_rows("delay", 3, 5)}
    assert offsets_log(ckpt) == {0: {"delay": 0}, 1: {"delay": 3}, 2: {"delay": 5}}


@needs_admission_control
def test_s2_minimum_with_maximum(s2: S2Env, idle_progress: None) -> None:
    """At most 8 a micro-batch; the 4 left after one of 8 wait for a fifth."""
    s2.create("both")
    s2.append("both", 0, 3)
    sink, ckpt = BatchLog(s2_row), s2.checkpoint()
    df = s2.read_stream(stream="both", minRecordsPerTrigger="5", maxRecordsPerTrigger="8")
    q = start_query(df, sink, ckpt)
    try:
        wait_for(lambda: held(q, {"both": 3}, {"both": 0}), "the first 3 records held")
        s2.append("both", 3, 9)
        wait_for(lambda: held(q, {"both": 12}, {"both": 8}), "the 4 left over held")
        assert sink.batches == {0: [], 1: s2_rows("both", 0, 8)}
        s2.append("both", 12, 1)
        wait_for(lambda: 2 in sink.batches, "the micro-batch of the 5 records")
        q.processAllAvailable()
    finally:
        q.stop()
    assert sink.batches == {0: [], 1: s2_rows("both", 0, 8), 2: s2_rows("both", 8, 13)}
    assert offsets_log(ckpt) == {0: {"both": 0}, 1: {"both": 8}, 2: {"both": 13}}


@needs_admission_control
@pytest.mark.parametrize(("sizes", "expected"), [
    ({"minRecordsPerTrigger": "1000"},
     {0: (s2_rows("x", 0, 7) + s2_rows("y", 0, 2), {"x": 7, "y": 2})}),
    ({"minRecordsPerTrigger": "3", "maxRecordsPerTrigger": "4"},
     {0: (s2_rows("x", 0, 2) + s2_rows("y", 0, 2), {"x": 2, "y": 2}),
      1: (s2_rows("x", 2, 6), {"x": 6, "y": 2}),
      2: (s2_rows("x", 6, 7), {"x": 7, "y": 2})}),
], ids=["minimum", "minimum-and-maximum"])
def test_s2_available_now_reads_everything_whatever_the_minimum(
    s2: S2Env, sizes: dict[str, str], expected: dict[int, tuple[list[Any], dict[str, int]]]
) -> None:
    x, y = f"x-{uuid.uuid4().hex[:6]}", f"y-{uuid.uuid4().hex[:6]}"
    s2.create(x, y)
    s2.append(x, 0, 7)
    s2.append(y, 0, 2)
    sink, ckpt = BatchLog(s2_row), s2.checkpoint()
    finish(start_query(s2.read_stream(streams=f"{x},{y}", **sizes), sink, ckpt,
                       available_now=True))
    names = {"x": x, "y": y}
    assert sink.batches == {b: [(names[s], i) for s, i in rows]
                            for b, (rows, _) in expected.items()}
    assert offsets_log(ckpt) == {b: {names[s]: n for s, n in ends.items()}
                                 for b, (_, ends) in expected.items()}


@needs_admission_control
def test_s2_trigger_once_reads_everything_in_one_micro_batch(s2: S2Env) -> None:
    """Spark hands a once trigger `ReadAllAvailable`: neither limit applies."""
    s2.create("once")
    s2.append("once", 0, 5)
    sink, ckpt = BatchLog(s2_row), s2.checkpoint()
    df = s2.read_stream(stream="once", minRecordsPerTrigger="2", maxRecordsPerTrigger="3")
    q = df.writeStream.foreachBatch(sink).option("checkpointLocation", ckpt) \
        .trigger(once=True).start()
    finish(q)
    assert sink.batches == {0: s2_rows("once", 0, 5)}
    assert offsets_log(ckpt) == {0: {"once": 5}}


# -- Durable Streams queries (PySpark 4.2+) -----------------------------------------------


@needs_admission_control
def test_durable_minimum_holds_json_messages_until_enough(
    ds: DurableEnv, idle_progress: None
) -> None:
    path = ds.new_stream()
    origin = {"offset": "-1", "skip": 0}
    sink, ckpt = BatchLog(ds_value), ds.checkpoint()
    q = start_query(ds.read_stream(stream=path, minRecordsPerTrigger="5"), sink, ckpt)
    try:
        wait_for(lambda: 0 in sink.batches, "the first (empty) micro-batch")
        ds.append(path, 0, 3)
        three = ds.tail(path)
        wait_for(lambda: held(q, {path: three}, {path: origin}), "3 messages held")
        assert sink.batches == {0: []}
        ds.append(path, 3, 2)
        wait_for(lambda: 1 in sink.batches, "the micro-batch of 5 messages")
        q.processAllAvailable()
    finally:
        q.stop()
    assert sink.batches == {0: [], 1: msgs(0, 5)}
    assert offsets_log(ckpt) == {0: {path: origin}, 1: {path: ds.tail(path)}}


@needs_admission_control
def test_durable_delay_releases_fewer_bytes_than_the_minimum(ds: DurableEnv) -> None:
    path = ds.new_stream("application/octet-stream")
    ds.client.stream(path).append(b"hello")
    sink, ckpt = BatchLog(lambda r: (r["offset"], r["index"], bytes(r["value"]))), ds.checkpoint()
    df = ds.read_stream(stream=path, minBytesPerTrigger="100", maxTriggerDelay="1500")
    q = start_query(df, sink, ckpt)
    try:
        wait_for(lambda: 1 in sink.batches, "the bytes held past the delay")
        q.processAllAvailable()
    finally:
        q.stop()
    assert sink.batches == {0: [], 1: [("-1", 0, b"hello")]}
    log = offsets_log(ckpt)
    assert log == {0: {path: {"offset": "-1", "skip": 0}}, 1: {path: ds.tail(path)}}


@needs_admission_control
def test_durable_available_now_reads_everything_whatever_the_minimum(ds: DurableEnv) -> None:
    path = ds.new_stream()
    ds.append(path, 0, 3)
    sink, ckpt = BatchLog(ds_value), ds.checkpoint()
    finish(start_query(ds.read_stream(stream=path, minRecordsPerTrigger="100"), sink, ckpt,
                       available_now=True))
    assert sink.batches == {0: msgs(0, 3)}
    assert offsets_log(ckpt) == {0: {path: ds.tail(path)}}


# -- what held plans ask the service (PySpark 4.2+) ---------------------------------------


@needs_admission_control
def test_held_plans_ask_only_about_streams_that_got_records(
    ds: DurableEnv, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Plans of a held trigger wait on the tail watch past the tails they saw: streams that
    got nothing since are not asked, and one that did is counted on from its last tail."""
    from http_proxy import HttpProxy
    from pyspark.sql.streaming.datasource import ReadMinRows

    from s2_spark.spark import DurableStreamsDataSource

    paths = [ds.new_stream() for _ in range(3)]
    for path in paths:
        ds.append(path, 0, 2)
    proxy = HttpProxy()
    for name in ("NO_PROXY", "no_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HTTP_PROXY", proxy.url)
    opts = ds.options(streams=",".join(paths), valueType="string", minRecordsPerTrigger="10")
    reader = DurableStreamsDataSource(opts).streamReader(None)  # type: ignore[arg-type]

    def asked() -> list[str]:  # requests other than the watch's long-polls
        return [line for line in list(proxy.request_lines) if "live=long-poll" not in line]

    try:
        start = reader.initialOffset()
        assert reader.latestOffset(start, ReadMinRows(10)) == start  # 6 new: held
        tails = {p: ds.tail(p) for p in paths}
        assert reader._hold.tails(start) == tails
        wait_for(lambda: reader._watch.quiet(tails) == set(paths), "the watch to settle", 30)
        before = len(asked())
        assert reader.latestOffset(start, ReadMinRows(10)) == start
        assert asked()[before:] == []
        ds.append(paths[1], 2, 3)  # 9 new: still held
        wait_for(lambda: reader._watch.quiet(tails) != set(paths), "the append to show", 30)
        assert reader.latestOffset(start, ReadMinRows(10)) == start
        new = asked()[before:]
        assert new and all(paths[1] in line for line in new), new
        assert not any("offset=-1" in line for line in new), new  # counted on, not again
        ds.append(paths[2], 2, 1)  # 10 new: the micro-batch
        end = start
        deadline = time.monotonic() + 30
        while end == start:
            assert time.monotonic() < deadline, "the tenth message never showed"
            end = reader.latestOffset(start, ReadMinRows(10))
        assert end == {p: ds.tail(p) for p in paths}
    finally:
        reader.stop()
        proxy.close()
